"""The epoch loop of a Keras trainer that evaluates at epoch ends, written once: resume, train the remaining steps
epoch by epoch (progress lines, stop_after_steps, checkpoints at epoch ends and every `checkpoint_every_steps`),
evaluate on the chief every `eval_every` epochs while the other workers wait, record each epoch in train_log.jsonl,
then write the chief's outputs (models.tfkit.run_state.write_final_outputs).

A trainer subclasses `EpochRun` with what is its own: how an epoch's batches are drawn, how the chief scores the
test data, what an epoch line and the final metrics say, its plot and its model file; `train_epoch_run` runs it.
The loop keeps the step count, so a resumed run skips the batches of its epoch already trained on and ends at the
same total step count as a straight one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models.tfkit.cluster import WorkerContext, barrier
from models.tfkit.run_state import RunState, TrainResult, write_final_outputs
from models.tfkit.training import make_train_step
from tasks.core.progress import ProgressMeter, RankLog, format_duration


@dataclass(kw_only=True)
class EpochRun:
    """One worker's run. `cfg` is the trainer's config: it has epochs, seed, xla, eval_every, log_every_steps,
    stop_after_steps, checkpoint_every_steps and test_mapping; `global_batch` is the rows of one step over all
    workers."""

    cfg: Any
    ctx: WorkerContext
    log: RankLog
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    state: RunState  # checkpoints, run.json, train_log.jsonl records
    out: Path
    global_batch: int
    steps_per_epoch: int
    total_steps: int
    micro_batches: int = 1  # slices of a worker's batch per forward/backward (models.tfkit.training.micro_batches)
    step: int = 0
    train_seconds: float = 0.0

    # ---- the trainer's own parts --------------------------------------------------------------------------------

    def description(self) -> dict[str, Any]:
        """The run file's description (models.tfkit.run_state): the model's settings and the sample order's."""
        raise NotImplementedError

    def epoch_batches(self, epoch: int, skip: int) -> Iterable[tuple[Any, tf.Tensor]]:
        """This worker's (inputs, labels) of `epoch`, its first `skip` batches left out."""
        raise NotImplementedError

    def make_scorer(self) -> Any:
        """The chief's compiled scoring function, made once and handed to `score`."""
        raise NotImplementedError

    def score(self, scorer: Any) -> dict[str, float]:
        """The chief's metrics on the test data (logged)."""
        raise NotImplementedError

    def epoch_metrics_line(self, record: dict[str, Any]) -> str:
        """What an `epoch N done` line adds about the epoch's metrics (`record` may hold none)."""
        raise NotImplementedError

    def best_metric(self) -> str:
        """The metric key that picks the best epoch (higher is better)."""
        raise NotImplementedError

    def own_final_metrics(self, last: dict[str, Any], rate: float) -> tuple[dict[str, Any], str]:
        """The trainer's own metrics.json entries from the last evaluation `last`, and the run's last log line."""
        raise NotImplementedError

    def save_model(self) -> Path:
        raise NotImplementedError

    def plot_curves(self, records: list[dict[str, Any]], path: Path) -> Path:
        raise NotImplementedError

    # ---- shared -------------------------------------------------------------------------------------------------

    def save(self, partial: dict[str, Any] | None = None) -> None:
        self.state.save(self.step, self.description(), partial)

    def evaluate(self, scorer: Any) -> dict[str, float] | None:
        """The chief scores while the other workers wait; None on the others."""
        metrics = self.score(scorer) if self.ctx.is_chief else None
        barrier(self.ctx)
        return metrics

    def final_metrics(self, rate: float, seconds: float, resumed: int | None) -> tuple[dict[str, Any], str]:
        """The chief's metrics.json (the last evaluation, the best epoch, the run's numbers) and its last log line."""
        cfg, key, records = self.cfg, self.best_metric(), self.state.records
        evals = [r for r in records if key in r]
        last = evals[-1] if evals else (self.evaluate(None) or {})
        best = max(evals, key=lambda r: r[key]) if evals else None
        own, done_line = self.own_final_metrics(last, rate)
        return {**own, "epochs": cfg.epochs, "steps": self.step, "steps_per_epoch": self.steps_per_epoch,
                "samples_per_s": rate, "seconds": seconds, "workers": self.ctx.workers, "xla": cfg.xla,
                "best_epoch": best["epoch"] if best else None, f"best_{key}": best[key] if best else None,
                "resumed_from_step": resumed, "final_train_loss": records[-1]["loss"] if records else None,
                "mapping": cfg.test_mapping}, done_line


