"""criteo_day_stats by both engines: one real spark-submit run (engine spark) and validation's own pass (engine
arrow) over the same small day, then the transform from either engine's stats.

The day is synthetic with a few malformed rows planted at known lines; validate_raw quarantines them first (budget
passes), then day_stats must keep exactly the other rows, in file order, with the counts Python computes from the
raw bytes. The two engines must write the same dataset (schemas, rows with row_order made dense, counts), and the
split-binary dataset transformed from either must be byte-identical.
"""

from __future__ import annotations

import json
import shutil
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
from tests.job_logging import root_logging_kept

pytestmark = pytest.mark.spark

DAY = 0
GOOD_ROWS = 2000
TEST_DAY, TEST_DAY_ROWS = 1, 1200  # the transform's test day
# Small splits: one file is read as several partitions, so row_order crosses partition boundaries.
SMALL_SPLITS = {"spark.sql.files.maxPartitionBytes": "196608", "spark.sql.shuffle.partitions": "2"}


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
        # Line terminators Java's `$` matches before (the Spark job anchors its patterns with `$`, GPU-friendly):
        1900: lines[15] + b"\r",                                        # CRLF line end, after a valid value
        1950: with_field(lines[16], 3, b"12\xc2\x85"),                   # U+0085 after a valid integer
        1980: with_field(lines[17], 30, b"0123abcd\xe2\x80\xa8"),        # U+2028 after a valid categorical
        1990: with_field(lines[18], 1, b"1\xe2\x80\xa9"),                # U+2029 after a valid label
        GOOD_ROWS + 12: lines[14] + b"\tdeadbeef",                      # 41 fields, last line of the day
    }


def write_raw_day(raw: Path) -> tuple[list[bytes], list[bytes], dict[int, bytes]]:
    """Day DAY with the planted bad rows: (all lines, good lines, bad lines by line number)."""
    write_criteo_day(raw, DAY, GOOD_ROWS, seed=42)
    good = raw.read_bytes().split(b"\n")[:-1]
    bad = _plant_bad_rows(good)
    lines, pending = [], iter(good)
    for line_no in range(1, GOOD_ROWS + len(bad) + 1):
        lines.append(bad[line_no] if line_no in bad else next(pending))
    raw.write_bytes(b"\n".join(lines) + b"\n")
    return lines, good, bad


