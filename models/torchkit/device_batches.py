"""Batches moved to the training device one step ahead, on a side stream (CUDA), so the copy overlaps the step.

A training loop that moves its batch with `.to(device, non_blocking=True)` on the compute stream right before the
step waits twice on a GPU: the copy is ordered after the previous step's kernels, and from pageable host memory
the host itself blocks in it (the driver stages pageable bytes through its own pinned buffers), so the CPU queues
the next step's kernels only once the GPU has drained. `ahead_on_device` issues batch N+1's copy (and whatever
`move` does on the device: decoding, casts) on a side stream before it hands out batch N; the compute stream waits
only for batch N's own copy (an event recorded after it), and each moved tensor is marked as used by the compute
stream, so the caching allocator does not reuse its memory while the step still reads it. With the batch in pinned
host memory (`SplitBinaryDataset(..., pin_memory=True)`) nothing in it blocks the host.

Elsewhere (the CPU) it is `map(move, batches)`: no streams, same order, same values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch

In = TypeVar("In")
Moved = tuple[torch.Tensor, ...]


def ahead_on_device(batches: Iterable[In], move: Callable[[In], Moved], device: torch.device | str,
                    enabled: bool = True) -> Iterator[Moved]:
    """move(batch) for every batch, in order; on CUDA (with `enabled`) each one issued a batch ahead on a side
    stream. The consumer must use a batch before asking for the next one's successor, as a training loop does."""
    device = torch.device(device)
    if device.type != "cuda" or not enabled:
        yield from map(move, batches)
        return
    side, compute = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    pending: tuple[Moved, torch.cuda.Event] | None = None
    for batch in batches:
        with torch.cuda.stream(side):
            moved = move(batch)
            ready = torch.cuda.Event()
            ready.record(side)
        if pending is not None:
            yield _handed_over(*pending, compute)
        pending = moved, ready
    if pending is not None:
        yield _handed_over(*pending, compute)


def _handed_over(moved: Moved, ready: torch.cuda.Event, compute: torch.cuda.Stream) -> Moved:
    compute.wait_event(ready)
    for tensor in moved:
        tensor.record_stream(compute)
    return moved
