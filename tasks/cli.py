"""recflow's command line: each pipeline's steps outside Airflow, through the same task functions the DAGs call.

  python -m tasks [--data-root DIR] [-v | --quiet] [--json PATH] PIPELINE COMMAND [options]   (or: recflow ...)

  criteo     demo-data   --days 0-2 [--rows N]     synthetic day_N files into the source folder
             ingest      --day 3 | --days 0-23 [--jobs N]
                                                   download_day -> validate_day -> day_stats, day by day
                                                   (N days at once, each in its own thread)
             preprocess  --train-days 0-1 --test-day 2 [--out DIR | --run-id ID] [--engine spark|arrow|nvtabular]
                                                   resolve_run -> build_dictionary -> transform_dataset ->
                                                   validate_dataset, into DIR/dictionary and DIR/dataset
  movielens  demo-data | ingest [--dataset ml-1m] | preprocess [--dataset ml-1m]
  outbrain   demo-data | ingest [--snapshot NAME] | features [--snapshot NAME]
  byo        demo-data [--train-rows N] | transcode --spec-uri URI [--run-id ID] [--engine arrow|spark]
                                                   resolve_run -> fetch -> validate -> transcode -> validate_dataset

The global options may also follow the command. Every step is a no-op when its output already carries a manifest
for the same inputs, as in the DAGs: a second run, or a backfill over days already ingested, does only what is
missing. Knobs come from the pipeline's profile (--profile, else RECFLOW_PROFILE) with the options given overriding
them, as a DAG run's params do.

Exit status: 0 on success; 1 with one line on stderr when the input is bad or an upstream step has not run (a data
quality failure, a missing day, a refused source, a failed Spark job: EXPECTED_ERRORS); any other exception is a
bug and shows its traceback. --json PATH writes, atomically and also on failure:
  {"command", "argv", "ok", "error", "data_root", "started_utc", "seconds",
   "steps": [{"step", "start", "end", "seconds", "result", "error"}, ...]}
with each step's result dict (what the DAG task returns to XCom) and its start / end on the monotonic clock
(time.monotonic(): comparable between processes of one Linux machine, e.g. with a memory sampler's timestamps).

Nothing here imports Airflow (a step that needs a connection, e.g. --aws-conn-id, imports it itself) and the heavy
libraries are imported by the steps that use them, so `--help` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.settings_registry import read

log = logging.getLogger("recflow.cli")

# Errors that mean bad input or a step run out of order, not a bug: reported in one line, exit status 1. Looked up
# only in modules already imported (an error can only come from a module that ran), so none is imported for this.
EXPECTED_ERRORS: tuple[tuple[str, str], ...] = (
    ("builtins", "ValueError"),  # bad options and bad data: DataQualityError, DatasetInvalid, ProfileError, ...
    ("tasks.core.config", "NotAllowed"),
    ("tasks.core.download_sources", "DownloadError"),
    ("tasks.core.storage", "PartitionLockTimeout"),
    ("tasks.core.spark_submit", "SparkJobFailed"),  # the job's own output, above the error line, says why
    ("tasks.release.runs", "SnapshotMissing"),
    ("tasks.criteo.ingest", "StepInputMissing"),
    ("tasks.movielens.ingest", "StepInputMissing"),
    ("tasks.outbrain.ingest", "StepInputMissing"),
    ("tasks.outbrain.features", "StepInputMissing"),
    ("tasks.byo.pipeline", "StepInputMissing"),
)
# tasks.criteo.settings.DAY_STATS_ENGINES where that exists; the option is passed on only when given, so the command
# line also works with a day_stats that has no engine argument.
DAY_STATS_ENGINES = ("arrow", "spark")


@dataclass
class StepRecord:
    step: str
    start: float
    end: float
    result: Any = None
    error: str | None = None  # the failed step's one line; its result is then None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "start": self.start, "end": self.end,
                "seconds": round(self.end - self.start, 3), "result": self.result, "error": self.error}


@dataclass
class Steps:
    """Runs a command's steps in order, logging and timing each; its records are what --json writes."""

    records: list[StepRecord] = field(default_factory=list)

    def run(self, step: str, fn: Callable[..., Any], *args: Any, label: str = "", **kwargs: Any) -> Any:
        shown = f"{step} {label}".strip()
        log.info("%s ...", shown)
        start = time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except Exception as error:
            self.records.append(StepRecord(step, start, time.monotonic(), error=one_line(error)))
            raise
        end = time.monotonic()
        self.records.append(StepRecord(step, start, end, result))
        cached = isinstance(result, dict) and result.get("cached")
        log.info("%s done in %.1f s%s", shown, end - start, " (cached: nothing to do)" if cached else "")
        return result


