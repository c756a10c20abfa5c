"""The single-machine Arrow engine (tasks/criteo/preprocess_arrow.py) and the NVTabular engine (nvt_jobs/criteo.py)
against the Spark jobs.

One tiny window (synthetic days 0, 1 train and 2 test, ingested by validate_day with the arrow day-stats engine, in
several row groups) is turned into a dictionary and a dataset once by each engine (the Spark jobs in-process, on the
session's local[2] SparkSession; NVTabular in its own environment) and the outputs are compared: dictionary rows,
json bytes, split-binary bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.criteo import dictionary as spark_dictionary, transform as spark_transform
from tasks import cli
from tasks.core.config import Settings
from tasks.core.storage import read_manifest
from tasks.criteo import layout, preprocess, preprocess_arrow
from tasks.criteo.schema import CAT_COLUMNS
from tests.criteo_window import ingest_synthetic_days
from tests.job_logging import root_logging_kept

DAY_ROWS = {0: 3000, 1: 2500, 2: 2001}
SEED = 7
THRESHOLD = 2
OVERRIDES = "cat_0:0,cat_9:5"
SMALL_SPLITS = {"spark.sql.files.maxPartitionBytes": "131072"}  # the test day read as several Spark partitions


@pytest.fixture(scope="module")
def window(tmp_path_factory) -> Path:
    """A data root with the three days validated (arrow engine: the stats are written in validation's pass)."""
    root = tmp_path_factory.mktemp("arrow_window")
    ingest_synthetic_days(root, DAY_ROWS)
    return root


def stats(root: Path, day: int, part: str) -> str:
    return str(layout.stats_day(root, day) / part)


def dictionary_argv(root: Path, out: Path, days=(0, 1), *extra: str) -> list[str]:
    return ["--counts", *(stats(root, d, "counts") for d in days), "--output", str(out),
            "--frequency-threshold", str(THRESHOLD), "--inputs-json", '{"w": 1}', *extra]


def transform_argv(root: Path, dictionary: Path, out: Path, test_day: str | None = None) -> list[str]:
    return ["--train-days", stats(root, 0, "columnar"), stats(root, 1, "columnar"),
            "--test-day", test_day or stats(root, 2, "columnar"), "--dictionary", str(dictionary),
            "--output", str(out), "--seed", str(SEED), "--inputs-json", '{"t": 2}']


@pytest.fixture(scope="module")
def by_spark(spark, window) -> dict[str, Path]:
    """Dictionary + dataset by the Spark jobs, in-process on the session's SparkSession."""
    out = {"dictionary": window / "spark" / "dictionary", "dataset": window / "spark" / "dataset"}
    with root_logging_kept():
        spark_dictionary.main(dictionary_argv(window, out["dictionary"]))
        spark_transform.main(transform_argv(window, out["dictionary"], out["dataset"]))
    return out


@pytest.fixture(scope="module")
def by_arrow(window) -> dict[str, Path]:
    out = {"dictionary": window / "arrow" / "dictionary", "dataset": window / "arrow" / "dataset"}
    preprocess_arrow.dictionary_main(dictionary_argv(window, out["dictionary"]))
    preprocess_arrow.transform_main(transform_argv(window, out["dictionary"], out["dataset"]), workers=1)
    return out


def dictionary_rows(directory: Path) -> tuple[list[tuple], dict[str, pa.DataType]]:
    table = pq.read_table(directory / "dictionary")
    rows = sorted(zip(*(table.column(c).to_pylist() for c in ("column", "id", "value", "count"))))
    return rows, {f.name: f.type for f in table.schema}


def dataset_bytes(dataset: Path) -> dict[str, bytes]:
    files = sorted(p for p in dataset.rglob("*") if p.is_file() and p.name != "_MANIFEST.json")
    return {p.relative_to(dataset).as_posix(): p.read_bytes() for p in files}


def extra_without_engine(directory: Path) -> dict:
    manifest = read_manifest(directory)
    return {k: v for k, v in manifest["extra"].items() if k != "engine"} | {"rows": manifest["rows"],
                                                                          "inputs": manifest["inputs"]}


# ---- Spark's xxhash64 ------------------------------------------------------------------------------------------------

@pytest.mark.spark
def test_xxhash64_equals_sparks_on_edge_values(spark):
    from pyspark.sql import functions as F

    rng = np.random.default_rng(3)
    row_orders = [0, 1, -1, 2, (1 << 33) - 1, 1 << 33, (5 << 33) | 17, (1 << 63) - 1, -(1 << 63), 180_000_000,
                  *rng.integers(-(1 << 62), 1 << 62, 200).tolist()]
    cases = [(seed, source) for seed in (0, 1, -1, 12345, (1 << 31) - 1, -(1 << 31), 1 << 31, -(1 << 40))
             for source in (0, 1, 23, (1 << 31) - 1)]
    df = spark.createDataFrame([(v,) for v in row_orders], "ro long")
    got = df.select("ro", *[F.xxhash64(F.lit(seed), F.lit(source), F.col("ro")).alias(f"h{i}")
                            for i, (seed, source) in enumerate(cases)]).collect()
    by_row = {r["ro"]: r for r in got}
    values = np.array(row_orders, dtype=np.int64)
    for i, (seed, source) in enumerate(cases):
        ours = preprocess_arrow.shuffle_keys(seed, source, values)
        assert ours.dtype == np.int64
        assert ours.tolist() == [by_row[v][f"h{i}"] for v in row_orders], (seed, source)


# ---- the same output as the Spark jobs -------------------------------------------------------------------------------

@pytest.mark.spark
def test_dictionary_equals_sparks(by_spark, by_arrow):
    spark_rows, spark_types = dictionary_rows(by_spark["dictionary"])
    arrow_rows, arrow_types = dictionary_rows(by_arrow["dictionary"])
    assert arrow_rows == spark_rows and arrow_types == spark_types
    assert any(r[1] > 1 for r in arrow_rows) and read_manifest(by_arrow["dictionary"])["extra"]["engine"] == "arrow"
    for name in ("cardinalities.json", "model_size.json"):
        assert (by_arrow["dictionary"] / name).read_bytes() == (by_spark["dictionary"] / name).read_bytes(), name
    assert extra_without_engine(by_arrow["dictionary"]) == extra_without_engine(by_spark["dictionary"])
    summary = read_manifest(by_arrow["dictionary"])["extra"]["summary"]
    assert any(s["dropped"] for s in summary.values())  # the threshold really dropped values


@pytest.mark.spark
def test_dictionary_with_overrides_over_all_days_equals_sparks(spark, window, tmp_path):
    argv = dictionary_argv(window, tmp_path / "spark", (0, 1, 2), "--threshold-overrides", OVERRIDES)
    with root_logging_kept():
        spark_dictionary.main(argv)
    preprocess_arrow.dictionary_main(
        dictionary_argv(window, tmp_path / "arrow", (0, 1, 2), "--threshold-overrides", OVERRIDES))
    assert dictionary_rows(tmp_path / "arrow") == dictionary_rows(tmp_path / "spark")
    assert extra_without_engine(tmp_path / "arrow") == extra_without_engine(tmp_path / "spark")
    summary = read_manifest(tmp_path / "arrow")["extra"]["summary"]
    assert summary["cat_0"]["dropped"] == 0 and summary["cat_9"]["threshold"] == 5


@pytest.mark.spark
def test_dataset_is_byte_identical_to_sparks(by_spark, by_arrow):
    arrow, spark_files = dataset_bytes(by_arrow["dataset"]), dataset_bytes(by_spark["dataset"])
    assert sorted(arrow) == sorted(spark_files) and "feature_spec.yaml" in arrow
    for name in spark_files:
        assert arrow[name] == spark_files[name], name
    assert extra_without_engine(by_arrow["dataset"]) == extra_without_engine(by_spark["dataset"])
    assert read_manifest(by_arrow["dataset"])["rows"] == {"train": 5500, "test": 1000, "validation": 1001}
    assert not (by_arrow["dataset"] / preprocess_arrow.SPILL_DIR).exists()


def test_many_buckets_and_two_workers_give_the_same_bytes(window, by_arrow, tmp_path):
    # 5500 train rows in 64-row buckets: 128 buckets; the test day in 32 row_order ranges; row groups on 2 processes
    preprocess_arrow.transform_main(transform_argv(window, by_arrow["dictionary"], tmp_path / "ds"),
                                    bucket_rows=64, workers=2, rows_per_worker=1)  # a pool however few the rows
    assert dataset_bytes(tmp_path / "ds") == dataset_bytes(by_arrow["dataset"])


def test_many_buckets_in_threads_under_a_small_file_limit_give_the_same_bytes(window, by_arrow, tmp_path,
                                                                              monkeypatch):
    # 128 train buckets through 2 threads, each allowed 8 open bucket files: the oldest are closed and reopened
    # (appending after what they hold); after pass 1 none of them is left open.
    import os

    monkeypatch.setattr(preprocess_arrow, "_file_limit", lambda: preprocess_arrow._RESERVED_FDS + 16)
    before = len(os.listdir("/proc/self/fd"))
    preprocess_arrow.transform_main(transform_argv(window, by_arrow["dictionary"], tmp_path / "ds"),
                                    bucket_rows=64, workers=2, rows_per_worker=1 << 30)  # threads
    assert dataset_bytes(tmp_path / "ds") == dataset_bytes(by_arrow["dataset"])
    assert len(os.listdir("/proc/self/fd")) <= before and not preprocess_arrow._APPENDERS


@pytest.mark.spark
def test_spark_engine_day_stats_give_the_same_bytes(spark, window, by_arrow, tmp_path):
    """The test day's stats by the Spark day-stats job (row_order = partition << 33 | index, several partitions)."""
    from spark_jobs.criteo import day_stats

    previous = {k: spark.conf.get(k) for k in SMALL_SPLITS}
    for key, value in SMALL_SPLITS.items():
        spark.conf.set(key, value)
    try:
        with root_logging_kept():
            day_stats.main(["--input", str(layout.raw_day(window, 2)), "--output", str(tmp_path / "stats"),
                            "--day", "2"])
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)
    groups = pq.read_table(tmp_path / "stats" / "columnar").column("row_order").to_numpy() >> 33
    assert len(np.unique(groups)) > 1
    preprocess_arrow.transform_main(transform_argv(window, by_arrow["dictionary"], tmp_path / "ds",
                                                   str(tmp_path / "stats" / "columnar")), workers=1)
    assert dataset_bytes(tmp_path / "ds") == dataset_bytes(by_arrow["dataset"])


