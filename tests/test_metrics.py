"""ROC AUC and logloss-from-logits: the numbers against independent computations, and the errors we promise.

The references here are written out from the definitions (AUC as the share of positive/negative pairs ranked right,
ties counting half; logloss as logaddexp(0, -/+z)), not scikit-learn, which the module itself calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from models.common import metrics
from models.common.metrics import StreamingPredictions, log_loss_from_logits, roc_auc


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting 1/2: every pair, by brute force."""
    labels = np.asarray(labels).astype(bool)
    positives, negatives = np.asarray(scores)[labels][:, None], np.asarray(scores)[~labels][None, :]
    return float(((positives > negatives) + 0.5 * (positives == negatives)).mean())


def exact_logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """-log sigmoid(z) for positives, -log(1 - sigmoid(z)) = log(1 + e^z) for negatives, without overflow."""
    z = np.asarray(logits, dtype=np.float64)
    return float(np.where(np.asarray(labels) == 1, np.logaddexp(0, -z), np.logaddexp(0, z)).mean())


@pytest.mark.parametrize("seed", range(3))
def test_auc_with_many_ties_counts_each_tie_half(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.random(3000) < 0.3
    # One decimal place: ~40 distinct scores for 3000 rows, so almost every pair across the classes is tied or not.
    scores = np.round(rng.normal(size=3000) + labels * 0.5, 1)
    assert len(np.unique(scores)) < 100
    assert roc_auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_auc_without_ties_in_float32_and_for_probabilities() -> None:
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 2, 4000)
    logits = (rng.normal(size=4000) + labels).astype(np.float32)
    assert roc_auc(labels, logits) == pytest.approx(pairwise_auc(labels, logits), abs=1e-12)
    # A monotone transform ranks the same: logits and probabilities give one AUC.
    assert roc_auc(labels, 1 / (1 + np.exp(-logits.astype(np.float64)))) == pytest.approx(roc_auc(labels, logits))


def test_auc_edge_cases() -> None:
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert roc_auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5  # all tied: chance
    assert roc_auc([0, 1, 0, 1], [0.1, 0.5, 0.5, 0.9]) == 0.875  # one tied pair of four: (3 + 0.5) / 4


def test_auc_refuses_one_class_naming_the_counts() -> None:
    with pytest.raises(ValueError, match="both classes; got 3 positives and 0 negatives"):
        roc_auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="got 0 positives and 2 negatives"):
        roc_auc(np.zeros(2, dtype=np.uint8), [0.1, 0.2])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scores_say_the_model_diverged(bad: float) -> None:
    for score in (roc_auc, log_loss_from_logits):
        with pytest.raises(ValueError, match=r"(NaN|infinite).*the model diverged"):
            score([0, 1, 0], np.array([0.1, bad, 0.3], dtype=np.float32))


def test_empty_and_mismatched_inputs_are_refused() -> None:
    for score in (roc_auc, log_loss_from_logits):
        with pytest.raises(ValueError, match="empty"):
            score([], [])
        with pytest.raises(ValueError, match="differ in length"):
            score([0, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="no predictions"):
        StreamingPredictions().compute()
    with pytest.raises(ValueError, match="batch of 2 labels but 3 logits"):
        StreamingPredictions().add(np.array([0, 1]), np.array([0.1, 0.2, 0.3]))


def test_logloss_matches_the_definition() -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 10000)
    logits = rng.normal(0, 6, 10000)  # up to |z| ~ 25: the far tails are where 1 - sigmoid(z) would cancel
    assert log_loss_from_logits(labels, logits) == pytest.approx(exact_logloss(labels, logits), rel=1e-9)
    assert log_loss_from_logits([1, 0], [0.0, 0.0]) == pytest.approx(np.log(2))
    assert log_loss_from_logits([1, 1], [0.0, 0.0]) == pytest.approx(np.log(2))  # one class is fine for logloss


def test_logloss_is_finite_for_extreme_logits() -> None:
    # Probabilities are clipped to [eps, 1 - eps], so a confidently wrong row costs -log(eps) ~ 36.04, not |z|,
    # and a confidently right one ~eps; never inf or NaN.
    loss = log_loss_from_logits(np.array([1, 0, 1, 0]), np.array([-800.0, 800.0, 800.0, -800.0]))
    cap = -np.log(np.finfo(np.float64).eps)
    assert np.isfinite(loss) and loss == pytest.approx((cap + cap) / 4, rel=1e-9)
    # Below the cap the loss is exact: a wrong guess at |z| = 30 costs 30 + log1p(e^-30).
    assert log_loss_from_logits([0], [30.0]) == pytest.approx(30.0, rel=1e-9)


def test_logloss_in_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 2, 1000)
    logits = rng.normal(0, 2, 1000)
    whole = log_loss_from_logits(labels, logits)
    monkeypatch.setattr(metrics, "LOGLOSS_CHUNK_ROWS", 64)  # 16 chunks, the last one short
    assert log_loss_from_logits(labels, logits) == pytest.approx(whole, rel=1e-12)
    monkeypatch.setattr(metrics, "LOGLOSS_CHUNK_ROWS", 2)  # a chunk of one class is scored too
    assert log_loss_from_logits(labels[:10], logits[:10]) == pytest.approx(exact_logloss(labels[:10], logits[:10]))


def test_streaming_equals_one_shot() -> None:
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 2, 3000).astype(np.float32)  # torch hands labels over as floats
    logits = np.round(rng.normal(size=3000) + labels, 2).astype(np.float32)
    stream = StreamingPredictions()
    for start in range(0, 3000, 512):  # last batch short, like an eval mapping
        stream.add(labels[start:start + 512], logits[start:start + 512].reshape(-1, 1))
    result = stream.compute()
    assert result == stream.compute()  # repeatable: the batches were merged, not consumed
    assert set(result) == {"auc", "logloss", "rows", "positive_rate"}
    assert result["rows"] == stream.rows == 3000
    assert result["auc"] == pytest.approx(pairwise_auc(labels, logits), abs=1e-12)
    assert result["logloss"] == pytest.approx(exact_logloss(labels, logits), rel=1e-9)
    assert result["positive_rate"] == pytest.approx(labels.mean())


def test_streaming_reports_one_class_with_counts() -> None:
    stream = StreamingPredictions()
    stream.add(np.ones(5), np.linspace(-1, 1, 5))
    stream.add(np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="got 8 positives and 0 negatives"):
        stream.compute()
