"""Reader of the prebatched TFRecords of docs/OUTBRAIN.md: the feature spec, per-worker shards and tf.data input.

A dataset directory holds feature_spec.yaml (NVIDIA's Wide & Deep FeatureSpec) whose channel_spec names the
features (`onehot_categorical`, `multihot_categorical`, `numerical`, `label`, `map` = display_id), whose
feature_spec gives `cardinality` (and `max_hotness` for multi-hot), and whose source_spec chunks per mapping are
`type: tfrecord` with `files` relative to the yaml and `metadata: {prebatch_size, multihot_padding}` (read from the
chunk, else from the top-level metadata).

Each record is one `tf.train.Example` holding a block of up to prebatch_size consecutive rows: one list per feature
(B values; B x max_hotness for multi-hot, padded with -1). The last block of a file may be shorter, so blocks are
parsed one by one with FixedLenSequenceFeature (any length) and reshaped to [B, 1] / [B, hotness]; `rebatch` then
cuts the stream of blocks into batches of any size without going through single rows.

Sharding per worker: by file (worker i reads files i, i+W, ...) when the files split evenly over the W workers, else
by record (worker i reads blocks i, i+W, ... of every file in order). Either way every row belongs to exactly one
worker. Every worker trains the same number of steps (the smallest shard's), so an uneven file split (3 files over
2 workers: 2 against 1) would leave a third of the rows out of every epoch; by record costs W reads of the files
instead, but the blocks a worker skips are not parsed. Training shuffles that worker's files and blocks with a seed per epoch (rows were shuffled before
blocking by the writer); evaluation reads every file in order, so display_id order is kept across files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tasks.formats.feature_spec import read_spec_document

FEATURE_SPEC_FILE = "feature_spec.yaml"
ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL = "onehot_categorical", "multihot_categorical", "numerical"
LABEL_CHANNEL, MAP_CHANNEL = "label", "map"
TFRECORD = "tfrecord"
INTERLEAVE_FILES = 4  # files read at once per worker; blocks are large, so a few streams keep the parser busy


class WideDeepDataError(ValueError):
    """A dataset that does not follow the prebatched-TFRecord layout; the message names the file and what is wrong."""


@dataclass(frozen=True)
class MappingSource:
    """One mapping's files and block layout."""

    files: tuple[Path, ...]
    features: tuple[str, ...]
    prebatch_size: int
    multihot_padding: int


@dataclass(frozen=True)
class WideDeepSpec:
    path: Path
    onehot: tuple[str, ...]
    multihot: tuple[str, ...]
    numerical: tuple[str, ...]
    label: str
    display_id: str | None
    cardinalities: dict[str, int]  # onehot and multihot features
    hotness: dict[str, int]  # multihot features
    sources: dict[str, MappingSource]

    @property
    def categorical(self) -> tuple[str, ...]:
        return self.onehot + self.multihot

    def source(self, mapping: str) -> MappingSource:
        try:
            return self.sources[mapping]
        except KeyError:
            raise WideDeepDataError(f"{self.path}: source_spec has no mapping {mapping!r} "
                                    f"(has {sorted(self.sources)})") from None


def _channel(path: Path, channels: dict[str, Any], name: str, required: bool = True) -> tuple[str, ...]:
    features = channels.get(name)
    if features is None and not required:
        return ()
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise WideDeepDataError(f"{path}: channel_spec.{name} must be a list of feature names, got {features!r}")
    return tuple(features)


