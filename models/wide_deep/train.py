"""Train Wide & Deep on prebatched TFRecords: `python -m models.wide_deep.train --dataset_dir D --output_dir O
[flags]` (flags: models/wide_deep/config.py, docs/OUTBRAIN.md "Model CLI").

One process per worker. With TF_CONFIG naming several workers (tasks.core.launch.train_with_tf_workers sets it)
the workers train data-parallel under MultiWorkerMirroredStrategy; without it, one process on one device. Also
callable in-process as `main(argv)`.

The loop is custom (strategy.run around a @tf.function step; Keras 3's `fit` under the multi-worker strategy has
open failure reports). Each worker reads its own shard of the training files (models.wide_deep.data), shuffled
from (seed, epoch), in batches of global_batch_size / workers; every worker runs the same number of steps per epoch
(the smallest shard's full batches), so no collective waits on a worker that ran out of data. BCE with logits
scaled by the global batch; one `keras.optimizers.MultiOptimizer` applies FTRL to the wide variables and RMSProp
(NVIDIA's warmup schedule) to the deep ones, after the gradients are summed across workers. The chief evaluates
MAP@k / AUC / logloss every `eval_every` epochs while the others wait. Checkpoints (model, both optimizers' slots,
step) are taken at each epoch's end and every `checkpoint_every_steps`; a rerun with the same output_dir resumes
from the newest one, skips the batches of its epoch already trained on, and ends at the same total step count
(models.tfkit.run_state: run.json, restore, train_log.jsonl; the step: models.tfkit.training; the loop:
models.tfkit.epoch_loop).
Shuffling and dropout depend only on (seed, epoch / step), so a resumed run trains on what a straight run would.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models.tfkit.cluster import WorkerContext, start_worker
from models.tfkit.epoch_loop import EpochRun, train_epoch_run
from models.tfkit.precision import precision_policy, wrap_optimizer
from models.tfkit.run_state import RunState, TrainResult, check_run_arguments
from models.wide_deep import data
from models.wide_deep.config import (DEFAULT_EMBEDDING_DIM, NVIDIA_EMBEDDING_DIMS, WideDeepConfig, build_parser,
                                     config_from_namespace)
from models.wide_deep.evaluate import evaluate_mapping, make_scorer, save_model
from models.wide_deep.model import WideDeep, WideDeepModelConfig, build_model, make_optimizer, warmup_schedule
from tasks.core.progress import RankLog


@dataclass(kw_only=True)
class _Run(EpochRun):
    cfg: WideDeepConfig
    model: WideDeep
    spec: data.WideDeepSpec
    precision: str  # fp32, bf16 or fp16: what --precision amp means on this device
    local_batch: int

    def description(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"model": self.model.config.to_dict(), "steps_per_epoch": self.steps_per_epoch,
                "global_batch_size": cfg.global_batch_size, "seed": cfg.seed, "workers": self.ctx.workers,
                "precision": self.precision}

    def epoch_batches(self, epoch: int, skip: int) -> tf.data.Dataset:
        cfg, ctx = self.cfg, self.ctx
        dataset = data.make_dataset(self.spec, cfg.train_mapping, self.local_batch, index=ctx.index,
                                    workers=ctx.workers, shuffle_seed=(cfg.seed, epoch),
                                    shuffle_blocks=cfg.shuffle_blocks, drop_remainder=True)
        return dataset.take(self.steps_per_epoch).skip(skip)

    def make_scorer(self):
        return make_scorer(self.model, self.cfg.xla)

    def score(self, scorer) -> dict[str, float]:
        """The whole test mapping."""
        cfg, k = self.cfg, self.cfg.map_k
        started = time.perf_counter()
        metrics = evaluate_mapping(self.model, self.spec, cfg.test_mapping, cfg.eval_batch_size, k, scorer=scorer,
                                   limit_batches=cfg.limit_eval_batches)
        self.log(f"eval step {self.step}: map@{k} {metrics[f'map@{k}']:.4f} (random "
                 f"{metrics[f'random_map@{k}']:.4f}) auc {metrics['auc']:.4f} logloss {metrics['logloss']:.4f} over "
                 f"{metrics['rows']:,} rows / {metrics['displays']:,} displays in "
                 f"{time.perf_counter() - started:.1f}s")
        return metrics

    def epoch_metrics_line(self, record: dict[str, Any]) -> str:
        k = self.cfg.map_k
        return f", map@{k} {record[f'map@{k}']:.4f} auc {record['auc']:.4f}" if f"map@{k}" in record else ""

    def best_metric(self) -> str:
        return f"map@{self.cfg.map_k}"

    def own_final_metrics(self, last: dict[str, Any], rate: float) -> tuple[dict[str, Any], str]:
        k = self.cfg.map_k
        final = {key: last[key] for key in (f"map@{k}", f"random_map@{k}", "auc", "logloss", "rows", "displays",
                                           "displays_without_positive", "map_k")}
        metrics = {**final, "global_batch_size": self.cfg.global_batch_size, "precision": self.precision,
                   "history": self.state.records}
        return metrics, (f"done: {self.step} steps, map@{k} {final[f'map@{k}']:.4f} (random "
                         f"{final[f'random_map@{k}']:.4f}) auc {final['auc']:.4f}, {rate:,.0f} samples/s, outputs in "
                         f"{self.out}")

    def save_model(self) -> Path:
        return save_model(self.out, self.model, self.cfg.to_dict(), self.step)

    def plot_curves(self, records: list[dict[str, Any]], path: Path) -> Path:
        from models.wide_deep.plots import plot_wide_deep_curves  # matplotlib: the chief only, at the end

        return plot_wide_deep_curves(records, path, self.cfg.map_k, title=f"Wide & Deep {self.out.name}")


def parse_args(argv: list[str] | None = None) -> WideDeepConfig:
    parser = build_parser("train Wide & Deep on prebatched TFRecords (NVIDIA DeepLearningExamples TF2 recipe)")
    return config_from_namespace(parser.parse_args(argv))


def resolve_precision(precision: str) -> str:
    """--precision amp means fp16 with loss scaling on a GPU, bf16 on CPU (no loss scaling needed)."""
    if precision == "amp":
        return "fp16" if tf.config.list_logical_devices("GPU") else "bf16"
    return precision


def embedding_dims(spec: data.WideDeepSpec, cfg: WideDeepConfig) -> dict[str, int]:
    """Deep embedding dim per categorical: --embedding_dim for all, else NVIDIA's table with --embedding_dims
    overrides."""
    unknown = sorted(set(cfg.embedding_dims) - set(spec.categorical))
    if unknown:
        raise ValueError(f"--embedding_dims names {unknown}, which are not categorical features of {spec.path}")
    if cfg.embedding_dim:
        return {name: cfg.embedding_dim for name in spec.categorical}
    return {name: cfg.embedding_dims.get(name, NVIDIA_EMBEDDING_DIMS.get(name, DEFAULT_EMBEDDING_DIM))
            for name in spec.categorical}


def model_config(spec: data.WideDeepSpec, cfg: WideDeepConfig) -> WideDeepModelConfig:
    return WideDeepModelConfig(
        onehot={n: spec.cardinalities[n] for n in spec.onehot},
        multihot={n: spec.cardinalities[n] for n in spec.multihot}, hotness=dict(spec.hotness),
        numerical=spec.numerical, embedding_dims=embedding_dims(spec, cfg), hidden_units=cfg.deep_hidden_units,
        dropout=cfg.deep_dropout, combiner=cfg.combiner,
        multihot_padding=spec.source(cfg.train_mapping).multihot_padding)


def gather_from_workers(ctx: WorkerContext, value: int) -> list[int]:
    """Every worker's `value`, in worker order (every worker must call this together)."""
    if not ctx.is_distributed:
        return [value]
    one_hot = np.zeros(ctx.workers, np.float64)
    one_hot[ctx.index] = value  # float64 sums are exact far beyond any row count

    @tf.function
    def all_sum(vector: tf.Tensor) -> tf.Tensor:
        per_replica = ctx.strategy.run(tf.identity, args=(vector,))
        return ctx.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return [int(round(v)) for v in all_sum(tf.constant(one_hot)).numpy()]


