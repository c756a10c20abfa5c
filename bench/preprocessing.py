"""Figure 2, preprocessing: dictionary + transform + split-binary writing rows/s against the same parse floor.

A preprocessing run is recflow's command line, `python -m tasks criteo preprocess` (resolve_run, then
build_dictionary and transform_dataset from tasks.criteo.preprocess: two spark-submits, then validate_dataset) over a
window of N train days plus one test day, reading the day_stats outputs of the first ingest pass, in a child process
whose tree the parent samples for memory. The figures take the dictionary and transform steps from the command's
--json report: their seconds, and the peak memory between the dictionary's start and the transform's end (the
dataset check after them is not part of the figure). Knobs are the `full` profile's (frequency threshold 15, the
train days' dictionary, seed 12345) on the `local` Spark profile, whatever the environment says. Rows/s counts
every input row (train days and test day: all of them are transformed and written). Each window runs
mode.spark_repeats times, each time into a fresh output dir.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, Mode, Stat, log, ratio_of
from bench.ingest import IngestData
from bench.proc import ChildRun, run_child

SECTION = "2 preprocessing"


@dataclass
class PreprocessRun:
    window: int  # train days
    rows: int    # all rows written (train + test + validation)
    dictionary_seconds: float
    transform_seconds: float
    peak_rss: int
    child: ChildRun

    @property
    def seconds(self) -> float:
        return self.dictionary_seconds + self.transform_seconds


@dataclass
class PreprocessData:
    runs: list[PreprocessRun] = field(default_factory=list)

    def window(self, days: int) -> list[PreprocessRun]:
        return [r for r in self.runs if r.window == days]

    def to_raw(self) -> dict[str, Any]:
        return {"runs": [{"window": r.window, "rows": r.rows, "dictionary_seconds": r.dictionary_seconds,
                          "transform_seconds": r.transform_seconds, "peak_rss": r.peak_rss,
                          "baseline_rss": r.child.samples[0][1] if r.child.samples else 0,
                          "peak_breakdown": r.child.peak_breakdown, "log": str(r.child.log_path)}
                         for r in self.runs]}


def preprocess_args(data_root: Path, train_days: int, test_day: int, out_dir: Path, report_path: Path) -> list[str]:
    """The command line (after `python -m tasks`) of one preprocessing run: days 0..train_days-1 + test_day."""
    return ["--data-root", str(data_root), "--json", str(report_path), "criteo", "preprocess",
            "--train-days", f"0-{train_days - 1}", "--test-day", str(test_day), "--out", str(out_dir),
            "--profile", "full", "--spark-profile", "local"]


def measured_steps(report: dict[str, Any], out_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The build_dictionary and transform_dataset records of a `criteo preprocess --json` report; SystemExit if
    either was cached (a cached step measures nothing) or missing."""
    steps = {record["step"]: record for record in report["steps"]}
    missing = {"build_dictionary", "transform_dataset"} - set(steps)
    if missing or not report["ok"]:
        raise SystemExit(f"{out_dir}: preprocessing report without {sorted(missing)} (error: {report['error']})")
    dictionary, transform = steps["build_dictionary"], steps["transform_dataset"]
    if dictionary["result"]["cached"] or transform["result"]["cached"]:
        raise SystemExit(f"{out_dir}: a preprocessing step was cached; the benchmark needs a fresh output dir")
    return dictionary, transform


def run_window(data_root: Path, train_days: int, test_day: int, repeat: int, work_dir: Path) -> PreprocessRun:
    out_dir = work_dir / f"preprocess-{train_days}d-{repeat}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    report_path = work_dir / f"preprocess-{train_days}d-{repeat}.json"
    argv = [sys.executable, "-m", "tasks", *preprocess_args(data_root, train_days, test_day, out_dir, report_path)]
    log_path = work_dir / "logs" / f"preprocess-{train_days}d-{repeat}.log"
    log.info("preprocessing %d train day(s) + test day %d, run %d (log %s)", train_days, test_day, repeat + 1,
             log_path)
    child = run_child(argv, log_path, cwd=REPO)
    dictionary, transform = measured_steps(json.loads(report_path.read_text()), out_dir)
    run = PreprocessRun(window=train_days, rows=sum(transform["result"]["rows"].values()),
                        dictionary_seconds=dictionary["end"] - dictionary["start"],
                        transform_seconds=transform["end"] - transform["start"],
                        peak_rss=child.peak_rss(dictionary["start"], transform["end"]), child=child)
    log.info("  %d rows: dictionary %.1f s, transform %.1f s, peak RSS %.0f MB", run.rows, run.dictionary_seconds,
             run.transform_seconds, run.peak_rss / 1e6)
    shutil.rmtree(out_dir)  # the dataset is not reused; keep the disk free for the next window
    return run


def measure(mode: Mode, ingest: IngestData, work_dir: Path) -> PreprocessData:
    """Every window of mode.scaling_days, mode.spark_repeats times, round-robin (load drift hits every window)."""
    data = PreprocessData()
    data_root = ingest.passes[0].data_root
    test_day = mode.pass_days[-1]
    for repeat in range(mode.spark_repeats):
        for days in mode.scaling_days:
            data.runs.append(run_window(data_root, days, test_day, repeat, work_dir))
    return data


def figures(data: PreprocessData, ingest: IngestData, mode: Mode) -> list[Figure]:
    floor = ingest.floor()
    rows = []
    for days in mode.scaling_days:
        runs = data.window(days)
        rate = Stat.of([r.rows / r.seconds for r in runs])
        dictionary = Stat.of([r.dictionary_seconds for r in runs])
        transform = Stat.of([r.transform_seconds for r in runs])
        rows.append(Figure(SECTION, f"dictionary + transform, {days} train day(s) + test day ({runs[0].rows:,} rows)",
                           "rows/s", rate, "pyarrow read_csv of the same days, all cores", floor,
                           ratio_of(rate, floor), "medians",
                           note=f"dictionary {dictionary.median:.1f} s + transform {transform.median:.1f} s"))
    return rows