# ---- failures ------------------------------------------------------------------------------------------------------

def test_a_failure_mid_transform_leaves_no_output(window, by_arrow, tmp_path, monkeypatch):
    calls = []

    def failing_sort(records):
        calls.append(len(records))
        if len(calls) == 3:
            raise OSError("disk went away")
        return np.argsort(records["key"], kind="stable")

    monkeypatch.setattr(preprocess_arrow, "sort_order", failing_sort)
    with pytest.raises(OSError, match="disk went away"):
        preprocess_arrow.transform_main(transform_argv(window, by_arrow["dictionary"], tmp_path / "ds"),
                                        bucket_rows=1024, workers=1)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary (with the bucket files)


def test_bucket_stream_reuses_its_buffers_and_yields_every_bucket_sorted(tmp_path):
    import time

    dtype = preprocess_arrow.record_dtype([np.dtype(np.int32)] * len(CAT_COLUMNS))
    rng = np.random.default_rng(3)
    sizes = [700, 0, 1500, 10, 900]  # an empty bucket, and a bigger one after smaller ones (a buffer grows)
    files = {}
    for bucket, size in enumerate(sizes):
        records = np.zeros(size, dtype)
        records["key"] = np.sort(rng.integers(-(1 << 62), 1 << 62, size))
        records["row_order"] = np.arange(size)
        records[CAT_COLUMNS[0]] = bucket
        records[CAT_COLUMNS[1]] = np.arange(size)  # the position in output order
        on_disk = records[rng.permutation(size)] if bucket % 2 == 0 else records  # gathered, or already in order
        paths = []
        for piece, chunk in enumerate(np.array_split(on_disk, 2)):
            paths.append(tmp_path / f"train-{bucket:05d}-1.{piece}.rows")
            chunk.tofile(paths[-1])
        if size:
            files[("train", bucket)] = paths
    stream = preprocess_arrow.BucketStream("train", files, len(sizes), dtype, sum(sizes))
    batches = []
    for _, _, categorical in stream:
        time.sleep(0.05)  # the next bucket is loaded meanwhile: into a buffer other than this batch's
        batches.append((categorical[0].copy(), categorical[1].copy()))
    expected = [bucket for bucket, size in enumerate(sizes) if size]
    assert [int(bucket[0]) for bucket, _ in batches] == expected
    for (bucket, position), size in zip(batches, [size for size in sizes if size]):
        assert (bucket == bucket[0]).all() and position.tolist() == list(range(size))
    assert stream.rows == sum(sizes)
    assert not any(p.exists() for paths in files.values() for p in paths)

    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "train-00000-1.1.rows").write_bytes(b"x" * (dtype.itemsize + 3))
    with pytest.raises(ValueError, match="does not hold whole records"):
        list(preprocess_arrow.BucketStream("train", preprocess_arrow.bucket_files(torn), 1, dtype, 1))


