"""Train DLRM in TensorFlow 2 on a split-binary dataset: `python -m models.dlrm_tf.train --dataset_dir D
--output_dir O [flags]`, one process per worker.

With TF_CONFIG naming several workers (tasks.core.launch.train_with_tf_workers sets it) the workers train data
parallel under MultiWorkerMirroredStrategy; without it, one process on one device (models.tfkit.cluster). Also
callable in-process as `main(argv)`. The flags are models.dlrm.train's (models.dlrm_tf.config), so the Criteo DAG's
model config drives either trainer.

Custom loop (Keras 3's `fit` under the multi-worker strategy has open failure reports): plain SGD with NVIDIA's
warmup + polynomial decay (the same schedule object as the PyTorch trainer), BCE with logits over the global batch;
worker w reads its share of each global batch straight from the files (models.dlrm_tf.data), the rows the PyTorch
trainer's rank w reads. The chief evaluates (AUC, logloss on the whole test mapping) while the others wait.
Checkpoints (model, optimizer, step) every `checkpoint_every_minutes` and/or `checkpoint_every_steps`
(models/common/checkpoint_clock.py) and at the end; a rerun with the same output_dir
resumes from the newest one and reads on from the next batch (models.tfkit.run_state). Outputs on the chief:
model.weights.h5 + model_config.json, train_log.jsonl, training_curves.png and metrics.json, written last.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models.dlrm_tf import data
from models.dlrm_tf.config import DlrmTfConfig, parse_args
from models.dlrm_tf.evaluate import make_predictor, predict_mapping, save_model
from models.dlrm_tf.model import DlrmTf, DlrmTfModelConfig, build_model
from models.dlrm_tf.steps import make_host_table_sync, make_train_step
from models.common.checkpoint_clock import CheckpointClock
from models.common.evaluation import final_eval_words
from models.common.time_budget import AGREED_TOO_SLOW, measured_too_slow, stop_if_too_slow
from models.tfkit.cluster import WorkerContext, barrier, start_worker, sum_over_workers
from models.tfkit.precision import precision_policy, wrap_optimizer
from models.tfkit.run_state import RunState, TrainResult, check_run_arguments, write_final_outputs
from tasks.core.process import cannot_run_here
from tasks.core.progress import ProgressMeter, RankLog, format_bytes, format_duration
from tasks.formats.feature_spec import FeatureSpec


@dataclass
class _Run:
    cfg: DlrmTfConfig
    ctx: WorkerContext
    log: RankLog
    precision: str
    train_files: data.MappingFiles
    test_files: data.MappingFiles
    model: DlrmTf
    optimizer: keras.optimizers.Optimizer
    state: RunState
    out: Path
    steps_per_epoch: int
    total_steps: int
    step: int = 0
    saved_step: int = -1
    predictor: Any = None


def weights_checksum(model: keras.Model) -> str:
    """sha256 over every model variable in order: equal on all workers iff their weights are identical."""
    digest = hashlib.sha256()
    for variable in model.variables:
        digest.update(variable.path.encode())
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(variable)).tobytes())
    return digest.hexdigest()


def _setup(cfg: DlrmTfConfig, ctx: WorkerContext) -> _Run:
    check_run_arguments(cfg.dataset_dir, cfg.output_dir, "batch_size", cfg.batch_size, ctx.workers)
    log = RankLog(ctx.index)
    for name, why in cfg.ignored_settings().items():
        log(f"ignoring --{name}={getattr(cfg, name)}: {why}")
    spec = FeatureSpec.from_yaml(Path(cfg.dataset_dir) / cfg.feature_spec)
    train_files = data.mapping_files(spec, cfg.train_mapping)
    test_files = data.mapping_files(spec, cfg.test_mapping)
    steps_per_epoch = data.train_steps(train_files, cfg.batch_size)
    if cfg.limit_train_batches is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.limit_train_batches)
    if steps_per_epoch < 1:
        raise ValueError(f"{cfg.dataset_dir}/{cfg.train_mapping}: {train_files.rows} rows make no full global batch "
                         f"of {cfg.batch_size}")
    model_cfg = DlrmTfModelConfig(
        num_numerical=spec.get_number_of_numerical_features(), categorical_cardinalities=spec.get_categorical_sizes(),
        bottom_mlp_sizes=list(cfg.bottom_mlp_sizes), top_mlp_sizes=list(cfg.top_mlp_sizes),
        max_table_size=cfg.max_table_size, hash_indices=cfg.hash_indices, interaction=cfg.interaction,
        num_cross_layers=cfg.num_cross_layers, cross_layer_projection_dim=cfg.cross_layer_projection_dim,
        host_table_threshold_bytes=cfg.host_table_threshold_bytes)
    host = model_cfg.host_tables()
    log(f"embedding tables: {len(model_cfg.table_sizes())} tables, {sum(model_cfg.table_sizes()):,} rows x "
        f"{model_cfg.embedding_dim} dims = {format_bytes(sum(model_cfg.table_bytes()))} (fp32); in host memory "
        f"(the largest, beyond {format_bytes(cfg.host_table_threshold_bytes)} on the device): "
        + (", ".join(f"{i} ({format_bytes(model_cfg.table_bytes()[i])})" for i in host) if host else "none"))
    if host and cfg.xla and tf.config.list_logical_devices("GPU"):
        raise cannot_run_here(f"--xla with {len(host)} embedding table(s) in host memory (beyond "
                              f"--host_table_threshold_bytes {cfg.host_table_threshold_bytes:,}) on a GPU: an XLA "
                              "step on the GPU cannot read variables on the host; drop --xla, or raise the threshold "
                              "if the GPU holds the tables")
    keras.utils.set_random_seed(cfg.seed)
    precision = cfg.resolved_precision(bool(tf.config.list_logical_devices("GPU")))
    with ctx.strategy.scope():
        model = build_model(model_cfg)
        optimizer = wrap_optimizer(keras.optimizers.SGD(cfg.lr), precision)
        optimizer.build([v for v in model.trainable_variables
                         if id(v) not in {id(h) for h in model.host_table_variables()}])
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    out = Path(cfg.output_dir)
    state = RunState(out, tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var), step_var, ctx,
                     cfg.keep_checkpoints, log)
    return _Run(cfg=cfg, ctx=ctx, log=log, precision=precision, train_files=train_files, test_files=test_files,
                model=model, optimizer=optimizer, state=state, out=out, steps_per_epoch=steps_per_epoch,
                total_steps=steps_per_epoch * cfg.epochs)


def _run_description(run: _Run) -> dict[str, Any]:
    cfg = run.cfg
    return {"model": run.model.config.to_dict(), "steps_per_epoch": run.steps_per_epoch,
            "batch_size": cfg.batch_size, "seed": cfg.seed, "workers": run.ctx.workers, "precision": run.precision}


def _save(run: _Run) -> None:
    if run.saved_step != run.step:
        run.state.save(run.step, _run_description(run))
        run.saved_step = run.step


def _evaluate(run: _Run, final: bool = False) -> dict[str, Any] | None:
    """The chief scores the whole test mapping while the other workers wait."""
    metrics = None
    if run.ctx.is_chief:
        started = time.perf_counter()
        run.predictor = run.predictor or make_predictor(run.model, run.cfg.xla)
        predictions, _ = predict_mapping(run.model, run.test_files, run.cfg.eval_batch_size,
                                         run.cfg.limit_eval_batches, run.cfg.prefetch_depth, run.predictor)
        metrics = predictions.compute()
        run.log(f"eval step {run.step}: auc {metrics['auc']:.5f} logloss {metrics['logloss']:.5f} "
                f"rows {metrics['rows']} in {time.perf_counter() - started:.1f}s")
        if not any(r["kind"] == "eval" and r["step"] == run.step for r in run.state.records):
            run.state.record({"kind": "eval", "step": run.step, **metrics})
    if not final:
        barrier(run.ctx)
    return metrics


def _log_interval(run: _Run, epoch: int, loss_sum: tf.Tensor, count: int, meter: ProgressMeter, lr: float) -> None:
    loss = float(loss_sum) / count
    if not np.isfinite(loss):
        raise FloatingPointError(f"step {run.step}: training loss is {loss}: the model diverged")
    stats = meter.report(run.step)
    run.log(f"step {run.step}/{run.total_steps} epoch {epoch} loss {loss:.5f} lr {lr:.4g} "
            f"samples/s {stats.samples_per_second:,.0f} eta {format_duration(stats.eta_seconds)}")
    run.state.record({"kind": "train", "step": run.step, "epoch": epoch, "loss": loss, "lr": lr,
                      "samples_per_second": stats.samples_per_second})


def _train_epochs(run: _Run, meter: ProgressMeter) -> bool:
    """Run the remaining steps; True when stop_after_steps ended the run."""
    cfg, ctx = run.cfg, run.ctx
    train_step = make_train_step(run.model, run.optimizer, ctx.strategy, cfg.batch_size, cfg.xla)
    schedule = cfg.schedule(run.total_steps)
    clock = CheckpointClock(cfg.checkpoint_every_steps, cfg.checkpoint_every_minutes, cfg.log_every_steps,
                            agree=lambda due: sum_over_workers(ctx, float(due)) > 0, is_main=ctx.is_chief)
    run.log(f"checkpoints {clock.describe()}")
    started = time.perf_counter()
    for epoch in range(run.step // run.steps_per_epoch, cfg.epochs):
        done = run.step - epoch * run.steps_per_epoch
        batches = data.train_batches(run.train_files, cfg.batch_size, ctx.index, ctx.workers, cfg.prefetch_depth,
                                     first_batch=done).take(run.steps_per_epoch - done)
        loss_sum, count = tf.zeros([]), 0
        for inputs, labels in batches:
            lr = cfg.lr * schedule.factor(run.step)
            loss_sum += train_step(inputs, labels, tf.constant(lr, tf.float32))
            count += 1
            run.step += 1
            if run.step % cfg.log_every_steps == 0 or run.step == run.total_steps:
                _log_interval(run, epoch, loss_sum, count, meter, lr)
                loss_sum, count = tf.zeros([]), 0
                if run.step < run.total_steps and (cfg.time_budget_s or run.ctx.is_distributed):
                    _stop_if_too_slow(run, meter, started)
            if cfg.stop_after_steps is not None and run.step >= cfg.stop_after_steps:
                _save(run)
                run.log(f"stopping after step {run.step} (stop_after_steps): rerun to resume")
                return True
            if cfg.eval_every_steps and run.step % cfg.eval_every_steps == 0 and run.step < run.total_steps:
                _evaluate(run)
            if clock.due(run.step):
                _save(run)
                clock.saved()
    return False


def _stop_if_too_slow(run: _Run, meter: ProgressMeter, started: float) -> None:
    """The chief compares the run's need (trained + eta at its measured rate) with cfg.time_budget_s; every worker
    gets its verdict at the same step (models/common/time_budget.py); every worker of a distributed run comes here
    at every log interval whatever its own budget."""
    reason = measured_too_slow(run.cfg.time_budget_s, meter, run.step, started) if run.ctx.is_chief else None
    if run.ctx.is_distributed and sum_over_workers(run.ctx, float(reason is not None)) > 0 and reason is None:
        reason = AGREED_TOO_SLOW
    stop_if_too_slow(reason, prints=True)  # a TF launcher reads every worker's line: it takes the chief's when it can


def _finish(run: _Run, resumed: int | None, meter: ProgressMeter) -> TrainResult:
    cfg = run.cfg
    rate = meter.overall_samples_per_second(run.step)  # the loop's rate, before the final save and evaluation
    _save(run)
    checksum = weights_checksum(run.model)
    run.log(f"final weights sha256 {checksum} at step {run.step}", all_ranks=True)
    result = TrainResult(steps=run.step, epochs=cfg.epochs, workers=run.ctx.workers, resumed_from_step=resumed,
                         stopped=False, samples_per_second=rate, final_metrics={}, output_dir=run.out)
    if run.ctx.is_chief:
        from models.common.plots import plot_training_curves  # matplotlib: the chief only, at the end

        metrics = (_evaluate(run, final=True) if cfg.final_eval else None) or {}
        train_losses = [r["loss"] for r in run.state.records if r["kind"] == "train"]
        result.final_metrics = {
            **metrics, "steps": run.step, "world_size": run.ctx.workers, "workers": run.ctx.workers,
            "batch_size": cfg.batch_size, "samples_per_second": rate,
            "final_train_loss": train_losses[-1] if train_losses else None,
            "embedding_bytes": sum(run.model.config.table_bytes()), "host_tables": run.model.config.host_tables(),
            "resumed_from_step": resumed, "weights_sha256": checksum,
            **({"mapping": cfg.test_mapping} if metrics else {}),
            "framework": "tensorflow", "precision": run.precision, "xla": cfg.xla, "interaction": cfg.interaction}
        write_final_outputs(result, run.state, lambda: save_model(run.out, run.model, cfg.to_dict(), run.step),
                            lambda records, path: plot_training_curves(records, path,
                                                                       title=f"DLRM (TF2) {run.out.name}"))
        run.log(f"done: {run.step} steps, {final_eval_words(metrics)}, {rate:,.0f} samples/s, "
                f"outputs in {run.out}")
    barrier(run.ctx)  # nobody leaves the collective runtime while the chief still writes
    return result


def train(cfg: DlrmTfConfig, ctx: WorkerContext) -> TrainResult:
    with precision_policy(cfg.resolved_precision(bool(tf.config.list_logical_devices("GPU")))):
        run = _setup(cfg, ctx)
        run.out.mkdir(parents=True, exist_ok=True)
        resumed = run.state.resume(_run_description(run))
        run.step = resumed or 0
        run.saved_step = run.step if resumed is not None else -1
        if ctx.is_distributed:
            make_host_table_sync(run.model, ctx.strategy)()
        run.log(f"training {run.total_steps} steps ({cfg.epochs} epochs x {run.steps_per_epoch}) of {cfg.batch_size} "
                f"rows on {ctx.workers} worker(s) ({type(ctx.strategy).__name__}, "
                f"{ctx.intra_op_threads or 'default'} intra-op threads), precision {run.precision}, xla {cfg.xla}, "
                f"interaction {cfg.interaction}, starting at step {run.step}")
        meter = ProgressMeter(run.total_steps, run.step, cfg.batch_size)
        if _train_epochs(run, meter):
            return TrainResult.stopped_early(run.step, cfg.epochs, ctx.workers, resumed, run.out)
        return _finish(run, resumed, meter)


def main(argv: list[str] | None = None) -> TrainResult:
    cfg = parse_args(argv)
    ctx = start_worker(cfg.intra_op_threads, cfg.inter_op_threads, device=cfg.device)  # before any other TF op
    return train(cfg, ctx)


if __name__ == "__main__":
    sys.exit(3 if main().stopped else 0)