def _positive_int(path: Path, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WideDeepDataError(f"{path}: {where} must be a positive integer, got {value!r}")
    return value


def _mapping_source(path: Path, mapping: str, chunks: Any, metadata: dict[str, Any]) -> MappingSource:
    if not isinstance(chunks, list) or not chunks:
        raise WideDeepDataError(f"{path}: source_spec.{mapping} must be a non-empty list of chunks")
    files: list[Path] = []
    features: tuple[str, ...] | None = None
    layouts = set()
    for chunk in chunks:
        if chunk.get("type") != TFRECORD:
            raise WideDeepDataError(f"{path}: source_spec.{mapping} chunk type {chunk.get('type')!r}, expected "
                                    f"{TFRECORD!r} (a parquet spec is not this reader's input)")
        names = tuple(chunk.get("features") or ())
        if features is not None and names != features:
            raise WideDeepDataError(f"{path}: source_spec.{mapping} chunks list different features")
        features = names
        meta = {**metadata, **(chunk.get("metadata") or {})}
        layouts.add((_positive_int(path, f"{mapping} prebatch_size", meta.get("prebatch_size")),
                     int(meta.get("multihot_padding", -1))))
        for name in chunk.get("files") or ():
            file = (path.parent / name).resolve()
            if not file.is_file():
                raise WideDeepDataError(f"{path}: source_spec.{mapping} lists {name}, which does not exist")
            files.append(file)
    if not files:
        raise WideDeepDataError(f"{path}: source_spec.{mapping} lists no files")
    if len(layouts) != 1:
        raise WideDeepDataError(f"{path}: source_spec.{mapping} chunks differ in prebatch_size/multihot_padding")
    (prebatch, padding), = layouts
    return MappingSource(files=tuple(files), features=features or (), prebatch_size=prebatch,
                         multihot_padding=padding)


def read_spec(dataset_dir: Path | str, feature_spec: str = FEATURE_SPEC_FILE) -> WideDeepSpec:
    path = Path(dataset_dir) / feature_spec
    document = read_spec_document(path, WideDeepDataError)
    features, channels = document.get("feature_spec") or {}, document.get("channel_spec") or {}
    onehot, multihot = _channel(path, channels, ONEHOT_CHANNEL), _channel(path, channels, MULTIHOT_CHANNEL)
    numerical, labels = _channel(path, channels, NUMERICAL_CHANNEL), _channel(path, channels, LABEL_CHANNEL)
    map_features = _channel(path, channels, MAP_CHANNEL, required=False)
    if len(labels) != 1 or len(map_features) > 1:
        raise WideDeepDataError(f"{path}: channel_spec needs exactly one label and at most one map feature, got "
                                f"{list(labels)} and {list(map_features)}")
    cardinalities = {name: _positive_int(path, f"feature_spec.{name}.cardinality",
                                         (features.get(name) or {}).get("cardinality"))
                     for name in onehot + multihot}
    hotness = {name: _positive_int(path, f"feature_spec.{name}.max_hotness",
                                   (features.get(name) or {}).get("max_hotness")) for name in multihot}
    metadata = document.get("metadata") or {}
    sources = {mapping: _mapping_source(path, mapping, chunks, metadata)
               for mapping, chunks in (document.get("source_spec") or {}).items()}
    spec = WideDeepSpec(path=path, onehot=onehot, multihot=multihot, numerical=numerical, label=labels[0],
                        display_id=map_features[0] if map_features else None, cardinalities=cardinalities,
                        hotness=hotness, sources=sources)
    for mapping, source in sources.items():
        missing = [n for n in (*spec.categorical, *numerical, spec.label) if n not in source.features]
        if missing:
            raise WideDeepDataError(f"{path}: source_spec.{mapping} lacks features {missing}")
    return spec


# ---- parsing ------------------------------------------------------------------------------------------------


def _parse_features(spec: WideDeepSpec, with_display_id: bool) -> dict[str, tf.io.FixedLenSequenceFeature]:
    ints = spec.categorical + ((spec.display_id,) if with_display_id else ())
    parse = {name: tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True) for name in ints}
    parse.update({name: tf.io.FixedLenSequenceFeature([], tf.float32, allow_missing=True)
                  for name in (*spec.numerical, spec.label)})
    return parse


def make_block_parser(spec: WideDeepSpec, with_display_id: bool):
    """serialized block -> (features {name: [B, 1] or [B, hotness]}, labels [B], display_ids [B] if asked)."""
    parse = _parse_features(spec, with_display_id)

    def parse_block(serialized: tf.Tensor):
        values = tf.io.parse_single_example(serialized, parse)
        features = {name: tf.reshape(values[name], [-1, 1]) for name in (*spec.onehot, *spec.numerical)}
        features.update({name: tf.reshape(values[name], [-1, spec.hotness[name]]) for name in spec.multihot})
        labels = values[spec.label]
        if with_display_id:
            return features, labels, values[spec.display_id]
        return features, labels

    return parse_block