def test_row_order_with_gaps_is_refused(window, by_arrow, tmp_path):
    table = pq.read_table(stats(window, 2, "columnar"))
    gaps = table.set_column(table.schema.get_field_index("row_order"), "row_order",
                            pa.array(np.arange(table.num_rows, dtype=np.int64) * 2))
    (tmp_path / "columnar").mkdir()
    pq.write_table(gaps, tmp_path / "columnar" / "part-00000.parquet")
    with pytest.raises(ValueError, match=r"row_order of partition 0 is not dense \(2001 rows, indexes 0\.\.4000\)"):
        preprocess_arrow.transform_main(transform_argv(window, by_arrow["dictionary"], tmp_path / "ds",
                                                       str(tmp_path / "columnar")))
    assert not (tmp_path / "ds").exists()


def encoded_days(window: Path, dictionary: Path, out: Path) -> list[str]:
    """The three days as the nvtabular engine hands them over (ids and log numericals in place), encoded here by the
    arrow engine's own lookup."""
    cardinalities = list(json.loads((dictionary / "cardinalities.json").read_text()).values())
    lookup = preprocess_arrow.DictionaryLookup(dictionary, cardinalities)
    parts = []
    for day in (0, 1, 2):
        table = pq.read_table(stats(window, day, "columnar"))
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            if name in CAT_COLUMNS:
                column = pa.array(lookup.ids(CAT_COLUMNS.index(name), column).astype(np.int64))
            elif name.startswith("int_"):
                column = pa.array(preprocess_arrow.log_numerical(column))
            table = table.set_column(table.schema.get_field_index(name), name, column)
        (out / str(day)).mkdir(parents=True)
        pq.write_table(table, out / str(day) / "part.0.parquet")
        parts.append(str(out / str(day)))
    return parts


