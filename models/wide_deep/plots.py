"""Training curves of a Wide & Deep run: mean training loss, and MAP@k (with its random baseline) and AUC per
evaluated epoch, as a PNG next to its metrics (headless Agg backend, a bare Figure, an atomic write)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from models.common.plots import plot_epoch_loss, save_figure  # sets the headless Agg backend


def plot_wide_deep_curves(records: Sequence[dict[str, Any]], path: Path, k: int, title: str = "Wide & Deep") -> Path:
    """records: one per epoch with `epoch`, `loss` and, on evaluated epochs, `map@k`, `random_map@k`, `auc`."""
    figure = Figure(figsize=(13, 4), dpi=100)
    loss_axes, map_axes, auc_axes = figure.subplots(1, 3)
    plot_epoch_loss(loss_axes, records)
    evals = [r for r in records if r.get(f"map@{k}") is not None]
    epochs = [r["epoch"] for r in evals]
    map_axes.plot(epochs, [r[f"map@{k}"] for r in evals], "o-", color="tab:green", label=f"MAP@{k}")
    map_axes.plot(epochs, [r[f"random_map@{k}"] for r in evals], "--", color="tab:gray", label="random ranking")
    map_axes.set_xlabel("epoch")
    map_axes.set_title(f"MAP@{k} over displays")
    map_axes.grid(alpha=0.3)
    auc_axes.plot(epochs, [r["auc"] for r in evals], "o-", color="tab:orange")
    auc_axes.set_xlabel("epoch")
    auc_axes.set_title("ROC AUC")
    auc_axes.grid(alpha=0.3)
    if evals:
        map_axes.legend()
    return save_figure(figure, title, path)
