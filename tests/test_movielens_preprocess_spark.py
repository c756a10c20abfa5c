"""movielens_ncf preprocessing (spark_jobs/movielens/preprocess.py and tasks/movielens/preprocess.py) on a tiny
hand-made ratings table whose factorization, filter, tie-breaks, dedup and leave-one-out split are worked out by hand
below.

One local[2] SparkSession is shared by the in-process job runs (the job's spark_session() picks it up through
getOrCreate); one test goes through spark-submit end to end via the task function.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from spark_jobs.movielens import preprocess as job
from tasks.core.config import Settings
from tasks.core.storage import read_manifest
from tasks.movielens import preprocess as movielens_preprocess
from tasks.movielens.ingest import StepInputMissing
from tasks.movielens.schema import validated_arrow_schema
from tests.job_logging import root_logging_kept


pytestmark = pytest.mark.spark

SEED = 7
NEGATIVES = 100
# (line, user_id, item_id, timestamp); the rating is irrelevant to the recipe (implicit feedback).
RATINGS = [
    (1, 7, 300, 10),    # (7, 300) again at line 6 with an earlier timestamp: line 6 is its first occurrence
    (2, 9, 600, 5),     # user 9 has 2 raw rows: dropped by min_ratings=4, and item 600 with it
    (3, 50, 200, 20),
    (4, 7, 100, 30),
    (5, 50, 300, 20),   # tie with line 3 at t=20
    (6, 7, 300, 5),
    (7, 30, 400, 1),
    (8, 50, 100, 40),
    (9, 9, 100, 6),
    (10, 30, 500, 50),
    (11, 30, 200, 50),  # tie with line 10 at t=50: line 11 is later in the file, so it is user 30's last
    (12, 7, 200, 30),   # tie with line 4 at t=30: user 7's last
    (13, 50, 400, 40),  # tie with line 8 at t=40: user 50's last
    (14, 30, 400, 60),  # a repeat of (30, 400) (first at t=1): dropped, so it cannot be user 30's test item
]
MIN_RATINGS = 4  # counted on raw rows: users 7, 50 and 30 have 4 (with their repeats), user 9 has 2

# min_ratings=4. Users by first appearance: 7 (line 1) -> 0, 50 (line 3) -> 1, 30 (line 7) -> 2.
# Items by first appearance among the kept rows: 300 -> 0, 200 -> 1, 100 -> 2, 400 -> 3, 500 -> 4 (600 is gone).
# Per user in (timestamp, line) order after dropping repeats (lines 1 and 14):
#   user 0: 300 (t5), 100 (t30 l4), 200 (t30 l12)            -> test 200 = 1; train 0, 2
#   user 1: 200 (t20 l3), 300 (t20 l5), 100 (t40 l8), 400 (t40 l13) -> test 400 = 3; train 0, 1, 2
#   user 2: 400 (t1), 500 (t50 l10), 200 (t50 l11)           -> test 200 = 1; train 3, 4
FILTERED = {
    "users": [7, 50, 30], "items": [300, 200, 100, 400, 500],
    "train": [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2), (2, 3), (2, 4)],
    "positives": [1, 3, 1],
    "stats": {"rows_in": 14, "rows_after_filter": 12, "duplicates_dropped": 2, "users": 3, "items": 5,
              "train_rows": 7, "test_rows": 3 * (NEGATIVES + 1)},
}
# min_ratings=0 (PyTorch): users 7 -> 0, 9 -> 1, 50 -> 2, 30 -> 3; items 300 -> 0, 600 -> 1, 200 -> 2, 100 -> 3,
# 400 -> 4, 500 -> 5. User 9: 600 (t5), 100 (t6) -> test 100 = 3, train 600 = 1.
UNFILTERED = {
    "users": [7, 9, 50, 30], "items": [300, 600, 200, 100, 400, 500],
    "train": [(0, 0), (0, 3), (1, 1), (2, 0), (2, 2), (2, 3), (3, 4), (3, 5)],
    "positives": [2, 3, 4, 2],
    "stats": {"rows_in": 14, "rows_after_filter": 14, "duplicates_dropped": 2, "users": 4, "items": 6,
              "train_rows": 8, "test_rows": 4 * 3},
}
TENSORS = ("train_data_0.pt", "train_data_1.pt", "test_data_0.pt", "test_data_1.pt")


def write_ratings(directory: Path, files: int = 2) -> Path:
    """The validated-ratings parquet, rows in reverse physical order over `files` files: the job must order by
    `line`, not by reading order."""
    directory.mkdir(parents=True)
    rows = RATINGS[::-1]
    for i in range(files):
        part = rows[i::files]
        table = pa.table({"line": [r[0] for r in part], "user_id": [r[1] for r in part],
                          "item_id": [r[2] for r in part], "rating": [4.0] * len(part),
                          "timestamp": [r[3] for r in part]}, schema=validated_arrow_schema())
        pq.write_table(table, directory / f"part-{i:05d}.parquet")
    return directory


def run_job(ratings: Path, out: Path, *extra: str) -> job.PreprocessResult:
    with root_logging_kept():
        return job.main(["--ratings", str(ratings), "--output", str(out), "--seed", str(SEED), *extra])


def load(path: Path) -> np.ndarray:
    return torch.load(path, weights_only=True).numpy()


def mapping(out: Path, name: str) -> list[int]:
    table = pq.read_table(out / "mappings" / f"{name}s.parquet")
    assert table.column_names == [name, f"{name}_id"]
    assert table.column(name).to_pylist() == list(range(len(table)))
    return table.column(f"{name}_id").to_pylist()


def tensor_bytes(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in (*TENSORS, "mappings/users.parquet", "mappings/items.parquet",
                                                         "feature_spec.yaml")}


# ---- fixtures ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ratings(tmp_path_factory) -> Path:
    return write_ratings(tmp_path_factory.mktemp("validated") / "ratings")


@pytest.fixture(scope="module")
def dataset(spark, ratings, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "dataset"
    run_job(ratings, out, "--min-ratings", str(MIN_RATINGS))
    return out


@pytest.fixture(scope="module")
def unfiltered(spark, ratings, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "unfiltered"
    run_job(ratings, out, "--min-ratings", "0", "--test-negatives", "2")
    return out


# ---- the recipe, by hand ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["filtered", "unfiltered"])
def test_factorization_filter_dedup_and_leave_one_out(case, request):
    out = request.getfixturevalue("dataset" if case == "filtered" else "unfiltered")
    want = FILTERED if case == "filtered" else UNFILTERED
    assert mapping(out, "user") == want["users"] and mapping(out, "item") == want["items"]
    train = load(out / "train_data_0.pt")
    assert train.dtype == np.int64 and [tuple(r) for r in train] == want["train"]
    labels = load(out / "train_data_1.pt")
    assert labels.dtype == np.float32 and labels.shape == (len(want["train"]), 1) and np.all(labels == 1)
    width = NEGATIVES + 1 if case == "filtered" else 3
    test = load(out / "test_data_0.pt").reshape(-1, width, 2)
    assert test[:, 0, 1].tolist() == want["positives"]  # each series starts with its positive
    stats = json.loads((out / "stats.json").read_text())
    assert {k: stats[k] for k in want["stats"]} == want["stats"]
    assert stats["seconds"] > 0 and stats["rows_per_s"] > 0


def test_test_series_positive_first_then_negatives_outside_train(dataset):
    test, labels = load(dataset / "test_data_0.pt"), load(dataset / "test_data_1.pt")
    users, width = 3, NEGATIVES + 1
    assert test.dtype == np.int64 and test.shape == (users * width, 2)
    assert labels.dtype == np.float32 and labels.shape == (users * width, 1)
    assert labels.reshape(users, width).tolist() == [[1.0] + [0.0] * NEGATIVES] * users
    series = test.reshape(users, width, 2)
    assert np.array_equal(series[:, :, 0], np.repeat(np.arange(users), width).reshape(users, width))
    train = {}
    for user, item in FILTERED["train"]:
        train.setdefault(user, set()).add(item)
    for user in range(users):
        negatives = series[user, 1:, 1]
        assert len(negatives) == NEGATIVES
        assert np.all((negatives >= 0) & (negatives < 5)), user
        assert not set(negatives.tolist()) & train[user], user
    # user 1's train is {0, 1, 2}: its negatives are 3 (its own test item: NVIDIA keeps such draws) and 4
    assert set(series[1, 1:, 1].tolist()) == {3, 4}


def test_feature_spec_is_nvidias_template(dataset):
    loaded = yaml.safe_load((dataset / "feature_spec.yaml").read_text())
    chunks = {m: [{"type": "torch_tensor", "features": ["user", "item"], "files": [f"{m}_data_0.pt"]},
                  {"type": "torch_tensor", "features": ["label"], "files": [f"{m}_data_1.pt"]}]
              for m in ("train", "test")}
    assert loaded == {
        "feature_spec": {"user": {"dtype": "torch.int64", "cardinality": 3},
                         "item": {"dtype": "torch.int64", "cardinality": 5},
                         "label": {"dtype": "torch.float32"}},
        "metadata": {"test_samples_per_series": NEGATIVES + 1},
        "source_spec": chunks,
        "channel_spec": {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]},
    }
    assert list(loaded) == ["feature_spec", "metadata", "source_spec", "channel_spec"]  # the template's order


def test_manifest_and_no_leftovers(dataset):
    manifest = read_manifest(dataset)
    assert manifest["kind"] == "movielens_preprocess"
    assert manifest["rows"] == {"train": 7, "test": 3 * (NEGATIVES + 1)}
    assert set(manifest["files"]) == {*TENSORS, "feature_spec.yaml", "stats.json", "mappings/users.parquet",
                                      "mappings/items.parquet", "seen.parquet"}
    assert not (dataset / "_parquet").exists()


def test_sampling_is_per_user_and_rejects_a_full_train_set():
    first = job.sample_negatives(3, 11, [4, 1, 2], 6, 50)
    assert np.array_equal(first, job.sample_negatives(3, 11, [2, 4, 1], 6, 50))  # train order does not matter
    assert set(first.tolist()) <= {0, 3, 5}
    assert not np.array_equal(first, job.sample_negatives(3, 12, [4, 1, 2], 6, 50))  # another user
    assert not np.array_equal(first, job.sample_negatives(4, 11, [4, 1, 2], 6, 50))  # another seed
    with pytest.raises(ValueError, match="user 11 has all 3 items in train"):
        job.sample_negatives(3, 11, [0, 1, 2], 3, 5)


def test_series_sampling_streams_and_does_not_depend_on_batching():
    """The mapInArrow body sees a partition's rows grouped by user, cut into Arrow batches anywhere (a user's rows
    may straddle batches): every cut gives the same series, each user's positive first."""
    rng = np.random.default_rng(0)
    users, items, tests = [], [], []
    for user in (4, 0, 9, 2):  # grouped, not sorted: a partition is sorted by user only within itself
        own = rng.choice(50, size=int(rng.integers(1, 12)), replace=False)
        test_at = int(rng.integers(len(own)))
        users += [user] * len(own)
        items += own.tolist()
        tests += [i == test_at for i in range(len(own))]
    table = pa.table({"user": pa.array(users, pa.int64()), "item": pa.array(items, pa.int64()),
                      job.IS_TEST: pa.array(tests)})

    def run(batches):
        out = list(job.test_series_batches(iter(batches), SEED, 50, 5))
        return ([u for b in out for u in b.column("user").to_pylist()],
                [s for b in out for s in b.column("series").to_pylist()])

    whole = run(table.to_batches())
    assert whole[0] == [4, 0, 9, 2]
    for user, series in zip(*whole):
        rows = [(i, t) for u, i, t in zip(users, items, tests) if u == user]
        assert series[0] == next(i for i, t in rows if t)
        assert not set(series[1:]) & {i for i, t in rows if not t}
    for size in (1, 3, 7):
        assert run(table.to_batches(max_chunksize=size)) == whole, size
    assert run([]) == ([], [])
    two = pa.table({"user": pa.array([3, 3], pa.int64()), "item": pa.array([1, 2], pa.int64()),
                    job.IS_TEST: pa.array([False, False])})
    with pytest.raises(RuntimeError, match="user 3: 0 test positives"):
        run(two.to_batches())


