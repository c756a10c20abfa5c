"""Criteo's dictionary and transform on one machine with pyarrow + numpy: the Spark jobs' output, byte for byte.

  dictionary_main(argv)   the dictionary job's argv (contract.py); the same dictionary/ rows, cardinalities.json,
                          model_size.json and manifest `extra` (plus extra.engine = "arrow")
  transform_main(argv)    the transform job's argv (contract.py); the same split-binary files, feature_spec.yaml and
                          manifest `extra` (plus extra.engine = "arrow"); join options only name the joins recorded

Why: on one machine the Spark jobs pay ~10 s of JVM start each and stream every output row through the driver
anyway; these functions do the same work in-process (docs/preprocess_arrow.md has the measurements).

Dictionary. The window's counts are read batch by batch and split by column into Arrow IPC spill files inside the
output's temporary directory; then one column at a time is summed (group_by), thresholded and numbered by (count
desc, value asc) -- Arrow sorts strings bytewise, as Spark does. Memory: one batch, then one column's hash aggregation
of at most GROUP_BY_ROWS spilled counts (a larger column is split by value hash first) and its kept values.

Transform. The same rules as the Spark job (ids, 0 for missing/rare/unseen; log(x + 3) -> float32, 0 for missing and
x + 3 <= 0; dense row_order per day; train ordered by (xxhash64(seed, source, row_order), source, row_order); test
= the first floor(n/2) rows of the test day by row_order, validation the rest), as an external sort:
  pass 1  each day's columnar parquet is streamed in batches (categoricals read dictionary-encoded), transformed,
          keyed, and its rows appended as packed records to bucket files inside the output's temporary directory: a
          train row to the bucket of its key's top bits (in the key's signed order), a test-day row to the bucket of
          its row_order range, as test or validation (the test day is read once). One job per parquet row group, run
          by a pool of `workers` spawned processes, each appending to its own files, kept open (BucketAppender;
          threads of this process when the window holds fewer than ROWS_PER_WORKER rows per process: starting
          processes would cost more).
  pass 2  one bucket at a time is loaded, sorted exactly like Spark's orderBy (a thread prepares the next one) and
          streamed into tasks.formats.split_binary.write_dataset.
Memory is one batch per pass-1 process and three bucket buffers (`bucket_rows` each) in pass 2, whatever the number
of days.
A caller that runs this in a spawned pool must guard its main module (`if __name__ == "__main__":`), as
multiprocessing's spawn requires; `python -m tasks`, Airflow and pytest do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import threading
import uuid
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
import multiprocessing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from tasks.criteo import contract
from tasks.criteo.contract import (DICTIONARY, INDEX_MASK, MAPPINGS, PARTITION_SHIFT, ROW_ORDER, DictionaryResult,
                                   TransformResult)
from tasks.core.progress import ProgressLog
from tasks.core.xxhash import SPARK_HASH_SEED, xxhash64_int, xxhash64_long
from tasks.core.storage import atomic_directory
from tasks.criteo.day_stats_arrow import fibonacci_buckets
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, NUM_INT_FEATURES
from tasks.formats.feature_spec import DTYPE_SELECTOR, FeatureSpec
from tasks.formats.split_binary import write_dataset

log = logging.getLogger(__name__)

ENGINE = "arrow"
BATCH_ROWS = 1 << 18
BUCKET_ROWS = 1 << 20        # rows of one pass-2 bucket (~170 bytes each in memory, twice while sorting)
WORKERS = 2                  # pass-1 processes (days in parallel)
ROWS_PER_WORKER = 1 << 22     # processes only when each gets at least this many rows (~5 s of work); below, threads:
                              # spawning, importing and building the lookup per process cost more than they save
PROGRESS_SECONDS = 10.0
SPILL_DIR = "_arrow_spill"
DICTIONARY_FILE = "part-00000.parquet"
DICTIONARY_SCHEMA = pa.schema([pa.field("column", pa.int32()), pa.field("value", pa.string()),
                               pa.field("id", pa.int32(), nullable=False), pa.field("count", pa.int64())])
_COUNTS_SPILL_SCHEMA = pa.schema([pa.field("value", pa.string()), pa.field("count", pa.int64())])
GROUP_BY_ROWS = 1 << 25       # spilled counts summed in one hash aggregation (~1-2 GB); more are split by value hash
MAX_GROUP_BY_BUCKETS = 512    # open IPC writers while a column's spill is split (~16B counts of one column)
PARTITION_ROWS = 1 << 22      # spilled counts read at a time while splitting


# ---- the train shuffle's key: Spark's xxhash64 (tasks/core/xxhash.py) -------------------------------------------

def shuffle_keys(seed: int, source: int, row_order: np.ndarray) -> np.ndarray:
    """F.xxhash64(F.lit(seed), F.lit(source), row_order) as int64: a literal that fits an int hashes as 4 bytes."""
    h = np.full(1, SPARK_HASH_SEED, dtype=np.uint64)
    seed_array = np.array([seed], dtype=np.int64)
    h = xxhash64_int(seed_array, h) if -(1 << 31) <= seed < (1 << 31) else xxhash64_long(seed_array, h)
    h = xxhash64_int(np.array([source]), h)
    return xxhash64_long(row_order, h).view(np.int64)


# ---- dictionary ----------------------------------------------------------------------------------------------------

def parquet_dataset(directory: str | Path, what: str) -> pads.Dataset:
    """A Spark-style parquet directory (files starting with _ or . ignored); FileNotFoundError when absent."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{what} {directory} does not exist")
    return pads.dataset(str(directory), format="parquet")


