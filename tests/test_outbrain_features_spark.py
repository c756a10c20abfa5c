"""Outbrain features (sql/outbrain, spark_jobs/outbrain/features.py, tasks/outbrain/features.py) and the prebatched
TFRecord writer (tasks/formats/tfrecord.py) on tiny hand-made validated tables whose features are worked out by hand
below.

The in-process job runs share the session-scoped local[2] SparkSession of tests/conftest.py (the job's
spark_session() picks it up through getOrCreate); one test goes through spark-submit end to end via build_features.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.outbrain import features as job
from tasks.core.config import Settings
from tasks.formats import tfrecord
from tasks.outbrain import features as outbrain_features
from tasks.outbrain.features import (DISPLAY_ID, HASH_BUCKET_SIZES, LABEL, MULTIHOT_COLUMNS, NUMERIC_COLUMNS,
                                     ONEHOT_COLUMNS, DatasetInvalid)
from tests.job_logging import root_logging_kept

pytestmark = pytest.mark.spark

SEED = 0
DAY_MS = 86_400_000
OUTBRAIN_EPOCH = dt.datetime(2016, 6, 14, 3, 59, 59, 998000)  # timestamp 0 = 1465876799998 ms
# With seed 0 the split's r = top 53 bits of xxhash64(0, display_id) / 2^53 is (test_split_uniform_... checks):
# display 1: 0.216, 2: 0.822, 3: 0.986, 4: 0.942, 5: 0.877, 6: 0.129, 7: 0.644, 9: 0.625.
# So with day <= 10 and r >= 0.2: train = 1, 2, 3, 4, 5, 7; valid = 6 (r < 0.2) and 9 (day 11).
R_SEED_0 = {1: 0.216, 2: 0.822, 3: 0.986, 4: 0.942, 5: 0.877, 6: 0.129, 7: 0.644, 9: 0.625}
TRAIN_DISPLAYS, VALID_DISPLAYS = [1, 2, 3, 4, 5, 7], [6, 9]
# (display_id, ad_id, clicked)
CLICKS = [
    (1, 100, 1), (1, 101, 0),
    (2, 100, 1), (2, 101, 0),
    (3, 100, 1), (3, 101, 0),
    (4, 100, 0), (4, 101, 1),
    (5, 100, 0), (5, 102, 1),
    (6, 101, 1), (6, 100, 0),   # valid (r): ad 101's click here must not reach its CTR
    (7, 103, 0), (7, 104, 1),
    (9, 100, 1), (9, 103, 0),   # valid (day 11)
]
# display_id -> (document_id, day, platform, geo_location); timestamp = day * DAY_MS + 1 h
EVENTS = {1: (300, 0, 1, "US>SC>519"), 2: (300, 1, None, "--"), 3: (300, 2, 3, None), 4: (304, 3, 2, "CA>ON"),
          5: (300, 4, 1, "US>CA>807"), 6: (301, 2, 1, "US"), 7: (301, 5, 2, "GB"), 9: (302, 11, 1, "US>NY")}
# ad_id -> (document_id, campaign_id, advertiser_id)
PROMOTED = {100: (200, 1, 1), 101: (201, 1, 1), 102: (200, 2, 2), 103: (202, 2, 2), 104: (203, 3, 3)}
# document_id -> (source_id, publisher_id, publish_time)
META = {
    200: (10, 1, dt.datetime(2016, 6, 10)), 201: (11, 1, None), 202: (12, 2, dt.datetime(1990, 1, 1)),
    203: (12, None, dt.datetime(2016, 6, 13)), 300: (20, 3, dt.datetime(2016, 6, 4)),
    301: (21, None, dt.datetime(2030, 1, 1)), 302: (20, 3, None), 304: (22, 4, dt.datetime(2016, 5, 1)),
}
TOPICS = [(300, 1, 0.8), (300, 2, 0.6), (200, 1, 0.5), (200, 3, 0.5), (301, 2, 0.3), (202, 3, 0.9), (201, 1, 1.0)]
ENTITIES = [(300, "e1", 0.5), (300, "e2", 0.9), (300, "e3", 0.1), (300, "e4", 0.7), (200, "e1", 0.9)]
CATEGORIES = [(300, 1, 1.0), (200, 1, 0.5), (201, 2, 0.7)]

# ---- the features, by hand ---------------------------------------------------------------------------------------
# Train views / clicks (12 train rows): ad 100: 5 / 3 (at threshold 5: CTR 0.6); ad 101: 4 / 1 (below 5: 0; with
# valid display 6's click it would be 5 / 2 = 0.4); doc 200 (ads 100, 102): 6 / 4 (>= 5: 4/6); doc 201: 4 / 1 (< 5:
# 0); publisher 1 (docs 200, 201): 10 / 5 (at threshold 10: 0.5); advertiser 1 (ads 100, 101): 9 / 4 (below 10:
# 0); source 10 (doc 200): 6 views (< 10: 0).
AD_VIEWS = {100: 5, 101: 4, 102: 1, 103: 1, 104: 1}
TRAIN_AD_VIEWS = [5, 4] * 4 + [5, 1, 1, 1]  # the ad of each train row, displays 1-5 and 7
# Days since published of the event document (train rows): displays 1-3, 5 (doc 300, published 06-04 00:00; event
# day d at 05:00): 10 + d; display 4 (doc 304, 05-01): 47; display 7 (doc 301, 2030: negative -> null).
# Known train values 10,10,11,11,12,12,47,47,14,14 -> median 12 (the mean would be 18.8).
EVENT_DAYS_MEDIAN = 12.0
# Promoted document (train rows): ad 100 on displays 1-5 (doc 200, 06-10): 4, 5, 6, 7, 8; ad 102 (display 5): 8;
# ad 104 (doc 203, 06-13, display 7 day 5): 6; docs 201 (null) and 202 (1990: > 3650 days) -> null.
PROMO_DAYS_MEDIAN = statistics.median([4, 5, 6, 7, 8, 8, 6])  # 6


def days_since(day: int, published: dt.datetime) -> int:
    return ((OUTBRAIN_EPOCH + dt.timedelta(days=day, hours=1)) - published).days


def normalised_log_count(views: int) -> float:
    logs = np.log1p(np.array(TRAIN_AD_VIEWS, dtype=np.float64))
    return float((math.log1p(views) - logs.mean()) / logs.std(ddof=1))


def idf(documents: int, holding: int) -> float:
    return math.log(documents / holding)


def f32(value: float) -> float:
    return float(np.float32(value))


def cosine(a: dict, b: dict) -> float:
    dot = sum(a[t] * b[t] for t in a.keys() & b.keys())
    return dot / math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))


# Topics: 5 documents hold topics; topic 1 is in 3 of them (300, 200, 201), topics 2 and 3 in 2 each.
W300 = {1: f32(0.8) * idf(5, 3), 2: f32(0.6) * idf(5, 2)}
SIM_TOPICS = {200: cosine(W300, {1: f32(0.5) * idf(5, 3), 3: f32(0.5) * idf(5, 2)}),
              201: cosine(W300, {1: f32(1.0) * idf(5, 3)})}
# Categories: 300 and 200 share category 1 only (sim 1); 201 holds category 2 only (sim 0).
# Entities: only 300 and 200 hold any; e1 is in both (idf 0), so 200's vector is all zeros: sim 0.


# ---- fixtures ----------------------------------------------------------------------------------------------------

def write_table(directory: Path, columns: dict, files: int = 1) -> None:
    directory.mkdir(parents=True)
    table = pa.table(columns)
    step = math.ceil(len(table) / files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), directory / f"part-{i:05d}.parquet")


def write_tables(root: Path, clicks_table: str = "clicks_train", with_label: bool = True,
                 clicks: list | None = None) -> Path:
    """The validated tables (the ingest's types: ids int64, entity_id string, confidence float32, timestamp int64
    ms, platform nullable int8, publish_time timestamp)."""
    clicks = CLICKS if clicks is None else clicks
    i64 = pa.int64()
    columns = {"display_id": pa.array([c[0] for c in clicks], i64), "ad_id": pa.array([c[1] for c in clicks], i64)}
    if with_label:
        columns["clicked"] = pa.array([c[2] for c in clicks], pa.int8())
    write_table(root / clicks_table, columns, files=2)
    write_table(root / "events", {
        "display_id": pa.array(list(EVENTS), i64), "uuid": [f"u{d}" for d in EVENTS],
        "document_id": pa.array([e[0] for e in EVENTS.values()], i64),
        "timestamp": pa.array([e[1] * DAY_MS + 3_600_000 for e in EVENTS.values()], i64),
        "platform": pa.array([e[2] for e in EVENTS.values()], pa.int8()),
        "geo_location": pa.array([e[3] for e in EVENTS.values()], pa.string())})
    write_table(root / "promoted_content", {
        "ad_id": pa.array(list(PROMOTED), i64), **{name: pa.array([p[i] for p in PROMOTED.values()], i64)
                                                    for i, name in enumerate(("document_id", "campaign_id",
                                                                              "advertiser_id"))}})
    write_table(root / "documents_meta", {
        "document_id": pa.array(list(META), i64), "source_id": pa.array([m[0] for m in META.values()], i64),
        "publisher_id": pa.array([m[1] for m in META.values()], i64),
        "publish_time": pa.array([m[2] for m in META.values()], pa.timestamp("ms"))})
    for name, rows, term_type in (("documents_topics", TOPICS, i64), ("documents_entities", ENTITIES, pa.string()),
                                  ("documents_categories", CATEGORIES, i64)):
        term = {"documents_topics": "topic_id", "documents_entities": "entity_id",
                "documents_categories": "category_id"}[name]
        write_table(root / name, {"document_id": pa.array([r[0] for r in rows], i64),
                                  term: pa.array([r[1] for r in rows], term_type),
                                  "confidence_level": pa.array([r[2] for r in rows], pa.float32())})
    return root


def run_job(*argv: str) -> job.FeaturesResult:
    with root_logging_kept():
        return job.main(list(argv))


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    return write_tables(tmp_path_factory.mktemp("validated") / "kaggle")


@pytest.fixture(scope="module")
def fitted(spark, tables, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("features") / "fit"
    run_job("fit", "--tables", str(tables), "--output", str(out), "--seed", str(SEED), "--parquet-files", "2")
    return out


def rows(directory: Path) -> dict[tuple[int, int], dict]:
    """{(display_id, raw ad): row}; the raw ad is recovered from the hashed ad_id (distinct here)."""
    hashed = {hash_of(ad, "ad_id"): ad for ad in PROMOTED}
    table = pq.read_table(directory).to_pylist()
    return {(row[DISPLAY_ID], row.get("ad_id_raw", hashed.get(row["ad_id"]))): row for row in table}


_HASHES: dict = {}


def hash_of(value, column: str) -> int:
    """pmod(xxhash64(value), buckets) as Spark computes it (the hashing itself is Spark's; the tests check which
    value is hashed into which column and the bucket ranges)."""
    from pyspark.sql import SparkSession

    key = (value, column)
    if key not in _HASHES:
        literal = "NULL" if value is None else (f"'{value}'" if isinstance(value, str) else f"CAST({value} AS BIGINT)")
        buckets = HASH_BUCKET_SIZES[column]
        _HASHES[key] = SparkSession.getActiveSession().sql(f"SELECT pmod(xxhash64({literal}), {buckets})").first()[0]
    return _HASHES[key]


# ---- the split ---------------------------------------------------------------------------------------------------

def test_split_by_day_and_per_display_uniform(spark, fitted):
    train, valid = rows(fitted / "parquet" / "train"), rows(fitted / "parquet" / "valid")
    assert sorted({d for d, _ in train}) == TRAIN_DISPLAYS
    assert sorted({d for d, _ in valid}) == VALID_DISPLAYS
    assert len(train) + len(valid) == len(CLICKS)
    r = spark.sql("SELECT id, shiftrightunsigned(xxhash64(0, id), 11) / 9007199254740992.0 AS r "
                  "FROM range(1, 10)").collect()
    assert {row.id: round(float(row.r), 3) for row in r if row.id in R_SEED_0} == R_SEED_0
    uniform = spark.sql("SELECT avg(CAST(shiftrightunsigned(xxhash64(0, id), 11) / 9007199254740992.0 < 0.2 AS INT))"
                        " AS below FROM range(100000)").first().below
    assert abs(uniform - 0.2) < 0.01


def test_split_is_the_same_whatever_the_partitioning(spark, tables):
    splits = []
    for partitions in (1, 5):
        job.register_tables(spark, tables, "clicks_train")
        spark.table("clicks").repartition(partitions).createOrReplaceTempView("clicks")
        joined = job.run_view(spark, "joined", job.sql_parameters(SEED))
        splits.append(sorted((r.display_id, r.ad_id, r.is_train) for r in joined.collect()))
    assert splits[0] == splits[1]
    assert {d for d, _, train in splits[0] if train} == set(TRAIN_DISPLAYS)


def test_valid_is_sorted_by_display_across_files(fitted):
    files = sorted((fitted / "parquet" / "valid").glob("*.parquet"))
    order = [(r[DISPLAY_ID]) for f in files for r in pq.read_table(f).to_pylist()]
    assert order == sorted(order) and order == [6, 6, 9, 9]
    assert pq.read_table(fitted / "parquet" / "valid").column_names == [
        LABEL, *ONEHOT_COLUMNS, *MULTIHOT_COLUMNS, *NUMERIC_COLUMNS, DISPLAY_ID]


# ---- CTRs and counts ---------------------------------------------------------------------------------------------

def test_ctr_thresholds_and_train_only_counts(fitted):
    every = {**rows(fitted / "parquet" / "train"), **rows(fitted / "parquet" / "valid")}
    ad100, ad101 = every[(9, 100)], every[(6, 101)]  # both valid rows
    assert ad100["ad_id_ctr"] == pytest.approx(0.6)                  # 5 train views = threshold 5
    assert ad101["ad_id_ctr"] == 0.0                                  # 4 train views (its valid click not counted)
    assert ad100["document_id_promo_ctr"] == pytest.approx(4 / 6)     # doc 200: 6 >= 5
    assert ad101["document_id_promo_ctr"] == 0.0                      # doc 201: 4 < 5
    assert ad100["publisher_id_promo_ctr"] == pytest.approx(0.5)      # publisher 1: 10 = threshold 10
    assert ad100["advertiser_id_ctr"] == 0.0                          # advertiser 1: 9 < 10
    assert ad100["campaign_id_ctr"] == 0.0 and ad100["source_id_promo_ctr"] == 0.0
    assert every[(7, 104)]["ad_id_ctr"] == 0.0                        # 1 view
    for key, row in every.items():
        assert row["ad_id_count"] == pytest.approx(normalised_log_count(AD_VIEWS[key[1]]), rel=1e-5), key
    counts = pq.read_table(fitted / "stats" / "ctr_counts").to_pylist()
    assert {(c["feature"], c["value"]): (c["clicks"], c["views"]) for c in counts if c["feature"] == "ad_id"} == {
        ("ad_id", 100): (3, 5), ("ad_id", 101): (1, 4), ("ad_id", 102): (1, 1), ("ad_id", 103): (0, 1),
        ("ad_id", 104): (1, 1)}


def test_days_since_published_with_out_of_range_and_missing_to_the_train_median(fitted):
    every = {**rows(fitted / "parquet" / "train"), **rows(fitted / "parquet" / "valid")}
    numeric = json.loads((fitted / "stats" / "numeric.json").read_text())
    assert numeric["publish_time_days_since_published"]["median"] == EVENT_DAYS_MEDIAN
    assert numeric["publish_time_promo_days_since_published"]["median"] == PROMO_DAYS_MEDIAN
    event, promo = "publish_time_days_since_published", "publish_time_promo_days_since_published"
    assert days_since(2, META[300][2]) == 12
    assert every[(3, 100)][event] == pytest.approx(math.log1p(12))                      # in range
    assert every[(4, 101)][event] == pytest.approx(math.log1p(days_since(3, META[304][2])))  # 47
    assert every[(7, 104)][event] == pytest.approx(math.log1p(EVENT_DAYS_MEDIAN))        # published in 2030
    assert every[(9, 100)][event] == pytest.approx(math.log1p(EVENT_DAYS_MEDIAN))        # no publish time
    assert every[(9, 100)][promo] == pytest.approx(math.log1p(days_since(11, META[200][2])))  # 15
    assert every[(7, 103)][promo] == pytest.approx(math.log1p(PROMO_DAYS_MEDIAN))        # 1990: > 3650 days
    assert every[(1, 101)][promo] == pytest.approx(math.log1p(PROMO_DAYS_MEDIAN))        # no publish time


# ---- similarities and lists --------------------------------------------------------------------------------------

def test_tfidf_similarities_of_hand_made_pairs(fitted):
    every = {**rows(fitted / "parquet" / "train"), **rows(fitted / "parquet" / "valid")}
    pair_200, pair_201 = every[(1, 100)], every[(1, 101)]  # event doc 300 vs promoted 200 / 201
    prefix = "document_id_document_id_promo_sim_"
    assert pair_200[prefix + "topics"] == pytest.approx(SIM_TOPICS[200], rel=1e-6)
    assert pair_201[prefix + "topics"] == pytest.approx(SIM_TOPICS[201], rel=1e-6)
    assert pair_200[prefix + "categories"] == pytest.approx(1.0)
    assert pair_201[prefix + "categories"] == 0.0
    assert pair_200[prefix + "entities"] == 0.0
    assert every[(9, 100)][prefix + "topics"] == 0.0  # event doc 302 has no terms
    idf_rows = {(r["kind"], r["term"]): r["idf"] for r in pq.read_table(fitted / "stats" / "idf").to_pylist()}
    assert idf_rows[("topics", "1")] == pytest.approx(math.log(5 / 3))
    assert idf_rows[("entities", "e1")] == 0.0


def test_lists_of_the_event_document_top_3_by_confidence_hashed(fitted):
    every = {**rows(fitted / "parquet" / "train"), **rows(fitted / "parquet" / "valid")}
    row = every[(1, 100)]  # event doc 300
    assert row["entity_id_list"] == [hash_of(e, "entity_id_list") for e in ("e2", "e4", "e1")]  # e3 (0.1) cut
    assert row["topic_id_list"] == [hash_of("1", "topic_id_list"), hash_of("2", "topic_id_list")]
    assert row["category_id_list"] == [hash_of("1", "category_id_list")]
    assert every[(7, 103)]["topic_id_list"] == [hash_of("2", "topic_id_list")]  # event doc 301
    assert every[(7, 103)]["entity_id_list"] == [] and every[(9, 100)]["category_id_list"] == []


# ---- one-hot columns ---------------------------------------------------------------------------------------------

def test_geo_platform_publisher_fill_and_hash_ranges(fitted):
    every = {**rows(fitted / "parquet" / "train"), **rows(fitted / "parquet" / "valid")}
    us, unknown, missing = every[(1, 100)], every[(2, 100)], every[(3, 100)]
    assert (us["geo_location"], us["geo_location_country"], us["geo_location_state"]) == (
        hash_of("US>SC>519", "geo_location"), hash_of("US", "geo_location_country"),
        hash_of("US>SC", "geo_location_state"))
    assert unknown["geo_location_country"] == hash_of("--", "geo_location_country")
    assert missing["geo_location_country"] == hash_of(None, "geo_location_country") == 42
    # platform 1 -> 0, missing -> fill 1 -> 0, 3 -> 2
    assert us["platform"] == unknown["platform"] == hash_of(0, "platform")
    assert missing["platform"] == hash_of(2, "platform")
    # a document without publisher gets its own id, -1 - document_id
    assert every[(7, 104)]["publisher_id"] == hash_of(-302, "publisher_id")            # event doc 301
    assert every[(7, 104)]["publisher_id_promo"] == hash_of(-204, "publisher_id_promo")  # promoted doc 203
    assert us["ad_id"] == hash_of(100, "ad_id") and us["document_id_promo"] == hash_of(200, "document_id_promo")
    for row in every.values():
        for column in ONEHOT_COLUMNS:
            assert 0 <= row[column] < HASH_BUCKET_SIZES[column], column
        for column, hotness in MULTIHOT_COLUMNS.items():
            assert len(row[column]) <= hotness and all(0 <= v < HASH_BUCKET_SIZES[column] for v in row[column])
        assert row[LABEL] in (0, 1)


def test_transform_scores_new_rows_with_the_fitted_stats(spark, fitted, tmp_path):
    # new rows: display 9 and a display the fit never saw; no `clicked` column
    new = write_tables(tmp_path / "raw", clicks_table="clicks_test", with_label=False,
                       clicks=[(9, 103, 0), (9, 100, 0), (5, 101, 0)])
    out = tmp_path / "scored"
    run_job("transform", "--tables", str(new), "--stats", str(fitted / "stats"), "--output", str(out),
            "--parquet-files", "1")
    table = pq.read_table(out)
    assert table.column_names[-1] == "ad_id_raw"
    scored = table.to_pylist()
    assert [(r[DISPLAY_ID], r["ad_id_raw"]) for r in scored] == [(5, 101), (9, 100), (9, 103)]
    assert all(r[LABEL] is None for r in scored)
    fitted_rows = rows(fitted / "parquet" / "valid")
    for column in (*ONEHOT_COLUMNS, *MULTIHOT_COLUMNS, *NUMERIC_COLUMNS):
        assert scored[1][column] == pytest.approx(fitted_rows[(9, 100)][column]), column


# ---- prebatched TFRecords ----------------------------------------------------------------------------------------

def tf_blocks(path: Path, layout: tfrecord.RecordLayout) -> list[dict[str, np.ndarray]]:
    import tensorflow as tf

    spec = {name: tf.io.VarLenFeature(tf.int64) for name in (*layout.int64, *layout.multihot)}
    spec.update({name: tf.io.VarLenFeature(tf.float32) for name in layout.float32})
    return [{name: tf.sparse.to_dense(value).numpy() for name, value in tf.io.parse_single_example(record, spec).items()}
            for record in tf.data.TFRecordDataset(str(path))]


def as_rows(blocks: list[dict[str, np.ndarray]], layout: tfrecord.RecordLayout) -> list[tuple]:
    out = []
    for block in blocks:
        size = len(block[layout.float32[0]])
        lists = {name: block[name].reshape(size, hot) for name, hot in layout.multihot.items()}
        for i in range(size):
            out.append((*(int(block[n][i]) for n in layout.int64),
                        *(tuple(int(v) for v in lists[n][i]) for n in layout.multihot),
                        *(round(float(block[n][i]), 5) for n in layout.float32)))
    return out


def parquet_rows(directory: Path, layout: tfrecord.RecordLayout) -> list[tuple]:
    out = []
    for row in pq.read_table(directory).to_pylist():
        out.append((*(row[n] for n in layout.int64),
                    *(tuple(row[n] + [tfrecord.PADDING] * (hot - len(row[n]))) for n, hot in layout.multihot.items()),
                    *(round(float(np.float32(row[n])), 5) for n in layout.float32)))
    return out


def test_tfrecord_round_trip_valid_in_order_with_a_short_last_block(fitted, tmp_path):
    layout = outbrain_features.record_layout("test")
    result = tfrecord.write_tfrecords(fitted / "parquet" / "valid", tmp_path, layout, prebatch_size=3, shards=2)
    assert result["rows"] == 4 and result["blocks"] == 2
    first, second = (tf_blocks(tmp_path / tfrecord.SHARD_NAME.format(k), layout) for k in range(2))
    assert [len(b[LABEL]) for b in first] == [3] and [len(b[LABEL]) for b in second] == [1]  # short last block
    assert first[0]["entity_id_list"].shape == (9,)  # 3 rows x hotness 3, padded with -1
    assert as_rows(first + second, layout) == parquet_rows(fitted / "parquet" / "valid", layout)
    # the pure-python reader agrees with TensorFlow's parser
    for k, blocks in enumerate((first, second)):
        mine = [tfrecord.decode_example(r) for r in tfrecord.read_records(tmp_path / tfrecord.SHARD_NAME.format(k))]
        assert len(mine) == len(blocks)
        for ours, theirs in zip(mine, blocks):
            assert ours.keys() == theirs.keys() and all(np.array_equal(ours[n], theirs[n]) for n in ours)


def test_tfrecord_train_is_a_seeded_shuffle_of_every_row(fitted, tmp_path):
    layout = outbrain_features.record_layout("train")
    written = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        tfrecord.write_tfrecords(fitted / "parquet" / "train", tmp_path / name, layout, prebatch_size=5, shards=2,
                                 shuffle_seed=seed, bucket_rows=4)  # 3 buckets: the two-pass shuffle
        blocks = [b for k in range(2) for b in tf_blocks(tmp_path / name / tfrecord.SHARD_NAME.format(k), layout)]
        assert [len(b[LABEL]) for b in blocks] == [5, 5, 2]
        written[name] = as_rows(blocks, layout)
    assert sorted(written["a"]) == sorted(parquet_rows(fitted / "parquet" / "train", layout))
    assert written["a"] == written["b"] and written["a"] != written["c"]
    assert not (tmp_path / "a" / "_shuffle").exists()


def test_varints_round_trip_extremes():
    values = np.array([0, 1, 127, 128, 16383, 16384, 2**62, -1, -(2**63), 2**63 - 1], dtype=np.int64)
    assert np.array_equal(tfrecord.decode_varints(tfrecord.encode_varints(values)), values)
    assert tfrecord.encode_varints(np.array([300])) == b"\xac\x02"  # protobuf's documented example


# ---- the dataset through spark-submit ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tables, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("datasets") / "features"
    outbrain_features.build_features(Settings(data_root=out.parent), tables, out, seed=SEED, prebatch_size=4,
                                     shards=2, spark_conf={"spark.sql.shuffle.partitions": "3"})
    return out


def test_build_features_writes_both_specs_and_validates(dataset, fitted):
    import yaml

    result = outbrain_features.validate_dataset(dataset)
    assert result["rows"] == {"train": 12, "test": 4} and result["prebatch_size"] == 4
    spec = yaml.safe_load((dataset / "feature_spec.yaml").read_text())
    assert spec["source_spec"]["test"][0]["features"][-1] == DISPLAY_ID
    assert spec["source_spec"]["train"][0]["type"] == "parquet"
    assert all(f.startswith("parquet/train/part-") for f in spec["source_spec"]["train"][0]["files"])
    assert spec["feature_spec"]["entity_id_list"] == {"cardinality": 10000, "max_hotness": 3}
    records = yaml.safe_load((dataset / "tfrecords" / "feature_spec.yaml").read_text())
    assert records["metadata"] == {"prebatch_size": 4, "multihot_padding": -1}
    assert records["source_spec"]["test"][0]["files"] == ["valid/part-00000.tfrecord", "valid/part-00001.tfrecord"]
    assert records["channel_spec"] == spec["channel_spec"] and records["feature_spec"] == spec["feature_spec"]
    stats = json.loads((dataset / "stats.json").read_text())
    assert stats["test"] == {"rows": 4, "displays": 2, "positives": 2}
    # spark-submit (3 shuffle partitions) and the in-process run (2) give the same features
    assert rows(dataset / "parquet" / "valid") == rows(fitted / "parquet" / "valid")
    assert rows(dataset / "parquet" / "train") == rows(fitted / "parquet" / "train")


def test_build_features_is_cached(dataset, tables, monkeypatch):
    def no_spark(*args, **kwargs):
        raise AssertionError("spark-submit ran although the output was complete")

    monkeypatch.setattr("tasks.core.spark_submit.run_spark_job", no_spark)
    again = outbrain_features.build_features(Settings(data_root=dataset.parent), tables, dataset, seed=SEED,
                                             prebatch_size=4, shards=2)
    assert again["cached"] and again["rows"] == {"train": 12, "test": 4}


def test_validate_dataset_names_what_is_wrong(dataset, tmp_path):
    import shutil

    import yaml

    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    (broken / "tfrecords" / "valid" / "part-00001.tfrecord").unlink()
    with pytest.raises(DatasetInvalid, match=r"tfrecords/valid/part-00001.tfrecord: missing"):
        outbrain_features.validate_dataset(broken)
    shutil.rmtree(broken)
    shutil.copytree(dataset, broken)
    spec = yaml.safe_load((broken / "feature_spec.yaml").read_text())
    spec["feature_spec"]["topic_id_list"].pop("max_hotness")
    (broken / "feature_spec.yaml").write_text(yaml.dump(spec))
    with pytest.raises(DatasetInvalid, match="topic_id_list: multi-hot feature without an integer max_hotness"):
        outbrain_features.validate_dataset(broken)
    shutil.rmtree(broken)
    shutil.copytree(dataset, broken)
    manifest = json.loads((broken / "_MANIFEST.json").read_text())
    manifest["rows"]["test"] = 5
    (broken / "_MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetInvalid, match=r"parquet: rows .* differ from the manifest's"):
        outbrain_features.validate_dataset(broken)
