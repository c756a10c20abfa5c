"""The categorical dictionary of a training window (NVIDIA's "models"): value -> id per Criteo categorical column.

  spark-submit spark_jobs/criteo/dictionary.py --counts stats/day=0/counts stats/day=1/counts ... --output DIR \
      [--frequency-threshold 15] [--threshold-overrides cat_3:2,cat_7:0] [--inputs-json '{...}']

Semantics (NVIDIA's spark_data_utils.py, generate_models): the per-day value counts of the window are summed (the raw
days are never rescanned), a value is kept when its total count >= the column's threshold (0 keeps everything), and
the kept values of a column get ids 1..n by descending total count; 0 is reserved for missing, rare and unseen
values. NVIDIA leaves the order of equal counts unspecified; we break ties by value ascending so that a retry writes
the same ids.

Output (replaced atomically):
  dictionary/          parquet (column int 0..25, value string, id int, count long), each file sorted by (column, id)
  cardinalities.json   {"cat_0": max_id + 1, ...} in column order: the FeatureSpec cardinality
  model_size.json      NVIDIA's format {"_c14": max_id, ..., "_c39": max_id}; their split_dataset.py adds 1
  _MANIFEST.json       last; per-column summary (kept / dropped values, share of occurrences kept) in `extra`
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict

from spark_jobs.common import configure_logging, log, run_job, spark_session
from tasks.criteo.contract import (CARDINALITIES_FILE, DICTIONARY, MODEL_SIZE_FILE, DictionaryResult,  # noqa: F401
                                   column_thresholds, parse_threshold_overrides, record_dictionary)
from tasks.criteo.contract import parse_dictionary_args as parse_args
from tasks.criteo.schema import CAT_COLUMNS
from tasks.core.storage import atomic_directory


def summed_counts(spark, counts_dirs: Sequence[str]):
    """(column, value, count) summed over the window's per-day counts."""
    from pyspark.sql import functions as F

    counts = spark.read.parquet(*counts_dirs)
    return counts.groupBy("column", "value").agg(F.sum("count").cast("long").alias("count"))


def assign_ids(kept):
    """ids 1..n per column by (count desc, value asc).

    One window partition per column is one task per column. At threshold 15 on Criteo 1TB the largest column keeps
    ~8M values, which one task sorts (spilling) in seconds. NVIDIA's --low_mem variant computes the same row numbers
    without that: a global orderBy(column, count desc), monotonically_increasing_id, and per (column, partition)
    row counts turned into running offsets. It matters only when a column keeps hundreds of millions of values
    (threshold 0 on the full dataset); then this window is slow (one core per column) but still spills rather than
    failing, so we do not carry the extra pass.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_frequency = Window.partitionBy("column").orderBy(F.desc("count"), F.asc("value"))
    return kept.withColumn("id", F.row_number().over(by_frequency).cast("int")).select(
        F.col("column").cast("int"), "value", "id", F.col("count").cast("long"))


def column_summary(counts, thresholds: list[int]) -> dict[str, dict[str, float | int]]:
    """Per column: kept values, dropped values, share of occurrences kept (26 rows collected)."""
    from pyspark.sql import functions as F

    threshold = F.array(*[F.lit(t) for t in thresholds])[F.col("column")]
    kept = F.col("count") >= threshold
    rows = counts.groupBy("column").agg(
        F.sum(F.when(kept, 1).otherwise(0)).alias("kept"),
        F.count("*").alias("values"),
        F.sum(F.when(kept, F.col("count")).otherwise(0)).alias("kept_occurrences"),
        F.sum("count").alias("occurrences"),
    ).collect()
    by_column = {int(r["column"]): r for r in rows}
    summary: dict[str, dict[str, float | int]] = {}
    for index, name in enumerate(CAT_COLUMNS):
        r = by_column.get(index)
        kept_n, values, kept_occ, occ = (int(r["kept"]), int(r["values"]), int(r["kept_occurrences"]),
                                         int(r["occurrences"])) if r else (0, 0, 0, 0)
        summary[name] = {"threshold": thresholds[index], "kept": kept_n, "dropped": values - kept_n,
                         "occurrences_kept_share": round(kept_occ / occ, 6) if occ else 1.0}
    return summary


def main(argv: Sequence[str]) -> DictionaryResult:
    args = parse_args(argv)
    configure_logging(f"dictionary days={len(args.counts)}")
    thresholds = column_thresholds(args.frequency_threshold, parse_threshold_overrides(args.threshold_overrides))
    spark = spark_session(f"recflow dictionary ({len(args.counts)} days)")
    from pyspark.sql import functions as F

    with atomic_directory(args.output) as tmp:
        log.info("summing value counts of %d days: %s", len(args.counts), ", ".join(args.counts))
        counts = summed_counts(spark, args.counts)
        # Summed once into the output dir: the summary and the ids both read it instead of re-aggregating the days.
        summed_path = tmp / "_summed_counts"
        counts.write.parquet(str(summed_path))
        counts = spark.read.parquet(str(summed_path))
        summary = column_summary(counts, thresholds)
        threshold = F.array(*[F.lit(t) for t in thresholds])[F.col("column")]
        kept = counts.where(F.col("count") >= threshold)
        # The window's output is already sorted by (column, id) within each file: no global sort needed.
        assign_ids(kept).write.parquet(str(tmp / DICTIONARY))
        shutil.rmtree(summed_path)
        cardinalities, values = record_dictionary(tmp, args, summary, log)
    log.info("dictionary: %d values over %d columns in %s", values, len(CAT_COLUMNS), args.output)
    return DictionaryResult(str(args.output), values, cardinalities)


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result)))
