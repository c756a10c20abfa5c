"""Exact ROC AUC and logloss-from-logits against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from models.common.metrics import StreamingPredictions, log_loss_from_logits, roc_auc


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_with_many_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.random(5000) < 0.3
    # One decimal place: ~20 distinct scores for 5000 rows, so almost every score is tied.
    scores = np.round(rng.normal(size=5000) + labels * 0.5, 1)
    assert len(np.unique(scores)) < 100
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_matches_sklearn_without_ties_and_in_float32() -> None:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 2, 20000)
    scores = (rng.normal(size=20000) + labels).astype(np.float32)
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_edge_cases() -> None:
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert roc_auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5  # all tied: chance
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([0, 1], [0.1, float("nan")])


def test_logloss_matches_sklearn() -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 10000)
    logits = rng.normal(0, 3, 10000)
    probabilities = 1 / (1 + np.exp(-logits))
    assert log_loss_from_logits(labels, logits) == pytest.approx(log_loss(labels, probabilities), rel=1e-9)


def test_logloss_is_finite_for_extreme_logits() -> None:
    # Through probabilities these would be log(0); from logits the loss is exactly |z| for a wrong confident guess.
    loss = log_loss_from_logits(np.array([1, 0, 1, 0]), np.array([-800.0, 800.0, 800.0, -800.0]))
    assert loss == pytest.approx((800 + 800 + 0 + 0) / 4)


def test_streaming_equals_one_shot() -> None:
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 2, 3000)
    logits = np.round(rng.normal(size=3000) + labels, 2).astype(np.float32)
    stream = StreamingPredictions()
    for start in range(0, 3000, 512):  # last batch short, like an eval mapping
        stream.add(labels[start:start + 512], logits[start:start + 512])
    result = stream.compute()
    assert result["rows"] == 3000
    assert result["auc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-12)
    assert result["logloss"] == pytest.approx(log_loss_from_logits(labels, logits), rel=1e-12)
    assert result["positive_rate"] == pytest.approx(labels.mean())
    with pytest.raises(ValueError, match="no predictions"):
        StreamingPredictions().compute()
