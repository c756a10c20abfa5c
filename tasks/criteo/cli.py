"""`recflow criteo ...`: demo-data, ingest (download_day -> validate_day -> day_stats, N days in threads) and
preprocess (resolve_run -> build_dictionary -> transform_dataset -> validate_dataset), through the DAGs' task
functions. Registered in tasks/pipelines.py (COMMANDS); tasks/cli.py holds what every pipeline's commands share."""

from __future__ import annotations

import argparse
import inspect
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.cli import (StepRecord, Steps, non_negative, pipeline_commands, positive, profile_option, source_options,
                       spark_options)
from tasks.core.config import Settings

log = logging.getLogger("recflow.cli")

# Errors of this pipeline's steps that mean a step ran out of order (exit status 1, one line), as tasks.cli's.
EXPECTED_ERRORS: tuple[tuple[str, str], ...] = (("tasks.criteo.ingest", "StepInputMissing"),)
# tasks.criteo.settings.DAY_STATS_ENGINES where that exists; the option is passed on only when given, so the command
# line also works with a day_stats that has no engine argument.
DAY_STATS_ENGINES = ("arrow", "spark")


def day_list(text: str) -> list[int]:
    """'3' -> [3]; '0-2,5' -> [0, 1, 2, 5]: the criteo_dlrm train_days param's syntax (tasks.criteo.dlrm)."""
    from tasks.criteo.window import parse_days

    try:
        return parse_days(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a day (3), a range (0-23) or a list (0-1,5), "
                                         "ranges ascending") from None


def criteo_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.criteo import layout
    from tasks.criteo.synthetic import ensure_days

    out = args.out or layout.source_dir(settings.data_root)
    steps.run("write_days", lambda: {"path": str(ensure_days(out, args.days, args.rows, args.seed)),
                                     "days": args.days, "rows": args.rows, "seed": args.seed})


