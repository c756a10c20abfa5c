"""Quality gate between evaluation and publishing (TFX Evaluator's blessing, as a plain function).

A candidate passes when its metric clears an absolute threshold and is no worse than the currently published model
by more than `max_regression`. For metrics where lower is better (logloss), both comparisons flip: the threshold
is a ceiling and the baseline may be exceeded by at most `max_regression`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Comparisons allow this much slack so that a value exactly at a bound (0.75 - 0.005 vs 0.745) is not failed by
# floating-point rounding.
_EPS = 1e-12


@dataclass
class GateDecision:
    passed: bool
    reason: str  # one line, for the task log and the XCom
    metric: str
    value: float  # NaN when the metric is missing or not a number
    threshold: float
    baseline: float | None  # the published model's value, None when there is nothing to compare with


def _as_number(metrics: dict | None, metric: str) -> float | None:
    """The metric as a finite float, or None if it is missing, not a number, or NaN/inf."""
    if not metrics or metric not in metrics or isinstance(metrics[metric], bool):
        return None
    try:
        value = float(metrics[metric])
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def decide(metrics: dict, *, metric: str = "auc", min_value: float, baseline_metrics: dict | None,
           max_regression: float = 0.0, higher_is_better: bool = True) -> GateDecision:
    """Decide whether a candidate may be published.

    min_value: the absolute bar (a floor if higher_is_better, a ceiling otherwise).
    baseline_metrics: the published model's metrics (latest.json's "metrics"), None if nothing is published.
    max_regression: how much worse than the baseline the candidate may be, in the metric's units (>= 0).
    """
    if not math.isfinite(min_value):
        raise ValueError(f"gate threshold for {metric} must be a finite number, got {min_value!r}")
    if not (math.isfinite(max_regression) and max_regression >= 0):
        raise ValueError(f"gate max_regression for {metric} must be a finite number >= 0, got {max_regression!r}")
    sign = 1.0 if higher_is_better else -1.0
    better, worse = (">=", "<") if higher_is_better else ("<=", ">")

    def fail(value: float, baseline: float | None, reason: str) -> GateDecision:
        log.warning("gate failed: %s", reason)
        return GateDecision(False, reason, metric, value, min_value, baseline)

    value = _as_number(metrics, metric)
    if value is None:
        raw = metrics.get(metric, "missing") if metrics else "missing"
        return fail(math.nan, None, f"{metric} is {raw!r}, not a finite number "
                                    f"(evaluation metrics hold: {', '.join(sorted(metrics or {})) or 'nothing'})")
    if sign * (value - min_value) < -_EPS:
        return fail(value, None, f"{metric} {value:.4f} {worse} threshold {min_value:.4f}")

    baseline = _as_number(baseline_metrics, metric)
    if baseline is None:
        note = "nothing published yet" if not baseline_metrics else f"published model has no finite {metric}"
        reason = f"{metric} {value:.4f} {better} threshold {min_value:.4f} ({note}, threshold only)"
        log.info("gate passed: %s", reason)
        return GateDecision(True, reason, metric, value, min_value, None)

    allowed = baseline - sign * max_regression
    if sign * (value - allowed) < -_EPS:
        return fail(value, baseline, f"{metric} {value:.4f} {worse} {allowed:.4f}: worse than the published "
                                     f"model's {baseline:.4f} by more than the allowed {max_regression:.4f}")
    reason = (f"{metric} {value:.4f} {better} threshold {min_value:.4f} and {better} {allowed:.4f} "
              f"(published {baseline:.4f}, allowed regression {max_regression:.4f})")
    log.info("gate passed: %s", reason)
    return GateDecision(True, reason, metric, value, min_value, baseline)
