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

`to_host_behind` is the way back, for evaluation: each batch's results are copied into pinned host memory without
blocking, and handed out one batch later, once the next batch's work is queued, so reading them never leaves the
GPU idle while the host waits (a `.cpu()` per batch drains the queue every batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np
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


def to_host_behind(results: Iterable[Moved], device: torch.device | str) -> Iterator[tuple[np.ndarray, ...]]:
    """Each item's tensors as numpy arrays, in order. On CUDA item N's copies are issued (non-blocking, into pinned
    buffers) as it arrives and waited for only after item N+1 was drawn from `results`, i.e. after N+1's kernels
    were queued; the arrays own their memory, not the pinned buffers'. Elsewhere it is `.cpu().numpy()` per tensor
    (no copy for a CPU tensor)."""
    if torch.device(device).type != "cuda":
        for tensors in results:
            yield tuple(tensor.detach().cpu().numpy() for tensor in tensors)
        return
    pending: tuple[tuple[torch.Tensor, ...], torch.cuda.Event] | None = None
    for tensors in results:
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
        for target, tensor in zip(host, tensors):
            target.copy_(tensor.detach(), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(device))  # the copies' stream: `device`'s, whichever is current
        if pending is not None:
            yield _read_back(*pending)
        pending = host, copied
    if pending is not None:
        yield _read_back(*pending)


def _read_back(host: tuple[torch.Tensor, ...], copied: torch.cuda.Event) -> tuple[np.ndarray, ...]:
    copied.synchronize()
    # Copied out so the pinned buffers go back to torch's caching host allocator instead of being held by the
    # caller's arrays (evaluation keeps every batch's logits: that would pin the whole test set).
    return tuple(tensor.numpy().copy() for tensor in host)
