"""What a multi-worker training run keeps across restarts, and resumes from: its checkpoints (models.tfkit.checkpoint),
the run file `checkpoints/run.json` describing what they belong to, and the records of `train_log.jsonl`.

The run description is the trainer's: a dict whose "model" entry is the model's settings (a checkpoint of another
model is refused) and whose other entries are the settings that shape the sample order (batch size, seed, workers,
...; a change is allowed, with a warning). The chief writes the run file before each save; every worker saves
(the chief's copy is kept) and every worker restores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf

from models.common.train_log import append_record, read_records, write_records
from models.tfkit.checkpoint import WorkerCheckpoints
from models.tfkit.cluster import WorkerContext
from tasks.core.storage import write_text_atomic

RUN_FILE = "run.json"  # beside the checkpoints: the model shape and data layout they belong to


@dataclass
class TrainResult:
    steps: int
    epochs: int
    workers: int
    resumed_from_step: int | None
    stopped: bool  # stop_after_steps ended the run early: no final outputs
    samples_per_second: float
    final_metrics: dict[str, Any]
    output_dir: Path
    model_path: Path | None = None  # chief only
    metrics_path: Path | None = None
    log_path: Path | None = None
    plot_path: Path | None = None

    @classmethod
    def stopped_early(cls, step: int, epochs: int, workers: int, resumed: int | None, out: Path) -> TrainResult:
        """The result of a run that stop_after_steps ended at `step`: a checkpoint, no final outputs."""
        return cls(steps=step, epochs=epochs, workers=workers, resumed_from_step=resumed, stopped=True,
                   samples_per_second=0.0, final_metrics={}, output_dir=out)


class RunState:
    """OUT/checkpoints (tf.train checkpoints of `checkpoint`, which tracks `step_var`), its run.json, and the run's
    records (OUT/train_log.jsonl, written by the chief). `log` prints a line (rank-0 only)."""

    def __init__(self, out_dir: Path, checkpoint: tf.train.Checkpoint, step_var: tf.Variable, ctx: WorkerContext,
                 keep_checkpoints: int, log: Callable[[str], None]) -> None:
        self.out = Path(out_dir)
        self.checkpoints = WorkerCheckpoints(self.out / "checkpoints", checkpoint, ctx, keep_checkpoints)
        self.run_file = self.checkpoints.directory / RUN_FILE
        self.step_var = step_var
        self.ctx = ctx
        self.log = log
        self.records: list[dict[str, Any]] = []
        self.partial: dict[str, Any] | None = None  # the unfinished epoch of the checkpoint resumed from

    def resume(self, description: dict[str, Any]) -> int | None:
        """Restore the newest checkpoint, refusing one of another model; its step, or None for a fresh run."""
        path = self.checkpoints.latest()
        if path is None:
            return None
        saved = json.loads(self.run_file.read_text()) if self.run_file.is_file() else {}
        if saved.get("model") != description["model"]:
            raise ValueError(f"{path}: checkpoint of model {saved.get('model')} differs from this run's "
                             f"{description['model']}; use a new output_dir for a different model")
        changed = {k: f"{saved.get(k)!r} -> {v!r}" for k, v in description.items() if saved.get(k) != v}
        if changed:
            self.log(f"warning: resuming {Path(path).name} with changed settings {changed} (sample order differs)")
        self.checkpoints.restore_latest()
        step = int(self.step_var.numpy())
        partial = saved.get("partial_epoch")
        self.partial = partial if isinstance(partial, dict) and partial.get("step") == step else None
        records = read_records(self.out, step)
        if records is not None:
            self.records = records
            if self.ctx.is_chief:
                self.write_log()
        self.log(f"resumed from step {step} ({path})")
        return step

    def save(self, step: int, description: dict[str, Any], partial: dict[str, Any] | None = None) -> None:
        """Every worker saves together; the chief's copy is the one kept. `partial`: what the epoch that `step` falls
        inside has done so far (its epoch, step, loss sum, steps and seconds), for a resume to carry on."""
        self.step_var.assign(step)
        if self.ctx.is_chief:
            write_text_atomic(self.run_file, json.dumps({**description, "partial_epoch": partial}, indent=2))
        path = self.checkpoints.save(step)
        self.log(f"checkpoint step {step} -> {path}")

    def partial_epoch(self, epoch: int, step: int) -> tuple[float, int, float]:
        """(loss sum, steps, seconds) `epoch` had done before the checkpoint at `step` this run resumed from; zeros
        when it resumed at an epoch's start (or from a checkpoint that did not record them)."""
        partial = self.partial
        if partial and partial.get("epoch") == epoch and partial.get("step") == step:
            return float(partial["loss_sum"]), int(partial["steps"]), float(partial["seconds"])
        return 0.0, 0, 0.0

    def record(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.ctx.is_chief:
            append_record(self.out, record)

    def write_log(self) -> Path:
        """train_log.jsonl rewritten to hold exactly the records (the chief only)."""
        return write_records(self.out, self.records)


def check_run_arguments(dataset_dir: str, output_dir: str, batch_flag: str, global_batch: int, workers: int) -> None:
    """Refuse a run without its dataset and output folders, or whose global batch (the flag `batch_flag`) the
    workers cannot split evenly."""
    if not dataset_dir or not output_dir:
        raise ValueError("both --dataset_dir and --output_dir are required")
    if global_batch % workers:
        raise ValueError(f"{batch_flag} {global_batch} is not divisible by the {workers} workers")


def write_final_outputs(result: TrainResult, state: RunState, save_model: Callable[[], Path],
                        plot: Callable[[list[dict[str, Any]], Path], Path]) -> None:
    """The chief's outputs of a finished run, named on `result`: the model, train_log.jsonl, training_curves.png
    and, last, metrics.json (`result.final_metrics`): a metrics.json newer than the weights means they are complete."""
    result.model_path = save_model()
    result.log_path = state.write_log()
    result.plot_path = plot(state.records, state.out / "training_curves.png")
    result.metrics_path = state.out / "metrics.json"
    write_text_atomic(result.metrics_path, json.dumps(result.final_metrics, indent=2, sort_keys=True))
