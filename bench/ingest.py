"""Figure 1, ingest: validate_raw and validate + day_stats rows/s against pyarrow's bare parse of the same days.

One ingest pass = the criteo_ingest DAG run once per day over all the pass's days, in a child process
(bench.worker ingest-pass) whose process tree the parent samples for memory. Each day yields one sample of every
ingest and orchestration figure; the same pass gives the ingest scaling windows and the day_stats outputs that the
preprocessing runs read. The parse floor is measured on the same day files right before and right after the pass.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, Mode, Stat, log, ratio_of
from bench.datasets import airflow_env, airflow_home, criteo_days
from bench.floors import parse_seconds
from bench.proc import ChildRun, run_child

SECTION = "1 ingest"


@dataclass
class DayRecord:
    """One day of one pass: Airflow's view (wall, task durations) and the timed functions inside the tasks."""

    day: int
    rows: int
    start: float
    end: float
    wall: float                  # scripts/run_dag.py's wall_seconds (dag.test, excluding DAG parsing)
    durations: dict[str, float]  # task_id -> Airflow task instance duration
    functions: dict[str, float]  # timed function -> seconds

    @property
    def ingest_seconds(self) -> float:
        return self.functions["validate_day"] + self.functions["day_stats"]


@dataclass
class IngestPass:
    data_root: Path
    child: ChildRun
    days: list[DayRecord]


@dataclass
class IngestData:
    passes: list[IngestPass] = field(default_factory=list)
    floor_threads: list[float] = field(default_factory=list)  # rows/s, all cores
    floor_single: list[float] = field(default_factory=list)   # rows/s, one thread
    source_dir: Path | None = None

    @property
    def days(self) -> list[DayRecord]:
        return [day for p in self.passes for day in p.days]

    def floor(self) -> Stat:
        return Stat.of(self.floor_threads)

    def to_raw(self) -> dict[str, Any]:
        return {"floor_rows_per_s_threads": self.floor_threads, "floor_rows_per_s_one_thread": self.floor_single,
                "passes": [{"seconds": p.child.seconds, "log": str(p.child.log_path),
                            "peak_breakdown": p.child.peak_breakdown,
                            "days": [vars(d) for d in p.days]} for p in self.passes]}


def _day_record(raw: dict[str, Any]) -> DayRecord:
    functions: dict[str, float] = {}
    rows = 0
    for call in raw["calls"]:
        functions[call["name"]] = functions.get(call["name"], 0.0) + call["end"] - call["start"]
        if call["name"] == "validate_day":
            rows = int(call["result"]["total"])
    summary = raw["summary"]
    return DayRecord(day=raw["day"], rows=rows, start=raw["start"], end=raw["end"], wall=summary["wall_seconds"],
                     durations={task: info["duration"] for task, info in summary["tasks"].items()},
                     functions=functions)


def _measure_floor(data: IngestData, days: list[int]) -> None:
    for day in days:
        path = data.source_dir / f"day_{day}"
        rows, seconds = parse_seconds(path, threads=True)
        data.floor_threads.append(rows / seconds)
        rows, seconds = parse_seconds(path, threads=False)
        data.floor_single.append(rows / seconds)


def run_pass(index: int, days: list[int], source_dir: Path, work_dir: Path) -> IngestPass:
    root = work_dir / f"ingest-{index}"
    shutil.rmtree(root, ignore_errors=True)
    env = airflow_env(airflow_home(root / "airflow"), root / "data", source_dir)
    out = root / "pass.json"
    argv = [sys.executable, "-m", "bench.worker", "ingest-pass", "--days", *map(str, days), "--json", str(out)]
    log.info("ingest pass %d: criteo_ingest through Airflow for days %s (log %s)", index, days,
             work_dir / "logs" / f"ingest-{index}.log")
    child = run_child(argv, work_dir / "logs" / f"ingest-{index}.log", env=env, cwd=REPO)
    records = [_day_record(day) for day in json.loads(out.read_text())["days"]]
    for record in records:
        log.info("  day %d: %d rows, DAG %.1f s, validate %.1f s, day_stats %.1f s", record.day, record.rows,
                 record.wall, record.functions["validate_day"], record.functions["day_stats"])
    return IngestPass(root / "data", child, records)


def measure(mode: Mode, work_dir: Path) -> IngestData:
    """Run mode.spark_repeats ingest passes, with the parse floor measured before and after them."""
    days = mode.pass_days
    data = IngestData(source_dir=criteo_days(mode.day_rows, days))
    _measure_floor(data, days)
    for index in range(mode.spark_repeats):
        data.passes.append(run_pass(index, days, data.source_dir, work_dir))
    _measure_floor(data, days)
    return data


def figures(data: IngestData) -> list[Figure]:
    days = data.days
    floor = data.floor()
    one_thread = Stat.of(data.floor_single)
    floor_name = "pyarrow read_csv, 40 binary columns, all cores"

    def rate(seconds_of) -> Stat:
        return Stat.of([d.rows / seconds_of(d) for d in days])

    validate = rate(lambda d: d.functions["validate_raw_file"])
    checks = rate(lambda d: d.functions["validate_raw_file"] - d.functions.get("run_raw_suite", 0.0))
    ingest = rate(lambda d: d.ingest_seconds)
    gx = Stat.of([d.functions.get("run_raw_suite", 0.0) for d in days])
    rows = days[0].rows
    note_floor = f"one-thread parse: {one_thread.median:,.0f} rows/s"
    return [
        Figure(SECTION, f"validate_raw_file, {rows:,}-row day", "rows/s", validate, floor_name, floor,
               ratio_of(validate, floor), "medians", note=f"includes the GX report ({gx.median:.1f} s per day); "
                                                          f"{note_floor}"),
        Figure(SECTION, "validate_raw_file without the GX report", "rows/s", checks, floor_name, floor,
               ratio_of(checks, floor), "medians", note="the row checks alone (GX suite time subtracted)"),
        Figure(SECTION, "validate_day + day_stats (default engine)", "rows/s", ingest, floor_name, floor,
               ratio_of(ingest, floor), "medians", note="the two task functions, timed inside the DAG's tasks"),
    ]
