#!/usr/bin/env bash
# Write every secret docker-compose.yml reads into a folder (default ./secrets), one file each, mode 600; an existing
# file is kept (re-running never rotates a password under a running deployment). Passwords are 32 random characters
# including / @ % " and other punctuation: the deployment composes no URL or JSON by hand (deploy/secret_url.py).
#   ./deploy/make-secrets.sh [folder] [admin user name]
set -euo pipefail
dir="${1:-secrets}"
admin="${2:-admin}"
mkdir -p "$dir"
chmod 700 "$dir"
write() {  # name, command printing the value
  local path="$dir/$1"
  if [ ! -s "$path" ]; then (umask 077; "${@:2}" > "$path"); echo "wrote $path"; fi
}
password() { python3 -c 'import secrets, string; a = string.ascii_letters + string.digits + "/@%\"#:?&+=!-_"; print("".join(secrets.choice(a) for _ in range(32)))'; }
fernet() { python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'; }
for name in postgres_password registry_db_password redis_password minio_root_password minio_recflow_password \
            airflow_admin_password airflow_jwt_secret airflow_secret_key; do
  write "$name" password
done
write airflow_fernet_key fernet
write minio_root_user echo "recflow-root"
write airflow_admin_user echo "$admin"
echo "secrets in $dir: set RECFLOW_SECRETS_DIR=$(cd "$dir" && pwd) in .env"