def spill_counts_by_column(counts_dirs: Sequence[str], spill: Path) -> list[Path | None]:
    """Every (value, count) of the window appended to its column's IPC file; the files, by column."""
    spill.mkdir()
    paths: list[Path | None] = [None] * len(CAT_COLUMNS)
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
    try:
        for directory in counts_dirs:
            for batch in parquet_dataset(directory, "counts").to_batches(columns=["column", "value", "count"]):
                columns = batch.column(0).to_numpy(zero_copy_only=False)
                if len(columns) and (columns.min() < 0 or columns.max() >= len(CAT_COLUMNS)):
                    raise ValueError(f"{directory}: column index outside 0..{len(CAT_COLUMNS) - 1} in the counts")
                order = np.argsort(columns, kind="stable")
                bounds = np.searchsorted(columns[order], np.arange(len(CAT_COLUMNS) + 1))
                part = pa.Table.from_batches([batch]).select(["value", "count"]).take(order)
                for index in np.flatnonzero(np.diff(bounds)):
                    if index not in writers:
                        paths[index] = spill / f"column-{index:02d}.arrow"
                        writers[index] = pa.ipc.new_file(paths[index], _COUNTS_SPILL_SCHEMA)
                    piece = part.slice(bounds[index], bounds[index + 1] - bounds[index])
                    writers[index].write_table(piece.cast(_COUNTS_SPILL_SCHEMA))
    finally:
        for writer in writers.values():
            writer.close()
    return paths


def _record_batches(reader: pa.ipc.RecordBatchFileReader) -> Iterator[pa.RecordBatch]:
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def _value_buckets(values: pa.Array, bits: int) -> np.ndarray:
    """A bucket in 0..2**bits - 1 for each value, the same for equal values whatever else their batch holds: an
    8-byte value (every real Criteo value) is hashed as its int64 key, any other by pandas' hash of the string."""
    lengths, valid, data = _string_parts(values)
    eight = valid & (lengths == 8)
    buckets = np.zeros(len(values), dtype=np.uint64)
    if not eight.all():
        import pandas as pd

        hashed = pd.util.hash_array(values.filter(pa.array(~eight)).to_numpy(zero_copy_only=False).astype(object))
        buckets[~eight] = hashed >> np.uint64(64 - bits)
    starts = (np.cumsum(lengths, dtype=np.int64) - lengths)[eight]
    if len(starts) * 8 == len(data):  # every value 8 bytes long: their bytes in order
        keys = data.view("<u8")
    else:  # the 8 bytes of each 8-byte value, little-endian as the view above reads them
        keys = np.zeros(len(starts), dtype=np.uint64)
        for k in range(8):
            keys |= data[starts + k].astype(np.uint64) << np.uint64(8 * k)
    buckets[eight] = fibonacci_buckets(keys, bits)  # as day_stats_arrow's spill buckets its keys
    return buckets.astype(np.int64)


def _split_by_value(path: Path, buckets: int) -> list[Path]:
    """The spill at `path` rewritten as `buckets` IPC files, a value's rows all in one (read PARTITION_ROWS at a
    time); the spill is removed. Files, by bucket."""
    paths = [path.with_name(f"{path.stem}-{b:04d}.arrow") for b in range(buckets)]
    bits = buckets.bit_length() - 1
    writers: list[pa.ipc.RecordBatchFileWriter] = []

    def flush(batches: list[pa.RecordBatch]) -> None:
        table = pa.Table.from_batches(batches, _COUNTS_SPILL_SCHEMA).combine_chunks()
        bucket = _value_buckets(table.column("value").chunk(0) if table.num_rows else pa.array([], pa.string()), bits)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
        table = table.take(order)
        for b in np.flatnonzero(np.diff(bounds)):
            writers[b].write_table(table.slice(bounds[b], bounds[b + 1] - bounds[b]))

    try:
        writers.extend(pa.ipc.new_file(p, _COUNTS_SPILL_SCHEMA) for p in paths)
        with pa.memory_map(str(path)) as source:
            pending: list[pa.RecordBatch] = []
            held = 0
            for batch in _record_batches(pa.ipc.open_file(source)):
                pending.append(batch)
                held += batch.num_rows
                if held >= PARTITION_ROWS:
                    flush(pending)
                    pending, held = [], 0
            if pending:
                flush(pending)
    finally:
        for writer in writers:
            writer.close()
    path.unlink()
    return paths


def _summed_counts(path: Path) -> pa.Table:
    """(value, count) summed over the spill at `path`, null value dropped."""
    with pa.memory_map(str(path)) as source:
        counts = pa.ipc.open_file(source).read_all()
    # Summed as spilled (both engines' counts hold no null value; a null group, if any, is dropped after): a filter
    # first would copy the whole spill.
    summed = counts.group_by("value").aggregate([("count", "sum")])
    summed = summed.rename_columns(["value", "count"] if summed.column_names[0] == "value" else ["count", "value"])
    if summed.column("value").null_count:
        summed = summed.filter(pc.is_valid(summed.column("value")))
    return summed.select(["value", "count"])


