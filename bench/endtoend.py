"""Figure 2, raw logs to split-binary: the whole Criteo preprocessing path through the command line, against the
pyarrow parse floor of the same files measured in the same run.

One run = `python -m tasks criteo ingest --days 0-2 --jobs <cores>` (download + validate + day stats of each day,
one day per core at a time) then
`python -m tasks criteo preprocess --train-days 0-1 --test-day 2 [--engine E]` (dictionary + transform + dataset
validation) into a fresh data root, once per preprocessing engine (default: no --engine, what the README's command
gives a user, arrow on this one machine since issue #27; spark: the spark-submit jobs; arrow: the
single-machine engine, tasks/criteo/preprocess_arrow.py; nvtabular: NVIDIA's NVTabular workflow on CPU in
.venv-nvtabular, nvt_jobs/criteo.py), in rotating order, over the same ingested days: issue
#17's "end to end", from raw TSV to a validated split-binary dataset, is the ingest plus one engine's preprocess.
The engines' datasets must be byte-identical (checked here; the run fails otherwise). The "retrain-only" figure
is the dictionary + transform steps inside the preprocess command (timed by the CLI's --json report): the work a
scheduled retrain does over days already ingested. Rows/s counts every raw row
of the three days, on both figures, so they compare with the floor's rows/s: pyarrow.csv.read_csv of the same three
files (40 binary columns, all cores), measured right before and right after the runs. The children are the CLI
itself, so process start-up, imports and every JVM start are inside the times, as they are for a user.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, Mode, Stat, log, ratio_of
from bench.datasets import criteo_days
from bench.floors import parse_seconds
from bench.proc import ChildRun, run_child

SECTION = "2 end to end"
TRAIN_DAYS, TEST_DAY = (0, 1), 2
# The measurement: three 1,000,000-row days (train 0-1, test 2, frequency threshold 15). Smaller days only
# measure fixed costs (JVM and interpreter start-up), so quick mode keeps the size and runs it once.
DAY_ROWS = {"quick": 1_000_000, "full": 1_000_000}
TARGET_END_TO_END = 0.10
TARGET_END_TO_END_DEFAULT = 0.25  # issue #27: what a user gets with no engine flag
TARGET_RETRAIN = 0.25
DEFAULT = "default"  # no --engine flag: the engine the command picks (arrow on a local Spark master)
ENGINES = (DEFAULT, "spark", "arrow", "nvtabular")
# Days ingested at once: one per core, as the floor parses with every core (a user backfilling on one machine does
# the same with --jobs; the DAG runs days as concurrent runs).
INGEST_JOBS = os.cpu_count() or 1


@dataclass
class EndToEndRun:
    engine: str
    rows: int
    ingest_seconds: float
    preprocess_seconds: float
    ingest_steps: dict[str, float]      # step -> seconds inside the ingest command, summed over days
    preprocess_steps: dict[str, float]  # step -> seconds inside the preprocess command
    ingest: ChildRun
    preprocess: ChildRun
    picked: str = ""  # the engine that ran (for DEFAULT: the one the command chose)

    @property
    def end_to_end_seconds(self) -> float:
        return self.ingest_seconds + self.preprocess_seconds

    @property
    def steps(self) -> dict[str, float]:
        return self.ingest_steps | self.preprocess_steps

    @property
    def retrain_only_seconds(self) -> float:
        """Dictionary + transform: the work a retrain over days already ingested does (the preprocess command's
        dataset validation is not part of it)."""
        return self.preprocess_steps["build_dictionary"] + self.preprocess_steps["transform_dataset"]


@dataclass
class EndToEndData:
    runs: list[EndToEndRun] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)  # rows/s of the three days, all cores

    def of(self, engine: str) -> list[EndToEndRun]:
        return [r for r in self.runs if r.engine == engine]

    def to_raw(self) -> dict[str, Any]:
        return {"floor_rows_per_s": self.floor,
                "runs": [{"engine": r.engine, "picked": r.picked, "rows": r.rows, "ingest_seconds": r.ingest_seconds,
                          "preprocess_seconds": r.preprocess_seconds, "ingest_steps": r.ingest_steps,
                          "preprocess_steps": r.preprocess_steps,
                          "ingest_peak_rss": r.ingest.peak_rss(), "preprocess_peak_rss": r.preprocess.peak_rss(),
                          "logs": [str(r.ingest.log_path), str(r.preprocess.log_path)]} for r in self.runs]}


def _floor(source_dir: Path, days: list[int]) -> float:
    rows = seconds = 0.0
    for day in days:
        n, s = parse_seconds(source_dir / f"day_{day}", threads=True)
        rows, seconds = rows + n, seconds + s
    return rows / seconds


def _cli(args: list[str], env: dict[str, str], log_path: Path, json_path: Path) -> tuple[ChildRun, float, dict]:
    argv = [sys.executable, "-m", "tasks", *args, "--json", str(json_path)]
    started = time.monotonic()
    child = run_child(argv, log_path, env=env, cwd=REPO)
    return child, time.monotonic() - started, json.loads(json_path.read_text())


def step_seconds(result: dict[str, Any]) -> dict[str, float]:
    """step -> seconds, summed over days, from the CLI's --json output."""
    seconds: dict[str, float] = {}
    for step in result["steps"]:
        seconds[step["step"]] = seconds.get(step["step"], 0.0) + float(step["seconds"])
    return seconds


