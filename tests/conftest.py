import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest_plugins = ["tests.servers"]

# 100 real Criteo rows (a copy of the team's shared/data/criteo_sample_100.tsv, so a clone alone runs the tests).
CRITEO_SAMPLE = REPO / "tests" / "data" / "criteo_sample_100.tsv"


def airflow_test_env(home: Path, data: Path, **extra: str) -> dict[str, str]:
    """The environment of an Airflow child process (scripts/run_dag.py, the CLI) isolated in `home` and `data`."""
    return {**os.environ, "AIRFLOW_HOME": str(home), "RECFLOW_DATA_ROOT": str(data), "RECFLOW_RETRY_DELAY_S": "1",
            "RECFLOW_PROFILE": "demo", "RECFLOW_TRAIN_DEVICE": "cpu", "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


def airflow_init(env: dict[str, str]) -> dict[str, str]:
    """scripts/airflow_init.sh (DB migration, pools, connections) in that environment; returns it."""
    import subprocess

    subprocess.run(["bash", str(REPO / "scripts" / "airflow_init.sh")], env=env, check=True, timeout=300,
                   capture_output=True)
    return env
