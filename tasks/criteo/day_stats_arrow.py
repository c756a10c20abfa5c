"""criteo_day_stats written by pyarrow from the good rows validation has already parsed: the day is parsed once.

The output is the dataset spark_jobs/criteo/day_stats.py writes, field for field (type and nullability):
  columnar/part-NNNNN.parquet  label int8, int_* int64, cat_* string (empty -> null), row_order int64 not null =
                               the good row's dense index in file order (0..good-1). Row groups of whole validation
                               blocks, cut once they hold `row_group_rows` rows (~64 MiB of TSV: one row group is one
                               pass-1 job of the arrow preprocess, whatever the validation block); a new part file every
                               `row_groups_per_part` row groups.
  counts/part-00000.parquet    column int32 not null (categorical index 0..25), value string, count int64 not null;
                               one row per (column, value) seen; missing values are not counted.
  _MANIFEST.json               kind criteo_day_stats, rows.good, extra.day / distinct_values / engine = "arrow".

Memory is bounded by one row group (the typed blocks it is written from), whatever the day's size. A categorical
value is 8 lowercase hex characters, so a (column, value) pair is one uint64 key, column << 32 | int(value, 16).
Each block counts its values column by column on their raw 8 bytes (one uint64 each, no parsing) and turns only the
distinct ones into keys; the (key, count) pairs pile up to a bounded buffer, which is then combined and spilled,
split by a hash of the key into bucket files inside the output's temporary directory. At the end each bucket is
combined on its own (one bucket in memory at a time) and appended to the counts file.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.criteo.contract import COLUMNAR, COUNTS, ROW_ORDER
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest
from tasks.criteo.raw_fields import binary_parts
from tasks.criteo.raw_rows import checked_blocks
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL

log = logging.getLogger(__name__)

ENGINE = "arrow"
ROW_GROUP_ROWS = 1 << 18      # ~60 MiB of TSV, what one 64 MiB validation block held before blocks were 16 MiB
ROW_GROUPS_PER_PART = 16      # parts of ~300 MB of parquet
SPILL_BUFFER_PAIRS = 1 << 23  # (key, count) pairs held before a spill: 8Mi x 16 bytes = 128 MiB
SPILL_BUCKETS = 256           # a real day's spill (~10-20 GB) is combined 1/256 at a time
COUNTS_ROW_GROUP = 1 << 20
SPILL_DIR = "_spill"
_SPILL_PAIR = np.dtype([("key", "<u8"), ("count", "<u4")])  # a spill holds at most one buffer's rows per pair
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads the column bits over the buckets
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_HEX_VALUE = np.zeros(256, dtype=np.uint8)
_HEX_VALUE[_HEX_DIGITS] = np.arange(16, dtype=np.uint8)

COLUMNAR_SCHEMA = pa.schema(
    [pa.field(LABEL, pa.int8())]
    + [pa.field(name, pa.int64()) for name in INT_COLUMNS]
    + [pa.field(name, pa.string()) for name in CAT_COLUMNS]
    + [pa.field(ROW_ORDER, pa.int64(), nullable=False)]
)
# Min/max statistics only where a reader can use them (row_order: the test day's split by row_order range, ints):
# of 8-hex-character categoricals they prune nothing, and computing them is ~20% of the columnar write (0.2 s of CPU
# per 1M rows, issue #27 round 4).
COLUMNAR_STATISTICS = [LABEL, *INT_COLUMNS, ROW_ORDER]
COUNTS_SCHEMA = pa.schema([pa.field("column", pa.int32(), nullable=False), pa.field("value", pa.string()),
                           pa.field("count", pa.int64(), nullable=False)])


@dataclass(frozen=True)
class StatsTarget:
    """Where one day's stats go (layout.stats_day) and what their manifest records as inputs."""

    path: Path
    day: int
    inputs: dict[str, Any]


# ---- one block of good rows -> typed columns and categorical keys --------------------------------------------------