def dataset_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file of a split-binary dataset but its manifest (which names the engine)."""
    import hashlib

    from tasks.core.storage import MANIFEST_NAME

    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}


def run_once(source_dir: Path, rows_per_day: int, index: int, work_dir: Path,
             engines: tuple[str, ...] = ENGINES) -> list[EndToEndRun]:
    """Ingest the three days, then preprocess them with each engine (the order alternates with `index`); one run
    per engine, sharing the ingest."""
    root = work_dir / f"end-to-end-{index}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = {**os.environ, "RECFLOW_DATA_ROOT": str(root / "data"), "PYTHONPATH": str(REPO),
           "RECFLOW_CRITEO_SOURCE": source_dir.resolve().as_uri() + "/day_{day}"}
    logs = work_dir / "logs"
    days = f"{min(TRAIN_DAYS)}-{TEST_DAY}"
    train = f"{min(TRAIN_DAYS)}-{max(TRAIN_DAYS)}"
    log.info("end to end %d: criteo ingest --days %s, then preprocess with %s (logs in %s)", index + 1, days,
             " and ".join(engines), logs)
    ingest, ingest_s, ingest_json = _cli(["criteo", "ingest", "--days", days, "--jobs", str(INGEST_JOBS)], env,
                                         logs / f"e2e-ingest-{index}.log", root / "ingest.json")
    runs, digests = [], {}
    for engine in engines[index % len(engines):] + engines[:index % len(engines)]:
        out = root / f"out-{engine}"
        flag = [] if engine == DEFAULT else ["--engine", engine]
        preprocess, preprocess_s, preprocess_json = _cli(
            ["criteo", "preprocess", "--train-days", train, "--test-day", str(TEST_DAY), *flag,
             "--out", str(out)], env, logs / f"e2e-preprocess-{engine}-{index}.log", root / f"preprocess-{engine}.json")
        run = EndToEndRun(engine=engine, rows=3 * rows_per_day, ingest_seconds=ingest_s,
                          preprocess_seconds=preprocess_s, ingest_steps=step_seconds(ingest_json),
                          preprocess_steps=step_seconds(preprocess_json), ingest=ingest, preprocess=preprocess,
                          picked=next(step["result"]["engine"] for step in preprocess_json["steps"]
                                      if step["step"] == "build_dictionary"))
        if run.preprocess_steps["build_dictionary"] == 0 or run.preprocess_steps["transform_dataset"] == 0:
            raise SystemExit(f"{engine}: a preprocessing step found its output cached; nothing was measured")
        log.info("  %s, %d rows: ingest %.1f s + preprocess %.1f s = %.1f s; retrain-only %.1f s; steps %s", engine,
                 run.rows, ingest_s, preprocess_s, run.end_to_end_seconds, run.retrain_only_seconds,
                 {k: round(v, 1) for k, v in run.steps.items()})
        digests[engine] = dataset_digests(out / "dataset")
        runs.append(run)
    first, *others = digests.values()
    if not first or any(other != first for other in others):
        raise SystemExit(f"the engines wrote different datasets ({', '.join(digests)}): see {logs}")
    shutil.rmtree(root)
    return runs


def measure(mode: Mode, work_dir: Path, repeats: int = 1, engines: tuple[str, ...] = ENGINES) -> EndToEndData:
    rows = DAY_ROWS[mode.name]
    days = [*TRAIN_DAYS, TEST_DAY]
    source_dir = criteo_days(rows, days)
    data = EndToEndData()
    data.floor.append(_floor(source_dir, days))
    for index in range(repeats):
        data.runs.extend(run_once(source_dir, rows, index, work_dir, engines))
    data.floor.append(_floor(source_dir, days))
    return data


def figures(data: EndToEndData) -> list[Figure]:
    floor = Stat.of(data.floor)
    floor_name = "pyarrow read_csv of the same 3 days, all cores"
    rows = []
    for engine in [e for e in ENGINES if data.of(e)]:  # the engines this run measured
        runs = data.of(engine)
        end_to_end = Stat.of([r.rows / r.end_to_end_seconds for r in runs])
        retrain = Stat.of([r.rows / r.retrain_only_seconds for r in runs])
        first = runs[0]
        target = TARGET_END_TO_END_DEFAULT if engine == DEFAULT else TARGET_END_TO_END
        engine = f"{engine} ({first.picked}, no --engine flag)" if engine == DEFAULT else engine
        shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in first.steps.items())
        rows += [
            Figure(SECTION, f"end to end, {engine} engine: ingest 3 days + preprocess ({first.rows:,} rows), CLI",
                   "rows/s", end_to_end, floor_name, floor, ratio_of(end_to_end, floor), "medians",
                   target=f">= {target}",
                   note=f"ingest {first.ingest_seconds:.1f} s + preprocess {first.preprocess_seconds:.1f} s "
                        f"(wall, process start included); steps: {shown}"),
            Figure(SECTION, f"retrain-only, {engine} engine: dictionary + transform over the ingested days", "rows/s",
                   retrain, floor_name, floor, ratio_of(retrain, floor), "medians", target=f">= {TARGET_RETRAIN}",
                   note=f"dictionary {first.preprocess_steps['build_dictionary']:.1f} s + transform "
                        f"{first.preprocess_steps['transform_dataset']:.1f} s, timed inside the end-to-end run; "
                        "the engines' datasets are byte-identical"),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.endtoend [--engines default,arrow] [--repeats N]`: the figures as table rows on stdout (the
    harness, bench.run --only endtoend, writes them into docs/ with the machine's description)."""
    import argparse

    from bench.common import CACHE_DIR, QUICK

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    engines = tuple(e for e in args.engines.split(",") if e)
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: unknown {unknown}; choose from {', '.join(ENGINES)}")
    data = measure(QUICK, CACHE_DIR / "work" / "endtoend", args.repeats, engines)
    print(json.dumps(data.to_raw()))
    for figure in figures(data):
        print(f"| {figure.name} | {figure.value.median:,.0f} rows/s | floor {figure.reference.median:,.0f} | "
              f"**{figure.ratio.median:.3g}** | {figure.note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
