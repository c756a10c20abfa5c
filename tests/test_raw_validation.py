"""Row checks of raw Criteo TSV (tasks.criteo.raw_rows) and the validate_raw step (tasks.criteo.raw_validation, criteo_ingest).

Each kind of malformed row is planted at a known line of an otherwise good file and must come back with that line,
the first offending field and the byte column where the field starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tasks.criteo import layout as criteo_layout
from tasks.core.config import Settings
from tasks.criteo.schema import NUM_FIELDS, RAW_COLUMNS
from tasks.criteo.raw_rows import BadRow, _check_block_lines, check_block, checked_blocks, iter_line_blocks
from tasks.criteo.raw_validation import DataQualityError, validate_raw_file
from tasks.core.storage import MANIFEST_NAME, read_manifest
from tasks.criteo.synthetic import CriteoDayGenerator, format_block, write_criteo_day
from tests.conftest import CRITEO_SAMPLE

BAD_LINE = 3  # where the bad row sits in the small files below


@pytest.fixture(scope="module")
def good_lines() -> list[bytes]:
    block = next(CriteoDayGenerator(seed=99).blocks(0, 400, block_rows=400))
    return format_block(block).split(b"\n")[:-1]


def scan(path: Path, block_bytes: int = 64 << 20) -> tuple[int, list[BadRow]]:
    """Total lines and bad rows of a file, as validate_raw_file walks it."""
    total, bad = 0, []
    for first_line, block, skipped in iter_line_blocks(path, block_bytes):
        total += len(skipped)
        bad += skipped
        if block:
            result = check_block(block, first_line)
            total += result.lines
            bad += result.bad_rows
    return total, bad


def where(bad: list[BadRow]) -> list[tuple[int, int, int]]:
    return [(b.line, b.field, b.column) for b in bad]


def field_column(line: bytes, field: int) -> int:
    """1-based byte column where 1-based field `field` starts."""
    return sum(len(p) + 1 for p in line.split(b"\t")[: field - 1]) + 1


def with_field(line: bytes, field: int, value: bytes) -> bytes:
    parts = line.split(b"\t")
    parts[field - 1] = value
    return b"\t".join(parts)


def write_lines(path: Path, lines: list[bytes], trailing_newline: bool = True) -> Path:
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    return path


def test_real_sample_rows_all_pass() -> None:
    assert CRITEO_SAMPLE.read_bytes()[-1:] != b"\n"  # the sample's last line has no newline: still a row
    for block_bytes in (64 << 20, 500):
        total, bad = scan(CRITEO_SAMPLE, block_bytes)
        assert (total, bad) == (100, [])
    result = check_block(CRITEO_SAMPLE.read_bytes(), 1, keep_good=True)
    assert result.good_rows.num_rows == 100
    assert result.good_rows.column_names == list(RAW_COLUMNS)


def test_synthetic_day_passes(tmp_path: Path) -> None:
    path = write_criteo_day(tmp_path / "day_0", 0, 3000, seed=5)
    assert scan(path) == (3000, [])


def _field(name: str) -> int:
    return RAW_COLUMNS.index(name) + 1


# (id, make the bad line from a good one, expected field, reason pattern); field 0 = whole-row problem, column 1.
BAD_KINDS = [
    ("too-few-fields", lambda l: l.rsplit(b"\t", 1)[0], 0, r"has 39 fields, expected 40"),
    ("too-many-fields", lambda l: l + b"\tdeadbeef", 0, r"has 41 fields, expected 40"),
    ("empty-line", lambda l: b"", 0, r"has 0 fields"),
    ("label-2", lambda l: with_field(l, 1, b"2"), 1, r"'2' label must be 0 or 1"),
    ("label-empty", lambda l: with_field(l, 1, b""), 1, r"label must be 0 or 1"),
    ("int-not-numeric", lambda l: with_field(l, _field("int_4"), b"12a"), _field("int_4"), r"'12a' not an integer"),
    ("int-with-spaces", lambda l: with_field(l, _field("int_0"), b" 12"), _field("int_0"), r"' 12' not an integer"),
    ("int-float", lambda l: with_field(l, _field("int_12"), b"1.5"), _field("int_12"), r"not an integer"),
    ("cat-9-hex", lambda l: with_field(l, _field("cat_0"), b"abcdef012"), _field("cat_0"), r"not 8 lowercase hex"),
    ("cat-uppercase", lambda l: with_field(l, _field("cat_7"), b"ABCDEF01"), _field("cat_7"), r"not 8 lowercase"),
    ("cat-non-hex", lambda l: with_field(l, _field("cat_25"), b"zzzzzzzz"), _field("cat_25"), r"'zzzzzzzz' not 8"),
    ("invalid-utf8", lambda l: with_field(l, _field("cat_3"), b"\xff\xfe0000ab"), _field("cat_3"), r"xff.*not 8"),
]


@pytest.mark.parametrize("make, field, reason", [k[1:] for k in BAD_KINDS], ids=[k[0] for k in BAD_KINDS])
def test_bad_row_kind_detected_at_line_field_and_column(tmp_path: Path, good_lines: list[bytes], make,
                                                        field: int, reason: str) -> None:
    base = good_lines[BAD_LINE - 1]
    bad_line = make(base)
    lines = good_lines[:6]
    lines[BAD_LINE - 1] = bad_line
    total, bad = scan(write_lines(tmp_path / "day", lines))
    assert total == 6
    column = field_column(bad_line, field) if field else 1
    assert where(bad) == [(BAD_LINE, field, column)]
    assert re.search(reason, bad[0].reason), bad[0].reason
    if field:
        assert RAW_COLUMNS[field - 1] in bad[0].describe()
        assert f"line {BAD_LINE}, field {field}" in bad[0].describe()


@pytest.mark.parametrize("kind", ["good", *(k[0] for k in BAD_KINDS)])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_parse_first_gives_the_line_by_line_verdicts(good_lines: list[bytes], kind: str,
                                                     trailing_newline: bool) -> None:
    """check_block's shortcut (parse the block, skip the tab count when pyarrow reads it line for line) returns what
    the line-by-line way does: the same line count, bad rows and good rows, whatever the block holds."""
    lines = good_lines[:8]
    if kind != "good":
        lines[BAD_LINE - 1] = dict((k[0], k[1]) for k in BAD_KINDS)[kind](lines[BAD_LINE - 1])
    block = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    fast, slow = check_block(block, 11, keep_good=True), _check_block_lines(block, 11, keep_good=True)
    assert (fast.lines, fast.bad_rows) == (slow.lines, slow.bad_rows) == (8, fast.bad_rows)
    assert len(fast.bad_rows) == (kind != "good")
    assert fast.good_rows.equals(slow.good_rows)


@pytest.mark.parametrize("where", ["first", "last", "two in a row"])
def test_empty_lines_anywhere_give_the_line_by_line_verdicts(good_lines: list[bytes], where: str) -> None:
    """An empty line parses as a row of empty values: the shortcut sees its empty label and goes the long way,
    wherever the line is (and with the newlines counted by the caller, as checked_blocks hands them on)."""
    lines = good_lines[:6]
    at = {"first": [0], "last": [6], "two in a row": [3, 3]}[where]
    for index in at:
        lines.insert(index, b"")
    block = b"\n".join(lines) + b"\n"
    slow = _check_block_lines(block, 11, keep_good=True)
    for fast in (check_block(block, 11, keep_good=True), check_block(block, 11, True, block.count(b"\n"))):
        assert (fast.lines, fast.bad_rows) == (slow.lines, slow.bad_rows)
        assert fast.good_rows.equals(slow.good_rows)
    assert [bad.line for bad in slow.bad_rows] == [11 + i for i, line in enumerate(lines) if not line]
    assert all("has 0 fields" in bad.reason for bad in slow.bad_rows)


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_checked_blocks_match_check_block_block_by_block(tmp_path: Path, good_lines: list[bytes],
                                                         trailing_newline: bool) -> None:
    """The helper thread changes nothing: the same blocks, over-long lines and results, in file order (the
    newlines counted once by the reader give check_block's own line counts, a last line without one too)."""
    lines = list(good_lines[:60])
    lines[7] = with_field(lines[7], _field("cat_2"), b"XYZ")
    lines[30] = b"x" * 5000
    path = write_lines(tmp_path / "day", lines, trailing_newline=trailing_newline)
    expected = [(block, skipped, check_block(block, first, keep_good=True) if block else None)
                for first, block, skipped in iter_line_blocks(path, 2000, max_line_bytes=3000)]
    got = list(checked_blocks(path, 2000, keep_good=True, max_line_bytes=3000))
    assert len(got) == len(expected) > 3
    for (block, skipped, result), (want_block, want_skipped, want) in zip(got, expected):
        assert (block, skipped) == (want_block, want_skipped)
        assert (result is None) == (want is None)
        if result is not None:
            assert (result.first_line, result.lines, result.bad_rows) == (want.first_line, want.lines, want.bad_rows)
            assert result.good_rows.equals(want.good_rows)
    assert [b.line for _, skipped, r in got for b in skipped + (r.bad_rows if r else [])] == [8, 31]


def test_first_failing_field_wins(tmp_path: Path, good_lines: list[bytes]) -> None:
    line = with_field(with_field(good_lines[0], _field("cat_20"), b"XYZ"), _field("int_2"), b"x")
    total, bad = scan(write_lines(tmp_path / "day", [good_lines[1], line]))
    assert where(bad) == [(2, _field("int_2"), field_column(line, _field("int_2")))]


def test_invalid_utf8_text_is_kept_readable(tmp_path: Path, good_lines: list[bytes]) -> None:
    line = with_field(good_lines[0], _field("cat_3"), b"\xff\xfe0000ab")
    _, bad = scan(write_lines(tmp_path / "day", [line]))
    assert "\\xff\\xfe0000ab" in bad[0].text
    json.dumps(bad[0].text)  # quarantine lines must be JSON-encodable


def test_carriage_return_at_end_of_line_is_bad(tmp_path: Path, good_lines: list[bytes]) -> None:
    lines = good_lines[:6]
    lines[BAD_LINE - 1] = lines[BAD_LINE - 1] + b"\r"
    total, bad = scan(write_lines(tmp_path / "day", lines))
    assert total == 6
    assert where(bad) == [(BAD_LINE, NUM_FIELDS, field_column(lines[BAD_LINE - 1], NUM_FIELDS))]


def test_carriage_return_inside_a_field_is_quarantined(tmp_path: Path, good_lines: list[bytes]) -> None:
    lines = good_lines[:6]
    lines[BAD_LINE - 1] = with_field(lines[BAD_LINE - 1], _field("cat_4"), b"abc\rdef0")
    total, bad = scan(write_lines(tmp_path / "day", lines))
    assert where(bad) == [(BAD_LINE, _field("cat_4"), field_column(lines[BAD_LINE - 1], _field("cat_4")))]


@pytest.mark.parametrize("block_bytes", [300, 4096, 64 << 20])
def test_over_long_line_is_bad_at_its_line(tmp_path: Path, good_lines: list[bytes], block_bytes: int) -> None:
    lines = good_lines[:10]
    lines[BAD_LINE - 1] = b"x" * 100_000
    lines[7] = with_field(lines[7], 1, b"7")  # a later bad row: its line number survives the skip
    total, bad = scan(write_lines(tmp_path / "day", lines), block_bytes)
    assert total == 10
    assert where(bad) == [(BAD_LINE, 0, 1), (8, 1, 1)]
    if block_bytes < 64 << 10:  # the line never fits a block: skipped without being held in memory
        assert "line is 100000 bytes" in bad[0].reason
        assert len(bad[0].text) <= 201


def test_over_long_last_line_without_newline(tmp_path: Path, good_lines: list[bytes]) -> None:
    path = write_lines(tmp_path / "day", good_lines[:4] + [b"y" * 100_000], trailing_newline=False)
    assert where(scan(path, 1000)[1]) == [(5, 0, 1)]


def test_last_line_without_trailing_newline(tmp_path: Path, good_lines: list[bytes]) -> None:
    path = write_lines(tmp_path / "good", good_lines[:5], trailing_newline=False)
    assert scan(path) == (5, [])
    assert scan(path, 7) == (5, [])
    bad_last = with_field(good_lines[4], _field("int_1"), b"-")
    path = write_lines(tmp_path / "bad", good_lines[:4] + [bad_last], trailing_newline=False)
    for block_bytes in (64 << 20, 7):
        total, bad = scan(path, block_bytes)
        assert total == 5
        assert where(bad) == [(5, _field("int_1"), field_column(bad_last, _field("int_1")))]


def test_line_numbers_exact_across_block_boundaries(tmp_path: Path, good_lines: list[bytes]) -> None:
    lines = list(good_lines[:120])
    planted = {17: 1, 18: 0, 59: _field("cat_10"), 60: _field("int_12"), 100: 0, 120: _field("cat_25")}
    lines[16] = with_field(lines[16], 1, b"")
    lines[17] = b""
    lines[58] = with_field(lines[58], _field("cat_10"), b"0123456")
    lines[59] = with_field(lines[59], _field("int_12"), b"+1")
    lines[99] = lines[99] + b"\t"
    lines[119] = with_field(lines[119], _field("cat_25"), b"g0000000")
    path = write_lines(tmp_path / "day", lines)
    expected = [(n, f, field_column(lines[n - 1], f) if f else 1) for n, f in sorted(planted.items())]
    # At the small sizes every line spans several blocks; at 251/1000 blocks end mid-line.
    for block_bytes in (1, 7, 251, 1000, 64 << 20):
        total, bad = scan(path, block_bytes)
        assert total == 120, block_bytes
        assert where(bad) == expected, block_bytes


# --- validate_raw_file: outputs, budget, failure line -------------------------------------------------------


def _day_with_bad_rows(path: Path, good_lines: list[bytes], n: int, bad_at: dict[int, bytes]) -> Path:
    lines = list(good_lines[:n])
    for line_no, text in bad_at.items():
        lines[line_no - 1] = text
    return write_lines(path, lines)


def test_validate_within_budget_writes_manifest_quarantine_and_report(tmp_path: Path,
                                                                      good_lines: list[bytes]) -> None:
    label_bad = with_field(good_lines[9], 1, b"2")
    raw = _day_with_bad_rows(tmp_path / "day_0", good_lines, 200, {10: label_bad, 150: b"short\trow"})
    out = tmp_path / "validated"
    summary = validate_raw_file(raw, out, inputs={"raw": "x"}, budget=0.05, block_bytes=1000)
    assert summary.rows == {"total": 200, "good": 198, "bad": 2}
    assert summary.bad_fraction == pytest.approx(0.01)
    assert summary.first_bad == "day_0 line 10, field 1 (label), column 1: '2' label must be 0 or 1"

    manifest = read_manifest(out)
    assert manifest is not None and manifest["rows"] == summary.rows
    assert set(manifest["files"]) == {"quarantine.jsonl", "report.json"}

    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["field"], q["column"]) for q in quarantined] == [(10, 1, 1), (150, 0, 1)]
    assert quarantined[0]["reason"] == "'2' label must be 0 or 1"
    assert quarantined[1]["reason"] == "has 2 fields, expected 40"
    assert quarantined[1]["text"] == "short\trow"
    assert {q["file"] for q in quarantined} == {"day_0"}

    report = json.loads((out / "report.json").read_text())
    assert report["rows"] == summary.rows and report["budget"] == 0.05
    assert report["reasons"] == {"label: label must be 0 or 1": 1, "field count": 1}
    gx = report["gx"]
    assert gx["statistics"]["evaluated_expectations"] == 3 + 13 + 26 + 1
    assert gx["success"] is True  # 2 bad of 200 evidence rows is within mostly = 0.95
    failed = [r for r in gx["result"]["results"] if r["result"].get("unexpected_count")]
    assert {r["expectation_config"]["kwargs"].get("column") for r in failed} >= {"label", "field_count"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_quarantine_rows_name_the_column(tmp_path: Path, good_lines: list[bytes]) -> None:
    raw = _day_with_bad_rows(tmp_path / "day_0", good_lines, 50, {5: with_field(good_lines[4], 20, b"Q")})
    validate_raw_file(raw, tmp_path / "out", inputs={}, budget=0.5)
    row = json.loads((tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()[0])
    assert row["column_name"] == RAW_COLUMNS[19]


def test_validate_over_budget_fails_with_one_line_and_no_manifest(tmp_path: Path, good_lines: list[bytes]) -> None:
    bad_int = with_field(good_lines[6], _field("int_3"), b"abc")
    raw = _day_with_bad_rows(tmp_path / "day_4", good_lines, 100,
                             {7: bad_int, 8: b"", 40: with_field(good_lines[39], 1, b"")})
    out = tmp_path / "validated"
    # A previous passing validation of this directory must not survive a failing one.
    validate_raw_file(raw, out, inputs={"budget": 0.5}, budget=0.5)
    assert read_manifest(out) is not None

    with pytest.raises(DataQualityError) as caught:
        validate_raw_file(raw, out, inputs={"budget": 0.01}, budget=0.01)
    message = str(caught.value)
    assert "\n" not in message
    column = field_column(bad_int, _field("int_3"))
    assert message.startswith("day_4: 3 bad rows of 100 (3.000% > budget 1.000%)")
    assert f"line 7, field {_field('int_3')} (int_3), column {column}" in message
    assert str(out) in message
    assert sorted(p.name for p in out.iterdir()) == ["quarantine.jsonl", "report.json"]
    assert not (out / MANIFEST_NAME).exists()
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == 3
    report = json.loads((out / "report.json").read_text())
    assert report["rows"] == {"total": 100, "good": 97, "bad": 3}
    assert report["gx"]["success"] is False  # mostly = 0.99 with 3% bad evidence


def test_validate_empty_file_fails(tmp_path: Path) -> None:
    raw = tmp_path / "day_9"
    raw.write_bytes(b"")
    with pytest.raises(DataQualityError, match=r"empty day file \(0 rows\)"):
        validate_raw_file(raw, tmp_path / "out", inputs={}, budget=1.0)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


# --- tasks.criteo.ingest.validate_day: the cached step ------------------------------------------------------


def test_validate_day_is_cached(tmp_path: Path, good_lines: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.criteo import ingest as criteo_ingest
    from tasks.criteo import raw_validation
    settings = Settings(data_root=tmp_path, bad_row_budget=0.05, validation_block_bytes=4096)
    raw = criteo_layout.raw_day(tmp_path, 2)
    raw.parent.mkdir(parents=True)
    _day_with_bad_rows(raw, good_lines, 120, {5: with_field(good_lines[4], _field("cat_1"), b"BAD")})

    first = criteo_ingest.validate_day(settings, 2)
    assert first == {"day": 2, "path": str(criteo_layout.validated_day(tmp_path, 2)), "total": 120, "good": 119,
                     "bad": 1, "cached": False}

    def must_not_run(*args, **kwargs):
        raise AssertionError("validate_raw_file called although the day is validated")

    monkeypatch.setattr(raw_validation, "validate_raw_file", must_not_run)
    second = criteo_ingest.validate_day(settings, 2)
    assert second == {**first, "cached": True}

    # Other inputs (budget, raw bytes) are not the cached work: the validation runs again.
    with pytest.raises(AssertionError, match="validate_raw_file called"):
        criteo_ingest.validate_day(settings, 2, bad_row_budget=0.5)
    with open(raw, "ab") as f:
        f.write(good_lines[200] + b"\n")
    with pytest.raises(AssertionError, match="validate_raw_file called"):
        criteo_ingest.validate_day(settings, 2)


def test_validate_day_without_raw_file(tmp_path: Path) -> None:
    from tasks.criteo.ingest import StepInputMissing, validate_day

    with pytest.raises(StepInputMissing, match="run download first"):
        validate_day(Settings(data_root=tmp_path), 0)


# ---- the numpy field checks agree with the schema's regexes ----------------------------------------------------------

HOSTILE_VALUES = [
    b"", b"0", b"1", b"2", b"01", b"10", b"-", b"-0", b"--1", b"1-", b"0-1", b"+1", b" 1", b"1 ", b"1.5", b"1e3",
    b"9" * 18, b"9" * 19, b"-" + b"9" * 18, b"-" + b"9" * 19, b"00000000", b"0000000", b"000000000", b"deadbeef",
    b"DEADBEEF", b"deadbeeg", b"dead beef", b"68fd1e6\x00", b"\xff" * 8, b"\xc3\xa9" * 4, b"caf\xc3\xa9000",
    b"abcdef01", b"abcdef0", b"-abcdef0", b"12345678", b"-1234567", b"\\N", b"null", b"a", b"f" * 8, b"g" * 8,
]


@pytest.mark.parametrize("pattern_name", ["LABEL_PATTERN", "INT_PATTERN", "CAT_PATTERN"])
def test_numpy_field_checks_give_the_regexes_verdicts(pattern_name: str) -> None:
    """tasks.criteo.raw_fields replaces pyarrow's RE2 match of the schema's rules: the same verdict on every value,
    hostile ones included (the bytes right outside each run of allowed ones: '/', ':', '`', 'g'), in columns that are
    all good (the fast path) and mixed (the per-value path)."""
    import random

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from tasks.criteo import schema
    from tasks.criteo.raw_fields import failing_values

    pattern = getattr(schema, pattern_name)
    empty_ok = pattern != schema.LABEL_PATTERN
    rng = random.Random(7)
    alphabet = b"0123456789abcdef-gAZ \xff/:`@\x00"
    values = HOSTILE_VALUES + [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(3000)]
    good_only = [v for v in values if re.fullmatch(pattern.strip("^$").encode(), v) or (empty_ok and not v)]
    for sample in (values, good_only, values[::-1][1:]):
        column = pa.chunked_array([pa.array(sample[:50], pa.binary()), pa.array(sample[50:], pa.binary())])
        expected = pc.match_substring_regex(column, pattern)
        if empty_ok:
            expected = pc.or_(expected, pc.equal(pc.binary_length(column), 0))
        assert np.array_equal(failing_values(column, pattern), ~expected.to_numpy(zero_copy_only=False))
    assert len(good_only) > 10