def _setup(cfg: WideDeepConfig, ctx: WorkerContext, precision: str) -> _Run:
    check_run_arguments(cfg.dataset_dir, cfg.output_dir, "global_batch_size", cfg.global_batch_size, ctx.workers)
    log = RankLog(ctx.index)
    spec = data.read_spec(cfg.dataset_dir, cfg.feature_spec)
    local_batch = cfg.global_batch_size // ctx.workers
    shard_rows = gather_from_workers(ctx, int(data.block_rows(spec, cfg.train_mapping, ctx.index,
                                                              ctx.workers).sum()))
    steps_per_epoch = min(shard_rows) // local_batch
    if cfg.limit_train_batches is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.limit_train_batches)
    if steps_per_epoch < 1:
        raise ValueError(f"{spec.path}: the workers' shards of {cfg.train_mapping!r} hold {shard_rows} rows, no "
                         f"full batch of {local_batch} per worker")
    total_steps = steps_per_epoch * cfg.epochs
    keras.utils.set_random_seed(cfg.seed)
    with ctx.strategy.scope():
        model = build_model(model_config(spec, cfg))
        schedule = warmup_schedule(cfg.deep_learning_rate, round(cfg.deep_warmup_epochs * steps_per_epoch),
                                   total_steps)
        multi, ftrl, rmsprop = make_optimizer(model, cfg.linear_learning_rate, schedule)
        optimizer = wrap_optimizer(multi, precision)
        optimizer.build(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    # MultiOptimizer does not track its inner optimizers: name them, or FTRL/RMSProp slots would not be saved.
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, wide_optimizer=ftrl, deep_optimizer=rmsprop,
                                     step=step_var)
    out = Path(cfg.output_dir)
    state = RunState(out, checkpoint, step_var, ctx, cfg.keep_checkpoints, log)
    return _Run(cfg=cfg, ctx=ctx, log=log, spec=spec, precision=precision, model=model, optimizer=optimizer,
                state=state, out=out, global_batch=cfg.global_batch_size, local_batch=local_batch,
                steps_per_epoch=steps_per_epoch, total_steps=total_steps)


def train(cfg: WideDeepConfig, ctx: WorkerContext) -> TrainResult:
    started = time.perf_counter()
    precision = resolve_precision(cfg.precision)
    with precision_policy(precision):
        run = _setup(cfg, ctx, precision)
        return train_epoch_run(run, started, (
            f"training {run.total_steps} steps ({cfg.epochs} epochs x {run.steps_per_epoch}) of "
            f"{cfg.global_batch_size} rows on {ctx.workers} worker(s) ({type(ctx.strategy).__name__}, "
            f"{ctx.intra_op_threads or 'default'} intra-op threads), "
            f"{len(run.spec.source(cfg.train_mapping).files)} train file(s), {len(run.spec.onehot)} one-hot + "
            f"{len(run.spec.multihot)} multi-hot + {len(run.spec.numerical)} numerical features, deep "
            f"{list(cfg.deep_hidden_units)}, precision {precision}, xla {cfg.xla}"))


def main(argv: list[str] | None = None) -> TrainResult:
    cfg = parse_args(argv)
    ctx = start_worker(cfg.intra_op_threads, cfg.inter_op_threads, device=cfg.device)  # before any other TF op
    return train(cfg, ctx)


if __name__ == "__main__":
    sys.exit(3 if main().stopped else 0)