def test_frames_read_twice_stay_on_disk_in_a_local_run_and_in_memory_on_a_cluster(spark):
    """A local run's one JVM heap is every task's: caching there squeezed the sorts out of a 2g heap at ml-20m."""
    from types import SimpleNamespace

    from pyspark import StorageLevel

    from spark_jobs.common import reuse_level

    assert reuse_level(spark) == StorageLevel.DISK_ONLY
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://spark-master:7077"))
    assert reuse_level(cluster) == StorageLevel.MEMORY_AND_DISK


# ---- validation --------------------------------------------------------------------------------------------------

def test_validate_dataset_accepts_the_output(dataset, unfiltered):
    assert movielens_preprocess.validate_dataset(dataset) == {
        "path": str(dataset), "rows": {"train": 7, "test": 303}, "users": 3, "items": 5,
        "test_samples_per_series": 101}
    assert movielens_preprocess.validate_dataset(unfiltered)["rows"] == {"train": 8, "test": 12}


def corrupt_positive_last(out: Path) -> None:
    labels = load(out / "test_data_1.pt").reshape(3, NEGATIVES + 1)[:, ::-1].reshape(-1, 1)
    torch.save(torch.from_numpy(np.ascontiguousarray(labels)), out / "test_data_1.pt")


def corrupt_negative_in_train(out: Path) -> None:
    test = load(out / "test_data_0.pt").copy()
    test[5, 1] = 2  # user 0's train holds item 2
    torch.save(torch.from_numpy(test), out / "test_data_0.pt")


