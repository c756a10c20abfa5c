"""`make demo`: every registered pipeline (tasks/pipelines.py) end to end on this machine's embedded defaults,
through Airflow itself (`dag.test()`: real task instances, XCom, retries, the SQLite metadata DB under .airflow/).

  python scripts/demo.py [--pipeline criteo_dlrm] [pipeline options, see --help]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.pipelines import PIPELINES  # noqa: E402


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", action="append", choices=sorted(PIPELINES),
                        help="run only this pipeline (repeatable; default: all)")
    parser.add_argument("--engine", choices=("spark", "arrow", "nvtabular"), default=None,
                        help="preprocessing engine of the pipelines that offer one (criteo_dlrm: spark|arrow|"
                             "nvtabular, outbrain_wide_deep: spark|nvtabular); default: each pipeline's setting")
    modules = {name: importlib.import_module(module) for name, module in PIPELINES.items()}
    for module in modules.values():
        module.add_arguments(parser)
    return parser.parse_args(argv), modules


def main(argv: list[str] | None = None) -> int:
    args, modules = parse_args(argv)
    # The demo is a deployment of its own, at the demo profile: its small models gate against the demo's release
    # thresholds, which a run on a full-profile deployment may not loosen to (tasks.core.profiles).
    os.environ.setdefault("RECFLOW_PROFILE", "demo")
    logging.basicConfig(level=logging.WARNING)
    outcomes = {}
    for name in args.pipeline or list(PIPELINES):
        print(f"\n##### {name} #####")
        start = time.monotonic()
        outcomes[name] = (modules[name].run_demo(args), time.monotonic() - start)
    print("\n=== demo ===")
    for name, (ok, seconds) in outcomes.items():
        print(f"{name:<20} {'ok' if ok else 'FAILED':<7} {seconds:7.1f} s")
    return 0 if all(ok for ok, _ in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