def _nullable_strings(offsets: np.ndarray, data: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The values as a string array with empty -> null (Spark's empty_to_null), and the mask of present values."""
    present = offsets[1:] != offsets[:-1]
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(pa.string(), len(present), [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                  null_count=len(present) - int(np.count_nonzero(present)))
    return array, present


def hex_keys(data: np.ndarray, column: int) -> np.ndarray:
    """uint64 keys column << 32 | value of a run of 8-hex-character values (their bytes back to back)."""
    nibbles = _HEX_VALUE[data].reshape(-1, 8)
    packed = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    values = np.ascontiguousarray(packed).view(">u4").reshape(-1)
    return values.astype(np.uint64) | np.uint64(column << 32)


def hex_strings(values: np.ndarray) -> pa.Array:
    """uint32 values as 8 lowercase hex characters each (the inverse of hex_keys' value part)."""
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    chars = _HEX_DIGITS[(values.astype(np.uint32)[:, None] >> shifts) & np.uint32(0xF)]
    offsets = np.arange(0, 8 * len(values) + 1, 8, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(chars)])


@dataclass(frozen=True)
class TypedRows:
    """One block's good rows typed as the Spark job types them, row_order not yet added (it needs the rows before)."""

    arrays: list[pa.Array]  # COLUMNAR_SCHEMA's columns but row_order
    keys: np.ndarray        # the distinct (column, value) keys of their categoricals
    counts: np.ndarray      # how many of the rows hold each key
    num_rows: int


def value_counts(data: np.ndarray, column: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, counts) of a run of 8-hex-character values (their bytes back to back) of one column.

    The values are counted on their raw bytes, read as one uint64 each (equal bytes, equal number), by pandas' hash
    table; only the distinct ones are turned into keys: ~3.5x less CPU than parsing every value first (issue #27)."""
    import pandas as pd

    codes, distinct = pd.factorize(data.view("<u8"))
    counts = np.bincount(codes, minlength=len(distinct))
    return hex_keys(np.ascontiguousarray(distinct, dtype="<u8").view(np.uint8), column), counts


def type_rows(good: pa.Table) -> TypedRows:
    """The good rows (40 binary columns, as check_block keeps them) typed, and their categoricals' keys. A pure
    function of the block: checked_blocks runs it in its helper thread, beside the writer's parquet and counts."""
    arrays: list[pa.Array] = []
    offsets, data = binary_parts(good.column(LABEL))
    if len(data) != good.num_rows:
        raise ValueError("label values must be one character each; the rows were not validated")
    arrays.append(pa.array((data - ord("0")).astype(np.int8)))
    for name in INT_COLUMNS:
        strings, _ = _nullable_strings(*binary_parts(good.column(name)))
        arrays.append(pc.cast(strings, pa.int64()))
    keys, counts = [], []
    for index, name in enumerate(CAT_COLUMNS):
        offsets, data = binary_parts(good.column(name))
        strings, present = _nullable_strings(offsets, data)
        if len(data) != 8 * int(np.count_nonzero(present)) or np.any(np.diff(offsets)[present] != 8):
            raise ValueError(f"{name} holds values that are not 8 characters; the rows were not validated")
        arrays.append(strings)
        column_keys, column_counts = value_counts(data, index)
        keys.append(column_keys)
        counts.append(column_counts)
    return TypedRows(arrays, np.concatenate(keys), np.concatenate(counts), good.num_rows)


def numbered(typed: TypedRows, first_row: int) -> pa.Table:
    """The typed rows as a COLUMNAR_SCHEMA table, row_order numbered from `first_row`."""
    row_order = pa.array(np.arange(first_row, first_row + typed.num_rows, dtype=np.int64))
    return pa.Table.from_arrays([*typed.arrays, row_order], schema=COLUMNAR_SCHEMA)


# ---- exact counts in bounded memory --------------------------------------------------------------------------------


def combine(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and the (uint64) sum of each one's counts."""
    if len(keys) == 0:
        return keys.astype(np.uint64), counts.astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order].astype(np.uint64)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.add.reduceat(counts, starts)


def fibonacci_buckets(keys: np.ndarray, bits: int) -> np.ndarray:
    """A bucket in 0..2**bits - 1 (uint64) of each uint64 key: the top bits of key x the golden-ratio multiplier,
    so keys that differ only in their low bits (8 hex characters read as a number) spread over every bucket."""
    return (keys * _HASH_MULTIPLIER) >> np.uint64(64 - bits)


class KeyCounter:
    """Exact counts of uint64 keys: a bounded buffer of (key, count) pairs, spilled by key hash into bucket files."""

    def __init__(self, spill_dir: Path, *, buffer_pairs: int = SPILL_BUFFER_PAIRS, buckets: int = SPILL_BUCKETS):
        if buckets & (buckets - 1) or not 2 <= buckets <= 1 << 16:
            raise ValueError(f"buckets={buckets}: expected a power of two from 2 to 65536")
        self.spill_dir, self.buffer_pairs, self.buckets = spill_dir, buffer_pairs, buckets
        self._keys: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []
        self._buffered = 0
        self.spilled_pairs = 0

    def add(self, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count `keys` (each once), or, with `counts`, add counts[i] to distinct keys[i]."""
        if counts is None:
            import pandas as pd

            # pandas' hash table: ~4x faster than np.unique's sort on a block's ~5M keys
            codes, keys = pd.factorize(keys)
            counts = np.bincount(codes, minlength=len(keys))
        self._keys.append(np.asarray(keys, dtype=np.uint64))
        self._counts.append(counts.astype(np.uint32))
        self._buffered += len(keys)
        if self._buffered >= self.buffer_pairs:
            self._spill()

    def _combined_buffer(self) -> tuple[np.ndarray, np.ndarray]:
        keys, counts = combine(np.concatenate(self._keys or [np.empty(0, np.uint64)]),
                               np.concatenate(self._counts or [np.empty(0, np.uint32)]))
        self._keys, self._counts, self._buffered = [], [], 0
        return keys, counts

    def _bucket_of(self, keys: np.ndarray) -> np.ndarray:
        return fibonacci_buckets(keys, self.buckets.bit_length() - 1).astype(np.uint16)

    def _spill(self) -> None:
        keys, counts = self._combined_buffer()
        if counts.size and counts.max() > np.iinfo(np.uint32).max:
            raise OverflowError("a spill buffer counted one key more than 2**32 times; lower buffer_pairs")
        pairs = np.empty(len(keys), dtype=_SPILL_PAIR)
        pairs["key"], pairs["count"] = keys, counts
        bucket = self._bucket_of(keys)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.buckets + 1))
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        for b in np.flatnonzero(np.diff(bounds)):
            with open(self.spill_dir / f"bucket-{b:05d}", "ab") as f:
                pairs[order[bounds[b]:bounds[b + 1]]].tofile(f)
        self.spilled_pairs += len(pairs)

    def totals(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(sorted distinct keys, uint64 counts), one bucket at a time (one piece when nothing was spilled)."""
        if self.spilled_pairs == 0:
            yield self._combined_buffer()
            return
        self._spill()
        for b in range(self.buckets):
            path = self.spill_dir / f"bucket-{b:05d}"
            if path.exists():
                pairs = np.fromfile(path, dtype=_SPILL_PAIR)
                path.unlink()
                yield combine(pairs["key"], pairs["count"])


# ---- the writer ----------------------------------------------------------------------------------------------------


class DayStatsWriter:
    """Streams blocks of good rows into columnar/ and the counts; finish() writes counts/ and the manifest."""

    def __init__(self, directory: Path, *, row_group_rows: int = ROW_GROUP_ROWS,
                 row_groups_per_part: int = ROW_GROUPS_PER_PART, spill_buffer_pairs: int = SPILL_BUFFER_PAIRS,
                 spill_buckets: int = SPILL_BUCKETS):
        self.directory, self.row_group_rows, self.row_groups_per_part = directory, row_group_rows, row_groups_per_part
        (directory / COLUMNAR).mkdir()
        self.counter = KeyCounter(directory / SPILL_DIR, buffer_pairs=spill_buffer_pairs, buckets=spill_buckets)
        self.rows = self.blocks = self.parts = self.row_groups = 0
        self.finished = False
        self._part: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []  # typed blocks of the next row group
        self._pending_rows = 0
        self._started = time.monotonic()
        # Row groups are written by a thread of their own, one at a time, one more waiting at most: the caller goes
        # on reading and checking blocks meanwhile (the parquet write is ~1/3 of a day's CPU and releases the GIL).
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="day-stats-write")
        self._writing: Future | None = None

    def add(self, good: pa.Table, typed: TypedRows | None = None) -> None:
        """Append one block's good rows (binary columns, file order) to the day. typed: type_rows(good), when a
        helper thread has already computed it (checked_blocks' `prepare`)."""
        if good.num_rows == 0:
            return
        typed = typed or type_rows(good)
        table = numbered(typed, self.rows)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._write_row_group()
        self.counter.add(typed.keys, typed.counts)
        self.rows += table.num_rows
        self.blocks += 1

    def _write_row_group(self) -> None:
        """The pending blocks as one row group (the parquet writer keeps each block's arrays: no copy), handed to
        the writer thread once it has written the one before."""
        if not self._pending:
            return
        self._wait_for_writer()
        new_part = self._part is None or self.row_groups % self.row_groups_per_part == 0
        if new_part:
            self.parts += 1
        self._writing = self._writer.submit(self._write, pa.concat_tables(self._pending), self._pending_rows,
                                            self.parts - 1 if new_part else None)
        self._pending, self._pending_rows = [], 0
        self.row_groups += 1

    def _write(self, table: pa.Table, rows: int, new_part: int | None) -> None:
        """In the writer thread: one row group, into a new part file when `new_part` numbers one."""
        if new_part is not None:
            self._close_part()
            self._part = pq.ParquetWriter(self.directory / COLUMNAR / f"part-{new_part:05d}.parquet",
                                          COLUMNAR_SCHEMA, compression="snappy", write_statistics=COLUMNAR_STATISTICS)
        self._part.write_table(table, row_group_size=rows)

    def _wait_for_writer(self) -> None:
        """Until the row group being written is written (its error raised here)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _close_part(self) -> None:
        if self._part is not None:
            self._part.close()
            self._part = None

    def close(self) -> None:
        """Close the open part file; pending blocks are dropped (only finish() writes the last row group)."""
        self._pending, self._pending_rows = [], 0
        try:
            self._wait_for_writer()
        finally:
            self._writer.shutdown()
            self._close_part()

    def finish(self, target: StatsTarget) -> Manifest:
        """Close the columnar copy, write counts/ and the manifest: the output is then complete (not yet published)."""
        self._write_row_group()
        self._wait_for_writer()
        self._close_part()
        if self.parts == 0:  # a day without good rows still has a readable (empty) columnar copy
            pq.write_table(COLUMNAR_SCHEMA.empty_table(), self.directory / COLUMNAR / "part-00000.parquet")
        per_column = np.zeros(len(CAT_COLUMNS), dtype=np.int64)
        (self.directory / COUNTS).mkdir()
        with pq.ParquetWriter(self.directory / COUNTS / "part-00000.parquet", COUNTS_SCHEMA,
                              compression="snappy") as counts_file:
            pending: list[pa.Table] = []
            for keys, counts in self.counter.totals():
                columns = (keys >> np.uint64(32)).astype(np.int32)
                per_column += np.bincount(columns, minlength=len(CAT_COLUMNS))
                pending.append(pa.Table.from_arrays(
                    [pa.array(columns), hex_strings(keys & np.uint64(0xFFFFFFFF)), pa.array(counts.astype(np.int64))],
                    schema=COUNTS_SCHEMA))
                if sum(t.num_rows for t in pending) >= COUNTS_ROW_GROUP:
                    counts_file.write_table(pa.concat_tables(pending), row_group_size=COUNTS_ROW_GROUP)
                    pending = []
            if pending:
                counts_file.write_table(pa.concat_tables(pending), row_group_size=COUNTS_ROW_GROUP)
        shutil.rmtree(self.directory / SPILL_DIR, ignore_errors=True)
        distinct = {name: int(per_column[i]) for i, name in enumerate(CAT_COLUMNS)}
        manifest = write_manifest(self.directory, Manifest(  # sizes only: docs/ARCHITECTURE.md "Manifests"
            kind="criteo_day_stats", inputs=target.inputs, rows={"good": self.rows},
            extra={"day": target.day, "distinct_values": distinct, "engine": ENGINE}), checksum=False)
        self.finished = True
        log.info("day %d stats (arrow): %d rows in %d part files, %d distinct values, %d pairs spilled, %.1f s",
                 target.day, self.rows, max(self.parts, 1), int(per_column.sum()), self.counter.spilled_pairs,
                 time.monotonic() - self._started)
        return manifest


@contextlib.contextmanager
def day_stats_output(target: StatsTarget, **writer_options: int) -> Iterator[DayStatsWriter]:
    """A writer into a temporary sibling of target.path that replaces it when the block ends, if finish() was called.
    Otherwise (a day over its bad-row budget, an error) nothing is published and the temporary is removed."""
    class NotFinished(Exception):
        pass

    with contextlib.suppress(NotFinished), atomic_directory(target.path) as tmp:
        writer = DayStatsWriter(tmp, **writer_options)
        try:
            yield writer
        finally:
            writer.close()
        if not writer.finished:
            raise NotFinished


def write_day_stats(raw: Path, target: StatsTarget, *, block_bytes: int = 64 << 20,
                    **writer_options: int) -> Manifest:
    """The day's stats alone (no quarantine, no report): the recovery path for a day validated before validation
    wrote them. Parses the raw day again and keeps exactly the rows validation calls good."""
    progress = ProgressLog(f"day {target.day} stats from {raw.name}", total=raw.stat().st_size, unit="bytes",
                           every_s=10.0, logger=log)
    done = 0
    with day_stats_output(target, **writer_options) as writer:
        for block, skipped, result in checked_blocks(raw, block_bytes, keep_good=True, prepare=type_rows):
            if result is not None and result.good_rows is not None:
                writer.add(result.good_rows, result.prepared)
            done += len(block) + sum(len(bad.text) for bad in skipped)
            progress.report(done, note=f"{writer.rows} good rows")
        manifest = writer.finish(target)
    return manifest
