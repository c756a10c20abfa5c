"""Progress lines for the person reading the task log: rank-prefixed, flushed, with rates and ETA.

Lines go to stdout with print(flush=True) rather than through `logging`: under torchrun each worker's stdout is
piped through the launcher into the Airflow task log, and an unflushed buffer of a killed worker would be lost.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass


def format_duration(seconds: float) -> str:
    """H:MM:SS (or '?' when unknown)."""
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is sized)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


class RankLog:
    """Prints `[rank R] message` lines; only rank 0 prints unless `all_ranks=True` is passed per call."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __call__(self, message: str, all_ranks: bool = False) -> None:
        if self.rank == 0 or all_ranks:
            print(f"[rank {self.rank}] {message}", file=sys.stdout, flush=True)


@dataclass
class IntervalStats:
    step: int
    samples_per_second: float  # over the interval since the previous report
    eta_seconds: float


class ProgressMeter:
    """Rates over the last reporting interval and an ETA from the average rate since the meter started.

    `samples_per_step` is the global batch (all ranks), so the rate is the job's throughput, not one worker's.
    """

    def __init__(self, total_steps: int, start_step: int, samples_per_step: int) -> None:
        self.total_steps = total_steps
        self.samples_per_step = samples_per_step
        self._start_step = start_step
        self._start_time = time.perf_counter()
        self._last_step = start_step
        self._last_time = self._start_time

    def report(self, step: int) -> IntervalStats:
        now = time.perf_counter()
        interval = max(now - self._last_time, 1e-9)
        rate = (step - self._last_step) * self.samples_per_step / interval
        elapsed = max(now - self._start_time, 1e-9)
        steps_per_second = (step - self._start_step) / elapsed
        remaining = self.total_steps - step
        eta = remaining / steps_per_second if steps_per_second > 0 else float("inf")
        self._last_step, self._last_time = step, now
        return IntervalStats(step=step, samples_per_second=rate, eta_seconds=eta)

    def overall_samples_per_second(self, step: int) -> float:
        elapsed = max(time.perf_counter() - self._start_time, 1e-9)
        return (step - self._start_step) * self.samples_per_step / elapsed
