"""The measured ingest pass, a child process whose process tree the parent samples for memory.

  python -m bench.worker ingest-pass --days 0 1 2 --json OUT       (environment: bench.datasets.airflow_env)

(A preprocessing run needs no worker of its own: bench.preprocessing runs recflow's command line,
`python -m tasks criteo preprocess ... --json OUT`, which times each step.)

ingest-pass runs the criteo_ingest DAG once per day through Airflow's `dag.test()` (scripts/run_dag.py), which
executes each task in this process. Before that, the task functions the DAG's task bodies call (download_day,
validate_day, day_stats) and the pieces inside them (validate_raw_file, the GX suite) are wrapped with timers, so one
run yields both sides of the orchestration figure — Airflow's task durations and the work inside them — and the
ingest figures, without running any day twice. The wrappers only time the call; the functions are the project's.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any


# (module, function): what the ingest figures time inside the DAG's tasks
TIMED_FUNCTIONS = (
    ("tasks.criteo.ingest", "download_day"),
    ("tasks.criteo.ingest", "validate_day"),
    ("tasks.criteo.ingest", "day_stats"),
    ("tasks.criteo.raw_validation", "validate_raw_file"),
    ("tasks.criteo.gx_suite", "run_raw_suite"),
)
DAG_EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Imported before the first day, so day 0 is not charged the one-off import of GX / pyarrow / boto3 that later days
# (in this one process) skip. A real Airflow worker pays them in every task process; that start-up is not timed here.
WARM_IMPORTS = ("tasks.core.download", "tasks.criteo.raw_validation", "tasks.criteo.gx_suite", "tasks.core.spark_submit", "pyarrow.csv",
                "pyarrow.compute", "great_expectations")


def _timed(fn: Callable, name: str, calls: list[dict[str, Any]]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        call: dict[str, Any] = {"name": name, "start": start}
        try:
            result = fn(*args, **kwargs)
        finally:
            call["end"] = time.monotonic()
            calls.append(call)
        if isinstance(result, dict):
            call["result"] = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool))}
        return result

    return wrapper


def install_timers(calls: list[dict[str, Any]]) -> None:
    """Replace each TIMED_FUNCTIONS attribute by a timing wrapper. The DAG's task bodies and validate_day import
    these names at call time (`from tasks.x import f` inside the function), so they pick the wrapper up."""
    for module_name, attr in TIMED_FUNCTIONS:
        module = importlib.import_module(module_name)
        setattr(module, attr, _timed(getattr(module, attr), attr, calls))


def ingest_pass(days: Sequence[int]) -> dict[str, Any]:
    for module in WARM_IMPORTS:
        importlib.import_module(module)
    calls: list[dict[str, Any]] = []
    install_timers(calls)
    from tasks.dagkit.local_run import run_dag

    results = []
    for day in days:
        first_call = len(calls)
        start = time.monotonic()
        summary = run_dag("criteo_ingest", DAG_EPOCH + timedelta(days=day), {"day": day})
        end = time.monotonic()
        if summary["state"] != "success":
            raise SystemExit(f"criteo_ingest day {day}: run {summary['state']}; tasks {summary['tasks']}")
        results.append({"day": day, "start": start, "end": end, "summary": summary, "calls": calls[first_call:]})
        print(f"BENCH day {day}: {end - start:.1f} s", flush=True)
    return {"days": results}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ingest = sub.add_parser("ingest-pass")
    ingest.add_argument("--days", type=int, nargs="+", required=True)
    ingest.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = parse_args(argv)
    result = ingest_pass(args.days)
    args.json.write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
