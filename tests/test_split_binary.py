"""Split-binary write/check/read, verified against inline re-implementations of NVIDIA's two readers.

The readers below parse the yaml with PyYAML directly (not through tasks.formats.feature_spec) and follow
reference/nvidia-formats.md §2.2 (PyTorch ParametricDataset: os.pread per batch, short last batch) and §2.3 (TF2
TfRawBinaryDataset: FixedLengthRecordDataset, last partial batch dropped).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.formats.feature_spec import FeatureSpec
from tasks.formats.split_binary import DatasetError, SplitBinaryWriter, check_dataset, write_dataset

N_NUM = 3
# int8, int16 (127 is the boundary), int32, int8, int32 (32767 is the boundary)
CARDINALITIES = [3, 127, 40000, 126, 32767]
CAT_DTYPES = ["int8", "int16", "int32", "int8", "int32"]
ROWS = {"train": 1000, "test": 257, "validation": 100}
BATCH_SIZES = {"train": [300, 1, 450, 249], "test": [257], "validation": [60, 40]}


@dataclass
class Expected:
    label: np.ndarray
    numerical: np.ndarray
    categorical: np.ndarray  # [N, n_cat] int64


def _make_rows(rng: np.random.Generator, n: int) -> Expected:
    label = rng.integers(0, 2, n)
    numerical = rng.normal(0, 3, (n, N_NUM)).astype(np.float16)
    categorical = np.stack([rng.integers(0, card, n) for card in CARDINALITIES], axis=1)
    categorical[:3] = np.array(CARDINALITIES) - 1  # the largest ids must survive the narrow dtypes
    return Expected(label.astype(bool), numerical, categorical)


def _batches(expected: Expected, sizes: list[int]) -> list[tuple]:
    out, start = [], 0
    for i, size in enumerate(sizes):
        end = start + size
        # alternate the two accepted categorical shapes: [N, n_cat] array and list of columns
        cats = expected.categorical[start:end]
        cat_arg = cats if i % 2 == 0 else [cats[:, j].astype(np.int32) for j in range(cats.shape[1])]
        out.append((expected.label[start:end].astype(np.int64), expected.numerical[start:end].astype(np.float32),
                    cat_arg))
        start = end
    return out


@pytest.fixture()
def dataset(tmp_path: Path) -> tuple[Path, dict[str, Expected]]:
    rng = np.random.default_rng(7)
    expected = {m: _make_rows(rng, n) for m, n in ROWS.items()}
    out = tmp_path / "dataset"
    write_dataset(out, {m: _batches(expected[m], BATCH_SIZES[m]) for m in ROWS}, CARDINALITIES, N_NUM)
    return out, expected


# ---- independent readers ------------------------------------------------------------------------------------


def _nvidia_files(spec_path: Path, mapping: str) -> tuple[dict, str, str, list[str]]:
    """(yaml dict, label file, numerical file, categorical files in channel order) as NVIDIA resolves them."""
    d = yaml.safe_load(spec_path.read_text())
    base = os.path.dirname(str(spec_path))
    by_first = {c["features"][0]: os.path.join(base, c["files"][0]) for c in d["source_spec"][mapping]}
    ch = d["channel_spec"]
    return d, by_first[ch["label"][0]], by_first[ch["numerical"][0]], [by_first[c] for c in ch["categorical"]]


def _read_like_pytorch(spec_path: Path, mapping: str, batch_size: int) -> list[tuple]:
    d, label_path, num_path, cat_paths = _nvidia_files(spec_path, mapping)
    fs, ch = d["feature_spec"], d["channel_spec"]
    n_num = len(ch["numerical"])
    files = [(label_path, 1), (num_path, np.dtype(fs[ch["numerical"][0]]["dtype"]).itemsize * n_num)]
    files += [(p, np.dtype(fs[name]["dtype"]).itemsize) for p, name in zip(cat_paths, ch["categorical"])]
    fds = [(os.open(p, os.O_RDONLY), row_bytes * batch_size) for p, row_bytes in files]
    try:
        counts = {math.ceil(os.fstat(fd).st_size / bpb) for fd, bpb in fds}
        if len(counts) != 1:
            raise ValueError("Size mismatch in data files")
        batches = []
        for idx in range(counts.pop()):
            raw = [os.pread(fd, bpb, idx * bpb) for fd, bpb in fds]
            click = np.frombuffer(raw[0], dtype=bool).astype(np.float32)
            numerical = np.frombuffer(raw[1], dtype=np.float16).reshape(-1, n_num)
            cats = [np.frombuffer(r, dtype=np.dtype(fs[name]["dtype"])).astype(np.int64)[:, None]
                    for r, name in zip(raw[2:], ch["categorical"])]
            batches.append((numerical, np.concatenate(cats, axis=1), click))
        return batches
    finally:
        for fd, _ in fds:
            os.close(fd)


def _read_like_tf2(spec_path: Path, mapping: str, batch_size: int) -> list[tuple]:
    d, label_path, num_path, cat_paths = _nvidia_files(spec_path, mapping)
    fs, ch = d["feature_spec"], d["channel_spec"]
    n_num = len(ch["numerical"])
    cat_dtypes = [fs[name]["dtype"] for name in ch["categorical"]]
    assert set(cat_dtypes) <= {"int8", "int16", "int32"}  # TF2 decodes only these
    specs = [(label_path, 1), (num_path, 2 * n_num)]
    specs += [(p, np.dtype(t).itemsize) for p, t in zip(cat_paths, cat_dtypes)]
    records = []
    for path, row_bytes in specs:
        data, bpb = Path(path).read_bytes(), row_bytes * batch_size
        num_batches = int(len(data) / bpb)  # footer_bytes = the rest: the partial batch is dropped
        records.append([data[i * bpb:(i + 1) * bpb] for i in range(num_batches)])
    if len({len(r) for r in records}) != 1:
        raise ValueError("Size mismatch")
    batches = []
    for parts in zip(*records):
        labels = np.frombuffer(parts[0], dtype=np.int8)
        numerical = np.frombuffer(parts[1], dtype="<f2").reshape(-1, n_num)
        cats = [np.frombuffer(p, dtype=np.dtype(t).newbyteorder("<")).astype(np.int32).reshape(batch_size, 1)
                for p, t in zip(parts[2:], cat_dtypes)]
        batches.append(((numerical, np.concatenate(cats, axis=1)), labels))
    return batches


# ---- tests --------------------------------------------------------------------------------------------------


def test_written_files_have_nvidia_sizes_and_spec(dataset: tuple[Path, dict[str, Expected]]) -> None:
    out, _ = dataset
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    spec.check_feature_spec(tf2_compatible=True)
    assert sorted(spec.source_spec) == ["test", "train"]  # validation is written but, as NVIDIA, not listed
    assert [spec.feature_spec[f"cat_{i}.bin"]["dtype"] for i in range(5)] == CAT_DTYPES
    for mapping, rows in ROWS.items():
        assert (out / mapping / "label.bin").stat().st_size == rows
        assert (out / mapping / "numerical.bin").stat().st_size == rows * 2 * N_NUM
        for i, dtype in enumerate(CAT_DTYPES):
            assert (out / mapping / f"cat_{i}.bin").stat().st_size == rows * np.dtype(dtype).itemsize
    assert sorted(p.name for p in out.iterdir()) == ["feature_spec.yaml", "test", "train", "validation"]


@pytest.mark.parametrize("mapping", ["train", "test"])
def test_pytorch_reader_logic_reads_back_what_was_written(dataset, mapping: str) -> None:
    out, expected = dataset
    batch_size = 64
    batches = _read_like_pytorch(out / "feature_spec.yaml", mapping, batch_size)
    assert len(batches) == math.ceil(ROWS[mapping] / batch_size)
    assert len(batches[-1][2]) == ROWS[mapping] - batch_size * (len(batches) - 1)  # short last batch
    numerical = np.concatenate([b[0] for b in batches])
    categorical = np.concatenate([b[1] for b in batches])
    click = np.concatenate([b[2] for b in batches])
    np.testing.assert_array_equal(numerical, expected[mapping].numerical)
    np.testing.assert_array_equal(categorical, expected[mapping].categorical)
    np.testing.assert_array_equal(click, expected[mapping].label.astype(np.float32))


def test_tf2_reader_logic_drops_the_partial_batch(dataset) -> None:
    out, expected = dataset
    batch_size = 96
    batches = _read_like_tf2(out / "feature_spec.yaml", "train", batch_size)
    kept = (ROWS["train"] // batch_size) * batch_size
    assert len(batches) == ROWS["train"] // batch_size
    numerical = np.concatenate([b[0][0] for b in batches])
    categorical = np.concatenate([b[0][1] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(numerical, expected["train"].numerical[:kept])
    np.testing.assert_array_equal(categorical, expected["train"].categorical[:kept])
    np.testing.assert_array_equal(labels, expected["train"].label[:kept].astype(np.int8))


def test_check_dataset_passes_and_summarises(dataset) -> None:
    out, _ = dataset
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    summary = check_dataset(spec, ("train", "test", "validation"), chunk_rows=64)
    assert summary.rows == ROWS
    row_bytes = 1 + 2 * N_NUM + sum(np.dtype(t).itemsize for t in CAT_DTYPES)
    assert summary.bytes == {m: n * row_bytes for m, n in ROWS.items()}
    assert summary.total_rows == sum(ROWS.values())


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_check_dataset_catches_a_short_file(dataset) -> None:
    out, _ = dataset
    path = out / "train" / "cat_2.bin"  # int32
    os.truncate(path, path.stat().st_size - 3 * 4)
    with pytest.raises(DatasetError, match=r"^train/cat_2\.bin: 997 rows but train/label\.bin has 1000 rows "
                                           r"\(rows differ from row 997 on\)$"):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"))
    os.truncate(path, path.stat().st_size - 1)
    with pytest.raises(DatasetError, match=r"^train/cat_2\.bin: 3987 bytes is not a whole number of 4-byte rows"):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"))


def test_check_dataset_catches_an_id_at_cardinality(dataset) -> None:
    out, _ = dataset
    _poke(out / "test" / "cat_1.bin", 207 * 2, np.array([127], "<i2").tobytes())
    with pytest.raises(DatasetError, match=r"^test/cat_1\.bin row 207: id 127 >= cardinality 127$"):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"), chunk_rows=50)


def test_check_dataset_catches_a_negative_id(dataset) -> None:
    out, _ = dataset
    _poke(out / "train" / "cat_0.bin", 512, np.array([-1], "i1").tobytes())
    with pytest.raises(DatasetError, match=r"^train/cat_0\.bin row 512: id -1 < 0$"):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"), chunk_rows=100)


def test_check_dataset_catches_a_nan_numerical(dataset) -> None:
    out, _ = dataset
    _poke(out / "train" / "numerical.bin", (123 * N_NUM + 2) * 2, np.array([np.nan], "<f2").tobytes())
    message = r"^train/numerical\.bin row 123 column 2 \(num_2\): value nan is not finite$"
    with pytest.raises(DatasetError, match=message):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"), chunk_rows=50)


def test_check_dataset_catches_a_label_byte_2(dataset) -> None:
    out, _ = dataset
    _poke(out / "train" / "label.bin", 999, b"\x02")
    with pytest.raises(DatasetError, match=r"^train/label\.bin row 999: byte 2 is not 0 or 1$"):
        check_dataset(FeatureSpec.from_yaml(out / "feature_spec.yaml"), chunk_rows=64)


def test_check_dataset_catches_a_missing_validation_file(dataset) -> None:
    out, _ = dataset
    (out / "validation" / "cat_4.bin").unlink()
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    check_dataset(spec)  # train and test are fine
    with pytest.raises(DatasetError, match=r"^validation/cat_4\.bin: file is missing"):
        check_dataset(spec, ("validation",))


def test_writer_rejects_ids_that_do_not_fit_and_counts_rows_across_batches(tmp_path: Path) -> None:
    labels, numerical = np.zeros(4, int), np.zeros((4, 2), np.float32)
    with SplitBinaryWriter(tmp_path / "w", 2, [np.int8, np.int16]) as writer:
        writer.write(labels, numerical, np.ones((4, 2), np.int64))
        assert writer.rows == 4
        with pytest.raises(ValueError, match=r"cat_0\.bin row 6: id 128 outside \[0, 128\) \(int8\)"):
            writer.write(labels, numerical, [np.array([1, 1, 128, 1]), np.ones(4, int)])
        with pytest.raises(ValueError, match=r"cat_1\.bin row 4: id -2 outside"):
            writer.write(labels, numerical, [np.ones(4, int), np.array([-2, 1, 1, 1])])
        with pytest.raises(ValueError, match=r"label\.bin row 5: label 2 is not 0 or 1"):
            writer.write(np.array([0, 2, 1, 0]), numerical, np.ones((4, 2), int))
        # bools viewed from bytes may hold a 2
        with pytest.raises(ValueError, match=r"label\.bin row 6: label byte 2 is not 0 or 1"):
            writer.write(np.array([0, 1, 2, 0], np.uint8).view(np.bool_), numerical, np.ones((4, 2), int))
        with pytest.raises(ValueError, match=r"numerical\.bin row 7 column 1: value 1e\+06 is not finite"):
            writer.write(labels, np.array([[0, 0]] * 3 + [[0, 1e6]]), np.ones((4, 2), int))
        with pytest.raises(ValueError, match="ids must be integers"):
            writer.write(labels, numerical, np.ones((4, 2), np.float32))
        assert writer.rows == 4  # rejected batches leave nothing behind
    assert (tmp_path / "w" / "cat_1.bin").stat().st_size == 4 * 2


def test_write_dataset_enforces_cardinality_and_leaves_no_partial_mapping(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    good = (np.ones(2, int), np.zeros((2, 1)), np.array([[0], [1]]))
    bad = (np.ones(2, int), np.zeros((2, 1)), np.array([[0], [5]]))  # cardinality 5
    with pytest.raises(ValueError, match=rf"^{re.escape(str(out))}/train/cat_0\.bin row 3: id 5 outside \[0, 5\)"):
        write_dataset(out, {"train": [good, bad], "test": [good]}, [5], 1)
    assert not (out / "train").exists() and not (out / "feature_spec.yaml").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


def test_write_dataset_is_safe_to_retry(tmp_path: Path) -> None:
    # NVIDIA's transcoder appends on re-run; ours must produce the same bytes.
    out = tmp_path / "ds"
    batch = (np.array([1, 0, 1]), np.arange(6, dtype=np.float32).reshape(3, 2), np.array([[0], [1], [2]]))
    write_dataset(out, {"train": [batch], "test": [batch]}, [3], 2)
    first = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    write_dataset(out, {"train": [batch], "test": [batch]}, [3], 2)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == first
    assert (out / "train" / "label.bin").read_bytes() == b"\x01\x00\x01"
    with pytest.raises(ValueError, match=r"mappings \['test'\] are required"):
        write_dataset(out, {"train": [batch]}, [3], 2)
