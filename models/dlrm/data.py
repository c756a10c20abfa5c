"""Split-binary batch reader (NVIDIA ParametricDataset semantics) with rank sharding and a prefetch thread.

One item = one whole batch: `os.preadv` of `batch_size` rows from every file of the mapping at the batch's offset,
straight into the batch's buffers, so no file is ever loaded whole and any batch can be read in any order (shuffling
whole batches, as NVIDIA's `--shuffle_batch_order` does; rows inside a batch keep file order). The last batch may
be short: evaluation keeps it, training may drop it. Unlike NVIDIA, which only compares batch counts, every file
must hold exactly the same number of rows, so a truncated file fails at open time with its name instead of crashing
on the last batch.

Two forms of a batch. `dataset.raw(i)` is the bytes as stored (float16 numericals, the categorical columns in one
[k, b] array per file dtype (int8/16/32), bool labels): no decoding at all, the form to ship to a GPU, which decodes
it on the device (`decode_batch`), as NVIDIA's loader does. `dataset[i]` decodes on the host (float32 numericals,
int32 ids, float32 labels) for CPU training, in the prefetch thread, so it overlaps the training step. Decoding
writes ~2.5x the bytes it reads (float16 -> float32, int8/16 -> int32), so it costs more than the read itself
(docs/PERFORMANCE.md, loader figure).

Consecutive batches (evaluation, unshuffled single-process training) are read as spans of ~SPAN_BYTES, one preadv
per file per span, and handed out as views: at a 4096-row batch the per-call costs of 28 small reads per batch were
as large as the copying. Every file of a span is read into one buffer that the dataset keeps and reuses once no batch
of that span is alive any more (`_SpanBuffers`): a batch stays valid for as long as the consumer holds it.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from tasks.formats.feature_spec import FeatureSpec

# (numerical float32 [b, n_num], categorical int32 [b, n_cat], label float32 [b]); categorical is a column-major
# view (the transpose of a [n_cat, b] tensor), so each column the embedding tables look up is contiguous. Indices are
# int32 (embedding lookups take int32 as fast as int64, at half the bytes to write) unless a file holds int64 ids.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class CategoricalGroup(NamedTuple):
    """The categorical columns of one file dtype in a raw batch: `values[j]` is feature `positions[j]` (int64)."""

    positions: torch.Tensor  # [k] int64: where these columns go in the [b, n_cat] categorical batch
    values: torch.Tensor     # [k, b] in the files' dtype (int8/int16/int32/int64)


# (numerical [b, n_num], categorical groups (one per file dtype), label [b]) in the files' own dtypes.
RawBatch = tuple[torch.Tensor, tuple[CategoricalGroup, ...], torch.Tensor]

# torch parallelises an element-wise copy above ~32k elements; for a batch-sized cast its thread hand-off costs
# far more than the copy (measured 7x slower on 2 cores), so host decoding casts in slices below that size.
_CAST_SLICE_ELEMENTS = 16_384
# Consecutive batches are read as one span of about this many bytes (one preadv per file), then handed out as views:
# a 4096-row Criteo batch is 28 reads of ~16 KB, where the per-call cost (syscall, array, tensor) is as large as
# the copy itself.
SPAN_BYTES = 4 << 20
# Span buffers a dataset keeps for reuse: a prefetch queue of depth 4, the span being read, the one the consumer
# iterates and the previous one whose last batch it may still hold. More live spans get fresh buffers.
SPAN_BUFFERS = 8
# Each file's region of a span buffer starts on a cache line.
_REGION_ALIGN = 64


@dataclass
class ReadStats:
    """Bytes and batches read, and seconds spent inside pread + decode (not waiting on the consumer)."""

    batches: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def batches_per_second(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _Column:
    """One open file of a mapping: fd, dtype, values per row."""

    def __init__(self, path: Path, dtype: np.dtype, width: int) -> None:
        self.path, self.dtype, self.width = path, dtype, width
        self.row_bytes = dtype.itemsize * width
        self.fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        if size % self.row_bytes:
            os.close(self.fd)
            raise ValueError(
                f"{path}: {size} bytes is not a whole number of {self.row_bytes}-byte rows ({dtype} x {width})"
            )
        self.rows = size // self.row_bytes

    def read_into(self, view: memoryview, first_row: int) -> None:
        """Fill the byte view `view` (a whole number of rows) from row `first_row` on."""
        want, offset, done = len(view), first_row * self.row_bytes, 0
        while done < want:  # preadv may return less (e.g. Linux caps one read at ~2 GiB); finish it
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                raise OSError(f"{self.path}: short read at row {first_row} ({done} of {want} bytes): file changed?")
            done += got


class _Group:
    """The categorical columns of one dtype: read together into one [k, rows] array per span (one tensor), which is
    what makes a batch of 26 columns cheap: per column only the preadv is left."""

    def __init__(self, dtype: np.dtype, positions: list[int], columns: list[_Column]) -> None:
        self.dtype, self.columns = dtype, columns
        self.positions = np.asarray(positions, dtype=np.int64)
        self.positions_tensor = torch.from_numpy(self.positions)


class _SpanArrays(NamedTuple):
    """The rows of one span, as stored: views of one buffer of the dataset's `_SpanBuffers`."""

    label: np.ndarray               # [rows]
    numerical: np.ndarray | None    # [rows, n_num]
    groups: list[np.ndarray]        # one [k, rows] per categorical group


