"""Training-curve plot (loss and eval AUC vs step) written as a PNG next to the run's metrics.

Uses matplotlib's Agg backend: training runs on headless workers with no display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402  (after choosing the backend)

from tasks.core.storage import atomic_file  # noqa: E402


def plot_training_curves(records: Sequence[dict[str, Any]], path: Path, title: str = "training") -> Path:
    """Plot `loss` (records with kind 'train') and `auc` (kind 'eval') against `step`; atomic PNG write. A run
    that evaluated nothing (a pipeline's trainer: its evaluate task scores the model) gets the loss panel alone.

    Uses a bare Figure (not pyplot) so repeated calls in one process keep no global figure state.
    """
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("auc") is not None]
    figure = Figure(figsize=(10 if evals else 5, 4), dpi=100)
    loss_axes, auc_axes = figure.subplots(1, 2) if evals else (figure.subplots(1, 1), None)
    if train:
        loss_axes.plot([r["step"] for r in train], [r["loss"] for r in train], color="tab:blue", label="train loss")
        loss_axes.legend()
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("logloss (interval mean)")
    loss_axes.set_title("training loss")
    loss_axes.grid(alpha=0.3)
    if auc_axes is not None:
        auc_axes.plot([r["step"] for r in evals], [r["auc"] for r in evals], "o-", color="tab:green", label="eval AUC")
        auc_axes.legend()
        auc_axes.set_xlabel("step")
        auc_axes.set_ylabel("ROC AUC")
        auc_axes.set_title("evaluation AUC")
        auc_axes.grid(alpha=0.3)
    return save_figure(figure, title, path)


def plot_epoch_loss(axes: Any, records: Sequence[dict[str, Any]]) -> None:
    """The panel of an epoch-evaluated run's training loss: each epoch's mean against its number."""
    axes.plot([r["epoch"] for r in records], [r["loss"] for r in records], "o-", color="tab:blue", label="train loss")
    axes.set_xlabel("epoch")
    axes.set_ylabel("BCE (epoch mean)")
    axes.set_title("training loss")
    axes.grid(alpha=0.3)


def save_figure(figure: Figure, title: str, path: Path) -> Path:
    """The figure titled, laid out and written as a PNG at `path` (atomically); the path."""
    figure.suptitle(title)
    figure.tight_layout()
    with atomic_file(path, "wb") as f:
        figure.savefig(f, format="png")
    return path
