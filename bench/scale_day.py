"""A real day's size on one machine (issue #27 item 3): Criteo ingest + preprocess of one day of N rows through the
command line, with the default engine, and what it costs per row, in memory and on disk.

One size = a train day 0 of N rows and a test day 1 of 1,000,000 rows, then, each as a measured child
(bench.proc: peak RSS summed over the process tree):
  ingest      python -m tasks criteo ingest --days 0-1 --jobs 2
  preprocess  python -m tasks criteo preprocess --train-days 0 --test-day 1 --frequency-threshold 15
              --dictionary-days all
Rows/s per stage count every raw row the stage reads (ingest: N + 1M; validate_day: day 0's N rows in its own step
time; preprocess: N + 1M). Disk beside the inputs = everything under the data root (the downloaded raw copy, the
validation, the day stats, the dictionary and the dataset) per GB of source TSV; the source lies outside it.

Day 0 is made from the benchmark's cached synthetic 1M-row days (bench.datasets.criteo_days, days 0-2) written
back to back: the synthetic generator draws from fixed vocabularies (tasks.criteo.synthetic.VOCAB_SIZES), so a
longer generated day would not hold more distinct values either, and appending copies costs disk I/O instead of
~12 s of generation per 1M rows. The dictionary and the day stats' counts therefore hold the same values at every
size; what grows with N is every per-row cost, the columnar copy, the spill of the value counts and the dataset.

  python -m bench.scale_day --rows 10000000 --stage all     (or --stage make|ingest|preprocess|report|clean, so
                                                             each heavy stage can hold the shared lock on its own)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, REPO, log
from bench.datasets import criteo_days
from bench.endtoend import step_seconds
from bench.proc import RSS_METHOD, run_child

PIECE_ROWS = 1_000_000  # rows of each cached day the big day is made of
TEST_ROWS = PIECE_ROWS
STAGES = ("make", "ingest", "preprocess", "report", "clean")


def work_dir(rows: int) -> Path:
    return CACHE_DIR / "scale" / str(rows)


def make_days(rows: int, work: Path) -> Path:
    """source/day_0 of `rows` rows (the cached 1M-row days 0, 1, 2, 0, ... back to back) and source/day_1 (1M)."""
    if rows % PIECE_ROWS:
        raise SystemExit(f"--rows {rows}: a multiple of {PIECE_ROWS:,}")
    pieces = criteo_days(PIECE_ROWS, [0, 1, 2])
    source = work / "source"
    source.mkdir(parents=True, exist_ok=True)
    stamp = source / "day_0.rows"
    if not (stamp.is_file() and stamp.read_text() == str(rows)):
        needed = rows // PIECE_ROWS * (pieces / "day_0").stat().st_size * 2.5  # source + raw copy + outputs
        free = shutil.disk_usage(work).free
        if needed > free:
            raise SystemExit(f"{rows:,} rows need ~{needed / 1e9:.0f} GB here, {free / 1e9:.0f} GB are free")
        started = time.monotonic()
        with open(source / "day_0.part", "wb") as out:
            for index in range(rows // PIECE_ROWS):
                with open(pieces / f"day_{index % 3}", "rb") as piece:
                    shutil.copyfileobj(piece, out, 16 << 20)
        os.replace(source / "day_0.part", source / "day_0")
        stamp.write_text(str(rows))
        log.info("day 0: %d rows (%.1f GB) in %.0f s", rows, (source / "day_0").stat().st_size / 1e9,
                 time.monotonic() - started)
    if not (source / "day_1").is_file():
        shutil.copyfile(pieces / "day_2", source / "day_1")
    return source


def _cli(name: str, args: list[str], work: Path) -> dict[str, Any]:
    env = {**os.environ, "RECFLOW_DATA_ROOT": str(work / "data"), "PYTHONPATH": str(REPO),
           "RECFLOW_CRITEO_SOURCE": (work / "source").resolve().as_uri() + "/day_{day}"}
    for setting in ("RECFLOW_CRITEO_DAY_STATS_ENGINE", "RECFLOW_CRITEO_PREPROCESS_ENGINE", "RECFLOW_SPARK_PROFILE"):
        env.pop(setting, None)  # the default engine: what a user gets
    report = work / f"{name}.json"
    child = run_child([sys.executable, "-m", "tasks", *args, "--json", str(report)], work / f"{name}.log", env=env,
                      cwd=REPO)
    result = json.loads(report.read_text())
    if not result["ok"]:
        raise SystemExit(f"{name} failed: {result['error']} (log: {work / f'{name}.log'})")
    stage = {"seconds": child.seconds, "peak_rss_bytes": child.peak_rss(), "steps": step_seconds(result),
             "disk_bytes": _tree_bytes(work / "data"),
             "engines": sorted({str(step["result"].get("engine")) for step in result["steps"]
                                if isinstance(step["result"], dict) and "engine" in step["result"]})}
    (work / f"{name}.stage.json").write_text(json.dumps(stage, indent=1))
    log.info("%s: %.1f s, peak RSS %.2f GB, data root %.1f GB", name, child.seconds, stage["peak_rss_bytes"] / 1e9,
             stage["disk_bytes"] / 1e9)
    return stage


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def ingest(work: Path) -> dict[str, Any]:
    return _cli("ingest", ["criteo", "ingest", "--days", "0-1", "--jobs", "2"], work)


def preprocess(work: Path) -> dict[str, Any]:
    return _cli("preprocess", ["criteo", "preprocess", "--train-days", "0", "--test-day", "1",
                               "--frequency-threshold", "15", "--dictionary-days", "all",
                               "--out", str(work / "data" / "run")], work)


def report(rows: int, work: Path) -> dict[str, Any]:
    """The size's figures from the stages' records."""
    ingested = json.loads((work / "ingest.stage.json").read_text())
    prepared = json.loads((work / "preprocess.stage.json").read_text())
    source_bytes = sum(p.stat().st_size for p in (work / "source").glob("day_[0-9]*") if p.suffix == "")
    every = rows + TEST_ROWS
    validate_0 = json.loads((work / "ingest.json").read_text())["steps"]
    day0 = next(s for s in validate_0 if s["step"] == "validate_day" and s["result"]["day"] == 0)
    figures = {
        "rows_day_0": rows, "rows_all": every, "source_gb": source_bytes / 1e9,
        "ingest_rows_per_s": every / ingested["seconds"], "ingest_seconds": ingested["seconds"],
        "validate_day0_rows_per_s": rows / day0["seconds"], "validate_day0_seconds": day0["seconds"],
        "preprocess_rows_per_s": every / prepared["seconds"], "preprocess_seconds": prepared["seconds"],
        "dictionary_seconds": prepared["steps"].get("build_dictionary"),
        "transform_seconds": prepared["steps"].get("transform_dataset"),
        "us_per_row_end_to_end": 1e6 * (ingested["seconds"] + prepared["seconds"]) / every,
        "ingest_peak_rss_gb": ingested["peak_rss_bytes"] / 1e9, "preprocess_peak_rss_gb": prepared["peak_rss_bytes"] / 1e9,
        "disk_beside_inputs_gb": prepared["disk_bytes"] / 1e9,
        "disk_per_input_gb": prepared["disk_bytes"] / source_bytes,
        "engines": sorted(set(ingested["engines"]) | set(prepared["engines"])), "rss_method": RSS_METHOD,
        "cpus": os.cpu_count(),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True, help="rows of day 0 (a multiple of 1,000,000)")
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    args = parser.parse_args(argv)
    work = work_dir(args.rows)
    work.mkdir(parents=True, exist_ok=True)
    if args.stage in ("make", "all"):
        make_days(args.rows, work)
    if args.stage in ("ingest", "all"):
        shutil.rmtree(work / "data", ignore_errors=True)  # measured from nothing, never from a cache
        ingest(work)
    if args.stage in ("preprocess", "all"):
        shutil.rmtree(work / "data" / "run", ignore_errors=True)
        preprocess(work)
    if args.stage in ("report", "all"):
        report(args.rows, work)
    if args.stage == "clean":
        shutil.rmtree(work / "data", ignore_errors=True)
        shutil.rmtree(work / "source", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