class _SpanBuffers:
    """Byte buffers that spans are read into, each written again only once nothing made from its last span is alive.

    `take` hands out a fresh array over a kept buffer; every array, tensor and batch view made from a span keeps that
    array alive (numpy views keep their base, torch.from_numpy keeps the array, tensor views their storage), so a weak
    reference to it says when the consumer has dropped the span's last batch. A batch the consumer still holds is
    therefore never overwritten, and the reader needs no rule about when a batch is invalidated. One buffer per span
    instead of an array per file, kept instead of freed, made the reads ~10% faster (28 allocations a span less).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: list[tuple[np.ndarray, weakref.ref]] = []
        self._lock = threading.Lock()  # the prefetch thread and the consumer may both read

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` over a buffer that nothing alive refers to (a new one if none is free)."""
        with self._lock:
            free = [i for i, (_, handed_out) in enumerate(self._slots) if handed_out() is None]
            reusable = next((i for i in free if len(self._slots[i][0]) >= nbytes), None)
            if reusable is not None:
                buffer = self._slots[reusable][0]
            else:
                buffer = np.empty(nbytes, dtype=np.uint8)
                if len(self._slots) >= self.capacity and not free:
                    return buffer  # the consumer holds more spans than are kept: this one is not kept
            # An array whose base is a memoryview: numpy collapses every view made from it to this array, not to
            # `buffer`, so this array is alive exactly as long as something made from this span is.
            span = np.frombuffer(memoryview(buffer), dtype=np.uint8, count=nbytes)
            slot = (buffer, weakref.ref(span))
            if reusable is not None:
                self._slots[reusable] = slot
            elif len(self._slots) < self.capacity:
                self._slots.append(slot)
            else:
                self._slots[free[0]] = slot  # in place of a free buffer too small for this span
            return span

    def clear(self) -> None:
        with self._lock:
            self._slots = []


