"""Train NeuMF on an NCF dataset: `python -m models.ncf.train --dataset_dir D --output_dir O [flags]`.

One process per worker. With TF_CONFIG naming several workers (tasks.core.launch.train_with_tf_workers sets it)
the workers train data-parallel under MultiWorkerMirroredStrategy; without it, one process on one device. Also
callable in-process as `main(argv)`.

The loop is custom (strategy.run around a @tf.function step; Keras 3's `fit` under the multi-worker strategy has
open failure reports). Each epoch every worker draws the same sample from (seed, epoch) - the positives plus
`negatives` uniform items per positive, unchecked, shuffled (NVIDIA's recipe) - and takes its share of each global
batch, so all workers run the same number of steps; the last partial batch is dropped. BCE with logits, Adam,
gradients summed across workers (the loss is scaled by the global batch). The chief evaluates HR@k / NDCG@k every
`eval_every` epochs while the others wait. Checkpoints (model, optimizer, step) are taken at each epoch's end and
every `checkpoint_every_steps`; a rerun with the same output_dir resumes from the newest one and ends at the same
total step count (models.tfkit.run_state: run.json, restore, train_log.jsonl; the step: models.tfkit.training;
the loop: models.tfkit.epoch_loop). Negatives and dropout masks depend only on (seed, epoch / step), so nothing is
drawn twice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models.ncf import data
from models.ncf.config import NcfConfig, build_parser, config_from_namespace
from models.ncf.metrics import RankingMetrics
from models.ncf.evaluate import evaluate_ranking, make_series_scorer, ranking_document, save_model
from models.ncf.model import NeuMF, NeuMFConfig, build_model
from models.tfkit.cluster import WorkerContext, start_worker
from models.tfkit.epoch_loop import EpochRun, train_epoch_run
from models.tfkit.precision import precision_policy, wrap_optimizer
from models.tfkit.run_state import RunState, TrainResult, check_run_arguments
from models.tfkit.training import micro_batches
from tasks.core.progress import RankLog


@dataclass(kw_only=True)
class _Run(EpochRun):
    cfg: NcfConfig
    model: NeuMF
    spec: data.NcfSpec
    positives: data.Interactions
    series: data.RankingSeries | None  # chief only

    def description(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"model": self.model.config.to_dict(), "steps_per_epoch": self.steps_per_epoch,
                "batch_size": cfg.batch_size, "negatives": cfg.negatives, "seed": cfg.seed,
                "workers": self.ctx.workers, "precision": cfg.precision}

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[tuple[tf.Tensor, tf.Tensor], tf.Tensor]]:
        # the epoch's sample is drawn here, before the loop starts the epoch's clock
        arrays = data.epoch_sample(self.positives, self.spec.items, self.cfg.negatives, self.cfg.seed, epoch)
        return (self._worker_batch(arrays, in_epoch) for in_epoch in range(skip, self.steps_per_epoch))

    def _worker_batch(self, arrays: tuple[np.ndarray, ...], in_epoch: int):
        users, items, labels = data.worker_batch(arrays, in_epoch, self.cfg.batch_size, self.ctx.index,
                                                 self.ctx.workers)
        ids = (tf.constant(users.astype(np.int64)), tf.constant(items.astype(np.int64)))  # the model's int64 inputs
        return ids, tf.constant(labels)

    def make_scorer(self):
        return make_series_scorer(self.model, self.cfg.topk, self.cfg.xla)

    def score(self, scorer) -> dict[str, float]:
        """Every test series."""
        started = time.perf_counter()
        result = evaluate_ranking(self.model, self.series, self.cfg.topk, self.cfg.users_per_eval_batch,
                                  scorer=scorer)
        k = self.cfg.topk
        self.log(f"eval step {self.step}: hr@{k} {result.hit_rate:.4f} ndcg@{k} {result.ndcg:.4f} over "
                 f"{result.users} users in {time.perf_counter() - started:.1f}s")
        return {f"hr@{k}": result.hit_rate, f"ndcg@{k}": result.ndcg}

    def epoch_metrics_line(self, record: dict[str, Any]) -> str:
        return "".join(f", {k} {v:.4f}" for k, v in record.items() if "@" in k)

    def best_metric(self) -> str:
        return f"hr@{self.cfg.topk}"

    def own_final_metrics(self, last: dict[str, Any], rate: float) -> tuple[dict[str, Any], str]:
        k = self.cfg.topk
        document = ranking_document(RankingMetrics(last[f"hr@{k}"], last[f"ndcg@{k}"], self.series.users.shape[0]),
                                    self.series, k)
        metrics = {**document, "batch_size": self.cfg.batch_size, "precision": self.cfg.precision}
        return metrics, (f"done: {self.step} steps, hr@{k} {document[f'hr@{k}']:.4f} ndcg@{k} "
                         f"{document[f'ndcg@{k}']:.4f} (random {document[f'random_hr@{k}']:.4f}), {rate:,.0f} "
                         f"samples/s, outputs in {self.out}")

    def save_model(self) -> Path:
        return save_model(self.out, self.model, self.cfg.to_dict(), self.step)

    def plot_curves(self, records: list[dict[str, Any]], path: Path) -> Path:
        from models.ncf.plots import plot_ranking_curves  # matplotlib: the chief only, at the end

        return plot_ranking_curves(records, path, self.cfg.topk, title=f"NeuMF {self.out.name}")


def parse_args(argv: list[str] | None = None) -> NcfConfig:
    parser = build_parser("train NeuMF on an NCF dataset (NVIDIA DeepLearningExamples recipe)")
    return config_from_namespace(parser.parse_args(argv))


def _setup(cfg: NcfConfig, ctx: WorkerContext) -> _Run:
    check_run_arguments(cfg.dataset_dir, cfg.output_dir, "batch_size", cfg.batch_size, ctx.workers)
    log = RankLog(ctx.index)
    spec = data.read_spec(cfg.dataset_dir, cfg.feature_spec)
    positives = data.load_mapping(spec, cfg.train_mapping)
    series = data.ranking_series(spec, data.load_mapping(spec, cfg.test_mapping)) if ctx.is_chief else None
    steps_per_epoch = data.steps_per_epoch(len(positives), cfg.negatives, cfg.batch_size)
    if cfg.limit_train_batches is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.limit_train_batches)
    if steps_per_epoch < 1:
        raise ValueError(f"{spec.path}: {len(positives)} positives x {1 + cfg.negatives} make no full batch of "
                         f"{cfg.batch_size}")
    keras.utils.set_random_seed(cfg.seed)
    model_cfg = NeuMFConfig(users=spec.users, items=spec.items, factors=cfg.factors, mlp_sizes=cfg.mlp_sizes,
                            dropout=cfg.dropout)
    with ctx.strategy.scope():
        model = build_model(model_cfg)
        optimizer = wrap_optimizer(keras.optimizers.Adam(cfg.learning_rate, beta_1=cfg.beta1, beta_2=cfg.beta2,
                                                         epsilon=cfg.eps), cfg.precision)
        optimizer.build(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    out = Path(cfg.output_dir)
    state = RunState(out, checkpoint, step_var, ctx, cfg.keep_checkpoints, log)
    return _Run(cfg=cfg, ctx=ctx, log=log, spec=spec, positives=positives, series=series, model=model,
                optimizer=optimizer, state=state, out=out, global_batch=cfg.batch_size,
                steps_per_epoch=steps_per_epoch, total_steps=steps_per_epoch * cfg.epochs,
                micro_batches=micro_batches(cfg.micro_batches, cfg.batch_size // ctx.workers,
                                            on_gpu=bool(tf.config.list_logical_devices("GPU"))))


def train(cfg: NcfConfig, ctx: WorkerContext) -> TrainResult:
    started = time.perf_counter()
    with precision_policy(cfg.precision):
        run = _setup(cfg, ctx)
        return train_epoch_run(run, started, (
            f"training {run.total_steps} steps ({cfg.epochs} epochs x {run.steps_per_epoch}) of "
            f"{cfg.batch_size} samples ({len(run.positives)} positives x {1 + cfg.negatives}) on {ctx.workers} "
            f"worker(s) ({type(ctx.strategy).__name__}, {ctx.intra_op_threads or 'default'} intra-op threads), "
            f"{run.spec.users} users x {run.spec.items} items, precision {cfg.precision}, xla {cfg.xla}"))


def main(argv: list[str] | None = None) -> TrainResult:
    cfg = parse_args(argv)
    ctx = start_worker(cfg.intra_op_threads, cfg.inter_op_threads, device=cfg.device)  # before any other TF op
    return train(cfg, ctx)


if __name__ == "__main__":
    sys.exit(3 if main().stopped else 0)
