"""`make demo`: the main job end to end on this machine's embedded defaults, through Airflow itself.

Writes synthetic Criteo days (the public files cannot be downloaded here) to the source folder, then runs the
criteo_ingest DAG for each day with `dag.test()` (Airflow's in-process runner: real task instances, XCom, retries,
the SQLite metadata DB under .airflow/), and prints per-task timings and where the outputs are.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.criteo import layout as criteo_layout  # noqa: E402
from tasks.core.config import load_settings  # noqa: E402
from tasks.criteo.settings import load_criteo_settings  # noqa: E402
from tasks.criteo.synthetic import ensure_days  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from run_dag import run_dag  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3, help="number of Criteo days to ingest (from day 0)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per synthetic day")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--ingest-only", action="store_true", help="stop after criteo_ingest")
    parser.add_argument("--dlrm-conf", type=json.loads, default={},
                        help="extra criteo_dlrm params as JSON, e.g. '{\"nproc\": 2}'")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = load_settings()
    criteo = load_criteo_settings()
    source_dir = Path(criteo.source_template(settings.data_root).removeprefix("file://")).parent
    if criteo.source:
        print(f"using configured source {criteo.source}")
    else:
        print(f"writing {args.days} synthetic Criteo days of {args.rows} rows to {source_dir}")
        ensure_days(source_dir, range(args.days), args.rows, args.seed)

    epoch = criteo.epoch_datetime
    summary = []
    start = time.monotonic()
    for day in range(args.days):
        run = run_dag("criteo_ingest", epoch + timedelta(days=day))
        summary.append((day, run["state"], run["wall_seconds"], run["tasks"]))
        if run["state"] != "success":
            break
    ingest_ok = all(state == "success" for _, state, *_ in summary) and len(summary) == args.days
    training = None
    if ingest_ok and not args.ingest_only and args.days >= 2:
        conf = {"train_days": f"0-{args.days - 2}", "test_day": args.days - 1, **args.dlrm_conf}
        training = run_dag("criteo_dlrm", None, conf)
    total = time.monotonic() - start

    print("\n=== criteo_ingest through Airflow (dag.test) ===")
    for day, state, seconds, tasks in summary:
        print(f"day {day}: {state} in {seconds:.1f} s")
        print_tasks(tasks)
    if training:
        print(f"\n=== criteo_dlrm ({training['run_id']}): {training['state']} in {training['wall_seconds']:.1f} s ===")
        print_tasks(training["tasks"])
        print_training_outcome(settings, training)
    print(f"\ntotal {total:.1f} s")
    print("\noutputs:")
    root = settings.data_root
    for day, *_ in summary:
        print(f"  day {day}: raw {criteo_layout.raw_day(root, day)}")
        print(f"         validated {criteo_layout.validated_day(root, day)} (report.json, quarantine.jsonl)")
        print(f"         stats {criteo_layout.stats_day(root, day)} (columnar/, counts/, _MANIFEST.json)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return 0 if ingest_ok and (training is None or training["state"] == "success") else 1


def print_tasks(tasks: dict) -> None:
    for task_id, task in tasks.items():
        print(f"    {task_id:<17} {task['state']:<16} {task['duration']:7.1f} s")


def print_training_outcome(settings, training: dict) -> None:
    from tasks.criteo.dlrm import run_paths
    from tasks.release.publish import latest_version

    paths = run_paths(settings, training["run_id"])
    metrics_file = paths.evaluation / "metrics.json"
    if metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        print(f"test AUC {metrics['auc']:.4f}, logloss {metrics['logloss']:.4f} on {metrics['rows']} rows")
    print(f"run outputs: {paths.root} (dictionary/, dataset/, train/ with training_curves.png, eval/)")
    latest = latest_version(settings.publish_store, "criteo_dlrm")
    if training["tasks"].get("publish", {}).get("state") == "success" and latest:
        print(f"published: {latest['uri']} (version {latest['version']}, now latest)")
    else:
        print(f"not published (gate: see the gate task log); store {settings.publish_store}")


if __name__ == "__main__":
    sys.exit(main())