def test_an_encoded_id_past_its_cardinality_is_refused_not_wrapped(window, by_arrow, tmp_path):
    """Upstream-encoded ids arrive as int64 and are narrowed to the dataset's dtype: an id past the cardinality
    must fail the transform, not wrap (in int8, id cardinality + 256 would become a valid id)."""
    parts = encoded_days(window, by_arrow["dictionary"], tmp_path / "encoded")
    argv = ["--train-days", *parts[:2], "--test-day", parts[2], "--dictionary", str(by_arrow["dictionary"]),
            "--seed", str(SEED), "--inputs-json", '{"t": 2}']
    preprocess_arrow.transform_main([*argv, "--output", str(tmp_path / "good")], workers=1, encoded_by="nvtabular")
    assert dataset_bytes(tmp_path / "good") == dataset_bytes(by_arrow["dataset"])  # the encoding is the engines'

    cardinalities = json.loads((by_arrow["dictionary"] / "cardinalities.json").read_text())
    name = next(n for n in CAT_COLUMNS if 1 < cardinalities[n] <= 100)  # an int8 column
    day = pq.read_table(parts[1])
    ids = day.column(name).to_numpy().copy()
    ids[17] = cardinalities[name] + 256 - 1  # would wrap to cardinality - 1: a valid id
    day = day.set_column(day.schema.get_field_index(name), name, pa.array(ids))
    pq.write_table(day, Path(parts[1]) / "part.0.parquet")
    with pytest.raises(ValueError, match=rf"{parts[1]}.*: {name} holds id {ids[17]}, outside \[0, "
                                         rf"{cardinalities[name]}\)"):
        preprocess_arrow.transform_main([*argv, "--output", str(tmp_path / "bad")], workers=1,
                                        encoded_by="nvtabular")
    assert not (tmp_path / "bad").exists()


