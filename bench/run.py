"""Run the benchmark: `.venv/bin/python -m bench.run [--quick|--full] [--only NAME ...]` from the repository root.

Figures: ingest, endtoend (raw logs to split-binary through the CLI), preprocessing, loader, training, orchestration,
scaling, cluster (fixed cost per Spark job on a standalone cluster), byo (BYO transcode against NVIDIA's
transcode.py from the checkout named by $NVIDIA_DLRM; bench/byo.py), gpu_dlrm (the GPU DLRM benchmark's CPU mode at
criteo_f15/16 tables; bench/gpu_dlrm.py) (see docs/PERFORMANCE.md for what each
measures). quick (default): 50k-row days, windows of 1/2 days, 3 repeats of every cheap measurement and one
ingest pass / one preprocessing run per window (each Spark run costs tens of seconds of fixed start-up on 2 cores);
full: 500k-row days, windows of 1/2/4/8 days, 3 repeats of everything. Writes bench/results/<UTC timestamp>.json and
regenerates docs/PERFORMANCE.md with its plots in docs/perf/. Intermediate data lives in bench/.cache/work/<stamp>/
and is deleted at the end; child logs are kept in bench/.cache/logs/<stamp>/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from bench import (byo, cluster, endtoend, gpu_dlrm, ingest, loader, orchestration, preprocessing, report, scaling,
                   training)
from bench.common import (CACHE_DIR, MODES, REPO, RESULTS_DIR, Figure, LoadMonitor, Mode, OtherWork, Stage,
                          cpu_seconds, load_average, log, machine_info)
from bench.proc import RSS_METHOD
from tasks.core.storage import write_text_atomic

NAMES = ("ingest", "endtoend", "preprocessing", "loader", "training", "orchestration", "scaling", "cluster", "byo",
         "gpu_dlrm")
NEEDS_INGEST = {"ingest", "orchestration", "scaling", "preprocessing"}
NEEDS_PREPROCESSING = {"preprocessing", "scaling"}
# Each cluster repeat is 3 spark-submits per side (~20 s each on 2 cores). quick measures the fixed cost against
# local once (the `cluster` side: only the master differs); full adds the deployment's `cluster` profile, 3 times.
CLUSTER_REPEATS = {"quick": 1, "full": 3}
CLUSTER_SIDES = {"quick": ("local", "cluster"), "full": tuple(cluster.SIDES)}
T = TypeVar("T")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="mode", action="store_const", const="quick", help="the default")
    size.add_argument("--full", dest="mode", action="store_const", const="full")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only these figures (repeatable or comma-separated): {', '.join(NAMES)}")
    parser.add_argument("--repeats", type=int, help="override the mode's repeats of cheap measurements")
    parser.add_argument("--spark-repeats", type=int, help="override the mode's ingest passes / runs per window")
    parser.add_argument("--train-repeats", type=int, help="override the mode's interleaved training rounds")
    parser.add_argument("--keep-work", action="store_true", help="keep bench/.cache/work/<stamp>/ (data roots)")
    parser.add_argument("--page", default=report.DEFAULT_PAGE,
                        help="the page under docs/ to write (default %(default)s; another name keeps the main page, "
                             "e.g. PERFORMANCE-full.md for a --full --only preprocessing run)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_-]+\.md", args.page):
        parser.error(f"--page {args.page!r}: a file name ending in .md, no directories")
    args.mode = args.mode or "quick"
    only = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: unknown; choose from {', '.join(NAMES)}")
    args.only = [name for name in NAMES if name in only]
    for flag in ("repeats", "spark_repeats", "train_repeats"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class Runner:
    """Runs the stages the selected figures need, each once, recording duration, CPU time and load around each."""

    def __init__(self, mode: Mode, selected: list[str], work_dir: Path) -> None:
        self.mode, self.selected, self.work_dir = mode, selected, work_dir
        self.stages: dict[str, dict[str, Any]] = {}
        self.figures: list[Figure] = []
        self.raw: dict[str, Any] = {}
        self.series: dict[str, Any] = {}

    def stage(self, name: str, fn: Callable[[], T]) -> T:
        load_start = load_average()
        with Stage(name) as stage:
            result = fn()
        self.stages[name] = {"seconds": round(stage.seconds, 2), "cpu_seconds": round(stage.cpu_seconds, 2),
                             "load_start": load_start, "load_end": load_average()}
        return result

    def wants(self, names: set[str]) -> bool:
        return bool(names & set(self.selected))

    def run(self) -> None:
        mode, work = self.mode, self.work_dir
        ingest_data = prep_data = None
        if self.wants(NEEDS_INGEST):
            ingest_data = self.stage("ingest passes", lambda: ingest.measure(mode, work))
            self.raw["ingest"] = ingest_data.to_raw()
        if self.wants(NEEDS_PREPROCESSING):
            prep_data = self.stage("preprocessing runs", lambda: preprocessing.measure(mode, ingest_data, work))
            self.raw["preprocessing"] = prep_data.to_raw()
        if "endtoend" in self.selected:
            end_to_end = self.stage("end to end (CLI)", lambda: endtoend.measure(mode, work))
            self.raw["endtoend"] = end_to_end.to_raw()
        if "loader" in self.selected:
            self.raw["loader"] = self.stage("loader", lambda: loader.measure(mode))
        if "training" in self.selected:
            self.raw["training"] = self.stage("training", lambda: training.measure(mode, work))
        if "cluster" in self.selected:
            self.raw["cluster"] = self.stage("spark cluster", lambda: cluster.measure(CLUSTER_REPEATS[mode.name],
                                                                                  CLUSTER_SIDES[mode.name]))
        if "byo" in self.selected:
            self.raw["byo"] = self.stage("byo transcode", lambda: byo.measure(
                byo.BENCH_ROWS, mode.repeats, byo.nvidia_checkout(os.environ.get("NVIDIA_DLRM")), work / "byo"))
            self.figures += byo.figures(self.raw["byo"])
        if "gpu_dlrm" in self.selected:  # the GPU benchmark's CPU mode (issue #28)
            self.raw["gpu_dlrm"] = self.stage("gpu_dlrm (cpu mode)",
                                              lambda: gpu_dlrm.measure(gpu_dlrm.CPU_MODE, work / "gpu_dlrm"))
            self.figures += gpu_dlrm.figures(self.raw["gpu_dlrm"])
        if "ingest" in self.selected:
            self.figures += ingest.figures(ingest_data)
        if "endtoend" in self.selected:
            self.figures += endtoend.figures(end_to_end)
        if "preprocessing" in self.selected:
            self.figures += preprocessing.figures(prep_data, ingest_data, mode)
        if "loader" in self.selected:
            self.figures += loader.figures(self.raw["loader"])
        if "training" in self.selected:
            self.figures += training.figures(self.raw["training"])
        if "orchestration" in self.selected:
            self.figures += orchestration.figures(ingest_data)
        if "scaling" in self.selected:
            self.series["scaling"] = scaling.series(mode, ingest_data, prep_data)
            self.figures += scaling.figures(self.series["scaling"])
        if "cluster" in self.selected:
            self.figures += cluster.figures(self.raw["cluster"])


def _plan(mode: Mode, selected: list[str]) -> str:
    parts = []
    if NEEDS_INGEST & set(selected):
        parts.append(f"{mode.spark_repeats} ingest pass(es) of {len(mode.pass_days)} DAG runs "
                     f"({mode.day_rows:,}-row days)")
    if NEEDS_PREPROCESSING & set(selected):
        parts.append(f"{mode.spark_repeats * len(mode.scaling_days)} preprocessing runs (windows "
                     f"{list(mode.scaling_days)} train days)")
    if "endtoend" in selected:
        parts.append(f"1 end-to-end CLI run over 3 days of {endtoend.DAY_ROWS[mode.name]:,} rows")
    if "cluster" in selected:
        parts.append(f"{CLUSTER_REPEATS[mode.name]} round(s) of the 3 Spark jobs on "
                     f"{' / '.join(CLUSTER_SIDES[mode.name])}")
    if "loader" in selected:
        parts.append(f"{mode.repeats} loader repeats over {mode.loader_rows:,} rows")
    if "training" in selected:
        launches = sum(1 + len(mode.train.peer_variants[n]) for n in training.PROCESS_COUNTS)
        parts.append(f"{mode.train.repeats} training rounds of {launches} torchrun launches + 1 ceiling process")
    return "; ".join(parts)


def _print_summary(figures: list[Figure]) -> None:
    for f in figures:
        ratio = f" -> ratio {f.ratio.median:.3g} ({f.ratio.min:.3g}-{f.ratio.max:.3g})" if f.ratio else ""
        reference = f" vs {f.reference.median:,.4g} ({f.reference_name})" if f.reference else ""
        print(f"[{f.section}] {f.name}: {f.value.median:,.4g} {f.unit} ({f.value.min:,.4g}-{f.value.max:,.4g}, "
              f"n={f.value.n}){reference}{ratio}")


def _stop_on_sigterm(signum: int, frame: object) -> None:
    # Python's default SIGTERM ends the process at once; as an exception, the `finally` blocks stop the measured
    # children (bench.proc) and keep their logs.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(args_list)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    mode = MODES[args.mode]
    mode = replace(mode, repeats=args.repeats or mode.repeats, spark_repeats=args.spark_repeats or mode.spark_repeats,
                   train=replace(mode.train, repeats=args.train_repeats or mode.train.repeats))
    selected = args.only or list(NAMES)
    started = datetime.now(timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    load_start = load_average()
    work_dir = CACHE_DIR / "work" / stamp
    log.info("bench %s (%s): %s; load %s", mode.name, ", ".join(selected), _plan(mode, selected), load_start)
    runner = Runner(mode, selected, work_dir)
    clock = time.monotonic()
    monitor, other = LoadMonitor(), OtherWork()
    try:
        with monitor, other:
            runner.run()
    finally:
        logs = work_dir / "logs"
        if logs.is_dir():
            shutil.copytree(logs, CACHE_DIR / "logs" / stamp, dirs_exist_ok=True)
            log.info("child logs kept in %s", CACHE_DIR / "logs" / stamp)
        if not args.keep_work:
            shutil.rmtree(work_dir, ignore_errors=True)
    results_path = RESULTS_DIR / f"{stamp}.json"
    load_end = load_average()
    results = {
        "command": ".venv/bin/python -m bench.run" + (" " + shlex.join(args_list) if args_list else ""),
        "mode": mode.name, "only": args.only, "started_utc": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - clock, 1), "cpu_seconds": round(cpu_seconds(), 1),
        "results_path": str(results_path.relative_to(REPO)),
        "machine": machine_info(), "settings": asdict(mode), "rss_method": RSS_METHOD,
        "load": {"start": load_start, "end": load_end, **monitor.summary(), **other.summary()},
        "stages": runner.stages, "figures": [f.to_dict() for f in runner.figures], "series": runner.series,
        "raw": runner.raw,
    }
    write_text_atomic(results_path, json.dumps(results, indent=1, default=_jsonable))
    page = report.write_docs(json.loads(results_path.read_text()), args.page)
    _print_summary(runner.figures)
    log.info("results %s; page %s; %.1f min", results_path, page, results["seconds"] / 60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
