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

from tasks import layout  # noqa: E402
from tasks.config import load_settings  # noqa: E402
from tasks.synthetic_criteo import CriteoDayGenerator, write_criteo_day  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3, help="number of Criteo days to ingest (from day 0)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per synthetic day")
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


def ensure_source_days(source_dir: Path, days: int, rows: int, seed: int) -> None:
    """Write the synthetic day files unless identical ones (same rows and seed) are already there."""
    generator = None
    for day in range(days):
        path = source_dir / f"day_{day}"
        stamp = path.with_name(path.name + ".synthetic.json")
        wanted = {"day": day, "rows": rows, "seed": seed}
        if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
            continue
        generator = generator or CriteoDayGenerator(seed)
        write_criteo_day(path, day, rows, generator=generator)
        stamp.write_text(json.dumps(wanted))


def run_dag(dag_id: str, logical_date: datetime, conf: dict | None = None):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    return bag.get_dag(dag_id).test(logical_date=logical_date, run_conf=conf or {})


def task_rows(dag_run) -> list[tuple[str, str, float]]:
    rows = []
    for ti in sorted(dag_run.get_task_instances(), key=lambda t: t.start_date or datetime.max.replace(tzinfo=timezone.utc)):
        rows.append((ti.task_id, str(ti.state), float(ti.duration or 0.0)))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = load_settings()
    source_dir = Path(settings.criteo_source_template.removeprefix("file://")).parent
    if settings.criteo_source:
        print(f"using configured source {settings.criteo_source}")
    else:
        print(f"writing {args.days} synthetic Criteo days of {args.rows} rows to {source_dir}")
        ensure_source_days(source_dir, args.days, args.rows, args.seed)

    epoch = datetime(settings.criteo_epoch.year, settings.criteo_epoch.month, settings.criteo_epoch.day,
                     tzinfo=timezone.utc)
    summary = []
    start = time.monotonic()
    for day in range(args.days):
        t0 = time.monotonic()
        dag_run = run_dag("criteo_ingest", epoch + timedelta(days=day))
        summary.append((day, str(dag_run.state), time.monotonic() - t0, task_rows(dag_run)))
        if str(dag_run.state) != "success":
            break
    total = time.monotonic() - start

    print("\n=== criteo_ingest through Airflow (dag.test) ===")
    for day, state, seconds, tasks in summary:
        print(f"day {day}: {state} in {seconds:.1f} s")
        for task_id, task_state, duration in tasks:
            print(f"    {task_id:<14} {task_state:<8} {duration:7.1f} s")
    print(f"total {total:.1f} s")
    print("\noutputs:")
    root = settings.data_root
    for day, *_ in summary:
        print(f"  day {day}: raw {layout.criteo_raw_day(root, day)}")
        print(f"         validated {layout.criteo_validated_day(root, day)} (report.json, quarantine.jsonl)")
        print(f"         stats {layout.criteo_stats_day(root, day)} (columnar/, counts/, _MANIFEST.json)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return 0 if all(state == "success" for _, state, *_ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
