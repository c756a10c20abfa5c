"""Where Criteo days live under the data root, keyed by day."""

from __future__ import annotations

from pathlib import Path

from tasks.core.layout import dataset_stage_dir

DATASET = "criteo"


def source_dir(root: Path) -> Path:
    """Synthetic source day files of the demo (what RECFLOW_CRITEO_SOURCE points at by default)."""
    return dataset_stage_dir(root, DATASET, "source")


def raw_day(root: Path, day: int) -> Path:
    """Downloaded day file (plain TSV, as NVIDIA's scripts expect: day_N)."""
    return dataset_stage_dir(root, DATASET, "raw") / f"day_{day}"


def validated_day(root: Path, day: int) -> Path:
    """Validation report, quarantine and manifest of one day."""
    return dataset_stage_dir(root, DATASET, "validated") / f"day={day}"


def stats_root(root: Path) -> Path:
    return dataset_stage_dir(root, DATASET, "stats")


def stats_day(root: Path, day: int) -> Path:
    """Typed parquet copy (columnar/) and categorical value counts (counts/) of one day."""
    return stats_root(root) / f"day={day}"


def models_cache(root: Path) -> Path:
    """Published versions fetched to score with (the gate's production model), one folder per model/version."""
    return dataset_stage_dir(root, DATASET, "models_cache")
