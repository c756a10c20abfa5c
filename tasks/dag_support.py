"""What recflow's DAG files share (imported only by dags/ and tests): assets, default task arguments, and

Importing this must stay cheap (no torch, pyspark, tensorflow, no connections): it runs at DAG-parse time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import Asset

from tasks.config import Settings, criteo_day_index, load_settings

# One asset event per ingested Criteo day (extra = {"day": N, ...}); training DAGs schedule on it.
CRITEO_DAY_STATS = Asset(name="criteo_day_stats", uri="recflow://criteo/day_stats")

SPARK_POOL = "spark"
TRAIN_POOL = "train"


def _queue(variable: str) -> dict[str, str]:
    """A task's Celery queue from the environment at parse time ({} = Airflow's [operators] default_queue).
    LocalExecutor ignores queues; under CeleryExecutor, RECFLOW_TRAIN_QUEUE=gpu sends training to the GPU
    workers (docker-compose.yml's `gpu` profile) and RECFLOW_SPARK_QUEUE=gpu the Spark jobs (RAPIDS profile)."""
    queue = os.environ.get(variable, "").strip()
    return {"queue": queue} if queue else {}


SPARK_TASK: dict[str, Any] = {"pool": SPARK_POOL, **_queue("RECFLOW_SPARK_QUEUE")}
TRAIN_TASK: dict[str, Any] = {"pool": TRAIN_POOL, **_queue("RECFLOW_TRAIN_QUEUE")}

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "recflow",
    "retries": int(os.environ.get("RECFLOW_TASK_RETRIES", "2")),
    "retry_delay": timedelta(seconds=float(os.environ.get("RECFLOW_RETRY_DELAY_S", "30"))),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=10),
}


def epoch_datetime(settings: Settings | None = None) -> datetime:
    epoch = (settings or load_settings()).criteo_epoch
    return datetime(epoch.year, epoch.month, epoch.day, tzinfo=timezone.utc)


def criteo_day(context: dict[str, Any], settings: Settings) -> int:
    """The run's Criteo day: the `day` param if set, else the logical date's offset from the epoch."""
    day = context["params"].get("day")
    if day is not None:
        return int(day)
    logical = context.get("logical_date") or context.get("dag_run").run_after
    return criteo_day_index(logical.date(), settings.criteo_epoch)


def fail_without_retry(*errors: type[BaseException]) -> Callable:
    """Bad input does not get better on retry: turn these errors into AirflowFailException (no retries)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                from airflow.sdk.exceptions import AirflowFailException

                raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc

        return wrapper

    return decorate


def spark_master(conn_id: str = "spark_default") -> str:
    """The Spark master named by an Airflow connection (host[:port]); local[*] when there is none."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return "local[*]"
    host = conn.host or "local[*]"
    return f"{host}:{conn.port}" if conn.port else host
