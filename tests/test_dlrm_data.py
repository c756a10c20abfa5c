"""Split-binary batch reader: contents equal the files, short last batch, rank sharding, prefetch thread."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from models.dlrm.data import (PrefetchingReader, SplitBinaryDataset, categorical_columns, consecutive_runs,
                              decode_batch, decodes_on_device, shard_batch_indices, to_device)
from models.dlrm.synthetic import make_synthetic_dataset
from tasks.formats.feature_spec import FeatureSpec

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
            assert num_b.dtype == torch.float32 and cat_b.dtype == torch.int32 and label_b.dtype == torch.float32
            np.testing.assert_array_equal(num_b.numpy(), numerical[rows])
            np.testing.assert_array_equal(cat_b.numpy(), categorical[rows])
            np.testing.assert_array_equal(label_b.numpy(), label[rows])
        assert 0 < label.mean() < 1 and categorical[:, 2].max() > 127  # int16 ids above int8's range survive


def test_raw_batches_keep_the_file_dtypes_and_decode_to_the_host_batch(spec: FeatureSpec) -> None:
    numerical, categorical, label = _numpy_reads(spec, "train")
    names = spec.get_categorical_feature_names()
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        for i in (0, 7, len(dataset) - 1):  # first, middle, the short last batch
            raw = dataset.raw(i)
            num_r, cats_r, label_r = raw
            assert num_r.dtype == torch.float16 and label_r.dtype == torch.bool
            columns = categorical_columns(raw)
            assert [str(c.dtype).removeprefix("torch.") for c in columns] == [spec.feature_spec[n]["dtype"]
                                                                            for n in names]
            assert len(cats_r) == len({c.dtype for c in columns})  # one [k, b] array per file dtype
            rows = slice(i * BATCH, (i + 1) * BATCH)
            np.testing.assert_array_equal(np.stack([c.numpy() for c in columns], axis=1), categorical[rows])
            decoded = decode_batch(raw, torch.device("cpu"))
            host = dataset[i]
            for a, b in zip(decoded, host):
                assert a.dtype == b.dtype and torch.equal(a, b)
            assert torch.equal(to_device(raw, torch.device("cpu"))[1], host[1])
            np.testing.assert_array_equal(host[0].numpy(), numerical[rows])
            np.testing.assert_array_equal(host[2].numpy(), label[rows])
            # the categorical batch is a column-major view: each embedding lookup reads a contiguous column
            assert host[1][:, 2].is_contiguous() and not host[1].is_contiguous()
    assert decodes_on_device(torch.device("cuda")) and not decodes_on_device(torch.device("cpu"))


def test_prefetch_in_raw_mode_yields_raw_batches(spec: FeatureSpec) -> None:
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        batches = list(PrefetchingReader(dataset, [3, 0], depth=2, raw=True))
        assert [len(categorical_columns(b)) for b in batches] == [len(CARDS)] * 2
        assert batches[0][0].dtype == torch.float16
        assert torch.equal(decode_batch(batches[1], torch.device("cpu"))[1], dataset[0][1])


def test_spans_read_once_and_hand_out_the_same_batches(spec: FeatureSpec, monkeypatch) -> None:
    import models.dlrm.data as data

    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        singles = [dataset[i] for i in range(len(dataset))]
        raw_singles = [decode_batch(dataset.raw(i), torch.device("cpu")) for i in range(len(dataset))]
        span = dataset.span(12, 4)  # the last span holds the short batch
        raw_span = [decode_batch(b, torch.device("cpu")) for b in dataset.raw_span(12, 4)]
        for got in (span, raw_span):
            assert len(got) == 4 and len(got[-1][2]) == ROWS - 15 * BATCH
            for a, b in zip(got, singles[12:]):
                assert all(torch.equal(x, y) for x, y in zip(a, b))
                assert a[1][:, 1].is_contiguous()  # span views stay column-major
        assert all(torch.equal(x, y) for a, b in zip(raw_singles, singles) for x, y in zip(a, b))
        with pytest.raises(IndexError, match="batches 14..16 out of range"):
            dataset.span(14, 3)
        # A span is about SPAN_BYTES; the reader cuts runs of consecutive indices to that length.
        monkeypatch.setattr(data, "SPAN_BYTES", 3 * BATCH * dataset.bytes_per_row)
        assert dataset.span_batches == 3
        reads = []
        monkeypatch.setattr(dataset, "span", lambda first, count: reads.append((first, count)) or
                            [singles[i] for i in range(first, first + count)])
        order = [0, 1, 2, 3, 4, 9, 10, 7, 15]
        got = list(PrefetchingReader(dataset, order, depth=2))
        assert reads == [(0, 3), (3, 2), (9, 2), (7, 1), (15, 1)]
        assert all(torch.equal(g[2], singles[i][2]) for g, i in zip(got, order))
    assert list(consecutive_runs([5, 6, 7, 8, 2, 3, 3], 3)) == [(5, 3), (8, 1), (2, 2), (3, 1)]


def _raw_equals_files(raw, rows: slice, reads: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bool:
    numerical, categorical, label = reads
    return (np.array_equal(raw[0].float().numpy(), numerical[rows])
            and np.array_equal(np.stack([c.numpy() for c in categorical_columns(raw)], axis=1), categorical[rows])
            and np.array_equal(raw[2].float().numpy(), label[rows]))


def test_span_buffers_are_reused_only_once_no_batch_of_the_span_is_alive(spec: FeatureSpec, monkeypatch) -> None:
    import models.dlrm.data as data

    reads = _numpy_reads(spec, "train")
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        monkeypatch.setattr(data, "SPAN_BYTES", 4 * BATCH * dataset.bytes_per_row)
        first = dataset.raw_span(0, 4)
        address = first[0][2].data_ptr()
        held = first[3][1][0].values  # one categorical group of the last batch: a view holds the whole span
        del first
        for _ in range(3):  # spans read while `held` is alive never land in its buffer
            assert dataset.raw_span(4, 4)[0][2].data_ptr() != address
        assert torch.equal(held, dataset.raw(3)[1][0].values)
        del held
        again = dataset.raw_span(8, 4)  # now the buffer is free: reused, and holds the new rows
        assert again[0][2].data_ptr() == address
        assert all(_raw_equals_files(b, slice((8 + k) * BATCH, (9 + k) * BATCH), reads) for k, b in enumerate(again))


@pytest.mark.parametrize("depth", [0, 3])
def test_held_raw_batches_stay_intact_beyond_the_kept_buffers(spec: FeatureSpec, monkeypatch, depth: int) -> None:
    """A consumer holding every batch (more spans than SPAN_BUFFERS) gets fresh buffers, never overwritten ones."""
    import models.dlrm.data as data

    reads = _numpy_reads(spec, "train")
    with SplitBinaryDataset(spec, "train", BATCH) as dataset:
        monkeypatch.setattr(data, "SPAN_BYTES", BATCH * dataset.bytes_per_row)  # one batch per span: 16 spans
        monkeypatch.setattr(dataset._buffers, "capacity", 3)
        for order in (list(range(len(dataset))), shard_batch_indices(16, shuffle=True, seed=3, even=False)):
            held = list(PrefetchingReader(dataset, order, depth=depth, raw=True))
            assert len(held) == 16 and len({b[2].data_ptr() for b in held}) == 16
            assert all(_raw_equals_files(b, slice(i * BATCH, (i + 1) * BATCH), reads) for b, i in zip(held, order))
            assert len(dataset._buffers._slots) == 3


def test_pinned_spans_are_views_of_the_allocators_own_buffer(spec: FeatureSpec) -> None:
    """The pinned-memory path (a CUDA run) reads each batch into a fresh buffer from torch's allocator and hands
    out torch views of that very buffer: the pinned allocator records its copy events by the buffer's storage, so
    a batch made with torch.from_numpy over the same bytes would let the next read overwrite a batch mid-copy.
    No GPU here, so a plain torch buffer stands in for the pinned one; the batches must equal the pooled path's."""
    reads = _numpy_reads(spec, "train")
    with (SplitBinaryDataset(spec, "train", BATCH) as pooled,
          SplitBinaryDataset(spec, "train", BATCH) as fresh):
        assert pooled.span_batches > 1
        buffers: list[torch.Tensor] = []
        fresh._allocate = lambda nbytes: buffers.append(torch.empty(nbytes, dtype=torch.uint8)) or buffers[-1]
        assert fresh.span_batches == 1  # a longer span's categorical columns would be strided: copied synchronously
        for i in (0, 9, len(fresh) - 1):
            raw, expected = fresh.raw(i), pooled.raw(i)
            assert _raw_equals_files(raw, slice(i * BATCH, (i + 1) * BATCH), reads)
            assert raw[0].dtype == expected[0].dtype and raw[2].dtype == expected[2].dtype
            assert [(g.values.dtype, g.positions.tolist()) for g in raw[1]] == [
                (g.values.dtype, g.positions.tolist()) for g in expected[1]]
            base = buffers[-1].untyped_storage().data_ptr()
            tensors = [raw[0], raw[2], *(g.values for g in raw[1])]
            assert all(t.untyped_storage().data_ptr() == base for t in tensors)
            assert all(t.is_contiguous() for t in tensors)
        assert len(buffers) == 3 and not pooled._allocate


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
