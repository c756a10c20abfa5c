"""criteo_dlrm preprocessing: dictionary (spark_jobs/criteo/dictionary.py), transform (spark_jobs/criteo/transform.py) and the task
functions around them (tasks/criteo/preprocess.py), on tiny hand-made days with known answers.

One local[2] SparkSession is shared by the in-process job runs (the jobs' spark_session() picks it up through
getOrCreate); one test goes through spark-submit end to end via the task functions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.criteo import dictionary as criteo_dictionary, transform as criteo_transform
from tasks.criteo import preprocess as criteo_preprocess
from tasks.core import layout
from tasks.criteo import layout as criteo_layout
from tasks.core.config import Settings
from tasks.criteo.ingest import StepInputMissing
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL
from tasks.formats.feature_spec import FeatureSpec
from tests.split_binary_rows import read_rows as read_split_binary
from tasks.core.storage import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from tests.job_logging import root_logging_kept


pytestmark = pytest.mark.spark

P = 1 << 33  # row_order of the first row of source partition 1 (monotonically_increasing_id)
SEED = 7
THRESHOLD = 2


def row(label, row_order, ints=None, cats=None):
    return {"label": label, "row_order": row_order, "ints": ints or {}, "cats": cats or {}}


# Train window: cat_0 a x4, b x3, c x2, r x1 (rare at threshold 2); cat_1 x x3, y x1 (rare).
TRAIN_DAYS = {
    0: [row(1, 0, {0: 5}, {0: "a", 1: "x"}), row(0, 1, {0: None, 1: 2}, {0: "b"}),
        row(0, 2, {0: -3}, {0: "a", 1: "y"}), row(1, 3, {0: -2}, {0: "b", 1: "x"})],
    1: [row(0, 0, {0: 0}, {0: "a"}), row(1, 1, {0: -10}, {0: "c"}), row(0, 2, {0: 100}, {0: "b", 1: "x"}),
        row(1, 3, {0: 1}, {0: "a"}), row(0, 4, {1: 7}, {0: "c"}), row(1, 5, {}, {0: "r"}), row(0, 6, {0: 2})],
}
# Test day, 5 rows over three source partitions (spark-engine row_order: partition << 33 | index among its rows):
# test = the first 2 in file order, i.e. dense row_order 0 and 1.
TEST_DAY = 2
TEST_ROWS = [row(1, 0, {0: None}, {0: "a", 1: "x"}), row(0, P + 0, {0: -3}, {0: "z"}),
             row(1, P + 1, {0: -2}, {0: None, 1: "y"}), row(0, P + 2, {0: 0}, {0: "c"}),
             row(0, 2 * P + 0, {0: 7, 12: 4}, {0: "r", 1: "x"})]
IDS = {0: {"a": 1, "b": 2, "c": 3}, 1: {"x": 1}}  # ids at threshold 2; everything else -> 0


# ---- hand-made inputs --------------------------------------------------------------------------------------------

def columnar_table(rows: list[dict]) -> pa.Table:
    columns = {LABEL: pa.array([r["label"] for r in rows], pa.int8())}
    for i, name in enumerate(INT_COLUMNS):
        columns[name] = pa.array([r["ints"].get(i) for r in rows], pa.int64())
    for i, name in enumerate(CAT_COLUMNS):
        columns[name] = pa.array([r["cats"].get(i) for r in rows], pa.string())
    columns["row_order"] = pa.array([r["row_order"] for r in rows], pa.int64())
    return pa.table(columns)


def write_columnar(directory: Path, rows: list[dict]) -> Path:
    """Two files, rows in reverse physical order: the job must order by row_order, not by reading order."""
    directory.mkdir(parents=True)
    backwards = rows[::-1]
    half = len(backwards) // 2
    pq.write_table(columnar_table(backwards[:half]), directory / "part-00000.parquet")
    pq.write_table(columnar_table(backwards[half:]), directory / "part-00001.parquet")
    return directory


def write_counts(directory: Path, counts: dict[tuple[int, str], int]) -> Path:
    directory.mkdir(parents=True)
    keys = sorted(counts)
    pq.write_table(pa.table({"column": pa.array([k[0] for k in keys], pa.int32()),
                             "value": pa.array([k[1] for k in keys], pa.string()),
                             "count": pa.array([counts[k] for k in keys], pa.int64())}),
                   directory / "part-00000.parquet")
    return directory


def counts_of(rows: list[dict]) -> dict[tuple[int, str], int]:
    counts: dict[tuple[int, str], int] = {}
    for r in rows:
        for column, value in r["cats"].items():
            if value is not None:
                counts[(column, value)] = counts.get((column, value), 0) + 1
    return counts


def write_stats_day(root: Path, day: int, rows: list[dict]) -> Path:
    """stats/day=N as criteo_day_stats leaves it: columnar/, counts/, _MANIFEST.json."""
    stats = criteo_layout.stats_day(root, day)
    write_columnar(stats / "columnar", rows)
    write_counts(stats / "counts", counts_of(rows))
    write_manifest(stats, Manifest(kind="criteo_day_stats", inputs={"day": day}, rows={"good": len(rows)}))
    return stats


# ---- expected values ---------------------------------------------------------------------------------------------

def expected(r: dict) -> tuple:
    """(label, numerical float16 tuple, ids tuple) of one input row, computed independently of Spark."""
    def log3(x):
        return 0.0 if x is None or x + 3 <= 0 else math.log(x + 3)

    numerical = tuple(np.float16(np.float32(log3(r["ints"].get(i)))) for i in range(len(INT_COLUMNS)))
    ids = tuple(IDS.get(i, {}).get(r["cats"].get(i), 0) for i in range(len(CAT_COLUMNS)))
    return bool(r["label"]), numerical, ids


def read_rows(dataset: Path, mapping: str) -> list[tuple]:
    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    numerical, categorical, label = read_split_binary(spec, mapping, 0, 1000)
    return [(bool(label[i]), tuple(numerical[i]), tuple(int(v) for v in categorical[i])) for i in range(len(label))]


def mapping_bytes(dataset: Path, mapping: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((dataset / mapping).iterdir())}


def run_dictionary(argv: list[str]) -> criteo_dictionary.DictionaryResult:
    with root_logging_kept():
        return criteo_dictionary.main(argv)


# ---- fixtures ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark(spark):
    """The test session's SparkSession (tests/conftest.py) with broadcasts only by explicit hint, so the skew-safe
    path really shuffles its cold part."""
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    yield spark
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)


@pytest.fixture(scope="module")
def window(tmp_path_factory) -> Path:
    """A data root with stats for train days 0, 1 and test day 2."""
    root = tmp_path_factory.mktemp("data")
    for day, rows in TRAIN_DAYS.items():
        write_stats_day(root, day, rows)
    write_stats_day(root, TEST_DAY, TEST_ROWS)
    return root


def stats(root: Path, day: int, part: str) -> str:
    return str(criteo_layout.stats_day(root, day) / part)


@pytest.fixture(scope="module")
def dictionary(spark, window) -> Path:
    out = window / "runs" / "dictionary"
    run_dictionary(["--counts", stats(window, 0, "counts"), stats(window, 1, "counts"),
                    "--output", str(out), "--frequency-threshold", str(THRESHOLD)])
    return out


def run_transform(window: Path, dictionary: Path, out: Path, *extra: str) -> criteo_transform.TransformResult:
    with root_logging_kept():
        return criteo_transform.main(["--train-days", stats(window, 0, "columnar"), stats(window, 1, "columnar"),
                                      "--test-day", stats(window, TEST_DAY, "columnar"),
                                      "--dictionary", str(dictionary), "--output", str(out), "--seed", str(SEED),
                                      *extra])


@pytest.fixture(scope="module")
def dataset(spark, window, dictionary) -> Path:
    """Every column broadcast (the default --broadcast-max-values), looked up in one mapInArrow pass (the default
    --dictionary-lookup arrow)."""
    out = window / "runs" / "dataset_broadcast"
    result = run_transform(window, dictionary, out)
    assert result.joins["cat_0"] == "broadcast" and result.joins["cat_2"] == "empty"
    return out


# ---- dictionary --------------------------------------------------------------------------------------------------

COUNTS_A = {(0, "a"): 10, (0, "b"): 5, (0, "c"): 3, (0, "e"): 2, (1, "x"): 1, (1, "y"): 6, (3, "p"): 1}
COUNTS_B = {(0, "a"): 2, (0, "b"): 7, (0, "d"): 4, (0, "c"): 1, (1, "y"): 1, (3, "q"): 1}
# summed: cat_0 a 12, b 12, c 4, d 4, e 2; cat_1 y 7, x 1; cat_3 p 1, q 1


def dictionary_rows(out: Path) -> list[tuple[int, str, int, int]]:
    table = pq.read_table(out / "dictionary")
    assert table.schema.field("column").type == pa.int32() and table.schema.field("id").type == pa.int32()
    assert table.schema.field("count").type == pa.int64() and table.schema.field("value").type == pa.string()
    return sorted(zip(*(table.column(c).to_pylist() for c in ("column", "value", "id", "count"))))


@pytest.fixture(scope="module")
def day_counts(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("counts")
    return [str(write_counts(root / "day=0", COUNTS_A)), str(write_counts(root / "day=1", COUNTS_B))]


def test_dictionary_sums_days_thresholds_overrides_and_orders_ids(spark, day_counts, tmp_path):
    out = tmp_path / "dictionary"
    result = run_dictionary(["--counts", *day_counts, "--output", str(out), "--frequency-threshold", "4",
                                     "--threshold-overrides", "cat_1:8,cat_3:0", "--inputs-json", '{"w": 1}'])
    # cat_0: count >= 4 kept (c and d at exactly 4), e (2) dropped; ties by value: a before b, c before d.
    # cat_1: override 8 drops y (7) and x (1). cat_3: override 0 keeps both singletons.
    assert dictionary_rows(out) == [(0, "a", 1, 12), (0, "b", 2, 12), (0, "c", 3, 4), (0, "d", 4, 4),
                                    (3, "p", 1, 1), (3, "q", 2, 1)]
    cardinalities = json.loads((out / "cardinalities.json").read_text())
    assert list(cardinalities) == list(CAT_COLUMNS)
    assert cardinalities == {name: {"cat_0": 5, "cat_3": 3}.get(name, 1) for name in CAT_COLUMNS}
    model_size = json.loads((out / "model_size.json").read_text())
    assert list(model_size) == [f"_c{i}" for i in range(14, 40)]
    assert model_size == {f"_c{14 + i}": {0: 4, 3: 2}.get(i, 0) for i in range(26)}
    assert result.cardinalities == cardinalities and result.values == 6
    manifest = read_manifest(out)
    assert manifest["kind"] == "criteo_dictionary" and manifest["inputs"] == {"w": 1}
    summary = manifest["extra"]["summary"]
    assert summary["cat_0"] == {"threshold": 4, "kept": 4, "dropped": 1, "occurrences_kept_share": round(32 / 34, 6)}
    assert summary["cat_1"] == {"threshold": 8, "kept": 0, "dropped": 2, "occurrences_kept_share": 0.0}
    assert summary["cat_3"]["kept"] == 2 and summary["cat_5"]["kept"] == 0
    assert "cardinalities.json" in manifest["files"] and not (out / "_summed_counts").exists()


def test_dictionary_threshold_zero_keeps_every_value(spark, day_counts, tmp_path):
    out = tmp_path / "dictionary"
    run_dictionary(["--counts", *day_counts, "--output", str(out), "--frequency-threshold", "0"])
    assert dictionary_rows(out) == [(0, "a", 1, 12), (0, "b", 2, 12), (0, "c", 3, 4), (0, "d", 4, 4), (0, "e", 5, 2),
                                    (1, "x", 2, 1), (1, "y", 1, 7), (3, "p", 1, 1), (3, "q", 2, 1)]


def test_dictionary_rejects_a_bad_override():
    with pytest.raises(ValueError, match="cat_99:2"):
        criteo_dictionary.parse_threshold_overrides("cat_3:2,cat_99:2")


# ---- transform ---------------------------------------------------------------------------------------------------

def test_transform_writes_expected_test_and_validation_in_file_order(dataset):
    ordered = sorted(TEST_ROWS, key=lambda r: r["row_order"])
    assert read_rows(dataset, "test") == [expected(r) for r in ordered[:2]]
    assert read_rows(dataset, "validation") == [expected(r) for r in ordered[2:]]
    # spot checks of the rules, independent of expected(): unseen z, missing, rare r -> 0; -3 -> 0; -2 -> log(1)
    test, validation = read_rows(dataset, "test"), read_rows(dataset, "validation")
    assert test[0][2][:2] == (1, 1) and test[1][2][0] == 0 and test[1][1][0] == 0
    assert validation[0][2][:2] == (0, 0) and validation[0][1][0] == 0
    assert validation[2][2][:2] == (0, 1) and validation[2][1][12] == np.float16(math.log(7))


def test_transform_train_is_a_shuffle_of_all_train_rows(dataset):
    inputs = TRAIN_DAYS[0] + TRAIN_DAYS[1]
    train = read_rows(dataset, "train")
    assert sorted(train) == sorted(expected(r) for r in inputs)
    assert train != [expected(r) for r in inputs]


def test_transform_output_passes_nvidia_checks_and_records_rows(dataset):
    summary = criteo_preprocess.validate_dataset(dataset)
    assert summary["rows"] == {"train": 11, "test": 2, "validation": 3}
    assert summary["cardinalities"] == [4, 2] + [1] * 24
    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    assert sorted(spec.source_spec) == ["test", "train"]
    manifest = read_manifest(dataset)
    assert manifest["rows"] == summary["rows"] and manifest["extra"]["split_row_order"] == 2
    # sizes only: a whole extra read of the dataset to hash it, for no reader (docs/ARCHITECTURE.md "Manifests")
    assert manifest["files"]["train/cat_0.bin"] == {"bytes": (dataset / "train/cat_0.bin").stat().st_size}
    assert not (dataset / "_parquet").exists()


def test_skew_safe_join_gives_the_same_dataset_as_broadcast(spark, window, dictionary, dataset, tmp_path):
    # cat_0 occurrences 9: cutoff int(9 * 40 / 100) = 3 -> a (4) and b (3) hot (broadcast), c (2) cold (shuffle)
    result = run_transform(window, dictionary, tmp_path / "skew", "--broadcast-max-values", "0",
                           "--skew-cutoff-pct", "40")
    assert result.joins["cat_0"] == "skew" and result.joins["cat_1"] == "skew"
    for mapping in ("train", "test", "validation"):
        assert mapping_bytes(tmp_path / "skew", mapping) == mapping_bytes(dataset, mapping), mapping


def test_join_per_column_gives_the_same_dataset_as_the_arrow_lookup(spark, window, dictionary, dataset, tmp_path):
    # NVIDIA's plan (and the GPU profile's): one broadcast join per column
    result = run_transform(window, dictionary, tmp_path / "join", "--dictionary-lookup", "join")
    assert result.joins["cat_0"] == "broadcast"
    for mapping in ("train", "test", "validation"):
        assert mapping_bytes(tmp_path / "join", mapping) == mapping_bytes(dataset, mapping), mapping


def test_arrow_lookup_ids_with_and_without_the_cached_index(monkeypatch):
    values = pa.array(["a", "b", "c"])  # ids 1, 2, 3
    column = pa.array(["c", None, "a", "zz", "b", "a"])
    expected = [3, 0, 1, 0, 2, 1]  # null and unseen -> 0
    small = criteo_transform._lookup_ids(column, values, ("t", 0))
    assert small.type == pa.int32() and small.to_pylist() == expected
    monkeypatch.setattr(criteo_transform, "CACHED_INDEX_MIN_VALUES", 1)
    monkeypatch.setattr(criteo_transform, "_INDEX_CACHE", {})
    cached = criteo_transform._lookup_ids(column, values, ("t", 0))
    assert cached.type == pa.int32() and cached.to_pylist() == expected
    assert list(criteo_transform._INDEX_CACHE) == [("t", 0)]
    again = criteo_transform._lookup_ids(pa.array(["b"]), values, ("t", 0))  # the cached index is reused
    assert again.to_pylist() == [2] and len(criteo_transform._INDEX_CACHE) == 1


def test_gpu_profile_keeps_nvidias_join_per_column(monkeypatch, tmp_path):
    seen = {}

    def fake_submit(job, args, out_dir, inputs, label, master, profile, conf):
        seen[profile] = args[args.index("--dictionary-lookup") + 1]
        raise RuntimeError("stop before spark-submit")

    monkeypatch.setattr(criteo_preprocess, "_submit", fake_submit)
    monkeypatch.setattr(criteo_preprocess, "read_manifest", lambda path: {"kind": "criteo_dictionary",
                                                                          "inputs_fingerprint": "f"})
    monkeypatch.setattr(criteo_preprocess, "_stats_fingerprints", lambda settings, days: {str(d): "s" for d in days})
    for profile in ("local", "cluster", "gpu", "gpu-explain"):
        with pytest.raises(RuntimeError, match="stop before"):
            criteo_preprocess.transform_dataset(Settings(data_root=tmp_path), tmp_path / profile, tmp_path / "dict",
                                                [0], 1, spark_profile=profile, engine="spark")
    assert seen == {"local": "arrow", "cluster": "arrow", "gpu": "join", "gpu-explain": "join"}


def test_validate_dataset_names_the_bad_file(dataset, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    (broken / "validation" / "cat_0.bin").write_bytes(b"\x00" * 2)
    with pytest.raises(criteo_preprocess.DatasetInvalid, match=r"validation/cat_0.bin: 2 rows but"):
        criteo_preprocess.validate_dataset(broken)


def test_validate_dataset_reads_no_value_the_writer_checked_and_scans_a_dataset_it_did_not(dataset, tmp_path,
                                                                                            monkeypatch):
    """The transform's writer checked every value as it wrote it (its manifest says so): validate_dataset checks the
    spec, sizes and rows without reading the data again (~390 GB at full size). A dataset whose manifest does not
    say so (written before, or by hand) is scanned, and a bad id is named by file and row."""
    import shutil

    from tasks.formats import split_binary
    from tasks.formats.split_binary import CHECKED_AT_WRITE

    real_scan = split_binary._scan_file
    scanned: list[str] = []
    monkeypatch.setattr(split_binary, "_scan_file", lambda f, *a: scanned.append(f.rel) or real_scan(f, *a))
    assert read_manifest(dataset)["extra"][CHECKED_AT_WRITE] == [4, 2] + [1] * 24  # what the writer checked against
    assert criteo_preprocess.validate_dataset(dataset)["rows"] == {"train": 11, "test": 2, "validation": 3}
    assert scanned == []

    unvouched = tmp_path / "unvouched"
    shutil.copytree(dataset, unvouched)
    manifest = read_manifest(unvouched)
    del manifest["extra"][CHECKED_AT_WRITE]
    (unvouched / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert criteo_preprocess.validate_dataset(unvouched)["rows"] == {"train": 11, "test": 2, "validation": 3}
    assert "train/cat_0.bin" in scanned and "validation/label.bin" in scanned
    ids = np.fromfile(unvouched / "test" / "cat_0.bin", dtype=np.int8)  # cat_0's cardinality is 4
    ids[1] = 9
    ids.tofile(unvouched / "test" / "cat_0.bin")
    with pytest.raises(criteo_preprocess.DatasetInvalid, match=r"test/cat_0.bin row 1: id 9 >= cardinality 4"):
        criteo_preprocess.validate_dataset(unvouched)


# ---- task functions ----------------------------------------------------------------------------------------------

def test_tasks_name_the_day_without_stats(window, tmp_path):
    settings = Settings(data_root=window)
    with pytest.raises(StepInputMissing, match=r"day 5 has no completed day stats .*day=5"):
        criteo_preprocess.build_dictionary(settings, tmp_path / "d", [0, 5], TEST_DAY)
    with pytest.raises(StepInputMissing, match="day 9 has no completed day stats"):
        criteo_preprocess.build_dictionary(settings, tmp_path / "d", [0, 1], 9, dictionary_days="all")
    with pytest.raises(ValueError, match="test day 1 is also a train day"):
        criteo_preprocess.build_dictionary(settings, tmp_path / "d", [0, 1], 1)
    with pytest.raises(StepInputMissing, match="no completed dictionary"):
        criteo_preprocess.transform_dataset(settings, tmp_path / "t", tmp_path / "nothing", [0, 1], TEST_DAY)


def test_spark_submit_end_to_end_then_cached(window, dataset, monkeypatch):
    settings = Settings(data_root=window)
    run = layout.run_dir(window, "criteo_dlrm", "manual__2026-01-03T00:00:00+00:00")
    submit = {"spark_master": "local[2]", "spark_profile": "local", "engine": "spark",  # local: arrow unless pinned
              "spark_conf": {"spark.sql.shuffle.partitions": "3", "spark.driver.memory": "1g"}}
    built = criteo_preprocess.build_dictionary(settings, run / "dictionary", [0, 1], TEST_DAY,
                                               frequency_threshold=THRESHOLD, **submit)
    assert built["cached"] is False and built["cardinalities"] == [4, 2] + [1] * 24 and built["values"] == 4
    written = criteo_preprocess.transform_dataset(settings, run / "dataset", run / "dictionary", [0, 1], TEST_DAY,
                                                  seed=SEED, **submit)
    assert written["cached"] is False and written["rows"] == {"train": 11, "test": 2, "validation": 3}
    assert criteo_preprocess.validate_dataset(run / "dataset")["rows"] == written["rows"]
    # Another process and another partitioning (3 shuffle partitions): the same bytes, the train shuffle included.
    for mapping in ("train", "test", "validation"):
        assert mapping_bytes(run / "dataset", mapping) == mapping_bytes(dataset, mapping), mapping

    def no_spark(*args, **kwargs):
        raise AssertionError("spark-submit ran although the output was complete")

    monkeypatch.setattr("tasks.core.spark_submit.run_spark_job", no_spark)
    again = criteo_preprocess.build_dictionary(settings, run / "dictionary", [0, 1], TEST_DAY,
                                               frequency_threshold=THRESHOLD, **submit)
    assert again["cached"] is True and again["fingerprint"] == built["fingerprint"]
    assert criteo_preprocess.transform_dataset(settings, run / "dataset", run / "dictionary", [0, 1], TEST_DAY,
                                               seed=SEED, **submit)["cached"] is True
    # A different parameter is different work: the cache does not answer for it.
    with pytest.raises(AssertionError, match="spark-submit ran"):
        criteo_preprocess.build_dictionary(settings, run / "dictionary", [0, 1], TEST_DAY, frequency_threshold=3,
                                           **submit)