def test_lookup_of_values_that_are_not_hex(tmp_path):
    """Columns (or batches) whose values are not all 8 bytes long take pyarrow's index_in: the same ids."""
    (tmp_path / "dictionary").mkdir()
    values = {0: ["0000000a", "0000000b"], 1: ["a", "bb", "0000000c"]}
    rows = [(c, v, i + 1, 10 - i) for c, vs in values.items() for i, v in enumerate(vs)]
    pq.write_table(pa.Table.from_pylist([dict(zip(("column", "value", "id", "count"), r)) for r in rows],
                                        schema=preprocess_arrow.DICTIONARY_SCHEMA),
                   tmp_path / "dictionary" / "part-00000.parquet")
    cardinalities = [3, 4] + [1] * (len(CAT_COLUMNS) - 2)
    lookup = preprocess_arrow.DictionaryLookup(tmp_path, cardinalities)
    hexes = pa.array(["0000000b", None, "0000000a", "ffffffff"])
    assert lookup.ids(0, hexes).tolist() == [2, 0, 1, 0]
    assert lookup.ids(0, pa.array(["0000000b", "A", "", None])).tolist() == [2, 0, 0, 0]
    assert lookup.ids(1, pa.array(["bb", "0000000c", None, "a", "zz"])).tolist() == [2, 3, 0, 1, 0]
    assert lookup.ids(2, hexes).tolist() == [0, 0, 0, 0]
    # dictionary-encoded (as pass 1 reads parquet): looked up per distinct value, gathered by index
    assert lookup.ids(0, hexes.dictionary_encode()).tolist() == [2, 0, 1, 0]
    assert lookup.ids(0, pa.array(["A", "0000000a", None, "A"]).dictionary_encode()).tolist() == [0, 1, 0, 0]
    assert lookup.ids(1, pa.array([None, None], pa.string()).dictionary_encode()).tolist() == [0, 0]
    # int8 indices into 128 values: a null's index (past the dictionary) does not fit in int8
    full = pa.DictionaryArray.from_arrays(pa.array([11, None, 10, 127], pa.int8()),
                                          pa.array([f"{i:08x}" for i in range(128)]))
    assert lookup.ids(0, full).tolist() == [2, 0, 1, 0]
    with pytest.raises(ValueError, match="cat_0: 2 values but the recorded cardinalities say 5"):
        preprocess_arrow.DictionaryLookup(tmp_path, [5] + cardinalities[1:])


def test_a_column_dictionary_sums_spilled_counts_and_keeps_no_null_value(tmp_path):
    spill = tmp_path / "column-00.arrow"
    with pa.ipc.new_file(spill, preprocess_arrow._COUNTS_SPILL_SCHEMA) as writer:  # two days' counts
        writer.write_table(pa.table({"value": ["0000000b", None, "0000000a"], "count": [2, 9, 1]},
                                    schema=preprocess_arrow._COUNTS_SPILL_SCHEMA))
        writer.write_table(pa.table({"value": ["0000000a", "0000000c", None], "count": [1, 1, 9]},
                                    schema=preprocess_arrow._COUNTS_SPILL_SCHEMA))
    rows, summary = preprocess_arrow.column_dictionary(spill, 0, threshold=2)
    assert rows.to_pydict() == {"column": [0, 0], "value": ["0000000a", "0000000b"], "id": [1, 2], "count": [2, 2]}
    assert summary == {"threshold": 2, "kept": 2, "dropped": 1, "occurrences_kept_share": 0.8}


