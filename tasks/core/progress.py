"""Progress lines for the person reading the task log, with counts, rates and ETA: `ProgressLog` for streaming
work in a task or Spark driver (downloads, validation, writers), `RankLog` + `ProgressMeter` for trainers.

Trainer lines go to stdout with print(flush=True) rather than through `logging`: under torchrun each worker's
stdout is piped through the launcher into the Airflow task log, and an unflushed buffer of a killed worker would
be lost.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
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


class ProgressLog:
    """Throttled progress lines for long streaming work, for the person reading the task log:

        writing train: 1200000/4000000 rows (30%), 85000 rows/s, ETA 0:00:33
        downloading s3://b/day_3: 1.2 GB of 15.0 GB (8%), 95.1 MB/s, ETA 0:02:25

    At most one line every `every_s` seconds; the rate is the average since the log started. `total` may be
    unknown (no percentage, no ETA) or learnt later (pass it to `report`). Bytes are shown in decimal MB/GB, as
    network and disk rates are quoted.
    """

    def __init__(self, what: str, *, total: int | None = None, unit: str = "rows", every_s: float = 5.0,
                 logger: logging.Logger | None = None, clock: Callable[[], float] = time.monotonic,
                 done: int = 0) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.done = self._base = done  # work already done when the log starts (a resume) does not count in rates
        self._logger = logger or logging.getLogger(__name__)
        self._clock = clock
        self._start = self._last = clock()

    def advance(self, amount: int, note: str = "") -> None:
        self.report(self.done + amount, note=note)

    def report(self, done: int, *, total: int | None = None, note: str = "", force: bool = False) -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = self._clock()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        self._logger.info("%s", self.line(now, note))

    def rate(self, now: float | None = None) -> float:
        return (self.done - self._base) / max((self._clock() if now is None else now) - self._start, 1e-9)

    def line(self, now: float, note: str = "") -> str:
        rate = self.rate(now)
        done = self._amount(self.done)
        if self.total:
            pct = f" ({100.0 * self.done / self.total:.0f}%)"
            eta = format_duration((self.total - self.done) / rate) if rate > 0 else "?"
            head = (f"{done} of {self._amount(self.total)}{pct}" if self.unit == "bytes"
                    else f"{self.done}/{self.total} {self.unit}{pct}")
            tail = f", ETA {eta}"
        else:
            head, tail = (done if self.unit == "bytes" else f"{self.done} {self.unit}"), ""
        shown_rate = f"{rate / 1e6:.1f} MB/s" if self.unit == "bytes" else f"{rate:.0f} {self.unit}/s"
        return f"{self.what}: {head}, {shown_rate}{tail}{f', {note}' if note else ''}"

    def _amount(self, count: int) -> str:
        if self.unit != "bytes":
            return str(count)
        return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"
