"""BYO transcode against NVIDIA's own: `python -m bench.byo --nvidia-dlrm PATH [--rows N] [--repeats R]`.

PATH is a checkout of NVIDIA's DLRM code (DeepLearningExamples/PyTorch/Recommendation/DLRM; not vendored here): its
dlrm/scripts/transcode.py runs as a child process (this .venv's python: it needs torch, pandas, numpy, yaml) beside
recflow's engines on the same CSV files, interleaved, each run into a fresh output folder (NVIDIA's script appends
to its outputs). Two shapes, as in issue #26:

  few files   NVIDIA's small_csv.yaml (tests/transcoding): 3 numericals, 6 categoricals, 4 chunk files a mapping;
  many files  NVIDIA's different_feature_names.yaml (tests/feature_specs) turned into a CSV spec: one chunk per
              categorical, 28 files a mapping.

CSV files: tasks/byo/synthetic.py with numericals written with every bit of their float64 ("%.17g", as gen_csv's
pandas writes them), so numerical.bin tells single from double rounding. Every NVIDIA output file is compared with
recflow's byte for byte. Timed: process wall time of each child (python start and imports included on both sides),
peak RSS of its tree (bench.proc). The Spark job is timed once per shape with --spark; --scale N also runs the arrow
engine on N times the rows (peak RSS against rows). Without --nvidia-dlrm only recflow's engines are timed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, Figure, Stat, paired_ratio

log = logging.getLogger("bench.byo")

SECTION = "BYO transcode"
TRAIN_SHARE = 0.8
BENCH_ROWS = 200_000  # issue #26's size for both shapes
SMALL_CSV = REPO / "tests" / "data" / "byo" / "small_csv.yaml"
MANY_FILES_SPEC = Path("tests") / "feature_specs" / "different_feature_names.yaml"  # inside NVIDIA's checkout
SHAPES = ("few files", "many files")
NVIDIA_TRANSCODE = Path("dlrm") / "scripts" / "transcode.py"
# NVIDIA's script, unmodified, run after its heavy imports so that its work can be timed apart from them
NVIDIA_TIMED = ("import runpy, sys, time; import torch, pandas, numpy, yaml; started = time.perf_counter(); "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
                "print('WORK_SECONDS', time.perf_counter() - started)")


def many_files_spec(nvidia_dlrm: Path | None) -> dict[str, Any]:
    """NVIDIA's different_feature_names.yaml as a CSV spec (chunk types csv, .bin names -> .csv); without a
    checkout, the same shape built here (13 numericals, the label, 26 one-feature categorical chunks)."""
    if nvidia_dlrm is not None:
        spec = yaml.safe_load((nvidia_dlrm / MANY_FILES_SPEC).read_text())
    else:
        numerical, categorical = [f"n{i}.x" for i in range(13)], [f"{i}c.bin" for i in range(26)]
        spec = {"channel_spec": {"numerical": numerical, "categorical": categorical, "label": ["qwer"]},
                "feature_spec": {**{n: {"dtype": "float16"} for n in numerical}, "qwer": {"dtype": "bool"},
                                 **{c: {"cardinality": 100000, "dtype": "int32"} for c in categorical}},
                "metadata": {},
                "source_spec": {m: [{"type": "split_binary", "features": numerical, "files": [f"{m}/numerical.bin"]},
                                    {"type": "split_binary", "features": ["qwer"], "files": [f"{m}/label.bin"]}]
                                + [{"type": "split_binary", "features": [c], "files": [f"{m}/{c}"]}
                                   for c in categorical] for m in ("train", "test")}}
    for chunks in spec["source_spec"].values():
        for chunk in chunks:
            chunk["type"] = "csv"
            chunk["files"] = [name.removesuffix(".bin") + ".csv" for name in chunk["files"]]
    for props in spec["feature_spec"].values():
        props.pop("dtype", None)  # dtypes are the transcode's to choose
    return spec


def write_source(shape: str, folder: Path, rows: int, nvidia_dlrm: Path | None, seed: int = 7) -> Path:
    """The shape's CSV spec and generated files in `folder`; returns the spec's path."""
    from tasks.byo.spec import load_csv_spec
    from tasks.byo.synthetic import write_csvs

    spec = yaml.safe_load(SMALL_CSV.read_text()) if shape == "few files" else many_files_spec(nvidia_dlrm)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    train = int(rows * TRAIN_SHARE)
    write_csvs(load_csv_spec(path), folder, {"train": train, "test": rows - train}, seed=seed, float_format="%.17g")
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def commands(engine: str, spec: Path, out: Path, nvidia_dlrm: Path | None) -> tuple[list[str], Path | None,
                                                                                   dict[str, str]]:
    """(argv, cwd, env) of one transcode run."""
    if engine == "nvidia":
        env = dict(os.environ, PYTHONPATH=str(nvidia_dlrm))
        return ([sys.executable, "-c", NVIDIA_TIMED, str(nvidia_dlrm / NVIDIA_TRANSCODE), "--input", str(spec.parent),
                 "--feature_spec_in", spec.name, "--output", str(out)], nvidia_dlrm, env)
    if engine == "arrow":
        return [sys.executable, "-m", "tasks.byo.transcode_arrow", "--spec", str(spec), "--output", str(out)], \
            REPO, _env()
    from tasks.core.spark_submit import SparkSubmit

    return SparkSubmit("byo/transcode.py", ["--spec", str(spec), "--output", str(out)]).argv(), REPO, _env()


def run_once(engine: str, spec: Path, out: Path, nvidia_dlrm: Path | None, log_dir: Path) -> dict[str, Any]:
    from bench.proc import run_child

    shutil.rmtree(out, ignore_errors=True)
    argv, cwd, env = commands(engine, spec, out, nvidia_dlrm)
    child = run_child(argv, log_dir / f"{engine}-{out.name}.log", env=env, cwd=cwd, timeout=1800)
    return {"seconds": child.seconds, "peak_rss": child.peak_rss(), "work_seconds": _work_seconds(child.log_path)}


def _work_seconds(log_path: Path) -> float | None:
    """The run's own time after its imports: NVIDIA_TIMED's line, or the arrow engine's result (its main's time)."""
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("WORK_SECONDS "):
            return float(line.split()[1])
        if line.startswith("{") and '"seconds"' in line:
            return float(json.loads(line)["seconds"])
    return None


def compare_outputs(nvidia_out: Path, ours: Path) -> dict[str, Any]:
    """Every .bin NVIDIA wrote against ours: identical files, and for numerical.bin the float16 values that differ."""
    import numpy as np

    files = sorted(p.relative_to(nvidia_out).as_posix() for p in nvidia_out.rglob("*.bin"))
    different = [name for name in files if (nvidia_out / name).read_bytes() != (ours / name).read_bytes()]
    values = {}
    for mapping in ("train", "test"):
        a = np.fromfile(nvidia_out / mapping / "numerical.bin", np.float16)
        b = np.fromfile(ours / mapping / "numerical.bin", np.float16)
        values[mapping] = int((a != b).sum()) if a.shape == b.shape else "shapes differ"
    return {"files": len(files), "different": different, "numerical_values_different": values}


def measure(rows: int, repeats: int, nvidia_dlrm: Path | None, work: Path, spark: bool = False,
            scale: int = 0) -> dict[str, Any]:
    """Each shape: `repeats` interleaved rounds of NVIDIA's transcode.py (when given) and the arrow engine."""
    raw: dict[str, Any] = {"rows": rows, "repeats": repeats, "nvidia_dlrm": str(nvidia_dlrm) if nvidia_dlrm else None,
                           "shapes": {}}
    engines = (["nvidia"] if nvidia_dlrm else []) + ["arrow"]
    for shape in SHAPES:
        folder = work / shape.replace(" ", "_")
        spec = write_source(shape, folder / "source", rows, nvidia_dlrm)
        files = len([p for p in (folder / "source").rglob("*") if p.is_file() and p.name != spec.name])
        result: dict[str, Any] = {"files": files, "csv_bytes": sum(p.stat().st_size for p in
                                                                   (folder / "source").rglob("*") if p.is_file())}
        for round_ in range(repeats):
            for engine in engines:
                run = run_once(engine, spec, folder / f"out-{engine}", nvidia_dlrm, work / "logs")
                result.setdefault(engine, []).append(run)
                log.info("%s, %s, round %d: %.2f s (%.2f s after imports), peak RSS %.0f MB", shape, engine,
                         round_ + 1, run["seconds"], run["work_seconds"] or float("nan"), run["peak_rss"] / 1e6)
        if nvidia_dlrm:
            result["parity"] = compare_outputs(folder / "out-nvidia", folder / "out-arrow")
            log.info("%s: parity with NVIDIA %s", shape, result["parity"])
        if spark:
            result["spark"] = [run_once("spark", spec, folder / "out-spark", None, work / "logs")]
            same = compare_outputs(folder / "out-spark", folder / "out-arrow")["different"]
            result["spark_same_bytes_as_arrow"] = not same
            log.info("%s, spark: %.1f s; same bytes as arrow: %s", shape, result["spark"][0]["seconds"], not same)
        if scale > 1:
            big = write_source(shape, folder / "source-big", rows * scale, nvidia_dlrm)
            result["arrow_scaled"] = {"rows": rows * scale, **run_once("arrow", big, folder / "out-big", None,
                                                                       work / "logs")}
            shutil.rmtree(folder / "source-big")
            log.info("%s, arrow on %d rows: %s", shape, rows * scale, result["arrow_scaled"])
        raw["shapes"][shape] = result
    return raw