@pytest.mark.parametrize("values", ["hex", "mixed"])
def test_a_column_split_by_value_hash_gives_the_same_dictionary(tmp_path, monkeypatch, values):
    """A spill over GROUP_BY_ROWS is summed bucket by bucket (8-byte values hashed as keys, others by pandas): the
    same rows and summary as one aggregation, and no bucket file left behind. Mixed: the first chunk read holds
    only 8-byte values, the later ones other strings too (an 8-byte value must land in the same bucket in both)."""
    rng = np.random.default_rng(7)
    hex_values = [f"{v:08x}" for v in rng.integers(0, 2**32, 300)]
    other = [f"v{v}" * (1 + v % 3) for v in range(300)]
    pieces = []
    for piece in range(6):
        pool = hex_values + (other if values == "mixed" and piece >= 2 else [])
        pieces.append(pa.table({"value": [pool[i] if i % 37 else None for i in rng.integers(0, len(pool), 500)],
                                "count": rng.integers(1, 4, 500)}, schema=preprocess_arrow._COUNTS_SPILL_SCHEMA))

    def dictionary(directory):
        directory.mkdir()
        spill = directory / "column-03.arrow"
        with pa.ipc.new_file(spill, preprocess_arrow._COUNTS_SPILL_SCHEMA) as writer:
            for piece in pieces:
                writer.write_table(piece)
        result = preprocess_arrow.column_dictionary(spill, 3, threshold=8)
        assert list(directory.iterdir()) in ([], [spill])
        return result

    whole_rows, whole_summary = dictionary(tmp_path / "whole")
    monkeypatch.setattr(preprocess_arrow, "GROUP_BY_ROWS", 700)
    monkeypatch.setattr(preprocess_arrow, "PARTITION_ROWS", 1000)
    split_rows, split_summary = dictionary(tmp_path / "split")  # 3,000 counts: 8 buckets
    assert 0 < whole_summary["kept"] and 0 < whole_summary["dropped"]
    assert split_rows.equals(whole_rows) and split_summary == whole_summary
    monkeypatch.setattr(preprocess_arrow, "MAX_GROUP_BY_BUCKETS", 4)
    with pytest.raises(ValueError, match="cat_3: 3,000 spilled counts need 8 buckets of at most 700, more than 4"):
        dictionary(tmp_path / "too_many")


def test_log_numerical_rules():
    column = pa.array([None, -3, -2, 0, 7, 10**17], pa.int64())
    expected = [0.0, 0.0, 0.0, np.log(3.0), np.log(10.0), np.log(float(10**17 + 3))]
    assert preprocess_arrow.log_numerical(column).tolist() == np.array(expected, dtype=np.float32).tolist()
    assert preprocess_arrow.log_numerical(column.slice(4)).tolist() == np.array(expected[4:], np.float32).tolist()


def test_log_numerical_table_is_the_computation_it_replaces():
    """Values looked up (x + 3 below LOG_TABLE_SIZE) and computed (above, at the table's edge, negative) give the
    float64 log's float32 value, and in float16 that value rounded once more (what split binary stores)."""
    edge = preprocess_arrow.LOG_TABLE_SIZE - 3
    values = [None, -10**17, -4, -3, -2, -1, 0, 1, 12, 999, edge - 1, edge, edge + 1, 3 * edge, 10**17]
    column = pa.array(values, pa.int64())
    reference = np.array([0.0 if v is None or v + 3 <= 0 else np.log(float(v + 3)) for v in values]).astype(np.float32)
    assert preprocess_arrow.log_numerical(column).tobytes() == reference.tobytes()
    halves = preprocess_arrow.log_numerical(column, np.float16)
    assert halves.dtype == np.float16 and halves.tobytes() == reference.astype(np.float16).tobytes()
    assert preprocess_arrow.log_numerical(column.slice(3, 5), np.float16).tobytes() == \
        reference[3:8].astype(np.float16).tobytes()


# ---- engine selection in the task functions and the command line ---------------------------------------------------

def test_task_functions_and_cli_choose_the_engine(window, by_arrow, tmp_path, monkeypatch):
    settings = Settings(data_root=window)
    monkeypatch.setenv(preprocess.ENGINE_ENV, "arrow")
    built = preprocess.build_dictionary(settings, tmp_path / "dictionary", [0, 1], 2, frequency_threshold=THRESHOLD)
    assert (built["engine"], built["cached"]) == ("arrow", False)
    assert dictionary_rows(tmp_path / "dictionary") == dictionary_rows(by_arrow["dictionary"])

    def no_spark(*args, **kwargs):
        raise AssertionError("spark-submit ran although the output was complete")

    monkeypatch.setattr("tasks.core.spark_submit.run_spark_job", no_spark)
    # the engine is not part of the cache key: the spark engine finds the arrow engine's output complete
    again = preprocess.build_dictionary(settings, tmp_path / "dictionary", [0, 1], 2, frequency_threshold=THRESHOLD,
                                        engine="spark")
    assert (again["engine"], again["cached"], again["fingerprint"]) == ("arrow", True, built["fingerprint"])
    monkeypatch.setenv(preprocess.ENGINE_ENV, "dask")
    with pytest.raises(ValueError, match="RECFLOW_CRITEO_PREPROCESS_ENGINE 'dask'"):
        preprocess.build_dictionary(settings, tmp_path / "d2", [0, 1], 2)
    monkeypatch.delenv(preprocess.ENGINE_ENV)

    report = tmp_path / "report.json"
    assert cli.main(["--data-root", str(window), "--json", str(report), "criteo", "preprocess", "--train-days",
                     "0-1", "--test-day", "2", "--frequency-threshold", str(THRESHOLD), "--seed", str(SEED),
                     "--engine", "arrow", "--out", str(tmp_path / "run")]) == 0
    steps = {s["step"]: s["result"] for s in json.loads(report.read_text())["steps"]}
    assert steps["build_dictionary"]["engine"] == steps["transform_dataset"]["engine"] == "arrow"
    assert steps["validate_dataset"]["rows"] == {"train": 5500, "test": 1000, "validation": 1001}
    assert dataset_bytes(tmp_path / "run" / "dataset") == dataset_bytes(by_arrow["dataset"])
    shutil.rmtree(tmp_path / "run")


