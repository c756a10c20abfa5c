"""tasks.criteo.synthetic: the public Criteo TSV format, determinism, gzip, power-law values, a learnable signal."""

from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, NUM_FIELDS, RAW_COLUMNS
from tasks.criteo.synthetic import (
    SIGNAL_CATEGORICALS,
    SIGNAL_INTEGER,
    VOCAB_SIZES,
    CriteoDayGenerator,
    main,
    parse_day_range,
    write_criteo_day,
)

ROWS = 5000
HEX8 = re.compile(r"^[0-9a-f]{8}$")


@pytest.fixture(scope="module")
def generator() -> CriteoDayGenerator:
    return CriteoDayGenerator(seed=1234)


@pytest.fixture(scope="module")
def day0(tmp_path_factory: pytest.TempPathFactory, generator: CriteoDayGenerator) -> Path:
    return write_criteo_day(tmp_path_factory.mktemp("synthetic") / "day_0", 0, ROWS, generator=generator)


def _rows(path: Path) -> list[list[str]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    text = data.decode("ascii")  # the format is plain ASCII
    return [line.split("\t") for line in text[:-1].split("\n")]


def test_format_of_every_row(day0: Path) -> None:
    rows = _rows(day0)
    assert len(rows) == ROWS
    labels, negatives, empty_ints, empty_cats = Counter(), 0, 0, 0
    for row in rows:
        assert len(row) == NUM_FIELDS
        labels[row[0]] += 1
        for value in row[1:14]:
            if value == "":
                empty_ints += 1
            else:
                negatives += int(value) < 0  # must parse as an integer
        for value in row[14:]:
            if value == "":
                empty_cats += 1
            else:
                assert HEX8.match(value), value
    assert set(labels) == {"0", "1"}
    assert 0.05 < labels["1"] / ROWS < 0.6  # a click rate, not all clicks or none
    assert negatives > 0
    assert empty_ints > 0
    assert empty_cats > 0


def test_negative_integers_are_small_like_real_criteo(day0: Path) -> None:
    values = [int(row[i]) for row in _rows(day0) for i in range(1, 14) if row[i] != ""]
    assert min(values) >= -3


def test_deterministic_per_seed_and_day(tmp_path: Path) -> None:
    a = write_criteo_day(tmp_path / "a" / "day_2", 2, 1000, seed=7)
    b = write_criteo_day(tmp_path / "b" / "day_2", 2, 1000, seed=7)
    other_day = write_criteo_day(tmp_path / "c" / "day_3", 3, 1000, seed=7)
    other_seed = write_criteo_day(tmp_path / "d" / "day_2", 2, 1000, seed=8)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != other_day.read_bytes()
    assert a.read_bytes() != other_seed.read_bytes()


def test_block_size_does_not_change_the_rows(generator: CriteoDayGenerator) -> None:
    one = next(generator.blocks(1, 300, block_rows=300))
    # A fresh generator of the same seed gives the same rows: nothing depends on generator state between days.
    again = next(CriteoDayGenerator(seed=1234).blocks(1, 300, block_rows=300))
    for name in RAW_COLUMNS:
        assert np.array_equal(one[name], again[name])
    sizes = [len(b[LABEL]) for b in generator.blocks(1, 1000, block_rows=300)]
    assert sizes == [300, 300, 300, 100]


def test_gzip_variant_decompresses_to_plain_bytes(tmp_path: Path) -> None:
    plain = write_criteo_day(tmp_path / "day_5", 5, 2000)
    packed = write_criteo_day(tmp_path / "day_5.gz", 5, 2000, compress=True)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert packed.stat().st_size < plain.stat().st_size


def test_gzip_variant_is_reproducible_and_names_the_day(tmp_path: Path) -> None:
    first = write_criteo_day(tmp_path / "a" / "day_5.gz", 5, 200, compress=True)
    again = write_criteo_day(tmp_path / "b" / "day_5.gz", 5, 200, compress=True)
    assert b".tmp-" not in first.read_bytes()[:64]
    assert again.read_bytes() == first.read_bytes()


def test_categorical_values_follow_a_power_law(generator: CriteoDayGenerator) -> None:
    block = next(generator.blocks(0, 20000, block_rows=20000))
    values = block[CAT_COLUMNS[0]]
    counts = np.array(sorted(Counter(v for v in values if v).values(), reverse=True))
    assert counts[0] >= 50 * np.median(counts)
    assert len(counts) <= VOCAB_SIZES[0]
    # A long tail: most distinct values are seen only a few times.
    assert np.mean(counts <= 2) > 0.5


def test_hex_vocabulary_has_no_collisions(generator: CriteoDayGenerator) -> None:
    for vocab, size in zip(generator._hex_vocab, VOCAB_SIZES):
        assert len(set(vocab.tolist())) == size


def _signal_features(path: Path, columns: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One-hot-ready features: the categorical strings plus the signal integer bucketed by log."""
    import pandas as pd

    frame = pd.read_csv(path, sep="\t", header=None, names=list(RAW_COLUMNS), dtype=str, keep_default_na=False)
    cats = frame[[CAT_COLUMNS[c] for c in columns]].to_numpy()
    ints = pd.to_numeric(frame[INT_COLUMNS[SIGNAL_INTEGER]].replace("", np.nan))
    log_bucket = np.floor(np.log1p(ints.clip(lower=0).fillna(0))).astype(int).astype(str)
    bucket = np.where(ints.isna(), "missing", log_bucket)
    return np.column_stack([cats, bucket]), frame[LABEL].astype(int).to_numpy()


def _auc_day0_to_day1(tmp_path: Path, generator: CriteoDayGenerator, columns: tuple[int, ...]) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder

    train_x, train_y = _signal_features(write_criteo_day(tmp_path / "day_0", 0, 20000, generator=generator), columns)
    test_x, test_y = _signal_features(write_criteo_day(tmp_path / "day_1", 1, 20000, generator=generator), columns)
    encoder = OneHotEncoder(handle_unknown="ignore")
    model = LogisticRegression(max_iter=1000).fit(encoder.fit_transform(train_x), train_y)
    return float(roc_auc_score(test_y, model.predict_proba(encoder.transform(test_x))[:, 1]))


def test_planted_signal_is_learnable_across_days(tmp_path: Path, generator: CriteoDayGenerator) -> None:
    auc = _auc_day0_to_day1(tmp_path, generator, SIGNAL_CATEGORICALS)
    assert auc >= 0.7, auc


def test_non_signal_columns_carry_little_signal(tmp_path: Path, generator: CriteoDayGenerator) -> None:
    # Control for the test above: the signal lives in the columns the module names, not everywhere.
    noise = tuple(c for c in (1, 3, 6, 12, 15) if c not in SIGNAL_CATEGORICALS)
    auc = _auc_day0_to_day1(tmp_path, generator, noise)
    assert auc < 0.62, auc


def test_parse_day_range() -> None:
    assert parse_day_range("3") == [3]
    assert parse_day_range("0-2") == [0, 1, 2]


def test_main_writes_each_day(tmp_path: Path) -> None:
    paths = main([str(tmp_path), "--days", "1-2", "--rows", "50", "--gzip"])
    assert paths == [tmp_path / "day_1.gz", tmp_path / "day_2.gz"]
    for path in paths:
        assert gzip.decompress(path.read_bytes()).count(b"\n") == 50
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
