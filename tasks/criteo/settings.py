"""Criteo's own settings: which logical date is day 0, where raw days come from, which engine writes day stats.

  RECFLOW_CRITEO_EPOCH     the logical date of Criteo day 0, ISO date (default 2026-01-01)
  RECFLOW_CRITEO_SOURCE    URL template of raw day files, with {day} (default: file://<data root>/criteo/source/day_{day})
  RECFLOW_CRITEO_DAY_STATS_ENGINE  arrow | spark (default: arrow when the Spark master is local and the Spark profile
                           the local one, spark with a cluster master or profile): who writes a day's typed columnar
                           copy and value counts. arrow: validate_raw writes them in the pass that checks the rows (the
                           day is parsed once); spark: day_stats spark-submits spark_jobs/criteo/day_stats.py, which
                           parses the day again (what runs on a Spark cluster). Both write the same dataset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

from tasks.core.config import DatasetSource
from tasks.core.settings_registry import Setting, declare, read, value

DAY_STATS_ENGINES = ("arrow", "spark")
_LOCAL_OR_SPARK = "`arrow` on a local Spark master (or none) and the local profile, else `spark`"

declare(
    Setting("RECFLOW_CRITEO_EPOCH", "date", "2026-01-01", "logical date of Criteo day 0"),
    Setting("RECFLOW_CRITEO_SOURCE", "url", "", "URL template of raw days with `{day}` (`file://`, `http(s)://`, "
            "`s3://`; `.gz` is decompressed)", default_note="`file://$RECFLOW_DATA_ROOT/criteo/source/day_{day}`"),
    Setting("RECFLOW_CRITEO_DAY_STATS_ENGINE", "choice", "", "who writes a day's typed parquet copy and value counts: "
            "`arrow` (validate_raw, in the pass over the rows) or `spark` (day_stats' Spark job; a cluster's). Same "
            "dataset either way", default_note=_LOCAL_OR_SPARK),
    Setting("RECFLOW_CRITEO_PREPROCESS_ENGINE", "choice", "", "who builds the dictionary and the split-binary dataset "
            "when a run's `engine` param is empty: `spark`, `arrow` (docs/preprocess_arrow.md) or `nvtabular` "
            "(docs/nvtabular.md); byte-identical output", default_note=_LOCAL_OR_SPARK),
    Setting("RECFLOW_RETRAIN_CRON", "cron", "0 6 * * 1", "criteo_dlrm's safety-net schedule (UTC), which trains only a "
            "window newer than the last trained one", parse_time=True),
)


@dataclass(frozen=True)
class CriteoSettings(DatasetSource):
    epoch: date = date(2026, 1, 1)
    source: str = ""  # empty: the synthetic source folder under the data root
    day_stats_engine: str = ""  # one of DAY_STATS_ENGINES; empty: by the Spark master (tasks.criteo.ingest)

    def __post_init__(self) -> None:
        if self.day_stats_engine:
            check_day_stats_engine(self.day_stats_engine)

    def source_template(self, data_root: Path) -> str:
        if self.source:
            return self.source
        return (data_root / "criteo" / "source").as_uri() + "/day_{day}"

    def source_url(self, data_root: Path, day: int) -> str:
        return self.source_template(data_root).format(day=day)

    @property
    def epoch_datetime(self) -> datetime:
        return datetime(self.epoch.year, self.epoch.month, self.epoch.day, tzinfo=timezone.utc)


def load_criteo_settings(env: dict[str, str] | None = None) -> CriteoSettings:
    env = os.environ if env is None else env
    return CriteoSettings(
        epoch=date.fromisoformat(read("RECFLOW_CRITEO_EPOCH", env)) if read("RECFLOW_CRITEO_EPOCH", env)
        else date(2026, 1, 1),
        source=value("RECFLOW_CRITEO_SOURCE", env),
        day_stats_engine=check_day_stats_engine(read("RECFLOW_CRITEO_DAY_STATS_ENGINE", env),
                                                "RECFLOW_CRITEO_DAY_STATS_ENGINE")
        if read("RECFLOW_CRITEO_DAY_STATS_ENGINE", env) else "",
    )


def check_day_stats_engine(engine: str, setting: str = "day stats engine") -> str:
    """The engine, if it is one of DAY_STATS_ENGINES; else a ValueError naming the setting it came from."""
    if engine not in DAY_STATS_ENGINES:
        raise ValueError(f"{setting} {engine!r}: expected one of {', '.join(DAY_STATS_ENGINES)}")
    return engine


def criteo_day_index(logical_date: date, epoch: date) -> int:
    """Criteo day number for a logical date: day 0 is the epoch date."""
    index = (logical_date - epoch).days
    if index < 0:
        raise ValueError(f"logical date {logical_date} is before the Criteo epoch {epoch}: no day {index}")
    return index
