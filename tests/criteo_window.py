"""A tiny ingested Criteo window for preprocessing tests: synthetic days written and validated by the arrow
day-stats engine (which writes each day's columnar/ and counts/ in validation's pass)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tasks.core.config import Settings
from tasks.criteo import ingest, layout
from tasks.criteo.synthetic import write_criteo_day


def ingest_synthetic_days(root: Path, day_rows: Mapping[int, int], *, seed: int = 11,
                          block_bytes: int = 1 << 17) -> Settings:
    """Days day -> rows under root, ingested; small validation blocks give each day several row groups."""
    settings = Settings(data_root=root, bad_row_budget=0.01, validation_block_bytes=block_bytes)
    for day, rows in day_rows.items():
        raw = layout.raw_day(root, day)
        raw.parent.mkdir(parents=True, exist_ok=True)
        write_criteo_day(raw, day, rows, seed=seed)
        ingest.validate_day(settings, day, engine="arrow")
    return settings
