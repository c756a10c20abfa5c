"""TF2 DLRM (models.dlrm_tf.train) vs the PyTorch DLRM (models.dlrm.train): samples/s and test AUC on the same
split-binary data at NVIDIA's model sizes, each against its own compute-only ceiling. Prints one JSON line.

  python -m bench.dlrm_tf [--rows 200000] [--steps 45] [--repeats 2] [--processes 1] [--tf_flags --xla ...]

Both trainers run as child processes on the same Criteo-shaped dataset (bench.datasets.split_binary_dataset), the
same batch, sizes, lr schedule and steps, one after the other in an order that alternates between repeats; each
with all cores as its threads (PyTorch: --torch_threads / OMP_NUM_THREADS; TF: --intra_op_threads). With
`--processes 2` PyTorch runs under torchrun (gloo DDP) and TF as two MultiWorkerMirroredStrategy workers
(tasks.core.launch.tf_worker_envs), threads split between them. Samples/s: the trainers' own log intervals after
the first (bench.training.trainer_rate); AUC: the whole test mapping after the last step (both score the same rows).

Ceilings (dense math alone, one process, all cores): PyTorch's is bench.train_ceiling.dense_rate; TensorFlow's
(`tf_dense_rate`) is the same work in TensorFlow - the TF2 model's bottom MLP, dot interaction and top MLP doing
forward + backward + an SGD update in one tf.function on tensors made once, the embedding outputs given as inputs
that take gradients; no lookups, no reader, no collectives. Each trainer / its ceiling says what its embeddings,
reader and loop cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, NVIDIA_BOTTOM_MLP, NVIDIA_TOP_MLP, REPO, TrainShape, log
from bench.proc import run_child

EVAL_BATCH = 4096


def tf_dense_rate(num_numerical: int, num_categorical: int, bottom_mlp: list[int], top_mlp: list[int], rows: int,
                  threads: int, warmup_steps: int, measured_steps: int, barrier: Any = None,
                  jit_compile: bool = False) -> float:
    """Samples/s of the TF2 model's dense part (module docstring): rows over the median step time."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    from models.dlrm_tf.model import DlrmTfModelConfig, build_model

    tf.random.set_seed(12345)
    model = build_model(DlrmTfModelConfig(num_numerical, [1] * num_categorical, bottom_mlp, top_mlp))
    dense = [v for layer in (*model.bottom_mlp, *model.top_mlp) for v in layer.trainable_variables]
    numerical = tf.random.normal([rows, num_numerical])
    embedded = [tf.random.normal([rows, bottom_mlp[-1]]) for _ in range(num_categorical)]
    labels = tf.cast(tf.random.uniform([rows], 0, 2, tf.int32), tf.float32)
    tril = model._tril

    @tf.function(jit_compile=jit_compile)
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(embedded)
            x = numerical
            for layer in model.bottom_mlp:
                x = layer(x)
            stacked = tf.stack([x, *embedded], axis=1)
            n = num_categorical + 1
            dots = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, n * n])
            z = tf.concat([x, tf.gather(dots, tril, axis=1)], axis=1)
            for layer in model.top_mlp:
                z = layer(z)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.squeeze(z, 1)))
        gradients = tape.gradient(loss, dense + embedded)
        for variable, gradient in zip(dense, gradients[:len(dense)]):
            variable.assign_sub(0.01 * gradient)
        return loss

    for _ in range(warmup_steps):
        step().numpy()
    if barrier is not None:
        barrier.wait()
    seconds = []
    for _ in range(measured_steps):
        started = time.perf_counter()
        step().numpy()
        seconds.append(time.perf_counter() - started)
    return rows / statistics.median(seconds)


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
            "TF_CPP_MIN_LOG_LEVEL": "2"}


