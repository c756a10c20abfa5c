"""Where things live under the data root. Paths are keyed by Criteo day or by DAG run id, so a retried task
overwrites its own outputs and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

_SAFE_RUN_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def criteo_raw_day(root: Path, day: int) -> Path:
    """Downloaded day file (plain TSV, as NVIDIA's scripts expect: day_N)."""
    return root / "criteo" / "raw" / f"day_{day}"


def criteo_validated_day(root: Path, day: int) -> Path:
    """Validation report, quarantine and manifest of one day."""
    return root / "criteo" / "validated" / f"day={day}"


def criteo_stats_day(root: Path, day: int) -> Path:
    """Typed parquet copy (columnar/) and categorical value counts (counts/) of one day."""
    return root / "criteo" / "stats" / f"day={day}"


def run_dir(root: Path, pipeline: str, run_id: str) -> Path:
    """Outputs of one DAG run; the run id is made path-safe (Airflow ids hold ':' and '+')."""
    return root / "runs" / pipeline / _SAFE_RUN_ID.sub("_", run_id)
