"""Binary click metrics for evaluation: exact ROC AUC and logloss over every prediction, computed by scikit-learn.

Memory, measured (tracemalloc over `compute()`, 5M and 20M rows added in 16384-row batches): `add()` holds 5 bytes
per row (float32 logit + uint8 label), and `compute()` peaks at 77 bytes per row in all when every score is distinct
(the worst case; 75.5 with 5M normally distributed float32 logits, 3.5% of them tied), i.e. ~72 bytes/row of
temporaries on top of what `add()` holds. Nearly all of it is `sklearn.metrics.roc_auc_score`'s: it one-hot encodes
the labels to int64 (label_binarize), sorts the scores (an int64 permutation plus sorted copies) and keeps float64
cumulative true/false positive counts per distinct score. Logloss runs in chunks of LOGLOSS_CHUNK_ROWS rows
(sklearn's log_loss over everything at once would need ~106 bytes/row: two-column float64 probabilities, clipped
copies, one-hot labels), so it adds a constant ~110 MB rather than a per-row cost. The per-batch arrays are dropped
once concatenated. A 90M-row test set (half a day of a 1TB click log) needs ~7 GB at the peak of
`compute()`; that fits one worker, so we compute the exact AUC instead of a binned approximation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import expit
from sklearn.metrics import log_loss, roc_auc_score

# Rows per sklearn log_loss call: bounds its temporaries (~106 bytes/row) to ~110 MB whatever the dataset size.
LOGLOSS_CHUNK_ROWS = 1 << 20


def _validated(labels: np.ndarray, scores: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Flat labels and scores of equal, non-zero length, with every score finite (our messages, not sklearn's)."""
    y = np.asarray(labels).reshape(-1)
    s = np.asarray(scores).reshape(-1)
    if y.size == 0 or s.size == 0:
        raise ValueError(f"{'labels' if y.size == 0 else name} is empty: no predictions to score")
    if y.shape != s.shape:
        raise ValueError(f"labels ({y.size}) and {name} ({s.size}) differ in length")
    if np.issubdtype(s.dtype, np.floating) and not np.isfinite(s).all():
        nan, inf = int(np.isnan(s).sum()), int(np.isinf(s).sum())
        raise ValueError(f"{name} hold {nan} NaN and {inf} infinite values: the model diverged")
    return y, s


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (tied scores count half, as the Mann-Whitney U does), by sklearn.metrics.roc_auc_score.

    Any monotone score works (logits or probabilities). Raises ValueError if only one class is present, because the
    AUC is undefined then, naming how many rows of each class there were.
    """
    y, s = _validated(labels, scores, "scores")
    positives = int(np.count_nonzero(y))
    if positives in (0, y.size):
        raise ValueError(f"ROC AUC needs both classes; got {positives} positives and {y.size - positives} negatives")
    return float(roc_auc_score(y, s))


def log_loss_from_logits(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits, by sklearn.metrics.log_loss on probabilities from scipy's expit.

    Both probability columns come straight from the logit (P(0) = expit(-z), not 1 - expit(z)), so neither loses
    precision to cancellation and neither overflows. sklearn clips probabilities to [eps, 1 - eps] (float64 eps), so
    a row's loss is exact up to |z| ~ 36 and capped at -log(eps) ~ 36.04 beyond: the usual convention for published
    click-log logloss, and a confidently wrong |logit| > 36 only comes from a model that is broken either way.
    """
    y, z = _validated(labels, logits, "logits")
    total = 0.0
    for start in range(0, y.size, LOGLOSS_CHUNK_ROWS):
        chunk = z[start:start + LOGLOSS_CHUNK_ROWS].astype(np.float64)
        probabilities = np.column_stack((expit(-chunk), expit(chunk)))
        total += log_loss(y[start:start + LOGLOSS_CHUNK_ROWS], probabilities, labels=[0, 1], normalize=False)
    return total / y.size


@dataclass
class StreamingPredictions:
    """Collects (label, logit) per batch; `compute()` scores them all at once (exact AUC needs a global sort)."""

    _labels: list[np.ndarray] = field(default_factory=list)
    _logits: list[np.ndarray] = field(default_factory=list)
    rows: int = 0

    def add(self, labels: np.ndarray, logits: np.ndarray) -> None:
        labels = np.asarray(labels).reshape(-1)
        logits = np.asarray(logits, dtype=np.float32).reshape(-1)
        if labels.shape != logits.shape:
            raise ValueError(f"batch of {labels.size} labels but {logits.size} logits")
        self._labels.append(labels.astype(np.uint8))
        self._logits.append(logits)
        self.rows += labels.size

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(labels uint8, logits float32) of every row added so far, in the order added."""
        if not self._labels:
            raise ValueError("no predictions were added: the evaluation dataset yielded no batches")
        # One array each, kept in place of the per-batch ones so those are freed (and compute() can run again).
        labels, logits = np.concatenate(self._labels), np.concatenate(self._logits)
        self._labels, self._logits = [labels], [logits]
        return labels, logits

    def compute(self) -> dict[str, float]:
        """{'auc', 'logloss', 'rows', 'positive_rate'} over everything added."""
        labels, logits = self.arrays()
        return {
            "auc": roc_auc(labels, logits),
            "logloss": log_loss_from_logits(labels, logits),
            "rows": int(labels.size),
            "positive_rate": float(labels.mean()),
        }