# ---- the nvtabular engine: NVIDIA's NVTabular workflow, in NVTabular's own environment -----------------------------

@pytest.fixture(scope="module")
def by_nvtabular(window) -> dict:
    """Dictionary + dataset through the task functions with engine nvtabular: the workflow is fitted and applied by
    nvt_jobs/criteo.py in .venv-nvtabular (CPU here; `make test` builds it with `make nvt-env` first). Fails, not
    skips, when that environment is missing."""
    settings = Settings(data_root=window)
    out = {"dictionary": window / "nvt" / "dictionary", "dataset": window / "nvt" / "dataset"}
    out["built"] = preprocess.build_dictionary(settings, out["dictionary"], [0, 1], 2, frequency_threshold=THRESHOLD,
                                               engine="nvtabular")
    out["written"] = preprocess.transform_dataset(settings, out["dataset"], out["dictionary"], [0, 1], 2, seed=SEED,
                                                  engine="nvtabular")
    return out


def test_nvtabular_dictionary_equals_the_other_engines(by_arrow, by_nvtabular):
    rows, schema = dictionary_rows(by_nvtabular["dictionary"])
    assert (rows, schema) == dictionary_rows(by_arrow["dictionary"])
    for name in ("cardinalities.json", "model_size.json"):
        assert (by_nvtabular["dictionary"] / name).read_bytes() == (by_arrow["dictionary"] / name).read_bytes()
    # Equal counts, where Categorify's own order is unspecified, are many in this window: the tie rule is exercised.
    counts = {}
    for column, _, _, count in rows:
        counts[(column, count)] = counts.get((column, count), 0) + 1
    assert sum(n for n in counts.values() if n > 1) > len(rows) // 2
    manifest = read_manifest(by_nvtabular["dictionary"])["extra"]
    assert manifest["engine"] == by_nvtabular["built"]["engine"] == "nvtabular"
    kept = {name: s["kept"] for name, s in read_manifest(by_arrow["dictionary"])["extra"]["summary"].items()}
    assert {name: s["kept"] for name, s in manifest["summary"].items()} == kept
    assert (by_nvtabular["dictionary"] / manifest["workflow"] / "workflow.pkl").is_file()


def test_nvtabular_dataset_is_byte_identical_to_the_other_engines(by_arrow, by_nvtabular):
    assert dataset_bytes(by_nvtabular["dataset"]) == dataset_bytes(by_arrow["dataset"])
    assert read_manifest(by_nvtabular["dataset"])["extra"]["engine"] == by_nvtabular["written"]["engine"] == "nvtabular"
    encoded = by_nvtabular["dataset"].with_name(by_nvtabular["dataset"].name + ".nvt-encoded")
    assert not encoded.exists()  # the workflow's intermediate output goes once the dataset is complete


