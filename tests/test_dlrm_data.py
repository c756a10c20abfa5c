"""Split-binary batch reader: contents equal the files, short last batch, rank sharding, prefetch thread."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from models.dlrm.data import PrefetchingReader, SplitBinaryDataset, shard_batch_indices
from models.dlrm.synthetic import make_synthetic_dataset
from tasks.feature_spec import FeatureSpec

ROWS, BATCH = 1000, 64  # 15 full batches + one of 40 rows
CARDS = (40, 25, 200, 8, 300)  # 200 and 300 need int16 files; the others int8


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> FeatureSpec:
    out = tmp_path_factory.mktemp("split_binary")
    make_synthetic_dataset(out, train_rows=ROWS, test_rows=300, n_numerical=3, cardinalities=CARDS, seed=5)
    return FeatureSpec.from_yaml(out / "feature_spec.yaml")


def _numpy_reads(spec: FeatureSpec, mapping: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whole files with np.fromfile: the independent reference the batched reader must match."""
    label_path, numerical_path, cat_paths = spec.get_mapping_paths(mapping)
    label = np.fromfile(label_path, dtype=np.bool_).astype(np.float32)
    numerical = np.fromfile(numerical_path, dtype=np.float16).reshape(-1, 3).astype(np.float32)
    names = spec.get_categorical_feature_names()
    cats = [np.fromfile(cat_paths[n], dtype=spec.feature_spec[n]["dtype"]).astype(np.int64) for n in names]
    return numerical, np.stack(cats, axis=1), label


def test_batches_equal_numpy_reads_of_the_files(spec: FeatureSpec) -> None:
    numerical, categorical, label = _numpy_reads(spec, "train")
    assert {spec.feature_spec[n]["dtype"] for n in spec.get_categorical_feature_names()} == {"int8", "int16"}
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        assert dataset.rows == ROWS and len(dataset) == 16
        for i in range(len(dataset)):
            num_b, cat_b, label_b = dataset[i]
            rows = slice(i * BATCH, (i + 1) * BATCH)
            assert num_b.dtype == torch.float32 and cat_b.dtype == torch.int64 and label_b.dtype == torch.float32
            np.testing.assert_array_equal(num_b.numpy(), numerical[rows])
            np.testing.assert_array_equal(cat_b.numpy(), categorical[rows])
            np.testing.assert_array_equal(label_b.numpy(), label[rows])
        assert 0 < label.mean() < 1 and categorical[:, 2].max() > 127  # int16 ids above int8's range survive


def test_short_last_batch_kept_or_dropped(spec: FeatureSpec) -> None:
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        numerical, categorical, label = dataset[len(dataset) - 1]
        assert numerical.shape == (ROWS - 15 * BATCH, 3) and categorical.shape == (40, 5) and label.shape == (40,)
        with pytest.raises(IndexError):
            dataset[len(dataset)]
    with SplitBinaryDataset(spec, "train", BATCH, drop_last_batch=True) as dataset:
        assert len(dataset) == 15
    with SplitBinaryDataset(spec, "train", 100) as dataset:  # exact multiple: no short batch to keep
        assert len(dataset) == 10


@pytest.mark.parametrize("shuffle", [False, True])
def test_rank_sharding_covers_disjoint_batches(shuffle: bool) -> None:
    world = 3
    shards = [shard_batch_indices(16, rank, world, shuffle=shuffle, seed=1, epoch=2) for rank in range(world)]
    assert [len(s) for s in shards] == [5, 5, 5]  # 16 // 3 each: every rank runs the same number of steps
    flat = [i for s in shards for i in s]
    assert len(set(flat)) == 15 and set(flat) <= set(range(16))
    if not shuffle:
        assert shards[1] == [1, 4, 7, 10, 13]  # rank r takes batches r, r+world, ...
    uneven = [shard_batch_indices(16, rank, world, even=False) for rank in range(world)]
    assert sorted(i for s in uneven for i in s) == list(range(16))  # evaluation keeps every batch


def test_shuffle_is_seeded_per_epoch() -> None:
    epoch0 = shard_batch_indices(50, shuffle=True, seed=4, epoch=0)
    assert epoch0 == shard_batch_indices(50, shuffle=True, seed=4, epoch=0)
    assert epoch0 != shard_batch_indices(50, shuffle=True, seed=4, epoch=1)
    assert epoch0 != list(range(50)) and sorted(epoch0) == list(range(50))


def test_prefetch_thread_yields_the_same_as_direct_reads(spec: FeatureSpec) -> None:
    order = shard_batch_indices(16, shuffle=True, seed=9, even=False)
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        direct = list(PrefetchingReader(dataset, order, depth=0))
        prefetched = list(PrefetchingReader(dataset, order, depth=3))
        assert len(direct) == len(prefetched) == 16
        for a, b in zip(direct, prefetched):
            for x, y in zip(a, b):
                assert torch.equal(x, y)
        assert dataset.stats.batches == 32 and dataset.stats.bytes == 2 * ROWS * dataset.bytes_per_row
        assert dataset.stats.batches_per_second > 0 and dataset.stats.megabytes_per_second > 0


def test_prefetch_stops_its_thread_when_the_consumer_breaks(spec: FeatureSpec) -> None:
    with SplitBinaryDataset(spec, "train", 8) as dataset:
        reader = PrefetchingReader(dataset, range(len(dataset)), depth=2)
        for i, _ in enumerate(reader):
            if i == 3:
                break
        reader.close()
        assert not any(t.name == "split-binary-prefetch" for t in threading.enumerate())


def test_prefetch_reraises_reader_errors(spec: FeatureSpec) -> None:
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        with pytest.raises(IndexError, match="batch 99 out of range"):
            list(PrefetchingReader(dataset, [0, 1, 99], depth=2))


def test_truncated_file_is_refused_with_its_name(spec: FeatureSpec, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    for path in Path(spec.base_directory).rglob("*"):
        if path.is_file():
            target = copy / path.relative_to(spec.base_directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    label = copy / "train" / "label.bin"
    label.write_bytes(label.read_bytes()[:-3])  # 3 rows short: same batch count, so NVIDIA would accept it
    broken = FeatureSpec.from_yaml(copy / "feature_spec.yaml")
    with pytest.raises(ValueError, match=r"numerical\.bin: 1000 rows but .*label\.bin has 997"):
        SplitBinaryDataset(broken, "train", BATCH)
