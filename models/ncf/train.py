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
total step count (models.tfkit.run_state: run.json, restore, train_log.jsonl; the step: models.tfkit.training). Negatives and dropout masks depend only on (seed, epoch / step), so nothing is drawn twice.
"""

from __future__ import annotations

import json
import sys
import time
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
from models.tfkit.cluster import WorkerContext, barrier, start_worker
from models.tfkit.precision import precision_policy, wrap_optimizer
from models.tfkit.run_state import RunState, TrainResult
from models.tfkit.training import make_train_step, micro_batches
from tasks.core.progress import ProgressMeter, RankLog, format_duration
from tasks.core.storage import write_text_atomic


@dataclass
class _Run:
    cfg: NcfConfig
    ctx: WorkerContext
    log: RankLog
    spec: data.NcfSpec
    positives: data.Interactions
    series: data.RankingSeries | None  # chief only
    model: NeuMF
    optimizer: keras.optimizers.Optimizer
    state: RunState  # checkpoints, run.json, train_log.jsonl records
    out: Path
    steps_per_epoch: int
    total_steps: int
    step: int = 0
    train_seconds: float = 0.0


def parse_args(argv: list[str] | None = None) -> NcfConfig:
    parser = build_parser("train NeuMF on an NCF dataset (NVIDIA DeepLearningExamples recipe)")
    return config_from_namespace(parser.parse_args(argv))


def _setup(cfg: NcfConfig, ctx: WorkerContext) -> _Run:
    if not cfg.dataset_dir or not cfg.output_dir:
        raise ValueError("both --dataset_dir and --output_dir are required")
    if cfg.batch_size % ctx.workers:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by the {ctx.workers} workers")
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
                optimizer=optimizer, state=state, out=out, steps_per_epoch=steps_per_epoch,
                total_steps=steps_per_epoch * cfg.epochs)


def _run_description(run: _Run) -> dict[str, Any]:
    cfg = run.cfg
    return {"model": run.model.config.to_dict(), "steps_per_epoch": run.steps_per_epoch,
            "batch_size": cfg.batch_size, "negatives": cfg.negatives, "seed": cfg.seed, "workers": run.ctx.workers,
            "precision": cfg.precision}


def _save(run: _Run) -> None:
    run.state.save(run.step, _run_description(run))


def _evaluate(run: _Run, scorer) -> dict[str, float] | None:
    """The chief scores every test series while the other workers wait."""
    metrics = None
    if run.ctx.is_chief:
        started = time.perf_counter()
        result = evaluate_ranking(run.model, run.series, run.cfg.topk, run.cfg.users_per_eval_batch, scorer=scorer)
        k = run.cfg.topk
        metrics = {f"hr@{k}": result.hit_rate, f"ndcg@{k}": result.ndcg}
        run.log(f"eval step {run.step}: hr@{k} {result.hit_rate:.4f} ndcg@{k} {result.ndcg:.4f} over "
                f"{result.users} users in {time.perf_counter() - started:.1f}s")
    barrier(run.ctx)
    return metrics


def _train_epochs(run: _Run) -> bool:
    """Run the remaining steps; True when stop_after_steps ended the run."""
    cfg, ctx = run.cfg, run.ctx
    local = cfg.batch_size // ctx.workers
    slices = micro_batches(cfg.micro_batches, local, on_gpu=bool(tf.config.list_logical_devices("GPU")))
    if slices > 1:
        run.log(f"each worker's batch of {local} goes through {slices} micro-batches (gradients summed)")
    train_step = make_train_step(run.model, run.optimizer, ctx.strategy, cfg.batch_size, cfg.xla, slices)
    scorer = make_series_scorer(run.model, cfg.topk, cfg.xla) if ctx.is_chief else None
    meter = ProgressMeter(run.total_steps, run.step, cfg.batch_size)
    for epoch in range(run.step // run.steps_per_epoch, cfg.epochs):
        arrays = None  # the last epoch's sample is freed before the next one is drawn
        arrays = data.epoch_sample(run.positives, run.spec.items, cfg.negatives, cfg.seed, epoch)
        losses, started = [], time.perf_counter()
        for in_epoch in range(run.step - epoch * run.steps_per_epoch, run.steps_per_epoch):
            users, items, labels = data.worker_batch(arrays, in_epoch, cfg.batch_size, ctx.index, ctx.workers)
            ids = (tf.constant(users.astype(np.int64)), tf.constant(items.astype(np.int64)))  # the model's int64 inputs
            losses.append(train_step(ids, tf.constant(labels),
                                     tf.constant([cfg.seed, run.step], tf.int64)))
            run.step += 1
            if run.step % cfg.log_every_steps == 0:
                stats = meter.report(run.step)
                run.log(f"step {run.step}/{run.total_steps} epoch {epoch} loss {float(losses[-1]):.5f} samples/s "
                        f"{stats.samples_per_second:,.0f} eta {format_duration(stats.eta_seconds)}")
            if cfg.stop_after_steps is not None and run.step >= cfg.stop_after_steps:
                _save(run)
                run.log(f"stopping after step {run.step} (stop_after_steps): rerun to resume")
                return True
            if cfg.checkpoint_every_steps and run.step % cfg.checkpoint_every_steps == 0 \
                    and run.step % run.steps_per_epoch:
                _save(run)
        seconds = time.perf_counter() - started
        run.train_seconds += seconds
        loss = float(np.mean([float(x) for x in losses])) if losses else float("nan")
        if not np.isfinite(loss):
            raise FloatingPointError(f"epoch {epoch}: training loss is {loss}: the model diverged")
        rate = len(losses) * cfg.batch_size / max(seconds, 1e-9)
        record: dict[str, Any] = {"epoch": epoch, "step": run.step, "loss": loss, "samples_per_second": rate,
                                  "seconds": seconds}
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            record.update(_evaluate(run, scorer) or {})
        run.log(f"epoch {epoch} done: loss {loss:.5f}, {rate:,.0f} samples/s"
                + "".join(f", {k} {v:.4f}" for k, v in record.items() if "@" in k))
        run.state.record(record)
        _save(run)
    return False


def _finish(run: _Run, resumed: int | None, seconds: float) -> TrainResult:
    cfg, k = run.cfg, run.cfg.topk
    records = run.state.records
    trained = run.step - (resumed or 0)
    rate = trained * cfg.batch_size / max(run.train_seconds, 1e-9)
    result = TrainResult(steps=run.step, epochs=cfg.epochs, workers=run.ctx.workers, resumed_from_step=resumed,
                         stopped=False, samples_per_second=rate, final_metrics={}, output_dir=run.out)
    run.log(f"worker {run.ctx.index}/{run.ctx.workers} finished: {run.step} steps", all_ranks=True)
    if run.ctx.is_chief:
        from models.ncf.plots import plot_ranking_curves  # matplotlib: the chief only, at the end

        evals = [r for r in records if f"hr@{k}" in r]
        last = evals[-1] if evals else (_evaluate(run, None) or {})
        best = max(evals, key=lambda r: r[f"hr@{k}"]) if evals else None
        document = ranking_document(RankingMetrics(last[f"hr@{k}"], last[f"ndcg@{k}"], run.series.users.shape[0]),
                                    run.series, k)
        result.final_metrics = {
            **document, "epochs": cfg.epochs, "steps": run.step, "steps_per_epoch": run.steps_per_epoch,
            "batch_size": cfg.batch_size, "samples_per_s": rate, "seconds": seconds, "workers": run.ctx.workers,
            "precision": cfg.precision, "xla": cfg.xla, "best_epoch": best["epoch"] if best else None,
            f"best_hr@{k}": best[f"hr@{k}"] if best else None, "resumed_from_step": resumed,
            "final_train_loss": records[-1]["loss"] if records else None, "mapping": cfg.test_mapping}
        result.model_path = save_model(run.out, run.model, cfg.to_dict(), run.step)
        result.log_path = run.state.write_log()
        result.plot_path = plot_ranking_curves(records, run.out / "training_curves.png", k,
                                               title=f"NeuMF {run.out.name}")
        # Written last: a metrics.json newer than the weights means the run's outputs are complete.
        result.metrics_path = run.out / "metrics.json"
        write_text_atomic(result.metrics_path, json.dumps(result.final_metrics, indent=2, sort_keys=True))
        run.log(f"done: {run.step} steps, hr@{k} {document[f'hr@{k}']:.4f} ndcg@{k} {document[f'ndcg@{k}']:.4f} "
                f"(random {document[f'random_hr@{k}']:.4f}), {rate:,.0f} samples/s, outputs in {run.out}")
    barrier(run.ctx)  # nobody leaves the collective runtime while the chief still writes
    return result


def train(cfg: NcfConfig, ctx: WorkerContext) -> TrainResult:
    started = time.perf_counter()
    with precision_policy(cfg.precision):
        run = _setup(cfg, ctx)
        run.out.mkdir(parents=True, exist_ok=True)
        resumed = run.state.resume(_run_description(run))
        run.step = resumed or 0
        run.log(f"training {run.total_steps} steps ({cfg.epochs} epochs x {run.steps_per_epoch}) of "
                f"{cfg.batch_size} samples ({len(run.positives)} positives x {1 + cfg.negatives}) on {ctx.workers} "
                f"worker(s) ({type(ctx.strategy).__name__}, {ctx.intra_op_threads or 'default'} intra-op threads), "
                f"{run.spec.users} users x {run.spec.items} items, precision {cfg.precision}, xla {cfg.xla}, "
                f"starting at step {run.step}")
        if _train_epochs(run):
            return TrainResult(steps=run.step, epochs=cfg.epochs, workers=ctx.workers, resumed_from_step=resumed,
                               stopped=True, samples_per_second=0.0, final_metrics={}, output_dir=run.out)
        return _finish(run, resumed, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> TrainResult:
    cfg = parse_args(argv)
    ctx = start_worker(cfg.intra_op_threads, cfg.inter_op_threads)  # before any other TF op
    return train(cfg, ctx)


if __name__ == "__main__":
    sys.exit(3 if main().stopped else 0)