def column_dictionary(path: Path | None, index: int, threshold: int) -> tuple[pa.Table, dict[str, float | int]]:
    """One column's dictionary rows (ids by count desc, value asc) and its summary, from its spilled counts.

    A spill of more than GROUP_BY_ROWS rows (the widest column over NVIDIA's 24 days spills ~1B, ~290M of them
    distinct) is first split by a hash of the value into as many buckets as keep each under GROUP_BY_ROWS, and
    summed one bucket at a time: memory is one bucket's hash table and the kept values, not every distinct value."""
    if path is None:
        return DICTIONARY_SCHEMA.empty_table(), {"threshold": threshold, "kept": 0, "dropped": 0,
                                                 "occurrences_kept_share": 1.0}
    with pa.memory_map(str(path)) as source:
        spilled = sum(batch.num_rows for batch in _record_batches(pa.ipc.open_file(source)))
    buckets = 1 << max(0, math.ceil(math.log2(max(spilled, 1) / GROUP_BY_ROWS)))
    if buckets > MAX_GROUP_BY_BUCKETS:
        raise ValueError(f"{CAT_COLUMNS[index]}: {spilled:,} spilled counts need {buckets} buckets of at most "
                         f"{GROUP_BY_ROWS:,}, more than {MAX_GROUP_BY_BUCKETS}")
    parts = [path] if buckets == 1 else _split_by_value(path, buckets)
    kept_parts: list[pa.Table] = []
    distinct = occurrences = kept_occurrences = 0
    for part in parts:
        summed = _summed_counts(part)
        total = summed.column("count").to_numpy()
        kept_mask = total >= threshold
        kept_parts.append(summed.filter(pa.array(kept_mask)))
        distinct += len(total)
        occurrences += int(total.sum())
        kept_occurrences += int(total[kept_mask].sum())
        if part is not path:
            part.unlink()
    kept = pa.concat_tables(kept_parts) if kept_parts else _COUNTS_SPILL_SCHEMA.empty_table()
    del kept_parts  # the kept values are held twice at most: as summed, and sorted
    kept = kept.take(pc.sort_indices(kept, sort_keys=[("count", "descending"), ("value", "ascending")]))
    n = kept.num_rows
    rows = pa.Table.from_arrays([pa.array(np.full(n, index, dtype=np.int32)), kept.column("value"),
                                 pa.array(np.arange(1, n + 1, dtype=np.int32)), kept.column("count")],
                                schema=DICTIONARY_SCHEMA)
    summary = {"threshold": threshold, "kept": n, "dropped": distinct - n,
               "occurrences_kept_share": round(kept_occurrences / occurrences, 6) if occurrences else 1.0}
    return rows, summary


def dictionary_main(argv: Sequence[str]) -> DictionaryResult:
    """spark_jobs/criteo/dictionary.py's main, in this process (its argv, its output)."""
    args = contract.parse_dictionary_args(argv)
    thresholds = contract.column_thresholds(
        args.frequency_threshold, contract.parse_threshold_overrides(args.threshold_overrides))
    started = time.monotonic()
    with atomic_directory(args.output) as tmp:
        log.info("summing value counts of %d days (arrow): %s", len(args.counts), ", ".join(args.counts))
        spill = spill_counts_by_column(args.counts, tmp / SPILL_DIR)
        summary: dict[str, dict[str, float | int]] = {}
        (tmp / DICTIONARY).mkdir()
        with pq.ParquetWriter(tmp / DICTIONARY / DICTIONARY_FILE, DICTIONARY_SCHEMA, compression="snappy") as out:
            for index, name in enumerate(CAT_COLUMNS):
                rows, summary[name] = column_dictionary(spill[index], index, thresholds[index])
                if rows.num_rows:
                    out.write_table(rows)
        shutil.rmtree(tmp / SPILL_DIR)
        cardinalities, values = contract.record_dictionary(tmp, args, summary, log, engine=ENGINE)
    log.info("dictionary (arrow): %d values over %d columns in %s, %.1f s", values, len(CAT_COLUMNS), args.output,
             time.monotonic() - started)
    return DictionaryResult(str(args.output), values, cardinalities)


# ---- transform: the per-row rules ----------------------------------------------------------------------------------

