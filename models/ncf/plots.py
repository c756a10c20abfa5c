"""Training curves of a NeuMF run (mean loss and HR@k / NDCG@k per epoch) as a PNG next to its metrics.

models/common/plots.py draws loss + AUC for click models; ranking runs have no AUC, so this draws their two
metrics on the same headless matplotlib setup (Agg backend, a bare Figure, an atomic write).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from models.common.plots import plot_epoch_loss, save_figure  # sets the headless Agg backend


def plot_ranking_curves(records: Sequence[dict[str, Any]], path: Path, k: int, title: str = "NeuMF") -> Path:
    """records: one per epoch with `epoch`, `loss` and, on evaluated epochs, `hr@k` / `ndcg@k`."""
    figure = Figure(figsize=(10, 4), dpi=100)
    loss_axes, rank_axes = figure.subplots(1, 2)
    plot_epoch_loss(loss_axes, records)
    evals = [r for r in records if r.get(f"hr@{k}") is not None]
    for key, color in ((f"hr@{k}", "tab:green"), (f"ndcg@{k}", "tab:orange")):
        rank_axes.plot([r["epoch"] for r in evals], [r[key] for r in evals], "o-", color=color, label=key)
    rank_axes.set_xlabel("epoch")
    rank_axes.set_ylim(0, 1)
    rank_axes.set_title("leave-one-out ranking")
    rank_axes.grid(alpha=0.3)
    if evals:
        rank_axes.legend()
    return save_figure(figure, title, path)
