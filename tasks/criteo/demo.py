"""criteo_dlrm on this machine, through Airflow itself (`make demo`): writes synthetic Criteo days (the public
files cannot be downloaded here) to the source folder, runs criteo_ingest once per day and criteo_dlrm on the
demo profile, each with `dag.test()`, and prints per-task timings, the test AUC, the published version and where
the outputs are.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

from tasks.core.config import Settings, load_settings
from tasks.criteo import layout
from tasks.criteo.settings import load_criteo_settings
from tasks.criteo.synthetic import ensure_days
from tasks.dagkit.local_run import (describe_click_metrics, drop_triggered_runs, print_publish_outcome, print_run,
                                     print_run_outcome, print_tasks, run_dag)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("criteo_dlrm")
    group.add_argument("--days", type=int, default=3, help="number of Criteo days to ingest (from day 0)")
    group.add_argument("--rows", type=int, default=100_000, help="rows per synthetic day")
    group.add_argument("--seed", type=int, default=1234)
    group.add_argument("--ingest-only", action="store_true", help="stop after criteo_ingest")
    group.add_argument("--dlrm-conf", type=json.loads, default={},
                       help="extra criteo_dlrm params as JSON, e.g. '{\"nproc\": 2}' (profile: demo unless set)")


def run_demo(args: argparse.Namespace) -> bool:
    settings = load_settings()
    criteo = load_criteo_settings()
    source_dir = Path(criteo.source_template(settings.data_root).removeprefix("file://")).parent
    if criteo.source:
        print(f"using configured source {criteo.source}")
    else:
        print(f"writing {args.days} synthetic Criteo days of {args.rows} rows to {source_dir}")
        ensure_days(source_dir, range(args.days), args.rows, args.seed)

    summary, ingest_runs = [], []
    start = time.monotonic()
    for day in range(args.days):
        run = run_dag("criteo_ingest", criteo.epoch_datetime + timedelta(days=day))
        ingest_runs.append(run)
        summary.append((day, run["state"], run["wall_seconds"], run["tasks"]))
        if run["state"] != "success":
            break
    ingest_ok = all(state == "success" for _, state, *_ in summary) and len(summary) == args.days
    training = None
    if ingest_ok and not args.ingest_only and args.days >= 2:
        conf = {"profile": "demo", "train_days": f"0-{args.days - 2}", "test_day": args.days - 1,
                **({"engine": args.engine} if getattr(args, "engine", None) else {}), **args.dlrm_conf}
        drop_triggered_runs("criteo_dlrm", ingest_runs)
        training = run_dag("criteo_dlrm", None, conf)
    total = time.monotonic() - start

    print("\n=== criteo_ingest through Airflow (dag.test) ===")
    for day, state, seconds, tasks in summary:
        print(f"day {day}: {state} in {seconds:.1f} s")
        print_tasks(tasks)
    if training:
        print_run("criteo_dlrm", training["run_id"], training)
        print_training_outcome(settings, training)
    print(f"\ncriteo_dlrm total {total:.1f} s")
    print("outputs:")
    root = settings.data_root
    for day, *_ in summary:
        print(f"  day {day}: raw {layout.raw_day(root, day)}")
        print(f"         validated {layout.validated_day(root, day)} (report.json, quarantine.jsonl)")
        print(f"         stats {layout.stats_day(root, day)} (columnar/, counts/, _MANIFEST.json)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return ingest_ok and (training is None or training["state"] == "success")


def print_training_outcome(settings: Settings, training: dict) -> None:
    from tasks.criteo.dlrm import run_paths

    print_run_outcome(run_paths(settings, training["run_id"]), describe_click_metrics,
                      "dictionary/, dataset/, train/ with training_curves.png, eval/")
    print_publish_outcome(settings.publish_store, "criteo_dlrm", training)
