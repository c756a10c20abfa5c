"""criteo_day_stats by one real spark-submit run: the typed columnar copy and the value counts of a small day.

The day is synthetic with a few malformed rows planted at known lines; validate_raw quarantines them first (budget
passes), then day_stats must keep exactly the other rows, in file order, with the counts Python computes from the
raw bytes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tasks.criteo import ingest as criteo_ingest

from tasks.criteo import layout as criteo_layout
from tasks.core.config import Settings
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, RAW_COLUMNS
from tasks.core.storage import read_manifest
from tasks.criteo.synthetic import write_criteo_day

pytestmark = pytest.mark.spark

DAY = 0
GOOD_ROWS = 2000


def _plant_bad_rows(lines: list[bytes]) -> dict[int, bytes]:
    """Malformed rows, keyed by the 1-based line they end up on once inserted in order."""
    def with_field(line: bytes, field: int, value: bytes) -> bytes:
        parts = line.split(b"\t")
        parts[field - 1] = value
        return b"\t".join(parts)

    return {
        1: with_field(lines[0], 1, b"2"),                               # label 2, first line of the day
        150: b"",                                                       # empty line
        400: lines[10].rsplit(b"\t", 1)[0],                             # 39 fields
        777: with_field(lines[11], 16, b"ABCDEF01"),                    # uppercase categorical
        1200: with_field(lines[12], 5, b"4.5"),                         # non-integer
        1500: with_field(lines[13], 20, b"\xff\xfe0000ab"),             # invalid UTF-8
        1800: b"z" * 100_000,                                           # over-long line
        GOOD_ROWS + 7: lines[14] + b"\tdeadbeef",                       # 41 fields, last line of the day
    }


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("data_root")
    settings = Settings(data_root=root, bad_row_budget=0.01, spark_profile="local", validation_block_bytes=16384)
    raw = criteo_layout.raw_day(root, DAY)
    write_criteo_day(raw, DAY, GOOD_ROWS, seed=42)
    good = raw.read_bytes().split(b"\n")[:-1]
    bad = _plant_bad_rows(good)
    lines, pending = [], iter(good)
    for line_no in range(1, GOOD_ROWS + len(bad) + 1):
        lines.append(bad[line_no] if line_no in bad else next(pending))
    raw.write_bytes(b"\n".join(lines) + b"\n")

    validated = criteo_ingest.validate_day(settings, DAY)
    start = time.monotonic()
    stats = criteo_ingest.day_stats(
        settings, DAY, spark_master="local[2]",
        # Small splits: the one file is read as several partitions, so row_order crosses partition boundaries.
        spark_conf={"spark.sql.files.maxPartitionBytes": "196608", "spark.sql.shuffle.partitions": "2"},
    )
    return {"settings": settings, "raw": raw, "lines": lines, "bad": bad, "good": good, "validated": validated,
            "stats": stats, "seconds": time.monotonic() - start}


def test_validation_quarantined_exactly_the_planted_rows(ingested: dict[str, Any]) -> None:
    validated = ingested["validated"]
    assert (validated["good"], validated["bad"], validated["cached"]) == (GOOD_ROWS, len(ingested["bad"]), False)
    out = Path(validated["path"])
    quarantined = [json.loads(l)["line"] for l in (out / "quarantine.jsonl").read_text().splitlines()]
    assert quarantined == sorted(ingested["bad"])


def _expected_rows(good_lines: list[bytes]) -> list[dict[str, Any]]:
    rows = []
    for line in good_lines:
        parts = line.decode("ascii").split("\t")
        row: dict[str, Any] = {LABEL: int(parts[0])}
        row |= {name: int(v) if v else None for name, v in zip(INT_COLUMNS, parts[1:14])}
        row |= {name: v or None for name, v in zip(CAT_COLUMNS, parts[14:])}
        rows.append(row)
    return rows


def test_columnar_copy_holds_exactly_the_good_rows_typed_in_file_order(ingested: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(ingested["stats"]["path"])
    table = pq.read_table(out / "columnar")
    assert table.num_rows == GOOD_ROWS
    types = {f.name: f.type for f in table.schema}
    assert types[LABEL] == pa.int8()
    assert all(types[name] == pa.int64() for name in INT_COLUMNS)
    assert all(types[name] == pa.string() for name in CAT_COLUMNS)
    assert types["row_order"] == pa.int64()
    assert [f.name for f in table.schema] == [*RAW_COLUMNS, "row_order"]

    order = table.column("row_order").to_pylist()
    assert len(set(order)) == GOOD_ROWS
    assert len({o >> 33 for o in order}) > 1  # the file was read as several partitions (ids carry the partition)
    table = table.sort_by("row_order")
    actual = table.drop_columns(["row_order"]).to_pylist()
    # Sorted by row_order, the rows are the raw file's good lines in their file order.
    assert actual == _expected_rows(ingested["good"])
    # Empty fields became nulls (never empty strings or zeros).
    assert table.column("int_0").null_count == sum(1 for line in ingested["good"] if line.split(b"\t")[1] == b"")
    assert table.column("cat_0").null_count > 0
    assert not any(v == "" for name in CAT_COLUMNS for v in table.column(name).to_pylist())
    assert min(v for v in table.column("int_1").to_pylist() if v is not None) < 0


def test_counts_equal_python_counts_of_the_raw_file(ingested: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    expected: Counter[tuple[int, str]] = Counter()
    for line in ingested["good"]:
        for column, value in enumerate(line.decode("ascii").split("\t")[14:]):
            if value:
                expected[(column, value)] += 1
    counts = pq.read_table(Path(ingested["stats"]["path"]) / "counts").to_pylist()
    actual = {(r["column"], r["value"]): r["count"] for r in counts}
    assert len(actual) == len(counts)  # one row per (column, value)
    assert actual == dict(expected)
    distinct = ingested["stats"]["distinct_values"]
    assert distinct == {name: len({v for (c, v) in expected if c == i}) for i, name in enumerate(CAT_COLUMNS)}


def test_manifest_rows_equal_validation_good_rows(ingested: dict[str, Any]) -> None:
    stats = ingested["stats"]
    assert stats["rows"] == ingested["validated"]["good"] == GOOD_ROWS
    assert stats["cached"] is False
    manifest = read_manifest(Path(stats["path"]))
    assert manifest is not None
    assert manifest["rows"] == {"good": GOOD_ROWS}
    assert manifest["extra"]["day"] == DAY
    assert any(name.startswith("columnar/") and name.endswith(".parquet") for name in manifest["files"])
    assert any(name.startswith("counts/") for name in manifest["files"])


def test_second_call_is_cached(ingested: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.core import spark_submit
    def must_not_run(*args, **kwargs):
        raise AssertionError("spark-submit ran although the day's stats are complete")

    monkeypatch.setattr(spark_submit, "run_spark_job", must_not_run)
    again = criteo_ingest.day_stats(ingested["settings"], DAY, spark_master="local[2]")
    assert again == {**ingested["stats"], "cached": True}
