"""Sharded vs data-parallel DLRM: per-rank embedding memory, samples/s and test AUC of recflow's trainer.

  python -m bench.sharding [--rows 200000] [--repeats 1] [--out bench/.cache/sharding]

The same training (NVIDIA's MLPs, batch 4096, the training figure's lr and step counts: bench.common.QUICK's
TrainShape) on a Criteo-shaped split-binary dataset (26 tables of synthetic_criteo's vocabulary sizes, dim 128),
run as: data parallel on 1 process (the whole machine's threads) and on 2 processes, and table-wise / column-wise
sharded on 2 processes (TorchRec's DistributedModelParallel on gloo). Each run's samples/s is the trainer's own
(log intervals after the warm-up), its embedding bytes per rank come from metrics.json (bytes of the table slices
each rank holds), the peak RSS is the torchrun process tree's. Prints one JSON line; also writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, QUICK, REPO, log
from bench.datasets import split_binary_dataset
from bench.proc import run_child
from bench.training import _env, trainer_rate, training_config

# (name, processes, sharding)
RUNS = (("data_parallel_1", 1, "data_parallel"), ("data_parallel_2", 2, "data_parallel"),
        ("table_wise_2", 2, "table_wise"), ("column_wise_2", 2, "column_wise"))


def run_one(dataset: Path, out: Path, nproc: int, sharding: str, cores: int) -> dict[str, Any]:
    from tasks.core.launch import config_args, torchrun_command

    shape = QUICK.train
    threads = max(1, cores // nproc)
    shutil.rmtree(out, ignore_errors=True)  # a leftover checkpoint would make the trainer resume
    config = {"dataset_dir": str(dataset), "output_dir": str(out), **training_config(shape, threads),
              "sharding": sharding, "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0, "keep_checkpoints": 1}
    child = run_child(torchrun_command(nproc, "models.dlrm.train", config_args(config)), out.with_suffix(".log"),
                      env=_env(threads), cwd=REPO)
    metrics = json.loads((out / "metrics.json").read_text())
    result = {"processes": nproc, "threads_per_process": threads, "sharding": sharding,
              "samples_per_second": trainer_rate(out / "train_log.jsonl", shape), "auc": metrics["auc"],
              "embedding_bytes_per_rank": metrics["embedding_bytes_per_rank"], "peak_rss_bytes": child.peak_rss(),
              "seconds": child.seconds}
    shutil.rmtree(out)
    return result


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds of all four runs")
    parser.add_argument("--out", type=Path, default=CACHE_DIR / "sharding")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    dataset = split_binary_dataset(args.rows)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in RUNS}
    for round_ in range(args.repeats):
        for name, nproc, sharding in RUNS:
            log.info("round %d: %s", round_ + 1, name)
            samples[name].append(run_one(dataset, args.out / name, nproc, sharding, cores))
    runs = {name: {**found[-1], "samples_per_second": median([r["samples_per_second"] for r in found]),
                   "auc": median([r["auc"] for r in found])} for name, found in samples.items()}
    full = runs["data_parallel_1"]["embedding_bytes_per_rank"][0]
    ratios = {}
    for name in ("data_parallel_2", "table_wise_2", "column_wise_2"):
        ratios[f"{name}_max_rank_embedding_vs_1_process"] = max(runs[name]["embedding_bytes_per_rank"]) / full
        ratios[f"{name}_samples_per_second_vs_data_parallel_2"] = (runs[name]["samples_per_second"]
                                                                   / runs["data_parallel_2"]["samples_per_second"])
        ratios[f"{name}_auc_minus_data_parallel_2"] = runs[name]["auc"] - runs["data_parallel_2"]["auc"]
    result = {"bench": "sharding", "rows": args.rows, "batch_size": QUICK.train.batch_size, "cores": cores,
              "repeats": args.repeats, "runs": runs, "ratios": ratios}
    line = json.dumps(result, sort_keys=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(line + "\n")
    print(line, flush=True)
    return result


if __name__ == "__main__":
    main()