def criteo_ingest(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.criteo.ingest import day_stats, day_stats_engine

    days = [args.day] if args.day is not None else args.days
    if args.source and len(days) > 1 and "{day}" not in args.source:
        raise ValueError(f"--source {args.source!r} names one file but {len(days)} days are ingested: "
                         "put {day} where the day number goes")
    if args.expected_sha256 and len(days) > 1:
        raise ValueError("--expected-sha256 checks one file: ingest one day with it")
    if args.day_stats_engine is not None and not _engine_kwargs(args, day_stats):
        raise ValueError("--day-stats-engine: this version's day_stats has no engine choice (it always runs Spark)")
    # One choice for every day (logged once, with its reason): each worker gets it as an explicit engine.
    engine = day_stats_engine(args.day_stats_engine, args.spark_master, settings.spark_profile)
    args = argparse.Namespace(**{**vars(args), "day_stats_engine": engine})
    jobs = min(args.jobs, len(days))
    if jobs <= 1:
        for day in days:
            _ingest_day(args, settings, day, steps)
        return
    # Days in parallel, each in its own thread of this process (a day's steps stay in order; days are independent,
    # as the DAG's runs are). Threads, not processes: a day's work is pyarrow's parse and numpy's checks, which
    # release the GIL, so N days keep N cores busy; what does not is Great Expectations, whose import (~4-6 s of
    # CPU, issue #27) a process per worker paid once each and the threads pay once, and the process start-ups (an
    # interpreter + pyarrow + pandas each). A Spark day_stats step runs in the command's own thread, one day at a
    # time, as each day's validation finishes: a local Spark JVM takes every core itself, so N of them at once
    # would fight over the cores (issue #27).
    from concurrent.futures import ThreadPoolExecutor

    # A day holds one of `jobs` slots while its rows are read and checked, and gives it back once it only waits for
    # Great Expectations' report (releasing_while_gx_runs): the next day starts on the cores meanwhile. Memory stays
    # that of `jobs` days' rows; up to `jobs` more threads wait for their reports.
    spark_here = engine == "spark"
    log.info("ingesting %d days, %d at a time%s", len(days), jobs,
             "; day_stats by Spark one day at a time in the main thread" if spark_here else "")
    slots, stop = threading.Semaphore(jobs), threading.Event()
    with ThreadPoolExecutor(min(len(days), 2 * jobs), thread_name_prefix="ingest-day") as pool:
        futures = [pool.submit(_ingest_day_in_slot, slots, stop, args, settings, day, not spark_here)
                   for day in days]
        failed = None
        for day, future in zip(days, futures):  # in day order: the report lists each day's steps together
            try:
                steps.records += future.result()
                if spark_here and failed is None:
                    _day_stats_step(args, settings, day, steps)
            except Exception as error:  # the day's records travel on the error (see _ingest_day_records)
                steps.records += getattr(error, "recflow_records", [])
                failed = failed or error
                stop.set()  # days not started yet do not start
                for other in futures:
                    other.cancel()
        if failed is not None:
            raise failed


def _engine_kwargs(args: argparse.Namespace, step: Callable[..., Any]) -> dict[str, str]:
    """--day-stats-engine for a step that takes one (validate_day writes the stats with the arrow engine)."""
    takes = args.day_stats_engine is not None and "engine" in inspect.signature(step).parameters
    return {"engine": args.day_stats_engine} if takes else {}


def _ingest_day(args: argparse.Namespace, settings: Settings, day: int, steps: Steps,
                with_day_stats: bool = True) -> None:
    from tasks.criteo.ingest import download_day, validate_day

    source = args.source.replace("{day}", str(day)) if args.source else None
    steps.run("download_day", download_day, settings, day, source=source,
              expected_sha256=args.expected_sha256, aws_conn_id=args.aws_conn_id, label=f"day {day}")
    steps.run("validate_day", validate_day, settings, day, bad_row_budget=args.bad_row_budget,
              label=f"day {day}", **_engine_kwargs(args, validate_day))
    if with_day_stats:
        _day_stats_step(args, settings, day, steps)


def _day_stats_step(args: argparse.Namespace, settings: Settings, day: int, steps: Steps) -> None:
    from tasks.criteo.ingest import day_stats

    steps.run("day_stats", day_stats, settings, day, spark_master=args.spark_master, label=f"day {day}",
              **_engine_kwargs(args, day_stats))


def _ingest_day_in_slot(slots: threading.Semaphore, stop: threading.Event, args: argparse.Namespace,
                        settings: Settings, day: int, with_day_stats: bool) -> list[StepRecord]:
    """_ingest_day_records once a slot is free (not at all once `stop` is set: an earlier day failed); the slot is
    given back when the day waits for its GX report."""
    from concurrent.futures import CancelledError

    from tasks.core.validation import releasing_while_gx_runs

    slots.acquire()
    if stop.is_set():
        slots.release()
        raise CancelledError(f"day {day} not started: an earlier day failed")
    once = threading.Lock()  # taken by the first release: the slot goes back exactly once

    def release() -> None:
        if once.acquire(blocking=False):
            slots.release()

    try:
        with releasing_while_gx_runs(release):
            return _ingest_day_records(args, settings, day, with_day_stats)
    finally:
        release()


def _ingest_day_records(args: argparse.Namespace, settings: Settings, day: int,
                        with_day_stats: bool = True) -> list[StepRecord]:
    """One day's steps in a worker thread; its step records, also attached to an error."""
    steps = Steps()
    try:
        _ingest_day(args, settings, day, steps, with_day_stats)
    except Exception as error:
        error.recflow_records = steps.records
        raise
    return steps.records


def criteo_preprocess(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.criteo import dlrm, preprocess
    from tasks.criteo.contract import parse_threshold_overrides
    from tasks.criteo.retrain import days_text

    params = {"profile": args.profile, "test_day": args.test_day,
              "train_days": ",".join(map(str, args.train_days)) if args.train_days else None,
              "frequency_threshold": args.frequency_threshold, "threshold_overrides": args.threshold_overrides,
              "dictionary_days": args.dictionary_days, "seed": args.seed}
    run = steps.run("resolve_run", dlrm.resolve_run, settings, {**params, "engine": args.engine},
                    spark_master=args.spark_master)
    engine = {"engine": run["engine"]}  # resolve_run's choice (asked for, else the setting, else by Spark master)
    knobs, train_days, test_day = run["knobs"], run["train_days"], run["test_day"]
    if args.out:
        paths = dlrm.RunPaths(args.out.expanduser().resolve())
    else:
        paths = dlrm.run_paths(settings, args.run_id or f"cli__test_{test_day}__train_{days_text(train_days)}")
    steps.run("build_dictionary", preprocess.build_dictionary, settings, paths.dictionary, train_days, test_day,
              frequency_threshold=knobs["frequency_threshold"],
              threshold_overrides=parse_threshold_overrides(knobs["threshold_overrides"]),
              dictionary_days=knobs["dictionary_days"], spark_master=args.spark_master, **engine)
    steps.run("transform_dataset", preprocess.transform_dataset, settings, paths.dataset, paths.dictionary,
              train_days, test_day, seed=knobs["seed"], spark_master=args.spark_master, **engine)
    steps.run("validate_dataset", preprocess.validate_dataset, paths.dataset)


def add_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.criteo.profiles import PROFILES

    commands = pipeline_commands(pipelines, "criteo", {
        "demo-data": (criteo_demo_data, "write synthetic Criteo day files (default: into the source folder)"),
        "ingest": (criteo_ingest, "download, validate and compute day stats of Criteo days"),
        "preprocess": (criteo_preprocess, "dictionary, transform and validation of a train/test window"),
    })
    p = commands["demo-data"]
    p.add_argument("--days", type=day_list, default=[0, 1, 2], help="days to write (default 0-2)")
    p.add_argument("--rows", type=positive, default=100_000, help="rows per day (default 100000)")
    p.add_argument("--seed", type=non_negative, default=1234)
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="folder (default: <data root>/criteo/source)")
    p = commands["ingest"]
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--day", type=non_negative, help="one day")
    which.add_argument("--days", type=day_list, help="days: a range (0-23) or a list (0-1,5)")
    source_options(p, "source of the day file, {day} replaced by the day")
    p.add_argument("--expected-sha256", default=None, help="checksum of the source file (one day only)")
    p.add_argument("--day-stats-engine", choices=DAY_STATS_ENGINES, default=None,
                   help="how day stats are computed (default: RECFLOW_CRITEO_DAY_STATS_ENGINE, else arrow with a "
                        "local --spark-master, spark with a cluster one; arrow: in validation's pass; spark: a "
                        "spark-submit per day, one at a time with --jobs)")
    p.add_argument("--jobs", type=positive, default=1,
                   help="days ingested at once, each in its own thread (default 1; the machine's cores is the "
                        "useful most)")
    spark_options(p)
    p = commands["preprocess"]
    p.add_argument("--test-day", type=non_negative, required=True, help="the held-out day (test + validation)")
    p.add_argument("--train-days", type=day_list, default=None,
                   help="train days, e.g. 0-22 or 0-3,5 (default: the profile's window_days days before the test day)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help="output folder: DIR/dictionary and DIR/dataset (default: "
                            "<data root>/runs/criteo_dlrm/cli__test_<T>__train_<days>)")
    where.add_argument("--run-id", default=None,
                       help="write into this criteo_dlrm run's folder, <data root>/runs/criteo_dlrm/<run id>")
    profile_option(p, PROFILES)
    p.add_argument("--frequency-threshold", type=non_negative, default=None)
    p.add_argument("--threshold-overrides", default=None, help="per-column thresholds, e.g. cat_3:2,cat_7:0")
    p.add_argument("--dictionary-days", choices=("train", "all"), default=None)
    p.add_argument("--seed", type=non_negative, default=None, help="seed of the train rows' shuffle")
    p.add_argument("--engine", choices=("spark", "arrow", "nvtabular"), default=None,
                   help="who builds the dictionary and the dataset (default: RECFLOW_CRITEO_PREPROCESS_ENGINE, else "
                        "arrow with a local --spark-master and Spark profile, spark with a cluster one; arrow: "
                        "pyarrow + numpy in this process; nvtabular: NVIDIA's NVTabular workflow in "
                        ".venv-nvtabular, `make nvt-env`; same output)")
    spark_options(p)