def test_the_saved_workflow_encodes_rows_as_its_dictionary_does_wherever_it_is_copied(window, by_nvtabular,
                                                                                     tmp_path):
    """A published version carries nvt_workflow/: loaded from a copy, NVTabular's own transform of the raw test day
    gives the ids the dictionary (which predict uses) gives, and log(x + 3) to float32 precision."""
    from tasks.core.nvtabular import run_nvt_job

    copied = tmp_path / "published" / "nvt_workflow"
    shutil.copytree(by_nvtabular["dictionary"] / "nvt_workflow", copied)
    test_day = stats(window, 2, "columnar")
    run_nvt_job("nvt_jobs.criteo", ["transform", "--workflow", str(copied), "--inputs", test_day,
                                    "--output", str(tmp_path / "encoded")])
    encoded = pq.read_table(tmp_path / "encoded" / "0").sort_by("row_order")
    raw = pq.read_table(test_day).sort_by("row_order")
    assert encoded.column("row_order").equals(raw.column("row_order"))
    assert encoded.column("label").to_pylist() == raw.column("label").to_pylist()
    cardinalities = json.loads((by_nvtabular["dictionary"] / "cardinalities.json").read_text())
    lookup = preprocess_arrow.DictionaryLookup(by_nvtabular["dictionary"], list(cardinalities.values()))
    for index, name in enumerate(CAT_COLUMNS):
        np.testing.assert_array_equal(encoded.column(name).to_numpy(),
                                      lookup.ids(index, raw.column(name).combine_chunks()), err_msg=name)
    for name in (f"int_{i}" for i in range(13)):
        np.testing.assert_allclose(encoded.column(name).to_numpy(),
                                   preprocess_arrow.log_numerical(raw.column(name).combine_chunks()), rtol=1e-6,
                                   err_msg=name)


def test_nvtabular_retries_refusals_and_failures(window, by_arrow, by_nvtabular, tmp_path, monkeypatch):
    from tasks.core import nvtabular
    from tasks.criteo.ingest import StepInputMissing

    settings = Settings(data_root=window)

    def no_nvtabular(*args, **kwargs):
        raise AssertionError("NVTabular ran although the output was complete")

    monkeypatch.setattr(nvtabular, "run_nvt_job", no_nvtabular)
    again = preprocess.build_dictionary(settings, by_nvtabular["dictionary"], [0, 1], 2, frequency_threshold=THRESHOLD,
                                        engine="nvtabular")
    assert (again["cached"], again["fingerprint"]) == (True, by_nvtabular["built"]["fingerprint"])
    # the engine is in nvtabular's cache key: an arrow dictionary in the same place is not taken for its output
    assert again["fingerprint"] != read_manifest(by_arrow["dictionary"])["inputs_fingerprint"]
    with pytest.raises(StepInputMissing, match="built by the arrow engine and holds no NVTabular workflow"):
        preprocess.transform_dataset(settings, tmp_path / "dataset", by_arrow["dictionary"], [0, 1], 2,
                                     engine="nvtabular")
    monkeypatch.undo()

    monkeypatch.setenv(nvtabular.PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(nvtabular.NvtEnvironmentMissing, match="run `make nvt-env`"):
        preprocess.build_dictionary(settings, tmp_path / "d", [0, 1], 2, engine="nvtabular")
    monkeypatch.delenv(nvtabular.PYTHON_ENV)
    (tmp_path / "empty").mkdir()
    with pytest.raises(nvtabular.NvtJobFailed, match=r"FileNotFoundError: .*empty: no parquet files"):
        nvtabular.run_nvt_job("nvt_jobs.criteo", ["fit", "--days", str(tmp_path / "empty"), "--output",
                                                  str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


@pytest.mark.gpu
def test_nvtabular_on_the_gpu_writes_the_same_dataset(window, by_arrow, tmp_path, monkeypatch):
    """On a GPU worker (RECFLOW_NVT_PYTHON: an environment with cudf / dask-cuda) the workflow runs on cudf."""
    monkeypatch.setenv("RECFLOW_NVT_DEVICE", "gpu")
    settings = Settings(data_root=window)
    preprocess.build_dictionary(settings, tmp_path / "dictionary", [0, 1], 2, frequency_threshold=THRESHOLD,
                                engine="nvtabular")
    preprocess.transform_dataset(settings, tmp_path / "dataset", tmp_path / "dictionary", [0, 1], 2, seed=SEED,
                                 engine="nvtabular")
    assert read_manifest(tmp_path / "dictionary")["extra"]["device"] == "gpu"
    assert dictionary_rows(tmp_path / "dictionary") == dictionary_rows(by_arrow["dictionary"])
    assert dataset_bytes(tmp_path / "dataset") == dataset_bytes(by_arrow["dataset"])