def figures(raw: dict[str, Any]) -> list[Figure]:
    """Per shape: the arrow engine's wall time against NVIDIA's transcode.py's (paired by round): the speed-up."""
    rows = []
    for shape, result in raw["shapes"].items():
        ours = [r["seconds"] for r in result["arrow"]]
        name = f"{shape}: {raw['rows']:,} rows in {result['files']} CSV files, arrow engine"
        if "nvidia" in result:
            theirs = [r["seconds"] for r in result["nvidia"]]
            rows.append(Figure(SECTION, name, "s", Stat.of(ours), "NVIDIA transcode.py", Stat.of(theirs),
                               paired_ratio(theirs, ours), "paired", target=">= 5 (speed-up)",
                               note="ratio = NVIDIA's seconds / ours; process wall time, imports included"))
            ours_work = [r["work_seconds"] for r in result["arrow"]]
            theirs_work = [r["work_seconds"] for r in result["nvidia"]]
            rows.append(Figure(SECTION, name + ", after imports", "s", Stat.of(ours_work), "NVIDIA transcode.py",
                               Stat.of(theirs_work), paired_ratio(theirs_work, ours_work), "paired",
                               target=">= 5 (speed-up)", note="each side timed after its imports (torch + pandas; "
                               "numpy + pyarrow): what a worker that has them loaded pays"))
        else:
            rows.append(Figure(SECTION, name, "s", Stat.of(ours), note="no NVIDIA checkout given"))
    return rows


