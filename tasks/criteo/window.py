"""criteo_dlrm's training window: which days a run trains and tests on (a form's train_days / test_day, else the
newest ingested day and the window_days before it), and which days are ingested. Read by the run's resolve step
(tasks/criteo/dlrm.py) and by the retrain gate (tasks/criteo/retrain.py)."""

from __future__ import annotations

import logging
import re
from typing import Any

from tasks.core.config import Settings
from tasks.core.storage import read_manifest
from tasks.criteo import layout

log = logging.getLogger(__name__)

_DAY_RANGES = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")


def parse_days(text: str, *, max_days: int | None = None, max_day: int | None = None) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]. Raises ValueError with the offending text. Bounded before anything is expanded: at
    most `max_days` days in all and no day above `max_day` (None: the deployment's RECFLOW_MAX_WINDOW_DAYS /
    RECFLOW_MAX_DAY_INDEX), so '0-300000000' is one line, not a list of 300 million days."""
    if not _DAY_RANGES.match(text or ""):
        raise ValueError(f"train days {text!r} are not a list of days or ranges like '0-22' or '0-3,5'")
    if max_days is None or max_day is None:
        from tasks.core.config import load_settings

        settings = load_settings()
        max_days = settings.max_window_days if max_days is None else max_days
        max_day = settings.max_day_index if max_day is None else max_day
    ranges = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"day range {part.strip()!r} runs backwards")
        if hi > max_day:
            raise ValueError(f"train days {_clipped(text)}: day {hi} is past the last day a run may name, {max_day} "
                             "(RECFLOW_MAX_DAY_INDEX)")
        ranges.append((lo, hi))
    named = sum(hi - lo + 1 for lo, hi in ranges)  # an upper bound of the distinct days, computed without them
    if named > max_days:
        raise ValueError(f"train days {_clipped(text)} name {named} days, more than the {max_days} a window may hold "
                         "(RECFLOW_MAX_WINDOW_DAYS)")
    return sorted({day for lo, hi in ranges for day in range(lo, hi + 1)})


def _clipped(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def ingested_days(settings: Settings) -> list[int]:
    """Days whose day_stats output is complete (has a manifest), ascending."""
    stats_root = layout.stats_root(settings.data_root)
    days = []
    for path in stats_root.glob("day=*"):
        suffix = path.name.removeprefix("day=")
        if suffix.isdigit() and read_manifest(path) is not None:
            days.append(int(suffix))
    return sorted(days)


def resolve_window(settings: Settings, train_days: str, test_day: int | None, window_days: int) -> dict[str, Any]:
    """The run's training window. Explicit params win; otherwise the newest ingested day is the test day and the
    `window_days` days before it are the train days (scheduled and asset-triggered retraining use this)."""
    if test_day is None:
        available = ingested_days(settings)
        if not available:
            raise ValueError(f"no ingested Criteo day under {settings.data_root}: run criteo_ingest first")
        test_day = available[-1]
    days = parse_days(train_days) if train_days else list(range(max(0, test_day - window_days), test_day))
    if not days:
        raise ValueError(f"no train days before test day {test_day} (window of {window_days} days)")
    if test_day in days:
        raise ValueError(f"test day {test_day} is also a train day ({train_days})")
    missing = [d for d in [*days, test_day] if read_manifest(layout.stats_day(settings.data_root, d)) is None]
    if missing:
        raise ValueError(f"days {missing} are not ingested (no day_stats manifest): run criteo_ingest for them")
    log.info("training window: train days %s, test day %d", days, test_day)
    return {"train_days": days, "test_day": test_day}
