"""Figure 4, training: models/dlrm/train.py against TorchRec's DLRM, the dense-only ceiling and the cores' peak.

Every repeat, for 1 and 2 processes (threads per process = cores / processes, as --torch_threads and
OMP_NUM_THREADS), recflow's trainer and the TorchRec peer (bench.torchrec_dlrm, each variant the mode names) are
launched under torchrun one after the other, in an order that rotates between repeats (A B, then B A), on the same
split-binary dataset, model sizes, global batch, learning-rate schedule and steps; then one process measures the
dense-only ceiling and the torch.mm peak (bench.train_ceiling). Ratios pair the samples of one repeat.

Samples/s, both sides: the log intervals after the first one (warm-up), samples / seconds: the reader and its
prefetch thread, the lr schedule and the per-interval loss all-reduce are inside that time; start-up, the final
evaluation and the checkpoint are not. (TrainResult's own samples_per_second also counts the final checkpoint save,
so it is not used here.) AUC, both sides: the whole test mapping after the last step, models.common.metrics.roc_auc.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import REPO, Figure, Mode, Stat, TrainShape, log, paired_ratio
from bench.datasets import split_binary_dataset
from bench.proc import run_child
from bench.train_ceiling import cpu_peak, model_flops

SECTION = "4 training"
PROCESS_COUNTS = (1, 2)
EVAL_BATCH = 4096


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


def training_config(shape: TrainShape, threads: int) -> dict[str, Any]:
    """The knobs both sides get (models.dlrm.config.DlrmConfig fields): sizes, batch, schedule, steps, threads."""
    return {"device": "cpu", "batch_size": shape.batch_size, "bottom_mlp_sizes": list(shape.bottom_mlp),
            "top_mlp_sizes": list(shape.top_mlp), "lr": shape.lr,
            "limit_train_batches": shape.warmup_steps + shape.measured_steps,
            "log_every_steps": shape.log_every_steps, "eval_batch_size": EVAL_BATCH, "torch_threads": threads}


def run_trainer(dataset: Path, out: Path, nproc: int, threads: int, shape: TrainShape,
                log_path: Path) -> tuple[float, float]:
    """(samples/s, test AUC) of one models.dlrm.train run under torchrun."""
    from tasks.core.launch import config_args, torchrun_command

    shutil.rmtree(out, ignore_errors=True)  # a leftover checkpoint would make the trainer resume
    config = {"dataset_dir": str(dataset), "output_dir": str(out), **training_config(shape, threads),
              "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0, "keep_checkpoints": 1}
    run_child(torchrun_command(nproc, "models.dlrm.train", config_args(config)), log_path, env=_env(threads), cwd=REPO)
    rate = trainer_rate(out / "train_log.jsonl", shape)
    auc = float(json.loads((out / "metrics.json").read_text())["auc"])
    shutil.rmtree(out)
    return rate, auc


def run_peer(variant: str, dataset: Path, out: Path, nproc: int, threads: int, shape: TrainShape,
             log_path: Path) -> tuple[float, float]:
    """(samples/s, test AUC) of one bench.torchrec_dlrm run under torchrun."""
    from tasks.core.launch import config_args, torchrun_command

    result = out.with_suffix(".json")
    config = {"variant": variant, "dataset_dir": str(dataset), "json": str(result), **training_config(shape, threads)}
    run_child(torchrun_command(nproc, "bench.torchrec_dlrm", config_args(config)), log_path, env=_env(threads),
              cwd=REPO)
    peer = json.loads(result.read_text())
    if peer["steps"] != shape.warmup_steps + shape.measured_steps or peer["warmup_steps"] != shape.warmup_steps:
        raise RuntimeError(f"{result}: ran {peer['steps']} steps with {peer['warmup_steps']} untimed, not the "
                           f"trainer's {shape.warmup_steps + shape.measured_steps} / {shape.warmup_steps}")
    return float(peer["samples_per_second"]), float(peer["auc"])


def run_ceilings(dataset: Path, out: Path, cores: int, shape: TrainShape, log_path: Path) -> dict[str, Any]:
    import sys

    from tasks.formats.feature_spec import FeatureSpec

    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    result = out.with_suffix(".json")
    args = ["--num_numerical", str(spec.get_number_of_numerical_features()),
            "--num_categorical", str(len(spec.get_categorical_sizes())), "--batch_size", str(shape.batch_size),
            "--bottom_mlp_sizes", *map(str, shape.bottom_mlp), "--top_mlp_sizes", *map(str, shape.top_mlp),
            "--processes", *map(str, PROCESS_COUNTS), "--cores", str(cores), "--json", str(result)]
    run_child([sys.executable, "-m", "bench.train_ceiling", *args], log_path, env=_env(cores), cwd=REPO)
    return json.loads(result.read_text())


def _rotated(items: list[Any], repeat: int) -> list[Any]:
    shift = repeat % len(items)
    return items[shift:] + items[:shift]


def measure(mode: Mode, work_dir: Path) -> dict[str, Any]:
    from tasks.formats.feature_spec import FeatureSpec

    shape = mode.train
    dataset = split_binary_dataset(mode.loader_rows)
    cores = os.cpu_count() or 1
    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    flops = model_flops(spec.get_number_of_numerical_features(), len(spec.get_categorical_sizes()),
                        shape.bottom_mlp, shape.top_mlp)
    raw: dict[str, Any] = {"dataset": str(dataset), "shape": asdict(shape), "flops": asdict(flops),
                           "train_flops_per_sample": flops.train_flops,
                           "cpu_peak": asdict(cpu_peak(Path("/proc/cpuinfo").read_text(), cores)),
                           "runs": {}, "ceilings": []}
    for nproc in PROCESS_COUNTS:
        raw["runs"][str(nproc)] = {"threads": max(1, cores // nproc), "recflow": [], "recflow_auc": [],
                                   "peers": {v: {"rate": [], "auc": []} for v in shape.peer_variants[nproc]}}
    for repeat in range(shape.repeats):
        for nproc in PROCESS_COUNTS:
            run = raw["runs"][str(nproc)]
            threads = run["threads"]
            for side in _rotated(["recflow", *shape.peer_variants[nproc]], repeat):
                name = f"train-{nproc}p-{repeat}-{side}"
                logged = work_dir / "logs" / f"{name}.log"
                if side == "recflow":
                    rate, auc = run_trainer(dataset, work_dir / name, nproc, threads, shape, logged)
                    run["recflow"].append(rate)
                    run["recflow_auc"].append(auc)
                else:
                    rate, auc = run_peer(side, dataset, work_dir / name, nproc, threads, shape, logged)
                    run["peers"][side]["rate"].append(rate)
                    run["peers"][side]["auc"].append(auc)
                log.info("  %d process(es) x %d thread(s), repeat %d: %s %.0f samples/s, AUC %.4f", nproc, threads,
                         repeat + 1, side, rate, auc)
        ceilings = run_ceilings(dataset, work_dir / f"ceilings-{repeat}", cores, shape,
                                work_dir / "logs" / f"ceilings-{repeat}.log")
        raw["ceilings"].append(ceilings)
        log.info("  repeat %d: dense-only ceiling %s samples/s, torch.mm %s GFLOP/s", repeat + 1,
                 {k: round(v) for k, v in ceilings["dense_samples_per_second"].items()},
                 {k: round(v / 1e9, 1) for k, v in ceilings["gemm_flops"].items()})
    return raw


def fastest_peer(run: dict[str, Any]) -> str:
    """The peer variant with the highest median samples/s."""
    return max(run["peers"], key=lambda v: Stat.of(run["peers"][v]["rate"]).median)


def figures(raw: dict[str, Any]) -> list[Figure]:
    shape = raw["shape"]
    model = f"bottom {shape['bottom_mlp']} / top {shape['top_mlp']}, batch {shape['batch_size']}"
    steps = f"{shape['warmup_steps']} + {shape['measured_steps']} steps, lr {shape['lr']}"
    flops_per_sample = raw["train_flops_per_sample"]
    peak = raw["cpu_peak"]
    peak_flops = peak["cores"] * peak["fma_units"] * peak["lanes"] * 2 * peak["clock_hz"]
    rows = []
    for nproc, run in raw["runs"].items():
        launch = f"{nproc} process(es) x {run['threads']} thread(s)"
        recflow = run["recflow"]
        variant = fastest_peer(run)
        peer = run["peers"][variant]
        others = ", ".join(f"{v} {Stat.of(p['rate']).median:,.0f}" for v, p in run["peers"].items() if v != variant)
        rows.append(Figure(SECTION, f"train.py vs TorchRec DLRM, {launch}", "samples/s", Stat.of(recflow),
                           f"TorchRec DLRM ({variant})", Stat.of(peer["rate"]), paired_ratio(recflow, peer["rate"]),
                           "paired", ">= 1.0", note=f"{model}, {steps}; fastest TorchRec variant"
                           + (f" (others: {others})" if others else "")))
        differences = [a - b for a, b in zip(run["recflow_auc"], peer["auc"])]
        rows.append(Figure(SECTION, f"train.py test AUC vs TorchRec's, {launch}", "AUC", Stat.of(run["recflow_auc"]),
                           f"TorchRec DLRM ({variant})", Stat.of(peer["auc"]),
                           paired_ratio(run["recflow_auc"], peer["auc"]), "paired", "≈ 1.0",
                           note=f"same test rows after the same steps; difference {Stat.of(differences).median:+.4f} "
                                f"({min(differences):+.4f} to {max(differences):+.4f})"))
        ceiling = [c["dense_samples_per_second"][nproc] for c in raw["ceilings"]]
        rows.append(Figure(SECTION, f"train.py vs dense-only ceiling, {launch}", "samples/s", Stat.of(recflow),
                           "the same model's dense math alone", Stat.of(ceiling), paired_ratio(recflow, ceiling),
                           "paired", "< 1 (a ceiling)", note="1 - ratio: embeddings, loader and DDP"))
        achieved = [rate * flops_per_sample for rate in recflow]
        gemm = [c["gemm_flops"][nproc] for c in raw["ceilings"]]
        rows.append(Figure(SECTION, f"train.py achieved FLOP/s, {launch}", "GFLOP/s", Stat.of(achieved).scaled(1e-9),
                           f"torch.mm {2048}² peak, same threads", Stat.of(gemm).scaled(1e-9),
                           paired_ratio(achieved, gemm), "paired",
                           note=f"{flops_per_sample / 1e6:.2f} MFLOP/sample x samples/s; "
                                f"{Stat.of(achieved).median / peak_flops:.0%} of the theoretical peak"))
    gemm_all = [c["gemm_flops"]["1"] for c in raw["ceilings"]]
    rows.append(Figure(SECTION, f"torch.mm fp32 peak, 1 process x {raw['runs']['1']['threads']} thread(s)", "GFLOP/s",
                       Stat.of(gemm_all).scaled(1e-9), "theoretical peak of the cores",
                       Stat.of([peak_flops]).scaled(1e-9), paired_ratio(gemm_all, [peak_flops] * len(gemm_all)),
                       "paired", note=peak["derivation"]))
    if {"1", "2"} <= set(raw["runs"]):
        one, two = raw["runs"]["1"]["recflow"], raw["runs"]["2"]["recflow"]
        rows.append(Figure(SECTION, "train.py, 2 processes vs 1 (gloo DDP scaling)", "samples/s", Stat.of(two),
                           "1 process", Stat.of(one), paired_ratio(two, one), "paired",
                           note="same cores either way: 1.0 = DDP costs nothing"))
    return rows