def train_epochs(run: EpochRun) -> bool:
    """Run the remaining steps; True when stop_after_steps ended the run."""
    cfg, ctx = run.cfg, run.ctx
    if run.micro_batches > 1:
        run.log(f"each worker's batch of {run.global_batch // ctx.workers} goes through {run.micro_batches} "
                "micro-batches (gradients summed)")
    train_step = make_train_step(run.model, run.optimizer, ctx.strategy, run.global_batch, cfg.xla,
                                 run.micro_batches)
    scorer = run.make_scorer() if ctx.is_chief else None
    meter = ProgressMeter(run.total_steps, run.step, run.global_batch)
    for epoch in range(run.step // run.steps_per_epoch, cfg.epochs):
        batches = run.epoch_batches(epoch, run.step - epoch * run.steps_per_epoch)
        # A resume mid-epoch carries on the epoch's loss from the checkpoint (summed in step order, as one run
        # sums it), so its record is the whole epoch's whether or not the run was interrupted.
        carried_loss, carried_steps, carried_seconds = run.state.partial_epoch(epoch, run.step)
        losses, started = [], time.perf_counter()
        folded = [carried_loss, 0]  # the loss sum so far, and how many of `losses` it holds (each read once)

        def so_far() -> tuple[float, int]:
            for x in losses[folded[1]:]:
                folded[0] += float(x)
            folded[1] = len(losses)
            return folded[0], carried_steps + len(losses)

        for inputs, labels in batches:
            losses.append(train_step(inputs, labels, tf.constant([cfg.seed, run.step], tf.int64)))
            run.step += 1
            if run.step % cfg.log_every_steps == 0:
                stats = meter.report(run.step)
                run.log(f"step {run.step}/{run.total_steps} epoch {epoch} loss {float(losses[-1]):.5f} samples/s "
                        f"{stats.samples_per_second:,.0f} eta {format_duration(stats.eta_seconds)}")
            if run.step % run.steps_per_epoch == 0:
                continue  # the epoch's end: recorded, evaluated and saved below, before any stop
            stop = _stop_requested(cfg, run.step)
            if stop or (cfg.checkpoint_every_steps and run.step % cfg.checkpoint_every_steps == 0):
                loss_sum, steps = so_far()
                run.save({"epoch": epoch, "step": run.step, "loss_sum": loss_sum, "steps": steps,
                          "seconds": carried_seconds + time.perf_counter() - started})
            if stop:
                run.log(f"stopping after step {run.step} (stop_after_steps): rerun to resume")
                return True
        seconds = time.perf_counter() - started
        run.train_seconds += seconds
        loss_sum, steps = so_far()
        loss = loss_sum / steps if steps else float("nan")
        if not np.isfinite(loss):
            raise FloatingPointError(f"epoch {epoch}: training loss is {loss}: the model diverged")
        rate = len(losses) * run.global_batch / max(seconds, 1e-9)
        record: dict[str, Any] = {"epoch": epoch, "step": run.step, "loss": loss, "samples_per_second": rate,
                                  "seconds": carried_seconds + seconds}
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            record.update(run.evaluate(scorer) or {})
        run.log(f"epoch {epoch} done: loss {loss:.5f}, {rate:,.0f} samples/s" + run.epoch_metrics_line(record))
        run.state.record(record)
        run.save()
        if _stop_requested(cfg, run.step) and epoch + 1 < cfg.epochs:
            run.log(f"stopping after step {run.step} (stop_after_steps): rerun to resume")
            return True
    return False


def _stop_requested(cfg: Any, step: int) -> bool:
    """Whether the stop_after_steps test hook ends the run at `step` (it saves first; a rerun resumes)."""
    return cfg.stop_after_steps is not None and step >= cfg.stop_after_steps


def finish(run: EpochRun, resumed: int | None, seconds: float) -> TrainResult:
    """The result of a run that trained all its steps; the chief writes the outputs while the others wait."""
    trained = run.step - (resumed or 0)
    rate = trained * run.global_batch / max(run.train_seconds, 1e-9)
    result = TrainResult(steps=run.step, epochs=run.cfg.epochs, workers=run.ctx.workers, resumed_from_step=resumed,
                         stopped=False, samples_per_second=rate, final_metrics={}, output_dir=run.out)
    run.log(f"worker {run.ctx.index}/{run.ctx.workers} finished: {run.step} steps", all_ranks=True)
    if run.ctx.is_chief:
        result.final_metrics, done_line = run.final_metrics(rate, seconds, resumed)
        write_final_outputs(result, run.state, run.save_model, run.plot_curves)
        run.log(done_line)
    barrier(run.ctx)  # nobody leaves the collective runtime while the chief still writes
    return result


def train_epoch_run(run: EpochRun, started: float, plan_line: str) -> TrainResult:
    """Resume `run` from its newest checkpoint, log `plan_line` + the starting step, train, finish. `started`: the
    perf_counter when the trainer began (the metrics' seconds)."""
    run.out.mkdir(parents=True, exist_ok=True)
    resumed = run.state.resume(run.description())
    run.step = resumed or 0
    run.log(f"{plan_line}, starting at step {run.step}")
    if train_epochs(run):
        return TrainResult.stopped_early(run.step, run.cfg.epochs, run.ctx.workers, resumed, run.out)
    return finish(run, resumed, time.perf_counter() - started)
