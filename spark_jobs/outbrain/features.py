"""Outbrain tables -> NVIDIA Wide & Deep's features (parquet), with the train-fitted statistics that score new rows.

  spark-submit spark_jobs/outbrain/features.py fit --tables VALIDATED_SNAPSHOT_DIR --output DIR [--seed 0]
      [--parquet-files 8]
  spark-submit spark_jobs/outbrain/features.py transform --tables TABLES_DIR --clicks-table clicks_test \
      --stats FEATURES_DIR/stats --output DIR

`fit` reads the validated tables (validated/<snapshot>/<table>/part-*.parquet: clicks_train, events,
promoted_content, documents_meta, documents_{topics,entities,categories}), splits the rows, fits the statistics on
the train split and writes
  stats/ctr_counts/   parquet (feature, value, clicks, views): train clicks and views of every value of the six CTR
                      inputs (CTRs and the two count features of any row are looked up here);
  stats/idf/          parquet (kind, term, idf) of topics, entities and categories (the similarities);
  stats/numeric.json  medians of the days since published, mean and std of the log counts;
  parquet/train/, parquet/valid/  NVIDIA's columns ([clicked] + one-hot + multi-hot + numeric + display_id); valid
                      sorted by (display_id, ad_id) across its part files; train in a seeded shuffled order;
  stats.json          rows, displays and positives per mapping, seconds.
`transform` computes the same columns for new rows (a clicks table of display_id, ad_id; clicked may be absent)
with an existing stats/, plus ad_id_raw (the ad a prediction names), sorted by (display_id, ad_id_raw).

The recipe is the SQL in sql/outbrain/ (each file says what it computes and where it follows NVIDIA); both modes run
the same statements, so training rows and the rows `predict` scores always get the same features. This file only
registers the tables, binds the parameters, runs the statements in order and writes what they return. The driver
reads the SQL text (spark-submit runs it in client mode, on the machine with the repository); executors receive
plans, never the files, so the cluster's --py-files archive does not need sql/.

NVIDIA's recipe followed: TensorFlow2/Recommendation/WideAndDeep at HEAD (NVTabular workflow, reference
nvidia-formats.md §4.1): its 13 one-hot, 3 multi-hot and 13 numeric features, thresholds and hash bucket sizes.
Where we differ from it, and why:
  - split r: a hash of (seed, display_id), not cupy's row-ordered stream: reproducible whatever the partitioning.
  - hashing: Spark's pmod(xxhash64(value), buckets) (NVTabular: cudf's murmur3 hash_values % buckets); the same
    SQL runs for training and for predict.
  - missing publisher_id: -1 - document_id (NVIDIA: max + running count in file order): a function of the document
    alone, so new rows get the same id.
  - days since published outside [0, 3650]: null -> train median (NVIDIA: 0).
  - multi-hot lists: the event document's (as NVIDIA), 3 highest-confidence terms (NVIDIA: the first 3 in file
    order), raw terms hashed (NVIDIA: Categorify, then hash).
  - idf = ln(documents / df) (NVTabular: ln((max document_id + 1) / df)); a document without weight -> similarity 0.
  - valid order: (display_id, ad_id) (NVIDIA: display_id, ties unspecified).
Where the TF1-era Spark recipe (§4.3: TFRecords with spark names, min-max scaled "log_01scaled" counts, 14 numerics, no
multi-hot) differs, the current recipe is followed: NVIDIA's current names, Normalize (mean/std) of log counts, the
13 numerics, the 3 lists. The TFRecord output (tasks/formats/tfrecord.py) keeps §4.3's prebatching.

At full size see docs/OUTBRAIN.md, "Features at full size".
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spark_jobs.common import configure_logging, log, reuse_level, run_job, spark_session
from tasks.core.config import REPO_ROOT
from tasks.outbrain.contract import (CTR_THRESHOLDS, DISPLAY_ID, HASH_BUCKET_SIZES, LABEL, MULTIHOT_COLUMNS,
                                     NUMERIC_COLUMNS, ONEHOT_COLUMNS, PARQUET_DIR, RAW_AD_ID, STATS_DIR, STATS_FILE,
                                     TRAIN_MAX_DAY, VALID_FRACTION)
from tasks.outbrain.contract import parse_features_args as parse_args

SQL_DIR = REPO_ROOT / "sql" / "outbrain"
DOCUMENT_TABLES = ("events", "promoted_content", "documents_meta", "documents_topics", "documents_entities",
                   "documents_categories")
CTR_COUNTS, IDF, NUMERIC_STATS = "ctr_counts", "idf", "numeric.json"
FEATURE_COLUMNS = [LABEL, *ONEHOT_COLUMNS, *MULTIHOT_COLUMNS, *NUMERIC_COLUMNS, DISPLAY_ID]
MEDIAN_FEATURES = ("publish_time_days_since_published", "publish_time_promo_days_since_published")
COUNT_FEATURES = ("ad_id_count", "document_id_promo_count")


@dataclass(frozen=True)
class FeaturesResult:
    output: str
    stats: dict




# ---- statements -------------------------------------------------------------------------------------------------

def sql_parameters(seed: int) -> dict[str, Any]:
    """The constants the statements bind (never formatted into the text)."""
    params: dict[str, Any] = {"seed": seed, "train_max_day": TRAIN_MAX_DAY, "valid_fraction": VALID_FRACTION,
                              "topic_buckets": HASH_BUCKET_SIZES["topic_id_list"],
                              "entity_buckets": HASH_BUCKET_SIZES["entity_id_list"],
                              "category_buckets": HASH_BUCKET_SIZES["category_id_list"]}
    params.update({f"{column}_threshold": threshold for column, threshold in CTR_THRESHOLDS.items()})
    params.update({f"{column}_buckets": HASH_BUCKET_SIZES[column] for column in ONEHOT_COLUMNS})
    return params


def statement(name: str) -> str:
    return (SQL_DIR / f"{name}.sql").read_text()


def run_view(spark, name: str, params: Mapping[str, Any]):
    """Run sql/outbrain/<name>.sql with the parameters it names and register the result as view <name>."""
    import re

    text = statement(name)
    used = set(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", _without_comments(text)))
    frame = spark.sql(text, args={key: params[key] for key in sorted(used)})
    frame.createOrReplaceTempView(name)
    return frame


def _without_comments(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def register_tables(spark, tables: Path, clicks_table: str) -> None:
    """The input tables as views; the clicks view always has `clicked` (null for rows to score)."""
    from pyspark.sql import functions as F

    for name in DOCUMENT_TABLES:
        spark.read.parquet(str(tables / name)).createOrReplaceTempView(name)
    clicks = spark.read.parquet(str(tables / clicks_table))
    if LABEL not in clicks.columns:
        clicks = clicks.withColumn(LABEL, F.lit(None).cast("int"))
    clicks.select(DISPLAY_ID, "ad_id", LABEL).createOrReplaceTempView("clicks")


def numeric_parameters(stats: Mapping[str, Mapping[str, float | None]]) -> dict[str, float]:
    """:<feature>_median, :<count>_mean, :<count>_std from stats/numeric.json's content. A median with no known
    train value (no train row has a publish time) is 0 days; a count with one train row has std 0 (features.sql
    then divides by 1)."""
    params = {f"{name}_median": float(stats[name].get("median") or 0.0) for name in MEDIAN_FEATURES}
    for name in COUNT_FEATURES:
        params[f"{name}_mean"] = float(stats[name].get("mean") or 0.0)
        params[f"{name}_std"] = float(stats[name].get("std") or 0.0)
    return params


def fit_numeric_stats(spark, params: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    rows = run_view(spark, "numeric_stats", params).collect()
    stats: dict[str, dict[str, float | None]] = {name: {} for name in (*MEDIAN_FEATURES, *COUNT_FEATURES)}
    for row in rows:
        stats[row["feature"]][row["statistic"]] = row["value"]
    return stats


def build_views(spark, params: Mapping[str, Any], stats_dir: Path, fit: bool) -> dict[str, dict[str, Any]]:
    """Register every view up to `features_unscaled`; in fit mode write the train-fitted tables to stats_dir first
    (and read them back, so both modes run on the same files). Returns the numeric statistics."""
    run_view(spark, "joined", params).persist(reuse_level(spark))
    run_view(spark, "document_terms", params)
    if fit:
        run_view(spark, CTR_COUNTS, params).write.parquet(str(stats_dir / CTR_COUNTS))
        run_view(spark, IDF, params).write.parquet(str(stats_dir / IDF))
    for name in (CTR_COUNTS, IDF):
        spark.read.parquet(str(stats_dir / name)).createOrReplaceTempView(name)
    for name in ("document_vectors", "similarity", "document_lists"):
        run_view(spark, name, params)
    run_view(spark, "features_unscaled", params).persist(reuse_level(spark))
    if fit:
        numeric = fit_numeric_stats(spark, params)
        (stats_dir / NUMERIC_STATS).write_text(json.dumps(numeric, indent=2, sort_keys=True) + "\n")
    return json.loads((stats_dir / NUMERIC_STATS).read_text())


def features(spark, params: Mapping[str, Any], numeric: Mapping[str, Mapping[str, float | None]]):
    return run_view(spark, "features", {**params, **numeric_parameters(numeric)})


# ---- writing ----------------------------------------------------------------------------------------------------

def write_mapping(frame, target: Path, files: int, order: list, columns: Sequence[str]) -> None:
    """`columns` in `files` part files, in `order` across files and within each (a range partitioning, then a local
    sort; part-00000 holds the first rows). An existing target (the caller's empty temporary directory) is
    replaced."""
    (frame.repartitionByRange(files, *order).sortWithinPartitions(*order).select(*columns)
     .write.mode("overwrite").parquet(str(target)))


def mapping_counts(spark, directory: Path) -> dict[str, int]:
    from pyspark.sql import functions as F

    row = (spark.read.parquet(str(directory))
           .agg(F.count("*").alias("rows"), F.countDistinct(DISPLAY_ID).alias("displays"),
                F.coalesce(F.sum(LABEL), F.lit(0)).alias("positives")).first())
    return {key: int(row[key]) for key in ("rows", "displays", "positives")}


def main(argv: Sequence[str]) -> FeaturesResult:
    from pyspark.sql import functions as F

    args = parse_args(argv)
    configure_logging(f"outbrain_features {args.mode}")
    started = time.monotonic()
    spark = spark_session(f"recflow outbrain features {args.mode}")
    register_tables(spark, args.tables, args.clicks_table)
    params = sql_parameters(args.seed)
    fit = args.mode == "fit"
    stats_dir = args.output / STATS_DIR if fit else args.stats
    if fit:
        stats_dir.mkdir(parents=True, exist_ok=True)
    numeric = build_views(spark, params, stats_dir, fit)
    frame = features(spark, params, numeric)
    if fit:
        shuffled = F.xxhash64(F.lit(args.seed), F.col(DISPLAY_ID), F.col(RAW_AD_ID))
        write_mapping(frame.where("is_train"), args.output / PARQUET_DIR / "train", args.parquet_files, [shuffled],
                      FEATURE_COLUMNS)
        write_mapping(frame.where("NOT is_train"), args.output / PARQUET_DIR / "valid", args.parquet_files,
                      [F.col(DISPLAY_ID), F.col(RAW_AD_ID)], FEATURE_COLUMNS)
        counts = {"train": mapping_counts(spark, args.output / PARQUET_DIR / "train"),
                  "test": mapping_counts(spark, args.output / PARQUET_DIR / "valid")}
    else:
        write_mapping(frame, args.output, args.parquet_files, [F.col(DISPLAY_ID), F.col(RAW_AD_ID)],
                      [*FEATURE_COLUMNS, RAW_AD_ID])
        counts = {"rows": mapping_counts(spark, args.output)}
    spark.catalog.clearCache()
    seconds = time.monotonic() - started
    rows_in = sum(entry["rows"] for entry in counts.values())
    stats = {"mode": args.mode, **counts, "seconds": round(seconds, 3),
             "rows_per_s": round(rows_in / max(seconds, 1e-9), 1)}
    if fit:
        (args.output / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
    log.info("%s: %s in %.1f s (%.0f rows/s)", args.mode, counts, seconds, stats["rows_per_s"])
    return FeaturesResult(str(args.output), stats)


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result)))
