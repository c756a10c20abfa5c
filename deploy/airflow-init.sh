#!/usr/bin/env bash
# The deployment's one-shot Airflow setup (docker-compose.yml's airflow-init): metadata DB, pools and connections
# (scripts/airflow_init.sh), the FAB auth manager's tables, the admin user and the two connections the tasks use,
# all from Docker secrets: nothing here has a default password. Idempotent: safe on every `docker compose up`.
set -euo pipefail
secret() { cat "/run/secrets/$1"; }
bash scripts/airflow_init.sh
airflow fab-db migrate >/dev/null
admin="$(secret airflow_admin_user)"
if ! airflow users list --output json | python -c 'import json,sys; sys.exit(0 if any(u["username"] == sys.argv[1] for u in json.load(sys.stdin)) else 1)' "$admin"; then
  airflow users create --role Admin --username "$admin" --password "$(secret airflow_admin_password)" \
    --firstname recflow --lastname admin --email "${AIRFLOW_ADMIN_EMAIL:-admin@localhost}" >/dev/null
  echo "created the Admin user $admin (add others in Security > Users, with the Viewer/User/Op roles they need)"
fi
# Connections as JSON built by Python, so any character in a password survives; stored encrypted (fernet key).
python - <<'PY'
import json, subprocess
from pathlib import Path

def secret(name):
    return Path("/run/secrets", name).read_text().rstrip("\r\n")

connections = {
    "aws_default": {"conn_type": "aws", "login": "recflow", "password": secret("minio_recflow_password"),
                    "extra": {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"}},
    "recflow_registry": {"conn_type": "postgres", "host": "postgres", "port": 5432, "login": "recflow_registry",
                         "password": secret("registry_db_password"), "schema": "recflow_registry"},
}
# Through a 0600 file, not argv: a password on a command line is visible to every process of the container.
import os, tempfile
fd, path = tempfile.mkstemp(suffix=".json")
try:
    with os.fdopen(fd, "w") as f:
        json.dump(connections, f)
    subprocess.run(["airflow", "connections", "import", "--overwrite", path], check=True, capture_output=True)
finally:
    os.unlink(path)
print("connections set:", ", ".join(connections))
PY
