"""Fail a training run early when its measured rate says it cannot finish in the time its task has left.

A scheduled run of NVIDIA's full recipe (4.4B rows a window) trains in ~15 min on an H200; on a CPU at the ~4,900
samples/s measured here it would need ~250 h, and would only fail when its task's execution_timeout ran out on every
attempt (days later). The train task passes what its attempts have left (`time_budget_s`); the trainer compares it,
at log intervals once `MIN_MEASURED_S` of training have set the rate, with the time the run needs (trained so far +
its eta), and stops with one line (TOO_SLOW) that the launcher turns into a failure without retry.
"""
from __future__ import annotations

import time

from tasks.core.process import ERROR_MARKER, TOO_SLOW
from tasks.core.progress import ProgressMeter, format_duration

MIN_MEASURED_S = 300.0  # training seconds before the rate is trusted (start-up, warm-up, first evaluations)


def too_slow(budget_s: float, trained_s: float, eta_s: float, samples_per_s: float) -> str | None:
    """The failure's line when a run that has trained `trained_s` seconds in this attempt and needs `eta_s` more
    cannot finish within `budget_s` (seconds this attempt and its retries have: 0 = no budget); else None."""
    if budget_s <= 0 or trained_s < MIN_MEASURED_S:
        return None
    needed = trained_s + eta_s  # leaves out the evaluations and checkpoints still to come: errs towards going on
    if needed <= budget_s:
        return None
    return (f"{TOO_SLOW} at {samples_per_s:,.0f} samples/s this run needs ~{format_duration(needed)}, more than the "
            f"{format_duration(budget_s)} its task has left over its attempts (execution_timeout x attempts): train "
            "on a GPU (device), with more processes (nproc), or on fewer rows (a shorter window, limit_train_batches)")


def measured_too_slow(budget_s: float, meter: ProgressMeter, step: int, started: float) -> str | None:
    """`too_slow` for a training loop that started at `started` (perf_counter) and is at `step`: the rate is the
    meter's since it started (evaluations and checkpoints included), the eta the steps left at that rate."""
    if budget_s <= 0:
        return None
    rate = meter.overall_samples_per_second(step)
    eta = (meter.total_steps - step) * meter.samples_per_step / max(rate, 1e-9)
    return too_slow(budget_s, time.perf_counter() - started, eta, rate)


# What a process that did not measure says when the main process's verdict reaches it only as a flag (TF's sum).
AGREED_TOO_SLOW = f"{TOO_SLOW} the main process's measured rate says this run cannot finish in its time budget"


class TrainingTooSlowError(RuntimeError):
    """Raised on every process of a run that `too_slow` stopped (after the line was printed: stop_if_too_slow)."""


def stop_if_too_slow(reason: str | None, prints: bool) -> None:
    """The agreed verdict of every process: each process that `prints` writes the line for its node's launcher
    (the first process of each node: every node's launcher fails without retry), every process stops."""
    if reason is None:
        return
    if prints:
        print(f"{ERROR_MARKER} {reason}", flush=True)
    raise TrainingTooSlowError(reason)
