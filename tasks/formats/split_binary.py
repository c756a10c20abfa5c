"""Split-binary datasets (NVIDIA DLRM's `split_binary` layout): write, verify and read them back.

Per mapping directory: `label.bin` (bool, 1 byte/row), `numerical.bin` (float16, row-major N x n_num), `cat_{i}.bin`
(int8/int16/int32 by NVIDIA's cardinality rule). Raw little-endian, no header; the row count is implied by the file
size. Writers stream batches and readers stream chunks, so no step holds a whole dataset in memory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core.progress import ProgressLog

from tasks.formats.feature_spec import (
    CARDINALITY_SELECTOR,
    CATEGORICAL_CHANNEL,
    DTYPE_SELECTOR,
    FEATURES_SELECTOR,
    FILES_SELECTOR,
    LABEL_CHANNEL,
    NUMERICAL_CHANNEL,
    TEST_MAPPING,
    TRAIN_MAPPING,
    FeatureSpec,
    FeatureSpecError,
)
from tasks.core.storage import atomic_directory

log = logging.getLogger(__name__)

# A dataset manifest's `extra` entry, set by whoever wrote the dataset through write_dataset: the cardinalities its
# writer checked every value against as it wrote it (labels 0/1, numericals finite as float16, ids in
# [0, cardinality)), so check_dataset need not read the dataset again (hundreds of GB at full size) while the
# feature spec still says the same.
CHECKED_AT_WRITE = "values_checked_at_write"


def checked_at_write(manifest: Mapping[str, Any] | None, spec: FeatureSpec) -> bool:
    """Whether a dataset's manifest says write_dataset's writer checked its values, and `spec` is still the feature
    spec write_dataset wrote with them: a yaml edited since (a smaller cardinality, two files' paths swapped, ...) is
    not vouched for, and neither is one too broken to compare (check_dataset then scans, or names what is wrong)."""
    checked = ((manifest or {}).get("extra") or {}).get(CHECKED_AT_WRITE)
    if not isinstance(checked, list):
        return False
    try:
        written = FeatureSpec.get_default_feature_spec(spec.get_number_of_numerical_features(), checked)
        return spec.to_dict() == written.to_dict()
    except (AttributeError, KeyError, TypeError, FeatureSpecError):
        return False

LABEL_FILE = "label.bin"
NUMERICAL_FILE = "numerical.bin"
NUMERICAL_DTYPE = np.dtype("<f2")
_PROGRESS_SECONDS = 30.0

# One batch: (label [N], numerical [N, n_num], categorical [N, n_cat] or a list of n_cat arrays [N]).
Batch = tuple[Any, Any, Any]


class DatasetError(ValueError):
    """A split-binary file that does not match its feature spec; the message names file, row and value."""


def categorical_file(index: int) -> str:
    return f"cat_{index}.bin"


def _little_endian(dtype: Any) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def _first_bad(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


class SplitBinaryWriter:
    """Appends batches to label.bin, numerical.bin and cat_{i}.bin in `directory` (truncated on open).

    Use as a context manager; make `directory` atomic with tasks.core.storage.atomic_directory. `cardinalities`
    (optional, ours) makes ids >= cardinality fail here rather than later in check_dataset.
    """

    def __init__(
        self,
        directory: Path,
        n_numerical: int,
        categorical_dtypes: Sequence[Any],
        cardinalities: Sequence[int] | None = None,
        buffer_bytes: int = 1 << 20,
        display_name: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        # what error messages call the directory: atomic_directory hands us a .tmp-* sibling of the real one
        self.name = Path(display_name) if display_name else self.directory
        self.n_numerical = n_numerical
        self.dtypes = [_little_endian(dt) for dt in categorical_dtypes]
        for dtype in self.dtypes:
            if dtype.kind not in "iu":
                raise ValueError(f"categorical dtype {dtype} is not an integer type")
        if cardinalities is not None and len(cardinalities) != len(self.dtypes):
            raise ValueError(f"{len(cardinalities)} cardinalities for {len(self.dtypes)} categorical features")
        self.cardinalities = list(cardinalities) if cardinalities is not None else None
        self.rows = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        names = [LABEL_FILE, NUMERICAL_FILE] + [categorical_file(i) for i in range(len(self.dtypes))]
        self._files: dict[str, Any] = {}
        try:
            for name in names:
                self._files[name] = open(self.directory / name, "wb", buffering=buffer_bytes)
        except BaseException:
            self._close(sync=False)
            raise
        self._progress = ProgressLog(f"writing {self.name}", every_s=_PROGRESS_SECONDS, logger=log)

    def __enter__(self) -> SplitBinaryWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._close(sync=exc_type is None)

    def close(self) -> None:
        self._close(sync=True)

    def _close(self, sync: bool) -> None:
        for f in self._files.values():
            if not f.closed:
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
                f.close()

    def write(self, label: Any, numerical: Any, categorical: Any) -> None:
        """Validate and append one batch; errors name the file and the dataset-wide row index."""
        labels = self._label_bytes(label)
        n = labels.shape[0]
        numbers = self._numerical_rows(numerical, n)
        columns = self._categorical_columns(categorical, n)
        self._files[LABEL_FILE].write(labels.data)
        self._files[NUMERICAL_FILE].write(numbers.data)
        for index, column in enumerate(columns):
            self._files[categorical_file(index)].write(column.data)
        self.rows += n
        self._progress.advance(n)

    def _where(self, name: str, batch_row: int) -> str:
        return f"{self.name / name} row {self.rows + batch_row}"

    def _label_bytes(self, label: Any) -> np.ndarray:
        array = np.asarray(label)
        if array.ndim == 2 and array.shape[1] == 1:
            array = array[:, 0]
        if array.ndim != 1:
            raise ValueError(f"{self.name / LABEL_FILE}: labels must be 1-d, got shape {array.shape}")
        if array.dtype == np.bool_:
            # numpy bools are bytes: one viewed from bytes may hold a 2, which check_dataset's scan would refuse
            array = np.ascontiguousarray(array)
            raw = array.view(np.uint8)
            if raw.size and int(raw.max()) > 1:
                bad = _first_bad(raw > 1)
                raise ValueError(f"{self._where(LABEL_FILE, bad)}: label byte {int(raw[bad])} is not 0 or 1")
        else:
            # astype(bool) would silently turn a 2 (or 0.5) into True; a label is 0 or 1. Integers within [0, 1]
            # are known so by two reductions; anything else is checked value by value.
            array = np.ascontiguousarray(array)
            within = array.dtype.kind in "iu" and (not array.size or (array.min() >= 0 and array.max() <= 1))
            bad = None if within else _first_bad((array != 0) & (array != 1))
            if bad is not None:
                raise ValueError(f"{self._where(LABEL_FILE, bad)}: label {array[bad].item()!r} is not 0 or 1")
        return np.ascontiguousarray(array.astype(np.bool_, copy=False))

    def _numerical_rows(self, numerical: Any, n: int) -> np.ndarray:
        array = np.zeros((n, 0)) if numerical is None and self.n_numerical == 0 else np.asarray(numerical)
        if array.shape != (n, self.n_numerical):
            raise ValueError(f"{self.name / NUMERICAL_FILE}: numerical batch has shape {array.shape}, "
                             f"expected ({n}, {self.n_numerical})")
        with np.errstate(over="ignore", invalid="ignore"):
            halves = np.ascontiguousarray(array.astype(NUMERICAL_DTYPE, copy=False))
        bad = None if np.isfinite(halves).all() else _first_bad(~np.isfinite(halves))
        if bad is not None:
            row, col = divmod(bad, self.n_numerical)
            raise ValueError(f"{self._where(NUMERICAL_FILE, row)} column {col}: value {float(array[row, col]):g} "
                             "is not finite as float16 (NaN, inf, or beyond +-65504)")
        return halves

    def _categorical_columns(self, categorical: Any, n: int) -> list[np.ndarray]:
        if isinstance(categorical, np.ndarray) and categorical.ndim == 2:
            columns = [categorical[:, i] for i in range(categorical.shape[1])]
        else:
            columns = [np.asarray(c) for c in (categorical if categorical is not None else [])]
        if len(columns) != len(self.dtypes):
            raise ValueError(f"{self.name}: {len(columns)} categorical columns, expected {len(self.dtypes)}")
        out = []
        for index, (column, dtype) in enumerate(zip(columns, self.dtypes)):
            name = categorical_file(index)
            if column.shape != (n,):
                raise ValueError(f"{self.name / name}: batch has shape {column.shape}, expected ({n},)")
            if column.dtype.kind not in "iu":
                raise ValueError(f"{self.name / name}: ids must be integers, got dtype {column.dtype}")
            limit = int(np.iinfo(dtype).max) + 1
            if self.cardinalities is not None:
                limit = min(limit, int(self.cardinalities[index]))
            # Checked once contiguous (a column of packed records is strided, and reductions over it are slow),
            # before any narrowing cast; two reductions, no masks unless a value is out of range.
            column = np.ascontiguousarray(column)
            if n and (int(column.min()) < 0 or int(column.max()) >= limit):
                bad = _first_bad((column < 0) | (column >= limit))
                raise ValueError(f"{self._where(name, bad)}: id {int(column[bad])} outside [0, {limit}) "
                                 f"({dtype.name}{', cardinality' if self.cardinalities else ''})")
            out.append(column.astype(dtype, copy=False))
        return out


def write_dataset(
    out_dir: Path,
    mappings: Mapping[str, Iterable[Batch]],
    cardinalities: Sequence[int],
    n_numerical: int,
) -> FeatureSpec:
    """Write each mapping into out_dir/<mapping>/ (atomically) and then out_dir/feature_spec.yaml.

    The yaml is NVIDIA's default spec and lists only train and test; extra mappings (e.g. validation) are
    written as directories beside them, as NVIDIA's preprocessing does. Wrap out_dir in atomic_directory if the
    whole dataset must appear at once.
    """
    out_dir = Path(out_dir)
    missing = sorted({TRAIN_MAPPING, TEST_MAPPING} - set(mappings))
    if missing:
        raise ValueError(f"write_dataset: mappings {missing} are required (the feature spec lists train and test)")
    spec = FeatureSpec.get_default_feature_spec(n_numerical, cardinalities)
    spec.base_directory = str(out_dir)
    spec.check_feature_spec()  # fail on bad cardinalities before writing gigabytes
    dtypes = [np.dtype(spec.feature_spec[name][DTYPE_SELECTOR]) for name in spec.get_categorical_feature_names()]
    for mapping, batches in mappings.items():
        if not mapping or mapping in {".", ".."} or "/" in mapping or "\\" in mapping:
            raise ValueError(f"write_dataset: mapping name {mapping!r} is not a plain directory name")
        started = time.monotonic()
        with atomic_directory(out_dir / mapping) as tmp:
            name = str(out_dir / mapping)
            with SplitBinaryWriter(tmp, n_numerical, dtypes, cardinalities, display_name=name) as writer:
                for batch in batches:
                    writer.write(*batch)
        log.info("wrote %s/%s: %d rows in %.1f s", out_dir, mapping, writer.rows, time.monotonic() - started)
    spec.to_yaml()
    return spec


@dataclass
class _DataFile:
    """One file of a mapping: where it is, how a row of it is laid out, and what its values must satisfy."""

    rel: str
    path: Path
    role: str  # label | numerical | categorical
    dtype: np.dtype
    width: int
    features: list[str]
    cardinality: int | None = None

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * self.width


def _chunk_file(spec: FeatureSpec, mapping: str, feature: str) -> str:
    """The relative file of the chunk holding `feature`; mappings not in the yaml mirror train's paths."""
    source = mapping if mapping in spec.source_spec else TRAIN_MAPPING
    for chunk in spec.source_spec[source]:
        if chunk[FEATURES_SELECTOR][0] == feature:
            rel = chunk[FILES_SELECTOR][0]
            break
    else:
        raise FeatureSpecError(f"source_spec.{source}: no chunk starts with feature {feature!r}")
    if source == mapping:
        return rel
    head, _, tail = rel.partition("/")
    if head != TRAIN_MAPPING or not tail:
        raise FeatureSpecError(f"mapping {mapping!r} is not in the feature spec and train file {rel!r} is not "
                               "under train/, so its files cannot be located")
    return f"{mapping}/{tail}"


def _mapping_files(spec: FeatureSpec, mapping: str) -> list[_DataFile]:
    """label, numerical, then categoricals in channel (embedding) order."""
    if spec.base_directory is None:
        raise FeatureSpecError("feature spec has no base_directory: cannot locate its files")
    label = spec.channel_spec[LABEL_CHANNEL][0]
    numerical = spec.channel_spec[NUMERICAL_CHANNEL]
    layout = [(label, "label", np.dtype(np.uint8), 1, [label])]  # bytes, so a stray 2 is visible
    if numerical:
        layout.append((numerical[0], "numerical", NUMERICAL_DTYPE, len(numerical), list(numerical)))
    for name in spec.channel_spec[CATEGORICAL_CHANNEL]:
        layout.append((name, "categorical", _little_endian(spec.feature_spec[name][DTYPE_SELECTOR]), 1, [name]))
    files = []
    for first, role, dtype, width, features in layout:
        rel = _chunk_file(spec, mapping, first)
        card = spec.feature_spec[first].get(CARDINALITY_SELECTOR) if role == "categorical" else None
        path = Path(os.path.join(spec.base_directory, rel))
        files.append(_DataFile(rel, path, role, dtype, width, features, card))
    return files


@dataclass
class DatasetSummary:
    """Rows and bytes per mapping of a checked dataset."""

    rows: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def _row_count(files: list[_DataFile]) -> int:
    """The one row count all files of a mapping describe; DatasetError naming the first file that disagrees."""
    counts = []
    for data_file in files:
        if not data_file.path.is_file():
            raise DatasetError(f"{data_file.rel}: file is missing ({data_file.path})")
        size = data_file.path.stat().st_size
        if size % data_file.row_bytes:
            raise DatasetError(f"{data_file.rel}: {size} bytes is not a whole number of {data_file.row_bytes}-byte "
                               f"rows (ends {size % data_file.row_bytes} bytes into row {size // data_file.row_bytes})")
        counts.append(size // data_file.row_bytes)
    reference = files[0]
    for data_file, count in zip(files, counts):
        if count != counts[0]:
            raise DatasetError(f"{data_file.rel}: {count} rows but {reference.rel} has {counts[0]} rows "
                               f"(rows differ from row {min(count, counts[0])} on)")
    return counts[0]


def _check_values(data_file: _DataFile, values: np.ndarray, first_row: int) -> None:
    """DatasetError for the first value of a chunk that breaks its file's rule."""
    if data_file.role == "label":
        bad = _first_bad(values > 1)
        if bad is not None:
            raise DatasetError(f"{data_file.rel} row {first_row + bad}: byte {int(values[bad])} is not 0 or 1")
    elif data_file.role == "numerical":
        bad = _first_bad(~np.isfinite(values))
        if bad is not None:
            row, col = divmod(bad, data_file.width)
            raise DatasetError(f"{data_file.rel} row {first_row + row} column {col} ({data_file.features[col]}): "
                               f"value {float(values[bad])} is not finite")
    else:
        bad = _first_bad((values < 0) | (values >= data_file.cardinality))
        if bad is not None:
            value = int(values[bad])
            rule = "< 0" if value < 0 else f">= cardinality {data_file.cardinality}"
            raise DatasetError(f"{data_file.rel} row {first_row + bad}: id {value} {rule}")


def _scan_file(data_file: _DataFile, chunk_rows: int, progress: ProgressLog) -> None:
    with open(data_file.path, "rb") as f:
        row = 0
        while True:
            values = np.fromfile(f, dtype=data_file.dtype, count=chunk_rows * data_file.width)
            if values.size == 0:
                return
            _check_values(data_file, values, row)
            rows = values.size // data_file.width
            row += rows
            progress.advance(rows)


def check_dataset(
    spec: FeatureSpec, mappings: Sequence[str] = (TRAIN_MAPPING, TEST_MAPPING), chunk_rows: int = 1 << 20,
    scan_values: bool = True,
) -> DatasetSummary:
    """Stream every file of each mapping and verify sizes, ids, numericals and labels against the spec
    (scan_values=False: sizes only, for a dataset whose writer checked its values: checked_at_write).

    Mappings not listed in the yaml (validation) are found by mirroring train's file names. Raises
    DatasetError (one line: file, row, value) or FeatureSpecError; an empty mapping is an error.
    """
    spec.check_feature_spec()
    summary = DatasetSummary()
    for mapping in mappings:
        started = time.monotonic()
        files = _mapping_files(spec, mapping)
        rows = _row_count(files)
        if rows == 0:
            raise DatasetError(f"{mapping}: every file is empty (0 rows)")
        if scan_values:
            progress = ProgressLog(f"checking {mapping}", total=rows * len(files), every_s=_PROGRESS_SECONDS,
                                   logger=log)
            for data_file in files:
                _scan_file(data_file, chunk_rows, progress)
        summary.rows[mapping] = rows
        summary.bytes[mapping] = sum(data_file.row_bytes * rows for data_file in files)
        log.info("checked %s: %d rows, %d files, %.1f MB in %.1f s%s", mapping, rows, len(files),
                 summary.bytes[mapping] / 1e6, time.monotonic() - started,
                 "" if scan_values else " (sizes; the values were checked as they were written)")
    return summary


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    """os.pread until `size` bytes or end of file (pread may return short reads)."""
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)