# ---- argument types --------------------------------------------------------------------------------------------

def day_list(text: str) -> list[int]:
    """'3' -> [3]; '0-2,5' -> [0, 1, 2, 5]: the criteo_dlrm train_days param's syntax (tasks.criteo.dlrm)."""
    from tasks.criteo.window import parse_days

    try:
        return parse_days(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a day (3), a range (0-23) or a list (0-1,5), "
                                         "ranges ascending") from None


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction between 0 and 1")
    return value


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return int(text)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return int(text)


# ---- options every pipeline shares --------------------------------------------------------------------------

def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes. On the commands their default is SUPPRESS, so one given before the
    command is not reset by the command's parser."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--data-root", type=Path, default=default(None), metavar="DIR",
                        help="where every output lives (default: RECFLOW_DATA_ROOT, else <repo>/data)")
    parser.add_argument("--json", type=Path, default=default(None), metavar="PATH",
                        help="write the steps' results and timings as JSON to PATH (also on failure)")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", action="store_true", default=default(False),
                          help="debug logging of recflow's own modules")
    loudness.add_argument("-q", "--quiet", action="store_true", default=default(False),
                          help="warnings and errors only")


def _spark_options(parser: argparse.ArgumentParser) -> None:
    from tasks.core.spark_submit import PROFILES

    parser.add_argument("--spark-master", default="local[*]",
                        help="Spark master (default local[*]; the DAGs read the spark_default connection)")
    parser.add_argument("--spark-profile", choices=PROFILES, default=None,
                        help="Spark conf profile (default: RECFLOW_SPARK_PROFILE, else local)")


def _source_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--source", default=None, metavar="URL",
                        help=f"{what} (file://, http(s)://, s3://); default: the configured source")
    parser.add_argument("--bad-row-budget", type=fraction, default=None,
                        help="fraction of bad rows quarantined before failing (default: RECFLOW_BAD_ROW_BUDGET)")
    parser.add_argument("--aws-conn-id", default=None,
                        help="Airflow connection with S3 credentials (default: boto3's own chain)")


def _profile_option(parser: argparse.ArgumentParser, profiles: Mapping[str, Any]) -> None:
    parser.add_argument("--profile", choices=sorted(profiles), default=None,
                        help="knob profile (default: RECFLOW_PROFILE, else full); the options below override it")


def _commands(pipelines: argparse._SubParsersAction, pipeline: str, commands: dict[str, tuple[Callable, str]]
             ) -> dict[str, argparse.ArgumentParser]:
    parser = pipelines.add_parser(pipeline, help=f"{pipeline} steps")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    made = {}
    for name, (handler, help_text) in commands.items():
        made[name] = sub.add_parser(name, help=help_text, description=help_text)
        made[name].set_defaults(handler=handler, pipeline=pipeline)
        _global_options(made[name], defaults=False)
    return made


# ---- criteo -------------------------------------------------------------------------------------------------------

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
    # interpreter + pyarrow + pandas each). A Spark day_stats step runs in the command's own thread, one day at a time, as each
    # day's validation finishes: a local Spark JVM takes every core itself, so N of them at once would fight over
    # the cores (issue #27).
    from concurrent.futures import ThreadPoolExecutor

    spark_here = engine == "spark"
    log.info("ingesting %d days in %d threads%s", len(days), jobs,
             "; day_stats by Spark one day at a time in the main thread" if spark_here else "")
    with ThreadPoolExecutor(jobs, thread_name_prefix="ingest-day") as pool:
        futures = [pool.submit(_ingest_day_records, args, settings, day, not spark_here) for day in days]
        failed = None
        for day, future in zip(days, futures):  # in day order: the report lists each day's steps together
            try:
                steps.records += future.result()
                if spark_here and failed is None:
                    _day_stats_step(args, settings, day, steps)
            except Exception as error:  # the day's records travel on the error (see _ingest_day_records)
                steps.records += getattr(error, "recflow_records", [])
                failed = failed or error
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


