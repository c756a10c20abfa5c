"""Split-binary batch reader (NVIDIA ParametricDataset semantics) with rank sharding and a prefetch thread.

One item = one whole batch: `os.pread` of `batch_size` rows from every file of the mapping at the batch's offset,
so no file is ever loaded whole and any batch can be read in any order (shuffling whole batches, as NVIDIA's
`--shuffle_batch_order` does; rows inside a batch keep file order). The last batch may be short: evaluation keeps
it, training may drop it. Unlike NVIDIA, which only compares batch counts, every file must hold exactly the same
number of rows, so a truncated file fails at open time with its name instead of crashing on the last batch.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tasks.feature_spec import FeatureSpec

# (numerical float32 [b, n_num], categorical int64 [b, n_cat], label float32 [b])
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


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

    def read(self, first_row: int, rows: int) -> np.ndarray:
        want, offset = rows * self.row_bytes, first_row * self.row_bytes
        data = os.pread(self.fd, want, offset)
        while 0 < len(data) < want:  # pread may return less (e.g. Linux caps one read at ~2 GiB); finish it
            more = os.pread(self.fd, want - len(data), offset + len(data))
            if not more:
                break
            data += more
        if len(data) != want:
            raise OSError(f"{self.path}: short read at row {first_row} ({len(data)} of {want} bytes): file changed?")
        return np.frombuffer(data, dtype=self.dtype)


class SplitBinaryDataset:
    """Batches of one mapping of a split-binary dataset: `dataset[i]` reads batch i (a torch Dataset of batches)."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, drop_last_batch: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.mapping, self.batch_size = mapping, batch_size
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

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} out of range: {self.mapping} has {self.num_batches} batches")
        started = time.perf_counter()
        first = index * self.batch_size
        rows = min(self.batch_size, self.rows - first)
        label = torch.from_numpy(self._label.read(first, rows).astype(np.float32))
        if self._numerical is not None:
            values = self._numerical.read(first, rows).reshape(rows, self._numerical.width)
            numerical = torch.from_numpy(values.astype(np.float32))
        else:
            numerical = torch.empty((rows, 0), dtype=torch.float32)
        categorical = np.empty((rows, len(self._categorical)), dtype=np.int64)
        for i, column in enumerate(self._categorical):
            categorical[:, i] = column.read(first, rows)
        self.stats.batches += 1
        self.stats.bytes += rows * self.bytes_per_row
        self.stats.seconds += time.perf_counter() - started
        return numerical, torch.from_numpy(categorical), label

    def close(self) -> None:
        for column in self._columns:
            try:
                os.close(column.fd)
            except OSError:
                pass
        self._columns = []

    def __enter__(self) -> SplitBinaryDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


class PrefetchingReader:
    """Iterates dataset[i] for the given indices; with depth > 0 a thread reads up to `depth` batches ahead.

    pread and numpy decoding release the GIL, so reading overlaps the training step. Errors in the thread are
    re-raised in the consumer; `close()` (or leaving a `with` block / breaking a for loop) stops the thread.
    """

    def __init__(self, dataset: SplitBinaryDataset, indices: Sequence[int], depth: int = 4) -> None:
        self.dataset, self.indices, self.depth = dataset, list(indices), depth
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[Batch]:
        if self.depth <= 0:
            for index in self.indices:
                yield self.dataset[index]
            return
        self._thread = threading.Thread(target=self._produce, name="split-binary-prefetch", daemon=True)
        self._thread.start()
        try:
            while (item := self._queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def _produce(self) -> None:
        try:
            for index in self.indices:
                if self._stop.is_set():
                    return
                self._put(self.dataset[index])
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
