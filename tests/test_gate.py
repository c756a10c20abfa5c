"""The quality gate: absolute threshold, no-worse-than-published, NaN/missing metrics, lower-is-better metrics."""

from __future__ import annotations

import math

import pytest

from tasks.release.gate import decide


def test_threshold_only_passes_and_fails_with_one_line_reasons():
    passed = decide({"auc": 0.8012}, min_value=0.75, baseline_metrics=None)
    assert passed.passed and passed.baseline is None
    assert passed.value == pytest.approx(0.8012) and passed.threshold == 0.75
    assert "nothing published yet" in passed.reason

    failed = decide({"auc": 0.7012}, min_value=0.75, baseline_metrics=None)
    assert not failed.passed
    assert failed.reason == "auc 0.7012 < threshold 0.7500"
    assert "\n" not in passed.reason + failed.reason


def test_threshold_failure_wins_even_when_better_than_baseline():
    decision = decide({"auc": 0.70}, min_value=0.75, baseline_metrics={"auc": 0.60})
    assert not decision.passed and "threshold" in decision.reason


@pytest.mark.parametrize(
    "value, passed",
    [(0.7600, True), (0.7500, True), (0.7460, True), (0.7450, True), (0.7449, False), (0.7300, False)],
)
def test_baseline_regression_within_and_beyond_tolerance(value, passed):
    decision = decide({"auc": value}, min_value=0.70, baseline_metrics={"auc": 0.75}, max_regression=0.005)
    assert decision.passed is passed, decision.reason
    assert decision.baseline == 0.75
    if not passed:
        assert "published model's 0.7500" in decision.reason and "0.0050" in decision.reason


def test_zero_tolerance_rejects_any_regression():
    assert decide({"auc": 0.75}, min_value=0.5, baseline_metrics={"auc": 0.75}).passed
    assert not decide({"auc": 0.7499}, min_value=0.5, baseline_metrics={"auc": 0.75}).passed


@pytest.mark.parametrize("metrics", [{"auc": math.nan}, {"auc": math.inf}, {"auc": "n/a"}, {"logloss": 0.4}, {}])
def test_nan_or_missing_metric_fails_clearly(metrics):
    decision = decide(metrics, min_value=0.5, baseline_metrics={"auc": 0.6})
    assert not decision.passed
    assert math.isnan(decision.value)
    assert decision.reason.startswith("auc is ") and "not a finite number" in decision.reason


def test_baseline_without_the_metric_falls_back_to_threshold():
    decision = decide({"auc": 0.8}, min_value=0.75, baseline_metrics={"logloss": 0.44, "auc": math.nan})
    assert decision.passed and decision.baseline is None
    assert "published model has no finite auc" in decision.reason


def test_lower_is_better_logloss():
    kwargs = dict(metric="logloss", min_value=0.45, higher_is_better=False, max_regression=0.002)
    assert decide({"logloss": 0.440}, baseline_metrics={"logloss": 0.441}, **kwargs).passed
    assert decide({"logloss": 0.443}, baseline_metrics={"logloss": 0.441}, **kwargs).passed  # within 0.002

    too_high = decide({"logloss": 0.4600}, baseline_metrics=None, **kwargs)
    assert not too_high.passed and too_high.reason == "logloss 0.4600 > threshold 0.4500"

    regressed = decide({"logloss": 0.444}, baseline_metrics={"logloss": 0.441}, **kwargs)
    assert not regressed.passed and "logloss 0.4440 > 0.4430" in regressed.reason


@pytest.mark.parametrize("bad", [dict(min_value=math.nan), dict(min_value=0.5, max_regression=-0.1)])
def test_invalid_gate_configuration_raises(bad):
    with pytest.raises(ValueError):
        decide({"auc": 0.8}, baseline_metrics=None, **bad)
