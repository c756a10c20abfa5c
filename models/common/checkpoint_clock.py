"""When a training loop takes a periodic checkpoint: every N steps, and/or once M minutes have passed since the last.

A step interval suits small runs (a test kills a worker after step N and expects a checkpoint there); at full scale a
step interval is either too dense or too sparse. A DLRM with NVIDIA's 1TB table sizes holds 16.7 GB of weights: one
`torch.save` took 26-29 s on an H200 machine, and 1,000 steps of batch 65536 take ~12 s there, so a checkpoint every
1,000 steps would spend twice as long saving as training (docs/PERFORMANCE-gpu.md). A time interval bounds both
what a retry loses (at most M minutes of training) and what saving costs (one save per M minutes: 27 s / 15 min =
3%), whatever the device, model size or batch.

Every process of a distributed run must agree (a sharded save, and TensorFlow's multi-worker save, are collective),
and the clocks of the processes differ. So the time interval is read on the main process only, at log intervals
(where the loop already waits for the device to report a loss), and `agree` hands its answer to the others.
"""
from __future__ import annotations

import time
from collections.abc import Callable


class CheckpointClock:
    """`due(step)`: whether to checkpoint after `step`; `saved()` restarts the time interval (any checkpoint does).

    every_steps: 0 = no step interval. every_minutes: 0 = no time interval; it is checked only at steps that are a
    multiple of `check_every` (the log interval). agree: the main process's answer on every process (a collective
    every process calls at the same steps; identity on one process). is_main: whether this process's clock counts.
    """

    def __init__(self, every_steps: int, every_minutes: float, check_every: int, *,
                 agree: Callable[[bool], bool] = lambda due: due, is_main: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        if every_steps < 0 or every_minutes < 0 or check_every < 1:
            raise ValueError(f"checkpoint interval: every_steps {every_steps} and every_minutes {every_minutes} must "
                             f"be >= 0, the check interval {check_every} >= 1")
        self.every_steps, self.every_seconds, self.check_every = every_steps, every_minutes * 60.0, check_every
        self._agree, self._is_main, self._clock = agree, is_main, clock
        self._last = clock()

    def due(self, step: int) -> bool:
        by_steps = bool(self.every_steps) and step % self.every_steps == 0
        if not self.every_seconds or step % self.check_every:
            return by_steps
        # Every process reaches the agreement at this step (whatever its step interval says), or a collective hangs.
        by_time = self._agree(self._is_main and self._clock() - self._last >= self.every_seconds)
        return by_steps or by_time

    def saved(self) -> None:
        self._last = self._clock()

    def describe(self) -> str:
        """The policy as a log line fragment: 'every 1000 steps and every 15 min', 'only at the end'."""
        parts = ([f"every {self.every_steps} steps"] if self.every_steps else []) + (
            [f"every {self.every_seconds / 60:g} min"] if self.every_seconds else [])
        return " and ".join(parts) or "only at the end"
