"""Where things live under the data root. Paths are keyed by a dataset partition (a day of click logs, a dataset
snapshot) or by DAG run id, so a retried task overwrites its own outputs and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

_SAFE_RUN_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def dataset_stage_dir(root: Path, dataset: str, stage: str) -> Path:
    """One stage of a dataset (raw, validated, stats, ...): <root>/<dataset>/<stage>."""
    return root / dataset / stage


def run_dir(root: Path, pipeline: str, run_id: str) -> Path:
    """Outputs of one DAG run; the run id is made path-safe (Airflow ids hold ':' and '+')."""
    return root / "runs" / pipeline / _SAFE_RUN_ID.sub("_", run_id)
