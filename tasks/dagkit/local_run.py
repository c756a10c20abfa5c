"""Run one DAG run in-process with Airflow's `dag.test()` (real task instances, XCom, retries, the metadata DB of
AIRFLOW_HOME) and summarise it: used by `make demo`, scripts/run_dag.py, the benchmarks and the end-to-end tests."""

from __future__ import annotations

import json
import time
from datetime import datetime
from collections.abc import Callable
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
            "tasks": dict(sorted(tasks.items(), key=lambda kv: kv[1]["start"] or "~")),
            "triggered": _triggered_run_ids(dag_id, dag_run.run_id)}


def _triggered_run_ids(dag_id: str, run_id: str) -> list[str]:
    """The run ids a run's trigger tasks created (their `trigger_run_id` XCom, TriggerDagRunOperator's record)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=run_id, dag_ids=dag_id, key="trigger_run_id")).all()
        return [str(XComModel.deserialize_value(row)) for row in rows]


def drop_triggered_runs(dag_id: str, ingest_runs: list[dict[str, Any]]) -> list[str]:
    """Remove from the metadata DB the runs of `dag_id` that the gates of these ingest runs (run_dag summaries)
    triggered and that still wait (queued: `dag.test()` runs no scheduler), because the demo runs that DAG itself.
    Left there, they would start under a scheduler started on this DB later (`make airflow`), as trainings nobody
    asked for. Other queued runs (a scheduler's, on this DB before) are left alone. Returns the removed run ids."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState

    run_ids = sorted({run_id for run in ingest_runs for run_id in run.get("triggered", [])})
    if not run_ids:
        return []
    with create_session() as session:
        waiting = session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id.in_(run_ids),
                                               DagRun.state == DagRunState.QUEUED).all()
        for run in waiting:
            print(f"{dag_id} run {run.run_id}, triggered by the ingest's gate, is left out: the demo runs {dag_id} "
                  "itself")
            session.delete(run)
        return [run.run_id for run in waiting]


def print_tasks(tasks: dict) -> None:
    """One line per task of a run summary: id, state, duration."""
    for task_id, task in tasks.items():
        print(f"    {task_id:<17} {task['state']:<16} {task['duration']:7.1f} s")


def print_run(dag_id: str, label: str, run: dict[str, Any]) -> None:
    """A run summary as a demo prints it: a heading (DAG, `label`, state, wall time), then its tasks."""
    print(f"\n=== {dag_id} ({label}): {run['state']} in {run['wall_seconds']:.1f} s ===")
    print_tasks(run["tasks"])


def run_ingest_then_training(ingest_dag: str, ingest_conf: dict[str, Any], ingest_label: str, training_dag: str,
                             training_conf: dict[str, Any],
                             print_outcome: Callable[[dict[str, Any]], None]) -> tuple[dict, dict | None]:
    """A snapshot pipeline's demo: its ingest DAG, then (when that succeeded) its training DAG, each run once; then
    both runs' tasks, the training run's outcome (`print_outcome`) and the total time. Returns both summaries (no
    training run when the ingest failed)."""
    start = time.monotonic()
    ingest = run_dag(ingest_dag, None, ingest_conf)
    training = None
    if ingest["state"] == "success":
        drop_triggered_runs(training_dag, [ingest])
        training = run_dag(training_dag, None, training_conf)
    total = time.monotonic() - start
    print_run(ingest_dag, ingest_label, ingest)
    if training:
        print_run(training_dag, training["run_id"], training)
        print_outcome(training)
    print(f"\n{training_dag} total {total:.1f} s")
    return ingest, training


def print_publish_outcome(store: str, pipeline: str, run: dict[str, Any]) -> dict[str, Any] | None:
    """Whether the training run published: the version it published (now the latest), else where to look why.
    Returns the latest version's record when it did."""
    from tasks.release.publish import latest_version

    latest = latest_version(store, pipeline)
    if run["tasks"].get("publish", {}).get("state") != "success" or not latest:
        print(f"not published (gate: see the gate task log); store {store}")
        return None
    print(f"published: {latest['uri']} (version {latest['version']}, now latest)")
    return latest


def print_run_outcome(paths: Any, describe_metrics: Callable[[dict[str, Any]], str], outputs: str) -> None:
    """A training run's evaluation (`describe_metrics` of its metrics.json, when there is one) and where its outputs
    are. `paths`: the run's RunPaths; `outputs`: what its folder holds."""
    metrics_file = paths.evaluation / "metrics.json"
    if metrics_file.exists():
        print(describe_metrics(json.loads(metrics_file.read_text())))
    print(f"run outputs: {paths.root} ({outputs})")


def describe_click_metrics(metrics: dict[str, Any]) -> str:
    """A click model's evaluation as a demo prints it."""
    return f"test AUC {metrics['auc']:.4f}, logloss {metrics['logloss']:.4f} on {metrics['rows']} rows"
