"""Figure 2, preprocessing: dictionary + transform + split-binary writing rows/s against the same parse floor.

A preprocessing run is build_dictionary then transform_dataset (tasks.criteo.preprocess; two spark-submits) over
a window of N train days plus one test day, reading the day_stats outputs of the first ingest pass, in a child
process whose tree the parent samples for memory. Rows/s counts every input row (train days and test day: all of
them are transformed and written). Each window runs mode.spark_repeats times, each time into a fresh output dir.
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


def run_window(data_root: Path, train_days: int, test_day: int, repeat: int, work_dir: Path) -> PreprocessRun:
    out_dir = work_dir / f"preprocess-{train_days}d-{repeat}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    result_path = out_dir / "run.json"
    argv = [sys.executable, "-m", "bench.worker", "preprocess", "--data-root", str(data_root),
            "--train-days", *map(str, range(train_days)), "--test-day", str(test_day), "--out-dir", str(out_dir),
            "--json", str(result_path)]
    log_path = work_dir / "logs" / f"preprocess-{train_days}d-{repeat}.log"
    log.info("preprocessing %d train day(s) + test day %d, run %d (log %s)", train_days, test_day, repeat + 1,
             log_path)
    child = run_child(argv, log_path, cwd=REPO)
    result = json.loads(result_path.read_text())
    run = PreprocessRun(window=train_days, rows=sum(result["rows"].values()),
                        dictionary_seconds=result["dictionary_seconds"], transform_seconds=result["transform_seconds"],
                        peak_rss=child.peak_rss(result["start"], result["end"]), child=child)
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