def nvidia_checkout(path: str | None) -> Path | None:
    """The DLRM folder of a DeepLearningExamples checkout (the folder holding dlrm/scripts/transcode.py)."""
    if not path:
        return None
    folder = Path(path).resolve()
    for candidate in (folder, folder / "PyTorch" / "Recommendation" / "DLRM"):
        if (candidate / NVIDIA_TRANSCODE).is_file():
            return candidate
    raise SystemExit(f"--nvidia-dlrm {path}: no {NVIDIA_TRANSCODE} in it (give NVIDIA's DLRM folder)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvidia-dlrm", default=os.environ.get("NVIDIA_DLRM"),
                        help="NVIDIA's DLRM code (default: $NVIDIA_DLRM); without it only recflow is timed")
    parser.add_argument("--rows", type=int, default=BENCH_ROWS, help="rows per shape, train and test (default 200k)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also time the Spark job once per shape")
    parser.add_argument("--scale", type=int, default=0, help="also run the arrow engine on SCALE x the rows")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    nvidia_dlrm = nvidia_checkout(args.nvidia_dlrm)
    with tempfile.TemporaryDirectory(prefix="bench-byo-") as work:
        raw = measure(args.rows, args.repeats, nvidia_dlrm, Path(work), spark=args.spark, scale=args.scale)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    for figure in figures(raw):
        speed = f" -> NVIDIA / ours {figure.ratio.median:.2f}x ({figure.ratio.min:.2f}-{figure.ratio.max:.2f})" \
            if figure.ratio else ""
        reference = f" vs {figure.reference.median:.2f} s" if figure.reference else ""
        print(f"[{SECTION}] {figure.name}: {figure.value.median:.2f} s{reference}{speed}")
    for shape, result in raw["shapes"].items():
        if "parity" in result:
            print(f"[{SECTION}] {shape}: {result['parity']['files']} files compared with NVIDIA's, different: "
                  f"{result['parity']['different'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
