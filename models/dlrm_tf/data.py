"""tf.data reader of a split-binary mapping that streams whole batches (NVIDIA's TF2 TfRawBinaryDataset, without its
GPU prefetch on CPU).

Each file of the mapping (label.bin, numerical.bin, cat_i.bin) is a `tf.data.FixedLengthRecordDataset` whose record
is one batch's bytes of that file; the files are zipped and each record decoded with `tf.io.decode_raw` (float16
numericals -> float32 [b, n_num], int8/16/32 ids -> int32 [b, n_cat], bool labels -> float32 [b]): one read and
a few vector ops per batch and file, no per-row Python.

Training (`train_batches`): a record is one *global* batch; worker w of W cuts its rows [w*b, (w+1)*b) out of the
record's bytes before decoding (b = global / W). Worker w's step s therefore sees rows [(s*W + w)*b, ...) of the
file, the batch the PyTorch trainer's rank w reads at step s (models.dlrm.data.shard_batch_indices), and the short
last global batch is dropped (NVIDIA's TF2 reader drops it too). Evaluation (`eval_batches`): every row in file
order, the short last batch included, so both frameworks score the same test rows.

Unlike NVIDIA's reader, which only compares batch counts, every file must hold exactly the same number of rows;
a file that does not is named when the reader is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from tasks.formats.feature_spec import FeatureSpec

_TF_DTYPES = {np.dtype("int8"): tf.int8, np.dtype("int16"): tf.int16, np.dtype("int32"): tf.int32,
              np.dtype("float16"): tf.float16, np.dtype("bool"): tf.uint8, np.dtype("uint8"): tf.uint8}


@dataclass(frozen=True)
class _File:
    path: Path
    dtype: np.dtype
    width: int  # values per row

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * self.width


@dataclass(frozen=True)
class MappingFiles:
    """The files of one mapping in reading order (label, numerical, categoricals in embedding order) and their rows."""

    mapping: str
    label: _File
    numerical: _File
    categorical: tuple[_File, ...]
    rows: int

    @property
    def files(self) -> tuple[_File, ...]:
        return (self.label, self.numerical, *self.categorical)

    @property
    def bytes_per_row(self) -> int:
        return sum(f.row_bytes for f in self.files)


def mapping_files(spec: FeatureSpec, mapping: str) -> MappingFiles:
    """Locate and size a mapping's files; ValueError naming the first file that is not whole rows or disagrees."""
    spec.check_feature_spec(tf2_compatible=True)  # as NVIDIA's TF2 reader: int8/16/32 categoricals only
    label_path, numerical_path, categorical_paths = spec.get_mapping_paths(mapping)
    label_name = spec.channel_spec["label"][0]
    numerical_names = spec.channel_spec["numerical"]
    if label_path is None or numerical_path is None or not numerical_names:
        raise ValueError(f"{spec.base_directory}: mapping {mapping!r} needs a label file and a numerical file "
                         "(DLRM's bottom MLP feeds the interaction)")
    label = _File(label_path, np.dtype(spec.feature_spec[label_name]["dtype"]), 1)
    numerical = _File(numerical_path, np.dtype(spec.feature_spec[numerical_names[0]]["dtype"]), len(numerical_names))
    categorical = tuple(_File(categorical_paths[name], np.dtype(spec.feature_spec[name]["dtype"]), 1)
                        for name in spec.get_categorical_feature_names())
    rows = None
    for f in (label, numerical, *categorical):
        if f.dtype not in _TF_DTYPES:
            raise ValueError(f"{f.path}: dtype {f.dtype} cannot be decoded by the TF2 reader")
        size = os.stat(f.path).st_size
        if size % f.row_bytes:
            raise ValueError(f"{f.path}: {size} bytes is not a whole number of {f.row_bytes}-byte rows "
                             f"({f.dtype} x {f.width})")
        if rows is None:
            rows = size // f.row_bytes
        elif size // f.row_bytes != rows:
            raise ValueError(f"{f.path}: {size // f.row_bytes} rows but {label.path} has {rows}: size mismatch")
    return MappingFiles(mapping, label, numerical, categorical, int(rows))


def _records(f: _File, batch_rows: int, first_row: int, batches: int) -> tf.data.Dataset:
    """`batches` records of `batch_rows` rows of file f, starting at row `first_row`."""
    record = batch_rows * f.row_bytes
    footer = os.stat(f.path).st_size - first_row * f.row_bytes - batches * record
    return tf.data.FixedLengthRecordDataset([str(f.path)], record_bytes=record, header_bytes=first_row * f.row_bytes,
                                            footer_bytes=footer)


def _decoder(files: MappingFiles, rows_from: int | None = None, rows: int | None = None):
    """A tf.data map function: one record per file -> ((numerical, categorical), label); with `rows_from`/`rows`,
    only those rows of the record are decoded (a worker's share of a global batch)."""

    def cut(record: tf.Tensor, f: _File) -> tf.Tensor:
        if rows is None:
            return record
        return tf.strings.substr(record, rows_from * f.row_bytes, rows * f.row_bytes)

    def decode(label: tf.Tensor, numerical: tf.Tensor, *categorical: tf.Tensor):
        y = tf.cast(tf.io.decode_raw(cut(label, files.label), tf.uint8), tf.float32)
        x = tf.io.decode_raw(cut(numerical, files.numerical), _TF_DTYPES[files.numerical.dtype])
        x = tf.cast(tf.reshape(x, [-1, files.numerical.width]), tf.float32)
        ids = [tf.cast(tf.io.decode_raw(cut(c, f), _TF_DTYPES[f.dtype]), tf.int32)
               for c, f in zip(categorical, files.categorical)]
        cat = tf.stack(ids, axis=1) if ids else tf.zeros([tf.shape(y)[0], 0], tf.int32)
        return (x, cat), y

    return decode


def _zipped(files: MappingFiles, batch_rows: int, first_row: int, batches: int) -> tf.data.Dataset:
    return tf.data.Dataset.zip(tuple(_records(f, batch_rows, first_row, batches) for f in files.files))


def train_batches(files: MappingFiles, global_batch: int, worker: int = 0, workers: int = 1,
                  prefetch: int = 4, first_batch: int = 0) -> tf.data.Dataset:
    """This worker's share (global_batch / workers rows) of every full global batch from `first_batch` on (a
    resumed run starts reading there: nothing before it is read), in file order."""
    if global_batch % workers:
        raise ValueError(f"global batch {global_batch} is not divisible by {workers} workers")
    batches = files.rows // global_batch - first_batch
    local = global_batch // workers
    data = _zipped(files, global_batch, first_batch * global_batch, batches).map(_decoder(files, worker * local, local),
                                                         num_parallel_calls=tf.data.AUTOTUNE)
    return data.prefetch(prefetch if prefetch > 0 else tf.data.AUTOTUNE)


def train_steps(files: MappingFiles, global_batch: int) -> int:
    """Full global batches in the mapping (the steps of one epoch)."""
    return files.rows // global_batch


def eval_batches(files: MappingFiles, batch_size: int, prefetch: int = 4) -> tf.data.Dataset:
    """Every row in file order, in batches of batch_size, the short last one included."""
    full, rest = divmod(files.rows, batch_size)
    decode = _decoder(files)
    data = _zipped(files, batch_size, 0, full).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    if rest:
        data = data.concatenate(_zipped(files, rest, full * batch_size, 1).map(decode))
    return data.prefetch(prefetch if prefetch > 0 else tf.data.AUTOTUNE)