class SplitBinaryDataset:
    """Batches of one mapping of a split-binary dataset: `dataset[i]` reads batch i (a torch Dataset of batches)."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, drop_last_batch: bool = False,
                 pin_memory: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.mapping, self.batch_size = mapping, batch_size
        self._buffers = _SpanBuffers(SPAN_BUFFERS)
        spec.check_feature_spec(tf2_compatible=False)  # as NVIDIA's reader does; PT accepts int64 categoricals
        label_path, numerical_path, categorical_paths = spec.get_mapping_paths(mapping)
        label_name = spec.channel_spec["label"][0]
        numerical_names = spec.channel_spec["numerical"]
        self.categorical_names = list(spec.get_categorical_feature_names())
        if label_path is None or (numerical_names and numerical_path is None):
            raise ValueError(f"{spec.base_directory}: mapping {mapping!r} lacks the label or numerical file")
        self._columns: list[_Column] = []
        self._label = self._open(label_path, spec.feature_spec[label_name]["dtype"], 1)
        self._numerical = (
            self._open(numerical_path, spec.feature_spec[numerical_names[0]]["dtype"], len(numerical_names))
            if numerical_names
            else None
        )
        self._categorical = [
            self._open(categorical_paths[name], spec.feature_spec[name]["dtype"], 1) for name in self.categorical_names
        ]
        by_dtype: dict[np.dtype, list[int]] = {}
        for position, column in enumerate(self._categorical):
            by_dtype.setdefault(column.dtype, []).append(position)
        self._groups = [_Group(dtype, positions, [self._categorical[p] for p in positions])
                        for dtype, positions in by_dtype.items()]
        self.index_dtype = index_dtype_for([g.dtype for g in self._groups])
        # Raw batches in pinned host memory (a CUDA run): their copies to the GPU run asynchronously to the host.
        self._allocate = _pinned_bytes if pin_memory else None
        if pin_memory:
            for group in self._groups:
                group.positions_tensor = group.positions_tensor.pin_memory()
        self.rows = self._label.rows
        for column in self._columns:
            if column.rows != self.rows:
                self.close()
                raise ValueError(f"{column.path}: {column.rows} rows but {label_path} has {self.rows}: size mismatch")
        full, rest = divmod(self.rows, batch_size)
        self.num_batches = full if drop_last_batch or rest == 0 else full + 1
        self.bytes_per_row = sum(c.row_bytes for c in self._columns)
        self.stats = ReadStats()

    def _open(self, path: Path, dtype: str, width: int) -> _Column:
        try:
            column = _Column(path, np.dtype(dtype), width)
        except BaseException:
            self.close()
            raise
        self._columns.append(column)
        return column

    @property
    def num_numerical(self) -> int:
        return self._numerical.width if self._numerical is not None else 0

    def __len__(self) -> int:
        return self.num_batches

    @property
    def span_batches(self) -> int:
        """How many consecutive batches one read covers (about SPAN_BYTES per span, at least one batch). One with
        pinned memory: a batch of a longer span has its categorical columns strided ([k, b] of a [k, span] array),
        and torch copies a strided host tensor to the GPU through a pageable contiguous copy, synchronously. (At
        NVIDIA's batch of 65536 a batch is larger than SPAN_BYTES anyway.)"""
        if self._allocate is not None:
            return 1
        return max(1, SPAN_BYTES // max(1, self.batch_size * self.bytes_per_row))

    def _rows_of(self, first_index: int, count: int) -> tuple[int, int]:
        last = first_index + count - 1
        if count < 1 or not 0 <= first_index <= last < self.num_batches:
            which = f"batch {first_index}" if count == 1 else f"batches {first_index}..{last}"
            raise IndexError(f"{which} out of range: {self.mapping} has {self.num_batches} batches")
        first = first_index * self.batch_size
        return first, min(last * self.batch_size + self.batch_size, self.rows) - first

    def _count(self, rows: int, batches: int, started: float) -> None:
        self.stats.batches += batches
        self.stats.bytes += rows * self.bytes_per_row
        self.stats.seconds += time.perf_counter() - started

    def _regions(self, rows: int) -> tuple[list[tuple[np.dtype, tuple[int, ...], list[_Column]]], list[int], int]:
        """(dtype, shape, the files that fill it one after the other) of each region of a span of `rows` rows
        (label, numerical, then each group), where each starts in the span's buffer, and the buffer's size."""
        regions = [(self._label.dtype, (rows,), [self._label])]
        if self._numerical is not None:
            regions.append((self._numerical.dtype, (rows, self._numerical.width), [self._numerical]))
        regions += [(g.dtype, (len(g.columns), rows), g.columns) for g in self._groups]
        starts, end = [], 0
        for dtype, shape, _ in regions:
            starts.append(end)
            end += -(-math.prod(shape) * dtype.itemsize // _REGION_ALIGN) * _REGION_ALIGN
        return regions, starts, end

    def _fill(self, span: np.ndarray, first: int, rows: int,
              regions: list[tuple[np.dtype, tuple[int, ...], list[_Column]]], starts: list[int]) -> None:
        with memoryview(span) as view:
            for (_, _, files), start in zip(regions, starts):
                step = rows * files[0].row_bytes  # the files of a region share a dtype and width
                for j, column in enumerate(files):
                    column.read_into(view[start + j * step:start + (j + 1) * step], first)

    def _read(self, first: int, rows: int) -> _SpanArrays:
        """Rows first .. first+rows-1 of every file, one preadv per file, into one buffer of the pool."""
        regions, starts, end = self._regions(rows)
        span = self._buffers.take(end)
        self._fill(span, first, rows, regions, starts)
        arrays = [span[start:start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
                  for (dtype, shape, _), start in zip(regions, starts)]
        numerical = arrays.pop(1) if self._numerical is not None else None
        return _SpanArrays(arrays[0], numerical, arrays[1:])

    def _read_pinned(self, first: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """(label, numerical, groups) as `_read` reads them, but into a fresh buffer from `self._allocate` (pinned
        host memory) and as torch views of it.

        Not from the pool, and views of the allocator's own tensor rather than torch.from_numpy of numpy views:
        torch's pinned-memory allocator records, on every non_blocking copy out of a tensor it allocated (slices
        included), an event on the copying stream, and hands the block out again only after those events. A
        torch.from_numpy tensor over the same bytes is pinned too, but its storage is not the allocator's, so no
        event would be recorded and the next span could be read into the block while the GPU still copies it."""
        regions, starts, end = self._regions(rows)
        buffer = self._allocate(end)
        self._fill(buffer.numpy(), first, rows, regions, starts)
        tensors = [buffer[start:start + math.prod(shape) * dtype.itemsize].view(_torch_dtype(dtype)).reshape(shape)
                   for (dtype, shape, _), start in zip(regions, starts)]
        label = tensors.pop(0)
        numerical = tensors.pop(0) if self._numerical is not None else torch.empty((rows, 0), dtype=torch.float16)
        return label, numerical, tensors

    def raw_span(self, first_index: int, count: int) -> list[RawBatch]:
        """Batches first_index .. first_index+count-1 in the files' dtypes, read with one preadv per file; each
        batch is a view of the span's buffer, which is not reused while any batch of it is alive (the GPU path, see
        the module docstring)."""
        started = time.perf_counter()
        first, rows = self._rows_of(first_index, count)
        if self._allocate is not None:
            label, numerical, values = self._read_pinned(first, rows)
        else:
            arrays = self._read(first, rows)
            label, values = torch.from_numpy(arrays.label), [torch.from_numpy(v) for v in arrays.groups]
            numerical = (torch.from_numpy(arrays.numerical) if arrays.numerical is not None
                         else torch.empty((rows, 0), dtype=torch.float16))
        # Tensor.split makes all the views of a span in one call: slicing each batch in Python cost ~8.5 us a
        # batch (five views, three groups), a third of np.fromfile's ~27 us for the batch's bytes; split ~4.5 us.
        size = self.batch_size
        groups = [map(CategoricalGroup, repeat(g.positions_tensor), v.split(size, 1))
                  for g, v in zip(self._groups, values)]
        batches = list(zip(numerical.split(size), zip(*groups), label.split(size)))
        self._count(rows, count, started)
        return batches

    def span(self, first_index: int, count: int) -> list[Batch]:
        """Batches first_index .. first_index+count-1 decoded on the host (float32 numericals, int32 categoricals
        [b, n_cat] as column-major views, float32 labels), read with one preadv per file and decoded in one pass."""
        started = time.perf_counter()
        first, rows = self._rows_of(first_index, count)
        arrays = self._read(first, rows)  # stored bytes: dropped below, so the next span reuses the buffer
        label = torch.from_numpy(arrays.label.astype(np.float32))
        if arrays.numerical is not None:
            numerical = _cast(torch.from_numpy(arrays.numerical), torch.float32)
        else:
            numerical = torch.empty((rows, 0), dtype=torch.float32)
        columns = np.empty((len(self._categorical), rows), dtype=self.index_dtype)  # column-major: contiguous
        for group, values in zip(self._groups, arrays.groups):
            columns[group.positions] = values  # one widening copy per dtype
        categorical = torch.from_numpy(columns).T  # [rows, n_cat], column-major; its row slices stay so
        size = self.batch_size
        batches = list(zip(numerical.split(size), categorical.split(size), label.split(size)))
        self._count(rows, count, started)
        return batches

    def raw(self, index: int) -> RawBatch:
        """Batch `index` in the files' dtypes, no decoding (see the module docstring)."""
        return self.raw_span(index, 1)[0]

    def __getitem__(self, index: int) -> Batch:
        """Batch `index` decoded on the host: float32 numericals, int32 categoricals [b, n_cat], float32 labels."""
        return self.span(index, 1)[0]

    def close(self) -> None:
        for column in self._columns:
            try:
                os.close(column.fd)
            except OSError:
                pass
        self._columns = []
        self._buffers.clear()

    def __enter__(self) -> SplitBinaryDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pinned_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """tensor.to(dtype) on the host in row slices small enough that torch does not hand them to its thread pool."""
    out = torch.empty(tensor.shape, dtype=dtype)
    per_row = max(1, int(np.prod(tensor.shape[1:])))
    step = max(1, _CAST_SLICE_ELEMENTS // per_row)
    for start in range(0, len(tensor), step):
        out[start:start + step].copy_(tensor[start:start + step])
    return out


def index_dtype_for(dtypes: Sequence[np.dtype]) -> np.dtype:
    """The decoded categorical dtype for files of these dtypes: int32, or int64 if a file holds int64 ids."""
    return np.dtype(np.int64) if any(np.dtype(d).itemsize > 4 for d in dtypes) else np.dtype(np.int32)


def decode_batch(raw: RawBatch, device: torch.device) -> Batch:
    """A raw batch moved to `device` as stored (fewest bytes over the bus), then decoded there (the GPU path)."""
    numerical, groups, label = raw
    numerical = numerical.to(device, non_blocking=True).float()
    index_dtype = torch.int64 if any(g.values.element_size() > 4 for g in groups) else torch.int32  # as on the host
    columns = torch.empty((sum(len(g.positions) for g in groups), len(label)), dtype=index_dtype, device=device)
    for group in groups:
        columns.index_copy_(0, group.positions.to(device, non_blocking=True),
                            group.values.to(device, non_blocking=True).to(index_dtype))
    return numerical, columns.T, label.to(device, non_blocking=True).float()


def categorical_columns(raw: RawBatch) -> list[torch.Tensor]:
    """The categorical columns of a raw batch in feature order, each in its file dtype (for inspection)."""
    columns: dict[int, torch.Tensor] = {}
    for group in raw[1]:
        columns.update(zip(group.positions.tolist(), group.values))
    return [columns[i] for i in range(len(columns))]


def decodes_on_device(device: torch.device) -> bool:
    """Whether batches travel raw and are decoded on `device` (an accelerator) rather than in the prefetch thread."""
    return torch.device(device).type != "cpu"


def to_device(batch: Batch | RawBatch, device: torch.device) -> Batch:
    """A decoded batch on `device`: a raw batch (tuple of categorical groups) is decoded there first."""
    if isinstance(batch[1], tuple):
        return decode_batch(batch, device)
    return tuple(t.to(device, non_blocking=True) for t in batch)


def shard_batch_indices(
    num_batches: int,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    even: bool = True,
) -> list[int]:
    """The batch indices rank `rank` reads this epoch: batches r, r+world, ... of the (optionally shuffled) order.

    `even=True` (training) drops the remainder so every rank runs the same number of steps: a rank with one extra
    step would wait forever in DDP's all-reduce. Shuffling uses seed + epoch, identical on every rank.
    """
    order = np.arange(num_batches)
    if shuffle:
        order = np.random.default_rng(seed + epoch).permutation(num_batches)
    if even:
        order = order[: num_batches // world_size * world_size]
    return [int(i) for i in order[rank::world_size]]


_DONE = object()


def consecutive_runs(indices: Sequence[int], longest: int) -> Iterator[tuple[int, int]]:
    """(first, count) runs of consecutive indices, in order, each at most `longest` long."""
    start = count = 0
    for index in indices:
        if count and index == start + count and count < longest:
            count += 1
            continue
        if count:
            yield start, count
        start, count = index, 1
    if count:
        yield start, count


class PrefetchingReader:
    """Iterates dataset[i] (raw=True: dataset.raw(i)) for the given indices; with depth > 0 a thread reads up to
    `depth` reads ahead.

    Runs of consecutive indices (evaluation, unshuffled single-process training) are read as spans of up to
    `dataset.span_batches` batches (one read per file per span, ~SPAN_BYTES); the batches of a span are views of its
    arrays. The thread hands over whole spans (one queue hand-off per span, not per batch), so up to `depth` spans
    (or single batches, where indices are not consecutive) wait in the queue. preadv and the decoding casts release
    the GIL, so reading overlaps the training step. Errors in the thread are re-raised in the consumer; `close()` (or
    leaving a `with` block / breaking a for loop) stops the thread.
    """

    def __init__(self, dataset: SplitBinaryDataset, indices: Sequence[int], depth: int = 4, raw: bool = False) -> None:
        self.dataset, self.indices, self.depth = dataset, list(indices), depth
        self._fetch_span = dataset.raw_span if raw else dataset.span
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spans(self) -> Iterator[list[Batch | RawBatch]]:
        for first, count in consecutive_runs(self.indices, self.dataset.span_batches):
            yield self._fetch_span(first, count)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[Batch]:
        if self.depth <= 0:
            for span in self._spans():
                yield from span
            return
        self._thread = threading.Thread(target=self._produce, name="split-binary-prefetch", daemon=True)
        self._thread.start()
        try:
            while (item := self._queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:
            self.close()

    def _produce(self) -> None:
        try:
            for span in self._spans():
                if self._stop.is_set():
                    return
                self._put(span)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(exc)
            return
        self._put(_DONE)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> PrefetchingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