def _string_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, valid mask, value bytes) of a string array, without copying the bytes."""
    if len(array) == 0:
        return np.empty(0, np.int32), np.empty(0, bool), np.empty(0, np.uint8)
    _, offsets_buffer, data_buffer = array.buffers()[:3]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[array.offset: array.offset + len(array) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    valid = (np.ones(len(array), dtype=bool) if array.null_count == 0
             else pc.is_valid(array).to_numpy(zero_copy_only=False))
    return np.diff(offsets), valid, data[offsets[0]: offsets[-1]]


def eight_byte_keys(array: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """(valid mask, int64 keys of the valid values) when every valid value is 8 bytes long, else None.

    A Criteo categorical is 8 hex characters: its 8 bytes read as one int64 are a key equal for equal strings and
    only for them (Spark compares strings bytewise), with no parsing.
    """
    lengths, valid, data = _string_parts(array)
    if np.any(lengths[valid] != 8) or np.any(lengths[~valid] != 0):
        return None
    return valid, data.view("<i8")


class DictionaryLookup:
    """value -> id of each categorical column, from a dictionary directory (ids checked to be 1..n per column).

    A column whose values are all 8 bytes long (every real Criteo value) is looked up as int64 keys in a pandas hash
    index; any other column (or batch) with pyarrow's index_in on the strings. Both give the Spark job's ids.
    """

    def __init__(self, dictionary_dir: Path, cardinalities: list[int] | None, values_dir: Path | None = None) -> None:
        """values_dir: the dictionary's parquet files, where they are not dictionary_dir/dictionary (a published
        version's dictionary/values/); cardinalities None: the value counts are not checked against them."""
        import pandas as pd

        values_dir = Path(dictionary_dir) / DICTIONARY if values_dir is None else values_dir
        table = parquet_dataset(values_dir, "dictionary").to_table(columns=["column", "value", "id"])
        table = table.take(pc.sort_indices(table, sort_keys=[("column", "ascending"), ("id", "ascending")]))
        column_ids = table.column("column").to_numpy()
        bounds = np.searchsorted(column_ids, np.arange(len(CAT_COLUMNS) + 1))
        self.values: list[pa.Array] = []
        self.indexes: list[object | None] = []
        for index, name in enumerate(CAT_COLUMNS):
            part = table.slice(bounds[index], bounds[index + 1] - bounds[index])
            ids = part.column("id").to_numpy()
            if not np.array_equal(ids, np.arange(1, len(ids) + 1)):
                raise ValueError(f"dictionary {name}: ids are not 1..{len(ids)}; rebuild the dictionary")
            if cardinalities is not None and len(ids) + 1 != cardinalities[index]:
                raise ValueError(f"dictionary {name}: {len(ids)} values but the recorded cardinalities say "
                                 f"{cardinalities[index]} (expected values + 1); the dictionary directory is "
                                 "inconsistent")
            values = part.column("value").combine_chunks()
            self.values.append(values)
            keys = eight_byte_keys(values)
            index_of_keys = pd.Index(keys[1]) if keys is not None and keys[0].all() else None
            if index_of_keys is not None:  # its hash table is built on first use: here, before threads share it
                index_of_keys.get_indexer(keys[1][:1])
            self.indexes.append(index_of_keys)

    def ids(self, index: int, column: pa.Array) -> np.ndarray:
        """int32 ids of one batch's column; 0 for null, rare and unseen values.

        A dictionary-encoded column (as pass 1 reads the parquet) is looked up once per distinct value of its chunk
        and the ids gathered by its indices: the strings are never materialised row by row.
        """
        if pa.types.is_dictionary(column.type):
            return self._dictionary_ids(index, column)
        keys = eight_byte_keys(column) if self.indexes[index] is not None else None
        if keys is None:
            positions = pc.index_in(column, value_set=self.values[index])
            return pc.fill_null(pc.add(positions, 1), 0).to_numpy(zero_copy_only=False).astype(np.int32)
        valid, values = keys
        found = (self.indexes[index].get_indexer(values) + 1).astype(np.int32)  # -1 (unseen) -> 0
        if len(found) == len(column):
            return found
        ids = np.zeros(len(column), dtype=np.int32)
        ids[valid] = found
        return ids


    def _dictionary_ids(self, index: int, column: pa.DictionaryArray) -> np.ndarray:
        indices = column.indices
        if len(column.dictionary) == 0 or len(column) == 0:
            return np.zeros(len(column), dtype=np.int32)
        per_value = self.ids(index, column.dictionary)
        if indices.null_count:  # a null points past the dictionary, at an id of 0: one gather, no masks
            per_value = np.append(per_value, np.int32(0))
            if indices.type.bit_width < 32:  # room for one index more (parquet's are int32 already)
                indices = indices.cast(pa.int32())
            indices = pc.fill_null(indices, pa.scalar(len(column.dictionary), indices.type))
        positions = np.frombuffer(indices.buffers()[1], dtype=indices.type.to_pandas_dtype())
        return per_value[positions[indices.offset: indices.offset + len(indices)]]


LOG_TABLE_SIZE = 1 << 16  # x + 3 below this (nearly every Criteo integer) is looked up, not computed


def _log_tables() -> dict[np.dtype, np.ndarray]:
    """log_numerical's value of x + 3 = 0 .. LOG_TABLE_SIZE - 1 by the very computation it stands for (float64 log,
    then float32, then the output dtype), and a last entry of 0 for a value out of the table."""
    shifted = np.arange(LOG_TABLE_SIZE, dtype=np.float64)
    table = np.zeros(LOG_TABLE_SIZE + 1, dtype=np.float64)
    np.log(shifted, out=table[:-1], where=shifted > 0)
    table32 = table.astype(np.float32)
    return {np.dtype(np.float32): table32, np.dtype(np.float16): table32.astype(np.float16)}


_LOG_TABLES = _log_tables()