def write_test_day(raw: Path) -> None:
    """The transform's test day: bad rows in several of Spark's partitions, so ids after the filter matter."""
    write_criteo_day(raw, TEST_DAY, TEST_DAY_ROWS, seed=43)
    lines = raw.read_bytes().split(b"\n")
    for line in (3, 400, 401, 950):
        lines[line - 1] = b"2" + lines[line - 1][1:]
    raw.write_bytes(b"\n".join(lines))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same raw days ingested twice: in root "spark" by the spark engine (validation writes no stats, day_stats
    spark-submits the job), in root "arrow" by the arrow engine (validation writes the stats)."""
    roots = {engine: tmp_path_factory.mktemp(f"root_{engine}") for engine in ("spark", "arrow")}
    settings = {engine: Settings(data_root=root, bad_row_budget=0.01, spark_profile="local",
                                 validation_block_bytes=16384) for engine, root in roots.items()}
    lines, good, bad = write_raw_day(criteo_layout.raw_day(roots["spark"], DAY))
    write_test_day(criteo_layout.raw_day(roots["spark"], TEST_DAY))
    for day in (DAY, TEST_DAY):
        criteo_layout.raw_day(roots["arrow"], day).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(criteo_layout.raw_day(roots["spark"], day), criteo_layout.raw_day(roots["arrow"], day))

    validated = {engine: criteo_ingest.validate_day(settings[engine], DAY, engine=engine) for engine in roots}
    assert not criteo_layout.stats_day(roots["spark"], DAY).exists()  # the spark engine's validation writes none
    start = time.monotonic()
    stats = criteo_ingest.day_stats(settings["spark"], DAY, engine="spark", spark_master="local[2]",
                                    spark_conf=SMALL_SPLITS)
    seconds = time.monotonic() - start
    arrow_stats = criteo_ingest.day_stats(settings["arrow"], DAY, engine="arrow")
    return {"settings": settings["spark"], "roots": roots, "all_settings": settings,
            "raw": criteo_layout.raw_day(roots["spark"], DAY), "lines": lines, "bad": bad, "good": good,
            "validated": validated["spark"], "arrow_validated": validated["arrow"], "stats": stats,
            "arrow_stats": arrow_stats, "seconds": seconds}


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
    # ids assigned after the bad rows are dropped: each partition's indexes are 0..n-1, without gaps
    per_partition = Counter(o >> 33 for o in order)
    assert {(o >> 33, o & ((1 << 33) - 1)) for o in order} == {
        (p, i) for p, n in per_partition.items() for i in range(n)}
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
    again = criteo_ingest.day_stats(ingested["settings"], DAY, engine="spark", spark_master="local[2]")
    assert again == {**ingested["stats"], "cached": True}


# ---- the arrow engine writes the same dataset ----------------------------------------------------------------------


def dense(table):
    """A spark-engine columnar table with row_order made the dense file-order index (what the transform does)."""
    import pyarrow as pa

    table = table.sort_by("row_order")
    return table.set_column(table.schema.get_field_index("row_order"), pa.field("row_order", pa.int64(), False),
                            pa.array(range(table.num_rows), pa.int64()))


def test_arrow_engine_writes_the_same_columnar_copy(ingested: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    spark_dir, arrow_dir = Path(ingested["stats"]["path"]), Path(ingested["arrow_stats"]["path"])
    assert ingested["arrow_stats"]["cached"] is True  # validation wrote them; day_stats had nothing to do
    schemas = {pq.read_schema(p).remove_metadata() for d in (spark_dir, arrow_dir)
               for p in (d / "columnar").glob("*.parquet")}
    assert len(schemas) == 1  # every part file of both engines: same names, types and nullability
    spark_rows = dense(pq.read_table(spark_dir / "columnar"))
    arrow_rows = pq.read_table(arrow_dir / "columnar")
    assert arrow_rows.column("row_order").to_pylist() == list(range(GOOD_ROWS))  # dense in file order as written
    assert arrow_rows.to_pylist() == spark_rows.to_pylist()


def test_arrow_engine_writes_the_same_counts_and_manifest(ingested: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    spark_dir, arrow_dir = Path(ingested["stats"]["path"]), Path(ingested["arrow_stats"]["path"])
    schemas = {pq.read_schema(p).remove_metadata() for d in (spark_dir, arrow_dir)
               for p in (d / "counts").glob("*.parquet")}
    assert len(schemas) == 1
    spark_counts = pq.read_table(spark_dir / "counts").sort_by([("column", "ascending"), ("value", "ascending")])
    arrow_counts = pq.read_table(arrow_dir / "counts").sort_by([("column", "ascending"), ("value", "ascending")])
    assert arrow_counts.to_pylist() == spark_counts.to_pylist()
    spark_manifest, arrow_manifest = read_manifest(spark_dir), read_manifest(arrow_dir)
    assert arrow_manifest["inputs_fingerprint"] == spark_manifest["inputs_fingerprint"]  # same inputs, same cache key
    assert arrow_manifest["rows"] == spark_manifest["rows"]
    assert {**arrow_manifest["extra"], "engine": None} == {**spark_manifest["extra"], "engine": None}
    assert (arrow_manifest["extra"]["engine"], spark_manifest["extra"]["engine"]) == ("arrow", "spark")
    assert ingested["arrow_validated"] == {**ingested["validated"], "path": ingested["arrow_validated"]["path"]}


# ---- the transform gives the same bytes from either engine's stats ------------------------------------------------


@pytest.fixture(scope="module")
def transformed(ingested: dict[str, Any], spark) -> dict[str, Path]:
    """Dictionary (day DAY) and transform (train DAY, test TEST_DAY) from each root's stats."""
    from spark_jobs.criteo import dictionary as criteo_dictionary, transform as criteo_transform

    datasets = {}
    for engine, root in ingested["roots"].items():
        settings = ingested["all_settings"][engine]
        criteo_ingest.validate_day(settings, TEST_DAY, engine=engine)
        criteo_ingest.day_stats(settings, TEST_DAY, engine=engine, spark_master="local[2]",
                                spark_conf={"spark.sql.files.maxPartitionBytes": "65536"})
        stats = {day: criteo_layout.stats_day(root, day) for day in (DAY, TEST_DAY)}
        dictionary, dataset = root / "dictionary", root / "dataset"
        with root_logging_kept():
            criteo_dictionary.main(["--counts", str(stats[DAY] / "counts"), "--output", str(dictionary),
                                    "--frequency-threshold", "2"])
            result = criteo_transform.main(["--train-days", str(stats[DAY] / "columnar"), "--test-day",
                                            str(stats[TEST_DAY] / "columnar"), "--dictionary", str(dictionary),
                                            "--output", str(dataset), "--seed", "3"])
        assert result.split_row_order == (TEST_DAY_ROWS - 4) // 2
        datasets[engine] = dataset
    spark_test_day = criteo_layout.stats_day(ingested["roots"]["spark"], TEST_DAY)
    assert read_manifest(spark_test_day)["extra"]["engine"] == "spark"
    return datasets


def test_transform_is_byte_identical_from_either_engines_stats(transformed: dict[str, Path]) -> None:
    def files(dataset: Path) -> dict[str, bytes]:
        return {p.relative_to(dataset).as_posix(): p.read_bytes() for p in sorted(dataset.rglob("*"))
                if p.is_file() and p.name != "_MANIFEST.json"}

    spark_files, arrow_files = files(transformed["spark"]), files(transformed["arrow"])
    assert {"train/label.bin", "test/cat_0.bin", "validation/numerical.bin"} <= set(spark_files)
    assert set(arrow_files) == set(spark_files)
    different = [name for name in spark_files if arrow_files[name] != spark_files[name]]
    assert different == []
    rows = {engine: read_manifest(dataset)["rows"] for engine, dataset in transformed.items()}
    assert rows["arrow"] == rows["spark"] == {"train": GOOD_ROWS, "test": (TEST_DAY_ROWS - 4) // 2,
                                              "validation": TEST_DAY_ROWS - 4 - (TEST_DAY_ROWS - 4) // 2}


def test_transform_refuses_row_order_with_gaps(spark, tmp_path: Path) -> None:
    """Stats written before row_order was dense (version 1 Spark ids counted bad rows too) would make colliding
    dense indexes: the transform refuses them with one line saying what to do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs.criteo import transform as criteo_transform

    columnar = tmp_path / "columnar"
    columnar.mkdir()
    pq.write_table(pa.table({"label": pa.array([0, 1, 0], pa.int8()),
                             "row_order": pa.array([0, 2, (1 << 33) + 0], pa.int64())}), columnar / "part-0.parquet")
    paths = [str(columnar)]
    with pytest.raises(ValueError, match=r"row_order of partition 0 is not dense \(2 rows, indexes 0\.\.2\)"):
        criteo_transform.dense_row_order(spark, criteo_transform.read_days(spark, paths), paths)
