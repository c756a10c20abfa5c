"""Run one DAG run in-process with Airflow's `dag.test()` (real task instances, XCom, retries, the metadata DB of
AIRFLOW_HOME) and summarise it: used by `make demo`, scripts/run_dag.py, the benchmarks and the end-to-end tests."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from tasks.core.config import REPO_ROOT


def run_dag(dag_id: str, logical_date: datetime | None, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse dags/, run the DAG once, and summarise the run: state, wall time, each task's state/duration/tries."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    start = time.monotonic()
    dag_run = bag.get_dag(dag_id).test(logical_date=logical_date, run_conf=conf or {})
    wall = time.monotonic() - start
    tasks = {}
    for ti in dag_run.get_task_instances():
        tasks[ti.task_id] = {"state": str(ti.state), "duration": float(ti.duration or 0.0),
                             "try_number": ti.try_number,
                             "start": ti.start_date.isoformat() if ti.start_date else None}
    return {"dag_id": dag_id, "run_id": dag_run.run_id, "state": str(dag_run.state), "wall_seconds": wall,
            "tasks": dict(sorted(tasks.items(), key=lambda kv: kv[1]["start"] or "~"))}


def print_tasks(tasks: dict) -> None:
    """One line per task of a run summary: id, state, duration."""
    for task_id, task in tasks.items():
        print(f"    {task_id:<17} {task['state']:<16} {task['duration']:7.1f} s")
