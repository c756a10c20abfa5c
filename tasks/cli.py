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
import importlib
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
from tasks.pipelines import COMMANDS

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
)  # plus each pipeline's own (its command module's EXPECTED_ERRORS)


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


def spark_options(parser: argparse.ArgumentParser) -> None:
    from tasks.core.spark_submit import PROFILES

    parser.add_argument("--spark-master", default="local[*]",
                        help="Spark master (default local[*]; the DAGs read the spark_default connection)")
    parser.add_argument("--spark-profile", choices=PROFILES, default=None,
                        help="Spark conf profile (default: RECFLOW_SPARK_PROFILE, else local)")


def source_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--source", default=None, metavar="URL",
                        help=f"{what} (file://, http(s)://, s3://); default: the configured source")
    parser.add_argument("--bad-row-budget", type=fraction, default=None,
                        help="fraction of bad rows quarantined before failing (default: RECFLOW_BAD_ROW_BUDGET)")
    parser.add_argument("--aws-conn-id", default=None,
                        help="Airflow connection with S3 credentials (default: boto3's own chain)")


def profile_option(parser: argparse.ArgumentParser, profiles: Mapping[str, Any]) -> None:
    parser.add_argument("--profile", choices=sorted(profiles), default=None,
                        help="knob profile (default: RECFLOW_PROFILE, else full); the options below override it")


def ingest_snapshot(args: argparse.Namespace, settings: Settings, steps: Steps, name: str,
                    download: Callable[..., Any], validate: Callable[..., Any]) -> None:
    """A snapshot's download then its validation, as a snapshot pipeline's ingest DAG runs them (with the options of
    `source_options`)."""
    steps.run("download_snapshot", download, settings, name, source=args.source, aws_conn_id=args.aws_conn_id,
              label=name)
    steps.run("validate_snapshot", validate, settings, name, bad_row_budget=args.bad_row_budget, label=name)


def pipeline_commands(pipelines: argparse._SubParsersAction, pipeline: str,
                      commands: dict[str, tuple[Callable, str]]) -> dict[str, argparse.ArgumentParser]:
    """A pipeline's sub-command parsers: {command: parser}, each running its handler(args, settings, steps)."""
    parser = pipelines.add_parser(pipeline, help=f"{pipeline} steps")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    made = {}
    for name, (handler, help_text) in commands.items():
        made[name] = sub.add_parser(name, help=help_text, description=help_text)
        made[name].set_defaults(handler=handler, pipeline=pipeline)
        _global_options(made[name], defaults=False)
    return made


# ---- the command line ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recflow", description=__doc__.split("\n\n")[0].split("\n")[0],
                                     epilog="Examples and what --json writes: README.md, 'Command line'. "
                                            "'recflow settings' lists the deployment's RECFLOW_* settings.")
    _global_options(parser, defaults=True)
    pipelines = parser.add_subparsers(dest="pipeline", required=True, metavar="PIPELINE")
    for module in COMMANDS.values():  # each pipeline's commands, from its dataset package (tasks/pipelines.py)
        importlib.import_module(module).add_commands(pipelines)
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
    known = [*EXPECTED_ERRORS, *(pair for module in COMMANDS.values() if module in sys.modules
                                 for pair in sys.modules[module].EXPECTED_ERRORS)]
    kinds = tuple(getattr(sys.modules[module], name) for module, name in known if module in sys.modules)
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