def _common_config(shape: TrainShape) -> dict[str, Any]:
    return {"device": "cpu", "batch_size": shape.batch_size, "bottom_mlp_sizes": list(shape.bottom_mlp),
            "top_mlp_sizes": list(shape.top_mlp), "lr": shape.lr,
            "limit_train_batches": shape.warmup_steps + shape.measured_steps,
            "log_every_steps": shape.log_every_steps, "eval_batch_size": EVAL_BATCH,
            "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0, "keep_checkpoints": 1}


def _result(out: Path, shape: TrainShape) -> tuple[float, float]:
    from bench.training import trainer_rate

    rate = trainer_rate(out / "train_log.jsonl", shape)
    auc = float(json.loads((out / "metrics.json").read_text())["auc"])
    return rate, auc


def run_pytorch(dataset: Path, out: Path, shape: TrainShape, processes: int, cores: int,
                log_path: Path) -> tuple[float, float]:
    from tasks.core.launch import config_args, torchrun_command

    shutil.rmtree(out, ignore_errors=True)
    threads = max(1, cores // processes)
    config = {"dataset_dir": str(dataset), "output_dir": str(out), **_common_config(shape), "torch_threads": threads}
    run_child(torchrun_command(processes, "models.dlrm.train", config_args(config)), log_path, env=_env(threads),
              cwd=REPO)
    try:
        return _result(out, shape)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_tensorflow(dataset: Path, out: Path, shape: TrainShape, processes: int, cores: int, log_path: Path,
                   extra: list[str]) -> tuple[float, float]:
    """One models.dlrm_tf.train run as `processes` TF workers (the launcher's environments); (samples/s, AUC)."""
    import subprocess

    from tasks.core.launch import config_args, tf_worker_envs

    shutil.rmtree(out, ignore_errors=True)
    config = {"dataset_dir": str(dataset), "output_dir": str(out), **_common_config(shape)}
    argv = [sys.executable, "-m", "models.dlrm_tf.train", *config_args(config), *extra]
    envs = tf_worker_envs(processes, cores=cores)
    if processes == 1:
        run_child(argv, log_path, env={**envs[0], "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=REPO)
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        workers = [subprocess.Popen(argv, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=REPO,
                                    stdout=open(f"{log_path}.{i}", "wb"), stderr=subprocess.STDOUT)
                   for i, env in enumerate(envs)]
        codes = [w.wait(timeout=1800) for w in workers]
        if any(codes):
            raise RuntimeError(f"TF workers exited {codes}: see {log_path}.*")
    try:
        return _result(out, shape)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="training rows of the split-binary dataset")
    parser.add_argument("--batch_size", type=int, default=4096)
    parser.add_argument("--warmup_steps", type=int, default=5, help="untimed first log interval")
    parser.add_argument("--measured_steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1.0, help="NVIDIA's 24 is for batch 65536; it diverges at 4096")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--tf_flags", nargs=argparse.REMAINDER, default=[], help="extra flags for the TF trainer")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.datasets import split_binary_dataset
    from bench.train_ceiling import concurrently, dense_rate
    from tasks.formats.feature_spec import FeatureSpec

    args = parse_args(argv)
    cores = os.cpu_count() or 1
    shape = TrainShape(args.batch_size, NVIDIA_BOTTOM_MLP, NVIDIA_TOP_MLP, lr=args.lr, warmup_steps=args.warmup_steps,
                       measured_steps=args.measured_steps, log_every_steps=args.warmup_steps, repeats=args.repeats)
    dataset = split_binary_dataset(args.rows)
    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    n_num, n_cat = spec.get_number_of_numerical_features(), len(spec.get_categorical_sizes())
    work = CACHE_DIR / "dlrm_tf"
    runs: dict[str, dict[str, list[float]]] = {side: {"rate": [], "auc": []} for side in ("pytorch", "tensorflow")}
    ceilings: dict[str, list[float]] = {"pytorch": [], "tensorflow": []}
    for repeat in range(args.repeats):
        order = ["pytorch", "tensorflow"] if repeat % 2 == 0 else ["tensorflow", "pytorch"]
        for side in order:
            out, logged = work / f"{side}-{repeat}", work / "logs" / f"{side}-{repeat}.log"
            if side == "pytorch":
                rate, auc = run_pytorch(dataset, out, shape, args.processes, cores, logged)
            else:
                rate, auc = run_tensorflow(dataset, out, shape, args.processes, cores, logged, args.tf_flags)
            runs[side]["rate"].append(rate)
            runs[side]["auc"].append(auc)
            log.info("repeat %d: %s %.0f samples/s, AUC %.4f", repeat + 1, side, rate, auc)
        sizes = (n_num, n_cat, list(shape.bottom_mlp), list(shape.top_mlp), shape.batch_size, cores, 3, 10)
        ceilings["pytorch"].append(concurrently(1, dense_rate, *sizes))
        ceilings["tensorflow"].append(concurrently(1, tf_dense_rate, *sizes))
    median = {side: {k: statistics.median(v) for k, v in r.items()} for side, r in runs.items()}
    ceiling = {side: statistics.median(v) for side, v in ceilings.items()}
    result = {
        "dataset": str(dataset), "rows": args.rows, "batch_size": shape.batch_size, "processes": args.processes,
        "cores": cores, "steps": shape.warmup_steps + shape.measured_steps, "measured_steps": shape.measured_steps,
        "tf_flags": args.tf_flags, "runs": runs, "ceilings": ceilings,
        "pytorch_samples_per_second": median["pytorch"]["rate"],
        "tensorflow_samples_per_second": median["tensorflow"]["rate"],
        "tf_over_pt_samples_per_second": median["tensorflow"]["rate"] / median["pytorch"]["rate"],
        "pytorch_auc": median["pytorch"]["auc"], "tensorflow_auc": median["tensorflow"]["auc"],
        "pytorch_dense_ceiling": ceiling["pytorch"], "tensorflow_dense_ceiling": ceiling["tensorflow"],
        "pytorch_vs_ceiling": median["pytorch"]["rate"] / ceiling["pytorch"],
        "tensorflow_vs_ceiling": median["tensorflow"]["rate"] / ceiling["tensorflow"],
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main()