def corrupt_dtype(out: Path) -> None:
    torch.save(torch.from_numpy(load(out / "train_data_0.pt").astype(np.int32)), out / "train_data_0.pt")


def corrupt_cardinality(out: Path) -> None:
    path = out / "feature_spec.yaml"
    path.write_text(path.read_text().replace("cardinality: 5", "cardinality: 9"))


def corrupt_series_length(out: Path) -> None:
    path = out / "feature_spec.yaml"
    path.write_text(path.read_text().replace("test_samples_per_series: 101", "test_samples_per_series: 100"))


@pytest.mark.parametrize("corrupt, message", [
    (corrupt_positive_last, r"test_data_1.pt: each series must be 1 \(the positive, first\)"),
    (corrupt_negative_in_train, r"test_data_0.pt: row 5 \(user 0, item 2\) is a test negative found in train"),
    (corrupt_dtype, r"train_data_0.pt: dtype torch.int32, expected torch.int64"),
    (corrupt_cardinality, r"item cardinality 9, but the largest item .* is 4"),
    (corrupt_series_length, r"test_data_0.pt: 303 rows, expected 3 users x 100 samples per series"),
])
def test_validate_dataset_names_what_is_wrong_in_one_line(dataset, tmp_path, corrupt, message):
    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    corrupt(broken)
    with pytest.raises(movielens_preprocess.DatasetInvalid, match=message) as err:
        movielens_preprocess.validate_dataset(broken)
    assert "\n" not in str(err.value) and str(broken) in str(err.value)


