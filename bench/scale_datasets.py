"""MovieLens at ml-20m's size and Outbrain at a tenth of Kaggle's on one machine (issue #27 item 3), through the
command line with the default engines: rows/s per stage, peak RSS, disk beside the inputs per GB of input.

  movielens  the project's synthetic generator (tasks.movielens.synthetic) at ml-20m's shape: 138,493 users,
             26,744 movies, ~20.0M ratings; then
               ingest      python -m tasks movielens ingest --dataset ml-20m
               preprocess  python -m tasks movielens preprocess --dataset ml-20m --profile full   (Spark: its only
                           engine)
               train       python -m models.ncf.train on the preprocessed dataset with the `full` profile's flags
                           (NVIDIA's recipe: batch 2^20, 4 negatives, NeuMF 64 / 256-256-128-64), one worker on the
                           CPU, the first --train-steps steps of epoch 1 (--train-steps 0: the whole epoch), then
                           the HR@10 evaluation of every user. samples/s is the trainer's own (steps x batch / the
                           time inside the training steps); a partial epoch's per-epoch time is an extrapolation.
  outbrain   tasks.outbrain.synthetic with 2,075,000 displays (~8.7M clicks_train rows: Kaggle's 87.1M x 0.1);
               ingest      python -m tasks outbrain ingest
               features    python -m tasks outbrain features --profile full --engine E, for each engine this
                           machine has (spark always; nvtabular where its environment is built)

--scale F runs every count times F (a smaller size beside the full one, to state how the time scales; the tests
use a tiny one). Each stage is a measured child (bench.proc: wall time, peak RSS summed over its process tree);
every stage can run alone (--stage), so that each holds the shared lock on its own. Disk beside the inputs =
everything under the data root (the downloaded copy, the validated tables, the datasets) per GB of source files,
which lie outside it.

  python -m bench.scale_datasets movielens --stage all    (make | ingest | preprocess | train | report | clean)
  python -m bench.scale_datasets outbrain --stage all     (make | ingest | features | report | clean)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, REPO, log
from bench.endtoend import step_seconds
from bench.proc import RSS_METHOD, ChildFailed, run_child

# ml-20m (GroupLens README): 20,000,263 ratings by 138,493 users of 27,278 movies (26,744 of them rated).
# The generator's n_u = round(ratings_per_user x lognormal(0, 0.35)), whose mean is x1.063: 136 gives ~20.0M.
ML20M = {"users": 138_493, "items": 26_744, "ratings_per_user": 136}
# Kaggle's Outbrain: 87.1M clicks_train rows. The generator writes ~4.19 clicks_train rows per display (2 + Bin(10,
# 0.3) ads a display, the training days' share of displays; measured: 19,026 rows from 4,540 displays), so 2.075M
# displays give ~8.7M rows.
OUTBRAIN_10PCT_DISPLAYS = 2_075_000
NCF_STEPS = 20            # training steps measured by default (a whole epoch at batch 2^20 is ~95 steps)
SEED = 1
STAGES = {"movielens": ("make", "ingest", "preprocess", "train", "report", "clean"),
          "outbrain": ("make", "ingest", "features", "report", "clean")}


def work_dir(dataset: str, scale: float) -> Path:
    return CACHE_DIR / "scale" / f"{dataset}-{scale:g}"


def movielens_size(scale: float) -> dict[str, int]:
    """ml-20m's shape times `scale` (users and movies; ratings per user kept, so ratings scale with users)."""
    users, items = max(50, round(ML20M["users"] * scale)), max(300, round(ML20M["items"] * scale))
    return {"users": users, "items": items, "ratings_per_user": min(ML20M["ratings_per_user"], items // 2)}


def outbrain_displays(scale: float) -> int:
    return max(200, round(OUTBRAIN_10PCT_DISPLAYS * scale))


def _env(dataset: str, work: Path) -> dict[str, str]:
    """The child's environment: a data root of its own, the synthetic source, the default engines."""
    source = (work / "source").resolve().as_uri()
    env = {**os.environ, "RECFLOW_DATA_ROOT": str(work / "data"), "PYTHONPATH": str(REPO),
           "RECFLOW_MOVIELENS_SOURCE": source + "/{name}.zip", "RECFLOW_OUTBRAIN_SOURCE": source + "/{file}"}
    for setting in ("RECFLOW_OUTBRAIN_FEATURES_ENGINE", "RECFLOW_SPARK_PROFILE", "RECFLOW_PROFILE"):
        env.pop(setting, None)  # what a user gets, unless the stage names it
    return env


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _measured(name: str, argv: list[str], work: Path, dataset: str) -> dict[str, Any]:
    """Run one stage as a measured child; its record (wall, peak RSS, the data root's size) in <name>.stage.json,
    also when it fails (then with `failed`, and the bench stops with the child's last lines)."""
    try:
        child = run_child(argv, work / f"{name}.log", env=_env(dataset, work), cwd=REPO)
    except ChildFailed as failure:
        stage = {"seconds": failure.run.seconds, "peak_rss_bytes": failure.run.peak_rss(), "failed": str(failure),
                 "disk_bytes": _tree_bytes(work / "data")}
        (work / f"{name}.stage.json").write_text(json.dumps(stage, indent=1))
        raise SystemExit(f"{name}: {failure}") from None
    stage = {"seconds": child.seconds, "peak_rss_bytes": child.peak_rss(), "disk_bytes": _tree_bytes(work / "data")}
    (work / f"{name}.stage.json").write_text(json.dumps(stage, indent=1))
    log.info("%s: %.1f s, peak RSS %.2f GB, data root %.2f GB", name, child.seconds, stage["peak_rss_bytes"] / 1e9,
             stage["disk_bytes"] / 1e9)
    return stage


def _cli(name: str, args: list[str], work: Path, dataset: str) -> dict[str, Any]:
    """`python -m tasks ARGS --json`, measured; fails with the step's error when the command did."""
    report = work / f"{name}.json"
    stage = _measured(name, [sys.executable, "-m", "tasks", *args, "--json", str(report)], work, dataset)
    result = json.loads(report.read_text())
    if not result["ok"]:
        raise SystemExit(f"{name} failed: {result['error']} (log: {work / f'{name}.log'})")
    stage["steps"] = step_seconds(result)
    stage["results"] = {step["step"]: step["result"] for step in result["steps"]}
    (work / f"{name}.stage.json").write_text(json.dumps(stage, indent=1, default=str))
    return stage


def _stage(work: Path, name: str) -> dict[str, Any]:
    return json.loads((work / f"{name}.stage.json").read_text())


def _source_bytes(work: Path) -> int:
    return sum(p.stat().st_size for p in (work / "source").iterdir() if p.is_file())


# ---- movielens ------------------------------------------------------------------------------------------------

def movielens_make(work: Path, scale: float) -> dict[str, Any]:
    size = movielens_size(scale)
    return _measured("make", [sys.executable, "-m", "tasks.movielens.synthetic", str(work / "source"),
                              "--name", "ml-20m", "--users", str(size["users"]), "--items", str(size["items"]),
                              "--ratings-per-user", str(size["ratings_per_user"]), "--seed", str(SEED)],
                     work, "movielens")


def ncf_train_argv(dataset_dir: Path, output_dir: Path, steps: int, batch_size: int | None = None) -> list[str]:
    """models.ncf.train's command line with the `full` profile's flags, one epoch, `steps` steps of it (0: all);
    batch_size overrides the profile's 2^20 (a tiny dataset holds no full batch of it)."""
    from tasks.movielens.ncf import trainer_config
    from tasks.movielens.profiles import PROFILES

    flags = {**trainer_config(PROFILES["full"], 1), "epochs": 1, "limit_train_batches": steps or None,
             "checkpoint_every_steps": 0}
    if batch_size:
        flags["batch_size"] = batch_size
    argv = [sys.executable, "-m", "models.ncf.train", "--dataset_dir", str(dataset_dir), "--output_dir",
            str(output_dir)]
    for name, value in flags.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            argv += [f"--{name}", *map(str, value)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


def movielens_train(work: Path, steps: int, batch_size: int | None = None) -> dict[str, Any]:
    dataset = Path(_stage(work, "preprocess")["results"]["preprocess"]["path"])
    out = work / "data" / "train"
    shutil.rmtree(out, ignore_errors=True)
    stage = _measured("train", ncf_train_argv(dataset, out, steps, batch_size), work, "movielens")
    stage["metrics"] = json.loads((out / "metrics.json").read_text())
    (work / "train.stage.json").write_text(json.dumps(stage, indent=1))
    return stage


def movielens_report(work: Path) -> dict[str, Any]:
    made, ingested, prepared = _stage(work, "make"), _stage(work, "ingest"), _stage(work, "preprocess")
    dataset = prepared["results"]["preprocess"]
    ratings = int(ingested["results"]["validate_snapshot"]["rows"])
    source = _source_bytes(work)
    figures: dict[str, Any] = {
        "ratings": ratings, "users": dataset["users"], "items": dataset["items"], "source_gb": source / 1e9,
        "generate_seconds": made["seconds"],
        "ingest_seconds": ingested["seconds"], "ingest_rows_per_s": ratings / ingested["seconds"],
        "ingest_steps": ingested["steps"], "ingest_peak_rss_gb": ingested["peak_rss_bytes"] / 1e9,
        "preprocess_seconds": prepared["seconds"], "preprocess_rows_per_s": ratings / prepared["seconds"],
        "preprocess_steps": prepared["steps"], "preprocess_peak_rss_gb": prepared["peak_rss_bytes"] / 1e9,
        "dataset_rows": dataset["rows"],
        "disk_beside_inputs_gb": prepared["disk_bytes"] / 1e9, "disk_per_input_gb": prepared["disk_bytes"] / source,
    }
    if (work / "train.stage.json").is_file():
        trained = _stage(work, "train")
        metrics = trained["metrics"]
        positives = dataset["rows"]["train"]  # an epoch: every positive with 4 negatives, the last partial batch dropped
        epoch_samples = positives * (1 + 4) // metrics["batch_size"] * metrics["batch_size"]
        figures |= {
            "train_steps": metrics["steps"], "train_batch_size": metrics["batch_size"],
            "train_samples_per_s": metrics["samples_per_s"], "train_wall_seconds": trained["seconds"],
            "train_peak_rss_gb": trained["peak_rss_bytes"] / 1e9, "hr@10": metrics["hr@10"],
            "epoch_samples": epoch_samples, "epoch_steps": epoch_samples // metrics["batch_size"],
            "epoch_seconds_from_rate": epoch_samples / metrics["samples_per_s"],
            "whole_epoch_measured": metrics["steps"] == epoch_samples // metrics["batch_size"],
        }
    return _write_figures(work, figures)


# ---- outbrain -------------------------------------------------------------------------------------------------

def outbrain_make(work: Path, scale: float) -> dict[str, Any]:
    return _measured("make", [sys.executable, "-m", "tasks.outbrain.synthetic", "--out", str(work / "source"),
                              "--displays", str(outbrain_displays(scale)), "--seed", str(SEED)], work, "outbrain")


def feature_engines() -> list[str]:
    """spark, and nvtabular where its environment is built (tasks.core.nvtabular.nvt_python)."""
    from tasks.core.nvtabular import NvtEnvironmentMissing, nvt_python

    try:
        nvt_python()
    except NvtEnvironmentMissing as missing:
        log.info("nvtabular engine not measured: %s", missing)
        return ["spark"]
    return ["spark", "nvtabular"]


def outbrain_features(work: Path, engines: list[str]) -> dict[str, Any]:
    stages = {}
    for engine in engines:
        shutil.rmtree(work / "data" / "outbrain" / "features", ignore_errors=True)  # each engine from the tables
        stages[engine] = _cli(f"features-{engine}", ["outbrain", "features", "--profile", "full", "--engine", engine],
                              work, "outbrain")
    return stages


def outbrain_report(work: Path) -> dict[str, Any]:
    made, ingested = _stage(work, "make"), _stage(work, "ingest")
    source = _source_bytes(work)
    rows = {name: table["total"] for name, table in ingested["results"]["validate_snapshot"]["tables"].items()}
    clicks = rows["clicks_train"]
    figures: dict[str, Any] = {
        "click_rows": clicks, "rows": rows, "source_gb": source / 1e9, "generate_seconds": made["seconds"],
        "ingest_seconds": ingested["seconds"], "ingest_click_rows_per_s": clicks / ingested["seconds"],
        "ingest_all_rows_per_s": sum(rows.values()) / ingested["seconds"],
        "ingest_steps": ingested["steps"], "ingest_peak_rss_gb": ingested["peak_rss_bytes"] / 1e9, "features": {},
    }
    for path in sorted(work.glob("features-*.stage.json")):
        engine = path.name.removeprefix("features-").removesuffix(".stage.json")
        stage = json.loads(path.read_text())
        figures["features"][engine] = {
            "seconds": stage["seconds"], "click_rows_per_s": clicks / stage["seconds"], "steps": stage["steps"],
            "peak_rss_gb": stage["peak_rss_bytes"] / 1e9, "disk_beside_inputs_gb": stage["disk_bytes"] / 1e9,
            "disk_per_input_gb": stage["disk_bytes"] / source}
    return _write_figures(work, figures)


def _write_figures(work: Path, figures: dict[str, Any]) -> dict[str, Any]:
    figures |= {"rss_method": RSS_METHOD, "cpus": os.cpu_count()}
    (work / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=sorted(STAGES))
    parser.add_argument("--stage", default="all", help="one of the dataset's stages (see the docstring), or all")
    parser.add_argument("--scale", type=float, default=1.0, help="every count times this (default 1: the full size)")
    parser.add_argument("--train-steps", type=int, default=NCF_STEPS,
                        help=f"NCF steps measured (default {NCF_STEPS}; 0: the whole epoch)")
    parser.add_argument("--train-batch", type=int, default=None,
                        help="NCF global batch (default: the full profile's 2^20)")
    parser.add_argument("--engines", default=None, help="outbrain features engines, comma-separated "
                                                         "(default: every engine this machine has)")
    args = parser.parse_args(argv)
    if args.stage not in (*STAGES[args.dataset], "all"):
        parser.error(f"--stage {args.stage}: {args.dataset} has {', '.join(STAGES[args.dataset])} (or all)")
    work = work_dir(args.dataset, args.scale)
    work.mkdir(parents=True, exist_ok=True)
    wanted = STAGES[args.dataset][:-1] if args.stage == "all" else (args.stage,)
    movielens = args.dataset == "movielens"
    for stage in wanted:
        if stage == "make":
            shutil.rmtree(work / "source", ignore_errors=True)
            (movielens_make if movielens else outbrain_make)(work, args.scale)
        elif stage == "ingest":
            shutil.rmtree(work / "data", ignore_errors=True)  # measured from nothing, never from a cache
            name = ["--dataset", "ml-20m"] if movielens else []
            _cli("ingest", [args.dataset, "ingest", *name], work, args.dataset)
        elif stage == "preprocess":
            shutil.rmtree(work / "data" / "movielens" / "preprocessed", ignore_errors=True)
            _cli("preprocess", ["movielens", "preprocess", "--dataset", "ml-20m", "--profile", "full"], work,
                 "movielens")
        elif stage == "train":
            movielens_train(work, args.train_steps, args.train_batch)
        elif stage == "features":
            outbrain_features(work, args.engines.split(",") if args.engines else feature_engines())
        elif stage == "report":
            (movielens_report if movielens else outbrain_report)(work)
        elif stage == "clean":
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
