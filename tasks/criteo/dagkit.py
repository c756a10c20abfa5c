"""Criteo's DAG glue (imported by dags/ only, at parse time: keep it cheap): the day asset and the day of a run."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

from tasks.criteo.settings import CriteoSettings, criteo_day_index, load_criteo_settings

# One asset event per ingested Criteo day (extra = {"day": N, ...}); training DAGs schedule on it.
CRITEO_DAY_STATS = Asset(name="criteo_day_stats", uri="recflow://criteo/day_stats")


def criteo_day(context: dict[str, Any], criteo: CriteoSettings | None = None) -> int:
    """The run's Criteo day: the `day` param if set, else the logical date's offset from the epoch (a scheduled or
    backfill run's logical date is the day that just ended; a manual trigger's is the date picked in the form)."""
    day = context["params"].get("day")
    if day is not None:
        return int(day)
    logical = context.get("logical_date") or context.get("dag_run").run_after
    return criteo_day_index(logical.date(), (criteo or load_criteo_settings()).epoch)
