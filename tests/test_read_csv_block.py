"""tasks.core.validation.read_csv_block: a block of lines parsed in small pieces reads exactly as one piece would."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tasks.core import validation

NAMES = ["a", "b", "c"]
PARSE = pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False)
CONVERT = pacsv.ConvertOptions(column_types={name: pa.binary() for name in NAMES})


def whole(data: bytes) -> pa.Table:
    """What the parsers did before: the block as one pyarrow block."""
    return pacsv.read_csv(io.BytesIO(data), read_options=pacsv.ReadOptions(
        column_names=NAMES, block_size=max(len(data), 1 << 20), use_threads=False),
        parse_options=PARSE, convert_options=CONVERT)


def lines(rows: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    widths = rng.integers(0, 30, size=(rows, 3))
    return b"".join(b"\t".join(b"x" * int(w) for w in row) + b"\n" for row in widths)


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(validation, "PARSE_CHUNK_BYTES", 4096)


def test_pieces_read_as_one_block_into_one_chunk_per_column(small_pieces):
    data = lines(5000)
    assert len(data) > 20 * validation.PARSE_CHUNK_BYTES
    table = validation.read_csv_block(data, NAMES, PARSE, CONVERT)
    assert all(column.num_chunks == 1 for column in table.columns)
    assert table.equals(whole(data))


def test_a_line_longer_than_a_piece_is_parsed_whole(small_pieces):
    data = lines(2000) + b"y" * (3 * validation.PARSE_CHUNK_BYTES) + b"\tb\tc\n" + lines(2000, seed=1)
    table = validation.read_csv_block(data, NAMES, PARSE, CONVERT)
    assert table.equals(whole(data))
    assert table.num_rows == 4001


def test_a_wrong_field_count_still_raises(small_pieces):
    data = lines(3000) + b"only\ttwo\n" + lines(3000, seed=2)
    with pytest.raises(pa.ArrowInvalid, match="Expected 3 columns, got 2"):
        validation.read_csv_block(data, NAMES, PARSE, CONVERT)
