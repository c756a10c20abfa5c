"""Run one DAG run in-process with Airflow's `dag.test()` and print a JSON summary of its task instances.

  python scripts/run_dag.py criteo_ingest --logical-date 2026-01-02 [--conf '{"day": 1}']

Used by `make demo` and the end-to-end tests; the last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.dagkit.local_run import run_dag  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dag_id")
    parser.add_argument("--logical-date", type=datetime.fromisoformat, default=None)
    parser.add_argument("--conf", type=json.loads, default={})
    args = parser.parse_args(argv)
    logical = args.logical_date
    if logical is not None and logical.tzinfo is None:
        logical = logical.replace(tzinfo=timezone.utc)
    summary = run_dag(args.dag_id, logical, args.conf)
    print(json.dumps(summary))
    return 0 if summary["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