# ---- the task function ---------------------------------------------------------------------------------------------

def test_preprocess_refuses_bad_knobs_and_missing_ratings(tmp_path):
    settings = Settings(data_root=tmp_path)
    with pytest.raises(ValueError, match="test_negatives 0: must be an integer >= 1"):
        movielens_preprocess.preprocess(settings, tmp_path, tmp_path / "o", min_ratings=20, test_negatives=0, seed=1)
    with pytest.raises(StepInputMissing, match="no validated ratings"):
        movielens_preprocess.preprocess(settings, tmp_path / "nothing", tmp_path / "o", min_ratings=20,
                                        test_negatives=100, seed=1)


def test_spark_submit_end_to_end_same_bytes_under_another_partitioning_then_cached(dataset, tmp_path):
    """Another process, the ratings in 5 files instead of 2, 5 shuffle partitions instead of 2: the same bytes."""
    settings = Settings(data_root=tmp_path)
    ratings = write_ratings(tmp_path / "ratings", files=5)
    knobs = {"min_ratings": MIN_RATINGS, "test_negatives": NEGATIVES, "seed": SEED}
    submit = {"spark_master": "local[2]", "spark_profile": "local",
              "spark_conf": {"spark.sql.shuffle.partitions": "5", "spark.driver.memory": "1g"}}
    out = tmp_path / "dataset"
    first = movielens_preprocess.preprocess(settings, ratings, out, **knobs, **submit)
    assert first["cached"] is False and first["rows"] == {"train": 7, "test": 303}
    assert (first["users"], first["items"]) == (3, 5) and first["stats"]["rows_in"] == 14
    assert Path(first["mappings"]["users"]).is_file() and Path(first["feature_spec"]).is_file()
    assert tensor_bytes(out) == tensor_bytes(dataset)
    again = movielens_preprocess.preprocess(settings, ratings, out, **knobs, **submit)
    assert again["cached"] is True and again["fingerprint"] == first["fingerprint"]