def worker_files(files: tuple[Path, ...], index: int, workers: int) -> tuple[tuple[Path, ...], bool]:
    """(the files worker `index` reads, whether it must also take every W-th record of them)."""
    if len(files) % workers == 0:
        return files[index::workers], False
    return files, workers > 1


def worker_records(spec: WideDeepSpec, mapping: str, index: int = 0, workers: int = 1,
                   shuffle_seed: tuple[int, int] | None = None) -> tf.data.Dataset:
    """This worker's serialized blocks; with a seed, files and blocks in a seeded random order, else file order."""
    files, by_record = worker_files(spec.source(mapping).files, index, workers)
    names = [str(f) for f in files]
    if by_record:
        records = tf.data.TFRecordDataset(names).shard(workers, index)
    elif shuffle_seed is None:
        records = tf.data.TFRecordDataset(names)  # sequential: keeps display_id order across files
    else:
        order = np.random.default_rng(shuffle_seed).permutation(len(names))
        records = tf.data.Dataset.from_tensor_slices([names[i] for i in order]).interleave(
            tf.data.TFRecordDataset, cycle_length=min(INTERLEAVE_FILES, len(names)), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return records


def make_dataset(spec: WideDeepSpec, mapping: str, batch_size: int, *, index: int = 0, workers: int = 1,
                 shuffle_seed: tuple[int, int] | None = None, shuffle_blocks: int = 64,
                 drop_remainder: bool = False, with_display_id: bool = False) -> tf.data.Dataset:
    """Batches of `batch_size` rows of this worker's shard: (features, labels[, display_ids]).

    Training passes shuffle_seed=(seed, epoch) and drop_remainder=True; evaluation leaves both off and asks for
    display_ids (rows then come in file order).
    """
    if with_display_id and spec.display_id is None:
        raise WideDeepDataError(f"{spec.path}: channel_spec has no map feature (display_id) to group displays by")
    if with_display_id and spec.display_id not in spec.source(mapping).features:
        raise WideDeepDataError(f"{spec.path}: mapping {mapping!r} has no {spec.display_id} column")
    records = worker_records(spec, mapping, index, workers, shuffle_seed)
    if shuffle_seed is not None:
        records = records.shuffle(shuffle_blocks, seed=int(np.random.default_rng(shuffle_seed).integers(1 << 31)),
                                  reshuffle_each_iteration=False)
    blocks = records.map(make_block_parser(spec, with_display_id), num_parallel_calls=tf.data.AUTOTUNE,
                         deterministic=True)
    options = tf.data.Options()
    options.deterministic = True  # a resumed run must see the batches a straight run sees
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF  # sharded here
    return blocks.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE) \
        .with_options(options)


# ---- row counts ---------------------------------------------------------------------------------------------


def block_rows(spec: WideDeepSpec, mapping: str, index: int = 0, workers: int = 1) -> np.ndarray:
    """Rows of each block of this worker's shard, in file order (parses only the label list of each block).

    Raises WideDeepDataError naming the file if a block is longer than prebatch_size, or a block other than a
    file's last is shorter (a writer that dropped rows mid-file).
    """
    source = spec.source(mapping)
    label = {spec.label: tf.io.FixedLenSequenceFeature([], tf.float32, allow_missing=True)}
    files, by_record = worker_files(source.files, index, workers)
    per_file = []
    for file in files:
        lengths = tf.data.TFRecordDataset(str(file)).map(
            lambda s: tf.size(tf.io.parse_single_example(s, label)[spec.label]),
            num_parallel_calls=tf.data.AUTOTUNE)
        rows = np.fromiter((int(n) for n in lengths.as_numpy_iterator()), dtype=np.int64)
        if rows.size and (rows.max() > source.prebatch_size or (rows[:-1] != source.prebatch_size).any()):
            raise WideDeepDataError(f"{file}: blocks of {sorted(set(rows.tolist()))} rows; every block but the "
                                    f"last must hold prebatch_size={source.prebatch_size}")
        per_file.append(rows)
    rows = np.concatenate(per_file) if per_file else np.zeros(0, np.int64)
    return rows[index::workers] if by_record else rows