def add_criteo_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.criteo.profiles import PROFILES

    commands = _commands(pipelines, "criteo", {
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
    _source_options(p, "source of the day file, {day} replaced by the day")
    p.add_argument("--expected-sha256", default=None, help="checksum of the source file (one day only)")
    p.add_argument("--day-stats-engine", choices=DAY_STATS_ENGINES, default=None,
                   help="how day stats are computed (default: RECFLOW_CRITEO_DAY_STATS_ENGINE, else arrow with a "
                        "local --spark-master, spark with a cluster one; arrow: in validation's pass; spark: a "
                        "spark-submit per day, one at a time with --jobs)")
    p.add_argument("--jobs", type=positive, default=1,
                   help="days ingested at once, each in its own thread (default 1; the machine's cores is the "
                        "useful most)")
    _spark_options(p)
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
    _profile_option(p, PROFILES)
    p.add_argument("--frequency-threshold", type=non_negative, default=None)
    p.add_argument("--threshold-overrides", default=None, help="per-column thresholds, e.g. cat_3:2,cat_7:0")
    p.add_argument("--dictionary-days", choices=("train", "all"), default=None)
    p.add_argument("--seed", type=non_negative, default=None, help="seed of the train rows' shuffle")
    p.add_argument("--engine", choices=("spark", "arrow", "nvtabular"), default=None,
                   help="who builds the dictionary and the dataset (default: RECFLOW_CRITEO_PREPROCESS_ENGINE, else "
                        "arrow with a local --spark-master and Spark profile, spark with a cluster one; arrow: "
                        "pyarrow + numpy in this process; nvtabular: NVIDIA's NVTabular workflow in "
                        ".venv-nvtabular, `make nvt-env`; same output)")
    _spark_options(p)


# ---- movielens ------------------------------------------------------------------------------------------------

def movielens_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens import layout
    from tasks.movielens.settings import load_movielens_settings
    from tasks.movielens.synthetic import ensure_archive

    name = args.dataset or load_movielens_settings().dataset
    out = args.out or layout.source_dir(settings.data_root)
    steps.run("write_archive", lambda: {"path": str(ensure_archive(
        out, name, users=args.users, items=args.items, ratings_per_user=args.ratings_per_user, seed=args.seed))})


def movielens_ingest(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens.ingest import download_snapshot, validate_snapshot
    from tasks.movielens.settings import load_movielens_settings

    name = args.dataset or load_movielens_settings().dataset
    steps.run("download_snapshot", download_snapshot, settings, name, source=args.source,
              aws_conn_id=args.aws_conn_id, label=name)
    steps.run("validate_snapshot", validate_snapshot, settings, name, bad_row_budget=args.bad_row_budget,
              label=name)


def movielens_preprocess(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens import ncf

    params = {"profile": args.profile, "dataset": args.dataset, "min_ratings": args.min_ratings,
              "test_negatives": args.test_negatives, "seed": args.seed}
    run = steps.run("resolve_run", ncf.resolve_run, settings, params)
    steps.run("preprocess", ncf.preprocess, settings, run, spark_master=args.spark_master)
    steps.run("validate_dataset", ncf.validate_dataset, settings, run)


def add_movielens_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.movielens.profiles import PROFILES
    from tasks.movielens.schema import DATASETS

    commands = _commands(pipelines, "movielens", {
        "demo-data": (movielens_demo_data, "write a synthetic MovieLens archive (default: into the source folder)"),
        "ingest": (movielens_ingest, "download and validate a MovieLens snapshot"),
        "preprocess": (movielens_preprocess, "NCF leave-one-out dataset of a validated snapshot, and its check"),
    })
    for p in commands.values():
        p.add_argument("--dataset", choices=DATASETS, default=None,
                       help="snapshot (default: RECFLOW_MOVIELENS_DATASET, else ml-20m)")
    p = commands["demo-data"]
    p.add_argument("--users", type=positive, default=3000)
    p.add_argument("--items", type=positive, default=1000)
    p.add_argument("--ratings-per-user", type=positive, default=40)
    p.add_argument("--seed", type=non_negative, default=7)
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder (default: <data root>/movielens/source)")
    _source_options(commands["ingest"], "URL of the archive, {name} replaced by the snapshot")
    p = commands["preprocess"]
    _profile_option(p, PROFILES)
    p.add_argument("--min-ratings", type=non_negative, default=None)
    p.add_argument("--test-negatives", type=positive, default=None)
    p.add_argument("--seed", type=non_negative, default=None)
    _spark_options(p)


# ---- outbrain -------------------------------------------------------------------------------------------------

def outbrain_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain import layout
    from tasks.outbrain.synthetic import write_snapshot

    out = args.out or layout.source_dir(settings.data_root)
    steps.run("write_snapshot", write_snapshot, out, displays=args.displays, seed=args.seed)


def outbrain_ingest(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain.ingest import download_snapshot, validate_snapshot
    from tasks.outbrain.settings import load_outbrain_settings

    name = args.snapshot or load_outbrain_settings().snapshot
    steps.run("download_snapshot", download_snapshot, settings, name, source=args.source,
              aws_conn_id=args.aws_conn_id, label=name)
    steps.run("validate_snapshot", validate_snapshot, settings, name, bad_row_budget=args.bad_row_budget,
              label=name)


def outbrain_features(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain import wide_deep

    params = {"profile": args.profile, "snapshot": args.snapshot, "split_seed": args.split_seed,
              "prebatch_size": args.prebatch_size, "tfrecord_shards": args.tfrecord_shards,
              "engine": args.engine}
    run = steps.run("resolve_run", wide_deep.resolve_run, settings, params)
    steps.run("build_features", wide_deep.build_features, settings, run, spark_master=args.spark_master)
    steps.run("validate_dataset", wide_deep.validate_dataset, settings, run)


def add_outbrain_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.outbrain.profiles import PROFILES

    commands = _commands(pipelines, "outbrain", {
        "demo-data": (outbrain_demo_data, "write a synthetic Outbrain snapshot (default: into the source folder)"),
        "ingest": (outbrain_ingest, "download and validate an Outbrain snapshot"),
        "features": (outbrain_features, "Wide & Deep features (parquet + TFRecords) of a validated snapshot"),
    })
    p = commands["demo-data"]
    p.add_argument("--displays", type=positive, default=20_000)
    p.add_argument("--seed", type=non_negative, default=11)
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder (default: <data root>/outbrain/source)")
    for name in ("ingest", "features"):
        commands[name].add_argument("--snapshot", default=None,
                                    help="snapshot name (default: RECFLOW_OUTBRAIN_SNAPSHOT, else kaggle)")
    _source_options(commands["ingest"], "URL template of the files, with {file}")
    p = commands["features"]
    _profile_option(p, PROFILES)
    p.add_argument("--split-seed", type=non_negative, default=None)
    p.add_argument("--prebatch-size", type=positive, default=None)
    p.add_argument("--tfrecord-shards", type=positive, default=None)
    p.add_argument("--engine", choices=("spark", "nvtabular"), default=None,
                   help="features engine (default: RECFLOW_OUTBRAIN_FEATURES_ENGINE, else spark; nvtabular: NVIDIA's "
                        "NVTabular workflow in .venv-nvtabular)")
    _spark_options(p)


# ---- byo ------------------------------------------------------------------------------------------------------------

def byo_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.byo.demo import source_dir, write_demo_source

    out = args.out or source_dir(settings.data_root)
    steps.run("write_source", lambda: {"spec": str(write_demo_source(out, args.train_rows, args.test_rows,
                                                                     args.seed))})


def byo_transcode(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.byo import pipeline

    params = {"profile": args.profile, "spec_uri": args.spec_uri, "data_uri": args.data_uri}
    run = steps.run("resolve_run", pipeline.resolve_run, settings, params)
    run_id = args.run_id or "cli__transcode"
    fetched = steps.run("fetch", pipeline.fetch_sources, settings, run_id, run, aws_conn_id=args.aws_conn_id)
    steps.run("validate", pipeline.validate, settings, run_id, fetched)
    steps.run("transcode", pipeline.transcode, settings, run_id, spark_master=args.spark_master,
              spark_profile=args.spark_profile, engine=args.engine)
    steps.run("validate_dataset", pipeline.validate_dataset, pipeline.run_paths(settings, run_id).dataset)


def add_byo_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.byo.pipeline import SPEC_URI_ENV, TRANSCODE_ENGINES
    from tasks.byo.profiles import PROFILES

    commands = _commands(pipelines, "byo", {
        "demo-data": (byo_demo_data, "write a CSV FeatureSpec and generated CSV files (default: into the source "
                                     "folder)"),
        "transcode": (byo_transcode, "fetch, validate and transcode a CSV FeatureSpec's files to split-binary, and "
                                     "check the dataset"),
    })
    p = commands["demo-data"]
    p.add_argument("--train-rows", type=positive, default=40_000)
    p.add_argument("--test-rows", type=positive, default=10_000)
    p.add_argument("--seed", type=non_negative, default=3)
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="folder (default: <data root>/byo/source)")
    p = commands["transcode"]
    p.add_argument("--spec-uri", default=None, metavar="URI",
                   help=f"the CSV FeatureSpec yaml: file://, http(s):// or s3:// (default: {SPEC_URI_ENV})")
    p.add_argument("--data-uri", default=None, metavar="URI",
                   help="folder the spec's relative file paths are resolved against (default: the spec's own)")
    p.add_argument("--run-id", default=None,
                   help="write into this byo_dlrm run's folder, <data root>/runs/byo_dlrm/<run id> "
                        "(default: cli__transcode)")
    p.add_argument("--aws-conn-id", default=None,
                   help="Airflow connection with S3 credentials (default: boto3's own chain)")
    p.add_argument("--engine", choices=TRANSCODE_ENGINES, default=None,
                   help="arrow: in this process; spark: spark-submit (default: RECFLOW_BYO_TRANSCODE_ENGINE, else "
                        "arrow with a local --spark-master, spark with a cluster one; same bytes)")
    _profile_option(p, PROFILES)
    _spark_options(p)


# ---- the command line ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recflow", description=__doc__.split("\n\n")[0].split("\n")[0],
                                     epilog="Examples and what --json writes: README.md, 'Command line'. "
                                            "'recflow settings' lists the deployment's RECFLOW_* settings.")
    _global_options(parser, defaults=True)
    pipelines = parser.add_subparsers(dest="pipeline", required=True, metavar="PIPELINE")
    for add_commands in (add_criteo_commands, add_movielens_commands, add_outbrain_commands, add_byo_commands):
        add_commands(pipelines)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


# ---- running a command ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def logging_to_stderr(verbose: bool, quiet: bool) -> Iterator[None]:
    """Progress lines to stderr while a command runs (stdout stays free for a caller); -v adds recflow's debug
    lines, -q keeps warnings and errors. Undone afterwards, so an in-process caller (a test) keeps its own."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    ours = [logging.getLogger(name) for name in ("recflow", "tasks", "spark_jobs", "models")]
    saved = root.level, [logger.level for logger in ours]
    root.addHandler(handler)
    root.setLevel(logging.WARNING if quiet else logging.INFO)
    if verbose:
        for logger in ours:
            logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        for logger, level in zip(ours, saved[1]):
            logger.setLevel(level)


def settings_for(args: argparse.Namespace) -> Settings:
    """The deployment's settings (environment), with --data-root and --spark-profile applied. (The steps' child
    processes, Spark jobs, are handed their paths; none reads the settings itself.)"""
    from tasks.core.config import load_settings

    settings = load_settings()
    if args.data_root is not None:
        settings = replace(settings, data_root=args.data_root.expanduser().resolve())
    if getattr(args, "spark_profile", None):
        settings = replace(settings, spark_profile=args.spark_profile)
    return settings


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def is_expected(error: BaseException) -> bool:
    kinds = tuple(getattr(sys.modules[module], name) for module, name in EXPECTED_ERRORS if module in sys.modules)
    return isinstance(error, kinds)


def write_report(path: Path, report: dict[str, Any]) -> None:
    from tasks.core.storage import write_text_atomic

    write_text_atomic(path, json.dumps(report, indent=2, default=str) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["settings"]:  # the deployment's settings, not a pipeline's command
        from tasks.core.settings_registry import main as settings_main

        return settings_main(argv[1:])
    args = parse_args(argv)
    with logging_to_stderr(args.verbose, args.quiet):
        return run_command(args, argv)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the parsed command's steps; the exit status (see the module docstring)."""
    command = f"{args.pipeline} {args.command}"
    steps = Steps()
    report: dict[str, Any] = {"command": command, "argv": argv, "ok": False, "error": None, "data_root": None,
                              "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    started = time.monotonic()
    try:
        if getattr(args, "profile", None) and not read("RECFLOW_PROFILE"):
            # A command line is the operator's, not a trigger form's: its --profile is the deployment's profile for
            # this run, so a `--profile demo` run gates at the demo's release thresholds (tasks.core.profiles lets a
            # form only tighten the deployment's; the operator sets the deployment).
            os.environ["RECFLOW_PROFILE"] = args.profile
        settings = settings_for(args)
        report["data_root"] = str(settings.data_root)
        log.info("recflow %s (data root %s)", command, settings.data_root)
        args.handler(args, settings, steps)
        report["ok"] = True
    except Exception as error:
        report["error"] = one_line(error)
        if not is_expected(error):
            raise  # a bug: the traceback is what its reader needs
        print(f"recflow {command}: {report['error']}", file=sys.stderr, flush=True)
        return 1
    finally:
        report["seconds"] = round(time.monotonic() - started, 3)
        report["steps"] = [record.to_json() for record in steps.records]
        if args.json is not None:
            write_report(args.json, report)
    log.info("recflow %s finished in %.1f s (%d steps)", command, report["seconds"], len(steps.records))
    return 0
