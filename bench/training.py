"""Figure 4, training: models/dlrm/train.py samples/s under torchrun (gloo, CPU) against a compute-only ceiling.

For 1 and 2 processes, each repeat launches the trainer and the ceiling (bench.train_ceiling) once each, side by
side (the order alternates between repeats, so a load change does not always hit the same side), with the same
model, global batch and threads per process (cores / processes, passed as --torch_threads and OMP_NUM_THREADS).

Trainer samples/s: from its own train_log.jsonl, the log intervals after the first one (warm-up), aggregated as
samples / seconds. Its reader (SplitBinaryDataset + prefetch thread), the lr schedule, the interval all-reduce and
progress lines are inside that time; start-up, the final evaluation and checkpoint are not. (TrainResult's own
samples_per_second also counts the final checkpoint save and weights checksum, so it is not used here.)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, Mode, Stat, TrainShape, log, paired_ratio
from bench.datasets import split_binary_dataset
from bench.proc import run_child

SECTION = "4 training"
PROCESS_COUNTS = (1, 2)


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}


def trainer_rate(train_log: Path, shape: TrainShape) -> float:
    """Samples/s over the log intervals after the warm-up interval, from the trainer's own records."""
    samples = seconds = 0.0
    for line in train_log.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "train" or record["step"] <= shape.warmup_steps:
            continue
        interval_samples = shape.log_every_steps * shape.batch_size
        samples += interval_samples
        seconds += interval_samples / record["samples_per_second"]
    if not samples:
        raise RuntimeError(f"{train_log}: no train records after step {shape.warmup_steps}")
    return samples / seconds


def run_trainer(dataset: Path, out: Path, nproc: int, threads: int, shape: TrainShape, log_path: Path) -> float:
    from tasks.core.launch import config_args, torchrun_command

    shutil.rmtree(out, ignore_errors=True)  # a leftover checkpoint would make the trainer resume
    config = {"dataset_dir": str(dataset), "output_dir": str(out), "device": "cpu", "batch_size": shape.batch_size,
              "bottom_mlp_sizes": list(shape.bottom_mlp), "top_mlp_sizes": list(shape.top_mlp),
              "limit_train_batches": shape.warmup_steps + shape.measured_steps,
              "log_every_steps": shape.log_every_steps, "checkpoint_every_steps": 0, "keep_checkpoints": 1,
              "eval_batch_size": 4096, "limit_eval_batches": 1, "torch_threads": threads}
    run_child(torchrun_command(nproc, "models.dlrm.train", config_args(config)), log_path, env=_env(threads), cwd=REPO)
    rate = trainer_rate(out / "train_log.jsonl", shape)
    shutil.rmtree(out)
    return rate


def run_ceiling(dataset: Path, out: Path, nproc: int, threads: int, shape: TrainShape, log_path: Path) -> float:
    from tasks.core.launch import torchrun_command

    result = out.with_suffix(".json")
    args = ["--dataset_dir", str(dataset), "--batch_size", str(shape.batch_size),
            "--bottom_mlp_sizes", *map(str, shape.bottom_mlp), "--top_mlp_sizes", *map(str, shape.top_mlp),
            "--torch_threads", str(threads), "--warmup_steps", str(shape.warmup_steps),
            "--measured_steps", str(shape.measured_steps), "--json", str(result)]
    run_child(torchrun_command(nproc, "bench.train_ceiling", args), log_path, env=_env(threads), cwd=REPO)
    return float(json.loads(result.read_text())["samples_per_second"])


def measure(mode: Mode, work_dir: Path) -> dict[str, Any]:
    dataset = split_binary_dataset(mode.loader_rows)
    cores = os.cpu_count() or 1
    raw: dict[str, Any] = {"dataset": str(dataset), "shape": vars(mode.train), "runs": {}}
    for nproc in PROCESS_COUNTS:
        threads = max(1, cores // nproc)
        trainer, ceiling = [], []
        for repeat in range(mode.repeats):
            name = f"train-{nproc}p-{repeat}"
            sides = [("ceiling", run_ceiling, ceiling), ("trainer", run_trainer, trainer)]
            for side, run, samples in (sides if repeat % 2 == 0 else sides[::-1]):
                samples.append(run(dataset, work_dir / f"{name}-{side}", nproc, threads, mode.train,
                                   work_dir / "logs" / f"{name}-{side}.log"))
            log.info("  %d process(es) x %d thread(s), repeat %d: trainer %.0f, ceiling %.0f samples/s", nproc,
                     threads, repeat + 1, trainer[-1], ceiling[-1])
        raw["runs"][str(nproc)] = {"threads": threads, "trainer": trainer, "ceiling": ceiling}
    return raw


def figures(raw: dict[str, Any]) -> list[Figure]:
    shape = raw["shape"]
    model = f"bottom {shape['bottom_mlp']} / top {shape['top_mlp']}, batch {shape['batch_size']}"
    rows = []
    for nproc, run in raw["runs"].items():
        rows.append(Figure(SECTION, f"train.py, {nproc} process(es) x {run['threads']} thread(s)", "samples/s",
                           Stat.of(run["trainer"]), "same model on random in-memory tensors, minimal loop",
                           Stat.of(run["ceiling"]), paired_ratio(run["trainer"], run["ceiling"]), "paired",
                           ">= 0.95", note=model))
    if {"1", "2"} <= set(raw["runs"]):
        one, two = raw["runs"]["1"]["trainer"], raw["runs"]["2"]["trainer"]
        rows.append(Figure(SECTION, "train.py, 2 processes vs 1 (gloo DDP scaling)", "samples/s", Stat.of(two),
                           "1 process", Stat.of(one), paired_ratio(two, one), "paired",
                           note="same cores either way: 1.0 = DDP costs nothing"))
    return rows