def log_numerical(array: pa.Array, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Spark's coalesce(log(x + 3), 0).cast(float): float32, 0 for null and x + 3 <= 0; with dtype float16 that
    float32 value rounded once more, as the split-binary file stores it. x + 3 in [0, LOG_TABLE_SIZE) comes from a
    table of the same computation (~4x less CPU than the logs); the rest is computed."""
    table = _LOG_TABLES[np.dtype(dtype)]
    values = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset: array.offset + len(array)]
    shifted = values + 3
    index = np.minimum(shifted.view(np.uint64), LOG_TABLE_SIZE)  # a negative wraps past the table: its last entry
    out = table[index]
    outside = np.flatnonzero(index == LOG_TABLE_SIZE)
    if len(outside):
        positive = outside[shifted[outside] > 0]
        out[positive] = np.log(shifted[positive].astype(np.float64)).astype(np.float32).astype(table.dtype)
    if array.null_count:
        out[~pc.is_valid(array).to_numpy(zero_copy_only=False)] = 0
    return out


# ---- transform: pass 1, days -> bucket files -----------------------------------------------------------------------

def record_dtype(cat_dtypes: Sequence[np.dtype]) -> np.dtype:
    """A packed row of a bucket file: sort key, source, dense row_order, then the row as split-binary stores it."""
    return np.dtype([("key", "<i8"), ("source", "<i4"), ("row_order", "<i8"), (LABEL, "i1"),
                     ("numerical", "<f2", (NUM_INT_FEATURES,))]
                    + [(name, np.dtype(dt).newbyteorder("<")) for name, dt in zip(CAT_COLUMNS, cat_dtypes)])


@dataclass(frozen=True)
class DayPlan:
    """One day of the window: its files, rows, and the dense offset of each row_order group."""

    source: int
    path: str
    files: list[str]
    rows: int
    groups: np.ndarray    # sorted row_order groups (row_order >> 33)
    offsets: np.ndarray   # rows of the day's earlier groups, per group

    def dense(self, row_order: np.ndarray) -> np.ndarray:
        group = row_order >> PARTITION_SHIFT
        return (row_order & INDEX_MASK) + self.offsets[np.searchsorted(self.groups, group)]


def plan_day(source: int, path: str) -> DayPlan:
    """Reads the day's row_order column only; ValueError like the Spark job's when a group's indexes have gaps."""
    files = sorted(parquet_dataset(path, "columnar day").files)
    stats: dict[int, list[int]] = {}  # group -> [rows, lowest index, highest index]
    for file in files:
        for batch in pq.ParquetFile(file).iter_batches(batch_size=1 << 22, columns=[ROW_ORDER]):
            row_order = batch.column(0).to_numpy()
            group, index = row_order >> PARTITION_SHIFT, row_order & INDEX_MASK
            for g in np.unique(group):
                mine = index[group == g]
                s = stats.setdefault(int(g), [0, mine.min(), mine.max()])
                s[0], s[1], s[2] = s[0] + len(mine), min(s[1], mine.min()), max(s[2], mine.max())
    groups = sorted(stats)
    offsets, rows = [], 0
    for g in groups:
        n, lo, hi = stats[g]
        if (lo, hi) != (0, n - 1):
            raise ValueError(f"{path}: row_order of partition {g} is not dense ({n} rows, indexes {lo}..{hi}): these "
                             "day stats predate criteo_day_stats version 2; re-run criteo_ingest for the day to "
                             "rewrite them")
        offsets.append(rows)
        rows += n
    return DayPlan(source, path, files, rows, np.array(groups, dtype=np.int64), np.array(offsets, dtype=np.int64))


@dataclass(frozen=True)
class BucketJob:
    """One piece of pass 1 (picklable, run by a worker): some row groups of one day's file."""

    job: int
    token: str            # this transform run: keys the workers' cached dictionary lookup
    day: DayPlan
    file: str
    row_groups: list[int]
    rows: int
    spill: str
    dictionary: str
    cardinalities: list[int]
    cat_dtypes: list[str]
    seed: int
    train: bool
    bucket_bits: int      # train: 2**bits buckets by the key's top bits
    test_buckets: int     # test day: buckets by row_order range
    split: int            # test day: first row_order of validation
    encoded: bool = False  # the days are already encoded (the nvtabular engine's output): no lookup, no log


_LOOKUPS: dict[str, DictionaryLookup] = {}  # per process: run token -> the run's dictionary lookup


def bucket_of(job: BucketJob, keys: np.ndarray) -> np.ndarray:
    """Train: the key's top bucket_bits bits, in signed order; test day: the row_order range (keys are row_orders)."""
    if not job.train:
        return keys * job.test_buckets // max(job.day.rows, 1)
    if job.bucket_bits == 0:
        return np.zeros(len(keys), dtype=np.int64)
    unsigned = keys.view(np.uint64) ^ np.uint64(1 << 63)  # signed order = unsigned order with the sign bit flipped
    return (unsigned >> np.uint64(64 - job.bucket_bits)).astype(np.int64)


def encoded_ids(column: pa.Array, name: str, cardinality: int, where: str) -> np.ndarray:
    """An upstream-encoded id column, checked inside [0, cardinality) before it is narrowed to the record's dtype: a
    wider id would wrap silently in the cast (to a valid-looking id that the writer cannot tell from a right one)."""
    if column.null_count:
        raise ValueError(f"{where}: {name} has {column.null_count} missing ids; the encoded days must map every "
                         "value to an id")
    low, high = (v.as_py() for v in pc.min_max(column).values())
    if len(column) and not 0 <= low <= high < cardinality:
        raise ValueError(f"{where}: {name} holds id {low if low < 0 else high}, outside [0, {cardinality}) (the "
                         "dictionary's cardinality): the encoded days do not match the dictionary; re-run the "
                         "transform")
    return column.to_numpy(zero_copy_only=False)


def transform_batch(batch: pa.RecordBatch, lookup: DictionaryLookup | None, job: BucketJob,
                    dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One parquet batch as packed records grouped by bucket (ascending), and the bucket of each record.

    Columns are gathered into bucket order one by one before packing: cheaper than gathering packed records, and
    nothing is gathered when the batch is already in bucket order (a test day in file order, a single bucket).
    """
    row_order = job.day.dense(batch.column(ROW_ORDER).to_numpy())
    keys = shuffle_keys(job.seed, job.day.source, row_order) if job.train else row_order
    buckets = bucket_of(job, keys)
    order = None if np.all(buckets[1:] >= buckets[:-1]) else np.argsort(buckets, kind="stable")

    def ordered(values: np.ndarray) -> np.ndarray:
        return values if order is None else values[order]

    records = np.empty(batch.num_rows, dtype=dtype)
    records["key"], records["source"], records["row_order"] = ordered(keys), job.day.source, ordered(row_order)
    records[LABEL] = ordered(batch.column(LABEL).to_numpy(zero_copy_only=False))
    if lookup is None:  # encoded upstream (the nvtabular engine): float numericals and ids as they are
        records["numerical"] = ordered(np.column_stack([batch.column(name).to_numpy(zero_copy_only=False)
                                                        for name in INT_COLUMNS]))
        for index, name in enumerate(CAT_COLUMNS):
            records[name] = ordered(encoded_ids(batch.column(name), name, job.cardinalities[index],
                                                f"{job.file} (row groups {job.row_groups})"))
        return records, ordered(buckets)
    numerical = np.empty((batch.num_rows, NUM_INT_FEATURES), dtype=records.dtype["numerical"].base)
    for column, name in enumerate(INT_COLUMNS):
        numerical[:, column] = log_numerical(batch.column(name), numerical.dtype)
    records["numerical"] = ordered(numerical)
    for index, name in enumerate(CAT_COLUMNS):
        records[name] = ordered(lookup.ids(index, batch.column(name)))
    return records, ordered(buckets)


def bucket_path(spill: Path, mapping: str, bucket: int) -> Path:
    """This thread's file of a bucket: each pass-1 process or thread appends to its own, so no two write one file."""
    return spill / f"{mapping}-{bucket:05d}-{os.getpid()}.{threading.get_native_id()}.rows"


class BucketAppender:
    """One pass-1 thread's bucket files of one run, each opened once (O_APPEND) and written one piece per write(),
    instead of an open + append + close per bucket per batch. At NVIDIA's 1TB size a batch of 262,144 rows spreads
    over 8,192 train buckets (~32 rows a piece, 137M pieces in all); where the data root is a network file system
    (the shared data root of a multi-worker deployment) every open and close is a round trip (NFS close-to-open),
    hours over a window. On this machine's local disk it changes nothing measurable: 27 vs 9 us a piece in isolation,
    but 12.6 vs 12.3 s (1.02x) for a 1.3M-row window at 8,192 buckets, paired (pass 1 is bound by the disk's writes
    there). The descriptors stay open until `close` (run_pass_one's end in this process; a spawned worker's exit with
    the run's pool); past `limit` open files the oldest are closed, and reopened when written again. Only its own
    thread uses it (bucket_path is per thread)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(16, limit)
        self.fds: dict[Path, int] = {}  # insertion order = opening order

    def append(self, path: Path, records: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(records)).cast("B")
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.limit:
                os.close(self.fds.pop(next(iter(self.fds))))
            fd = self.fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        while data:
            data = data[os.write(fd, data):]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


_APPENDERS: dict[tuple[str, int], BucketAppender] = {}  # per process: (run token, thread) -> its bucket files
_APPENDERS_LOCK = threading.Lock()
_RESERVED_FDS = 256  # of the process's file limit, left for everything but bucket files


def _file_limit() -> int:
    """This process's open-file limit, its soft limit first raised to the hard one (8,192 buckets need more than
    the usual soft 1,024)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def _appender(token: str) -> BucketAppender:
    """This thread's appender of run `token`. The process's file limit is shared by its Python threads (the pass-1
    threads, or a spawned worker's one), counted when the appender is made."""
    key = (token, threading.get_native_id())
    with _APPENDERS_LOCK:
        if key not in _APPENDERS:
            _APPENDERS[key] = BucketAppender((_file_limit() - _RESERVED_FDS) // max(1, threading.active_count()))
        return _APPENDERS[key]


def close_bucket_files(token: str) -> None:
    """Close this process's descriptors of a run's bucket files (its pass 1 is over)."""
    with _APPENDERS_LOCK:
        appenders = [_APPENDERS.pop(k) for k in [k for k in _APPENDERS if k[0] == token]]
    for appender in appenders:
        appender.close()


def bucket_files(spill: Path) -> dict[tuple[str, int], list[Path]]:
    """(mapping, bucket) -> the files pass 1 wrote for it."""
    files: dict[tuple[str, int], list[Path]] = {}
    for name in sorted(os.listdir(spill)):
        mapping, bucket, _ = name.split("-")
        files.setdefault((mapping, int(bucket)), []).append(spill / name)
    return files


def run_bucket_job(job: BucketJob) -> int:
    """Pass 1 for one piece: its rows transformed and appended to bucket files; returns the rows."""
    lookup = None if job.encoded else _LOOKUPS.get(job.token)
    if lookup is None and not job.encoded:
        _LOOKUPS.clear()  # an earlier run's, in a reused worker
        lookup = _LOOKUPS[job.token] = DictionaryLookup(Path(job.dictionary), job.cardinalities)
    dtype = record_dtype([np.dtype(d) for d in job.cat_dtypes])
    spill, rows, files = Path(job.spill), 0, _appender(job.token)
    parquet = pq.ParquetFile(job.file, read_dictionary=None if job.encoded else list(CAT_COLUMNS))
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=job.row_groups):
        records, buckets = transform_batch(batch, lookup, job, dtype)
        bounds = np.searchsorted(buckets, np.arange(int(buckets.max(initial=0)) + 2))
        for b in np.flatnonzero(np.diff(bounds)):
            part = records[bounds[b]:bounds[b + 1]]
            if job.train:
                pieces = [("train", part)]
            elif np.all(part["row_order"][1:] > part["row_order"][:-1]):  # in file order: two slices, no copy
                cut = int(np.searchsorted(part["row_order"], job.split))
                pieces = [("test", part[:cut]), ("validation", part[cut:])]
            else:
                test = part["row_order"] < job.split
                pieces = [("test", part[test]), ("validation", part[~test])]
            for mapping, piece in pieces:
                if len(piece):
                    files.append(bucket_path(spill, mapping, int(b)), piece)
        rows += batch.num_rows
    return rows


def sort_order(records: np.ndarray) -> np.ndarray | None:
    """Spark's orderBy(key, source, row_order) of a bucket (None: already in order, as a test day in file order
    is); a 64-bit key rarely ties, so that is a plain argsort."""
    if np.all(records["key"][1:] > records["key"][:-1]):
        return None
    order = np.argsort(records["key"], kind="stable")
    keys = records["key"][order]
    if np.any(keys[1:] == keys[:-1]):
        order = np.lexsort((records["row_order"], records["source"], records["key"]))
    return order


class BucketStream:
    """Pass 2 for one mapping: its buckets in key order, each loaded, sorted and yielded as split-binary batches.

    A thread loads and sorts the next bucket while the current one is written (numpy's sort, gather and file reads
    release the GIL): the second core's share of pass 2. The batches yielded are views of a bucket's buffer, valid
    until the next one is asked for (write_dataset writes each before it asks).

    Memory: three bucket buffers, reused from bucket to bucket (one the consumer reads, one the next bucket is read
    into, one it is sorted into). Fresh arrays per bucket cost more than the work on them: every page of a new
    ~100 MB array is faulted in and zeroed by the kernel; reading into and gathering into reused buffers made a 1M-row
    bucket's load + sort 2.4x cheaper in CPU (issue #27, docs/PERFORMANCE-endtoend.md round 6).
    """

    BUFFERS = 3

    def __init__(self, mapping: str, files: dict[tuple[str, int], list[Path]], buckets: int, dtype: np.dtype,
                 total: int) -> None:
        self.mapping, self.files, self.buckets, self.dtype = mapping, files, buckets, dtype
        self.total, self.rows = total, 0
        self._buffers: list[np.ndarray] = [np.empty(0, dtype) for _ in range(self.BUFFERS)]
        self._held: int | None = None  # the buffer whose rows the consumer is reading now

    def _buffer(self, rows: int, busy: set[int]) -> int:
        """A buffer the consumer does not hold and not in `busy`, of at least `rows` records (grown with 1/8 slack:
        buckets differ a little in size)."""
        index = next(i for i in range(self.BUFFERS) if i != self._held and i not in busy)
        if len(self._buffers[index]) < rows:
            self._buffers[index] = np.empty(rows + rows // 8, self.dtype)
        return index

    def load(self, bucket: int) -> tuple[int, int] | None:
        """(buffer, rows) holding the bucket's records in output order (its files deleted), or None when it is
        empty."""
        files = self.files.get((self.mapping, bucket), [])
        if not files:
            return None
        sizes = [p.stat().st_size for p in files]
        if any(size % self.dtype.itemsize for size in sizes):
            raise ValueError(f"{self.mapping} bucket {bucket}: a file of it does not hold whole records")
        rows = sum(sizes) // self.dtype.itemsize
        read = self._buffer(rows, set())
        records = self._buffers[read][:rows]
        target, done = memoryview(records.view(np.uint8)), 0
        for path, size in zip(files, sizes):
            with open(path, "rb", buffering=0) as f:
                end = done + size
                while done < end:
                    got = f.readinto(target[done:end])
                    if not got:
                        raise ValueError(f"{path}: ended after {done} of {sum(sizes)} bytes")
                    done += got
        for p in files:
            p.unlink()
        order = sort_order(records)
        if order is None:
            return read, rows
        sorted_into = self._buffer(rows, {read})
        # mode="clip": an argsort's indices are all in range, and "raise" would gather through a temporary buffer.
        np.take(records, order, out=self._buffers[sorted_into][:rows], mode="clip")
        return sorted_into, rows

    def __iter__(self) -> Iterator[tuple]:
        progress = ProgressLog(f"{self.mapping}: sorting buckets, writing split binary", total=self.total,
                               every_s=PROGRESS_SECONDS, logger=log)
        with ThreadPoolExecutor(max_workers=1) as loader:
            pending = loader.submit(self.load, 0) if self.buckets else None
            for bucket in range(self.buckets):
                loaded = pending.result()
                if loaded is not None:
                    self._held = loaded[0]  # before the next load picks its buffers
                pending = loader.submit(self.load, bucket + 1) if bucket + 1 < self.buckets else None
                if loaded is None:
                    continue
                records = self._buffers[loaded[0]][:loaded[1]]
                for start in range(0, len(records), BATCH_ROWS):
                    part = records[start:start + BATCH_ROWS]
                    yield part[LABEL], part["numerical"], [part[name] for name in CAT_COLUMNS]
                    self.rows += len(part)
                    progress.report(self.rows)
        self._buffers, self._held = [], None
        progress.report(self.rows, force=True)


# ---- transform: the job ---------------------------------------------------------------------------------------------

def plan_jobs(plans: Sequence[DayPlan], base: dict) -> list[BucketJob]:
    """One job per row group of every day's files (their rows known from the parquet footers)."""
    jobs, token = [], uuid.uuid4().hex
    for plan in plans:
        for file in plan.files:
            metadata = pq.ParquetFile(file).metadata
            for group in range(metadata.num_row_groups):
                rows = metadata.row_group(group).num_rows
                if rows:
                    jobs.append(BucketJob(job=len(jobs), token=token, day=plan, file=file, row_groups=[group],
                                          rows=rows, train=plan.source < len(plans) - 1, **base))
    return jobs


def run_pass_one(jobs: Sequence[BucketJob], workers: int, rows_per_worker: int = ROWS_PER_WORKER) -> int:
    """Every job, in a pool of `workers` processes, or of `workers` threads of this one when the jobs hold fewer
    than `rows_per_worker` rows per process (or this process may not start children); progress by rows done."""
    total = sum(job.rows for job in jobs)
    progress = ProgressLog("transform + bucket", total=total, every_s=PROGRESS_SECONDS, logger=log)
    done = 0
    workers = max(1, min(workers, len(jobs)))
    processes = workers > 1 and total >= workers * rows_per_worker
    if processes and multiprocessing.current_process().daemon:
        log.info("pass 1 runs in threads of this process: a daemonic process cannot start a pool")
        processes = False
    elif workers > 1 and not processes:
        log.info("pass 1 runs in %d threads of this process: %d rows are too few to pay for starting processes",
                 workers, total)
    try:
        if workers == 1:
            for job in jobs:
                done += run_bucket_job(job)
                progress.report(done)
            return done
        # Processes: spawn, not fork (this process already runs pyarrow's threads, which a fork does not carry over
        # safely). Threads: no start-up and one dictionary lookup; pyarrow's decode, numpy and the writes release
        # the GIL. A spawned worker's bucket files close when it exits, with the pool.
        pool = (ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) if processes
                else ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pass-1"))
        with pool:
            for rows in pool.map(run_bucket_job, jobs):
                done += rows
                progress.report(done)
        return done
    finally:
        for token in {job.token for job in jobs}:
            close_bucket_files(token)


def transform_main(argv: Sequence[str], *, bucket_rows: int = BUCKET_ROWS, workers: int = WORKERS,
                   rows_per_worker: int = ROWS_PER_WORKER,
                   encoded_by: str | None = None) -> TransformResult:
    """spark_jobs/criteo/transform.py's main, in this process (its argv, its output). The join options only decide
    which join the manifest names per column, as the Spark job would choose it.

    encoded_by: the engine that already encoded the days given (`nvtabular`: its workflow's output, with ids and
    log numericals in place); they are then only ordered, split and written, and the manifest names that engine.
    """
    args = contract.parse_transform_args(argv)
    started = time.monotonic()
    cardinalities = contract.load_cardinalities(args.dictionary)
    if encoded_by is None:
        lookup = DictionaryLookup(args.dictionary, cardinalities)  # checks the dictionary before any work
        joins = {name: "empty" if len(values) == 0 else "broadcast" if len(values) <= args.broadcast_max_values
                 else "skew" for name, values in zip(CAT_COLUMNS, lookup.values)}
    else:
        lookup, joins = None, {name: f"{encoded_by} workflow" for name in CAT_COLUMNS}
    plans = [plan_day(source, path) for source, path in enumerate([*args.train_days, args.test_day])]
    n = plans[-1].rows
    if n < 2:
        raise ValueError(f"the test day has {n} rows; splitting it into test and validation needs at least 2")
    split = n // 2
    log.info("test day: %d rows; test = %d rows before row_order %d, validation = %d rows", n, n // 2, split,
             n - n // 2)
    spec = FeatureSpec.get_default_feature_spec(NUM_INT_FEATURES, cardinalities)
    cat_dtypes = [str(np.dtype(spec.feature_spec[name][DTYPE_SELECTOR]))
                  for name in spec.get_categorical_feature_names()]
    train_rows = sum(plan.rows for plan in plans[:-1])
    bits = max(0, math.ceil(math.log2(max(train_rows / bucket_rows, 1))))
    test_buckets = max(1, math.ceil(n / bucket_rows))
    dtype = record_dtype([np.dtype(d) for d in cat_dtypes])
    with atomic_directory(args.output) as tmp:
        spill = tmp / SPILL_DIR
        spill.mkdir()
        jobs = plan_jobs(plans, dict(spill=str(spill), dictionary=str(args.dictionary), cardinalities=cardinalities,
                                     cat_dtypes=cat_dtypes, seed=args.seed, bucket_bits=bits,
                                     test_buckets=test_buckets, split=split, encoded=encoded_by is not None))
        log.info("pass 1: %d days, %d row groups, %d workers at most; %d train buckets, %d test-day buckets",
                 len(plans), len(jobs), workers, 1 << bits, test_buckets)
        if jobs and lookup is not None:
            _LOOKUPS[jobs[0].token] = lookup  # pass 1 in this process reuses it; workers build their own
        try:
            run_pass_one(jobs, workers, rows_per_worker)
        finally:
            _LOOKUPS.clear()
        files = bucket_files(spill)
        streams = {"train": BucketStream("train", files, 1 << bits, dtype, train_rows),
                   "test": BucketStream("test", files, test_buckets, dtype, split),
                   "validation": BucketStream("validation", files, test_buckets, dtype, n - split)}
        write_dataset(tmp, streams, cardinalities, NUM_INT_FEATURES)
        shutil.rmtree(spill)
        rows = {name: streams[name].rows for name in MAPPINGS}
        contract.record_transform(tmp, args, rows, n, cardinalities, split, joins, engine=encoded_by or ENGINE)
    log.info("dataset %s (%s): %s rows in %.1f s", args.output, encoded_by or ENGINE, rows, time.monotonic() - started)
    return TransformResult(str(args.output), rows, cardinalities, split, joins)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(message)s")
    job, rest = sys.argv[1], sys.argv[2:]
    mains = {"dictionary": dictionary_main, "transform": transform_main}
    if job not in mains:
        raise SystemExit("usage: python -m tasks.criteo.preprocess_arrow dictionary|transform [job options]")
    print(json.dumps(asdict(mains[job](rest))))
