"""Benchmark inputs, generated once into bench/.cache/ with the project's own generators and reused.

  criteo/<rows>/day_N        synthetic Criteo days (tasks.criteo.synthetic), plus day_N.synthetic.json (rows, seed)
  split_binary/<rows>/       a Criteo-shaped split-binary dataset (models.dlrm.synthetic via tasks.formats.split_binary):
                             13 numericals, 26 categoricals with synthetic_criteo's vocabulary sizes
  airflow-template/          an AIRFLOW_HOME whose SQLite DB is migrated once; each ingest pass copies it
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import CACHE_DIR, REPO, SEED, log
from tasks.criteo.schema import NUM_INT_FEATURES

LOADER_TEST_ROWS = 16_384


def criteo_days(rows: int, days: list[int]) -> Path:
    """Directory holding day_0..day_N of `rows` rows each (written only if missing or different)."""
    from tasks.criteo.synthetic import ensure_days

    directory = CACHE_DIR / "criteo" / str(rows)
    log.info("synthetic Criteo days %s (%d rows) in %s", days, rows, directory)
    return ensure_days(directory, days, rows, SEED)


def split_binary_dataset(rows: int) -> Path:
    """A Criteo-shaped split-binary dataset with `rows` training rows (written once)."""
    from models.dlrm.synthetic import make_synthetic_dataset
    from tasks.criteo.synthetic import VOCAB_SIZES

    directory = CACHE_DIR / "split_binary" / str(rows)
    stamp = directory / "bench.json"
    wanted = {"train_rows": rows, "test_rows": LOADER_TEST_ROWS, "seed": SEED, "cardinalities": list(VOCAB_SIZES)}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return directory
    log.info("generating a split-binary dataset of %d rows into %s", rows, directory)
    make_synthetic_dataset(directory, train_rows=rows, test_rows=LOADER_TEST_ROWS, n_numerical=NUM_INT_FEATURES,
                           cardinalities=VOCAB_SIZES, seed=SEED, chunk_rows=1 << 16)
    stamp.write_text(json.dumps(wanted))
    return directory


def airflow_env(home: Path, data_root: Path, source_dir: Path) -> dict[str, str]:
    """Environment of an isolated Airflow (own home and data root), as tests/test_e2e_criteo_ingest.py sets it."""
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "AIRFLOW_HOME": str(home), "RECFLOW_DATA_ROOT": str(data_root),
            "RECFLOW_CRITEO_SOURCE": source_dir.resolve().as_uri() + "/day_{day}",
            "RECFLOW_TASK_RETRIES": "0",  # a failure must fail the benchmark, not be retried into the timings
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "PYTHONPATH": str(REPO), "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}


def airflow_home(destination: Path) -> Path:
    """A fresh AIRFLOW_HOME at destination: a copy of the cached, migrated template (migrated on first use)."""
    template = CACHE_DIR / "airflow-template"
    ready = template / "bench.ready"
    if not ready.is_file():
        shutil.rmtree(template, ignore_errors=True)
        template.mkdir(parents=True)
        log.info("migrating a template Airflow metadata DB in %s (once)", template)
        env = airflow_env(template, template / "unused-data", template)
        subprocess.run(["bash", str(REPO / "scripts" / "airflow_init.sh")], env=env, check=True,
                       capture_output=True, timeout=600)
        ready.write_text("migrated\n")
    # Only the DB: airflow.cfg embeds its home's absolute paths, so each home generates its own on first use.
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(template / "airflow.db", destination / "airflow.db")
    return destination
