"""Per-day Criteo statistics: a typed parquet copy of the day and its categorical value counts.

  spark-submit spark_jobs/criteo/day_stats.py --input day_N --output stats/day=N --day N [--inputs-json '{...}']

Rows that break the raw-format rules (the same rules validate_raw applied, from tasks.criteo.schema) are dropped,
so the columnar copy holds exactly the rows validation called good; the task compares the two counts. Counts are
(column, value, count) with column = categorical index 0..25 (NVIDIA's column_id), the input of frequency
thresholding: a training window's dictionary is the sum of its days' counts, never a rescan of raw days.

This is the `spark` day-stats engine; the default `arrow` engine (tasks/criteo/day_stats_arrow.py) writes the same
dataset from validation's own pass. row_order is a monotonically_increasing_id assigned AFTER the bad rows are
dropped: (partition << 33) | the row's index among the partition's good rows. The transform turns it into the dense
file-order index the arrow engine writes (offset of the partition + that index), so both engines' stats give the
same bytes downstream.

Memory: Spark streams the text split by split; the only shuffle is the counts aggregation, which spills. Nothing
scales with the day in the driver. A line longer than --max-line-bytes (RECFLOW_MAX_LINE_BYTES, 64 KiB; a Criteo row
is at most ~500 bytes) is skipped by Hadoop's line reader as it reads, holding at most that many bytes of it:
validation counted it as a bad row, and a multi-gigabyte "line" inside the bad-row budget must not become one Java
string (an executor OOM instead of a clear error).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_jobs.common import LINE_TERMINATORS, configure_logging, log, run_job, spark_session, text_lines
from tasks.criteo.contract import COLUMNAR, COUNTS, ROW_ORDER
from tasks.criteo.schema import CAT_COLUMNS, CAT_PATTERN, INT_COLUMNS, INT_PATTERN, LABEL, LABEL_PATTERN, RAW_COLUMNS
from tasks.core.storage import Manifest, atomic_directory, write_manifest


@dataclass(frozen=True)
class DayStatsResult:
    day: int
    rows: int
    distinct_values: dict[str, int]
    output: str


def raw_lines(spark, path: str, max_line_bytes: int | None = None):
    """The file's lines split on '\n' as Spark's text reader gives them, lines longer than `max_line_bytes` (None:
    RECFLOW_MAX_LINE_BYTES) skipped while reading, never held whole."""
    if max_line_bytes is None:
        from tasks.core.config import load_settings

        max_line_bytes = load_settings().max_line_bytes
    return text_lines(spark, path, max_line_bytes)


def typed_rows(spark, path: str, max_line_bytes: int | None = None):
    """The day's rows that pass the raw-format rules, typed: label tinyint, int_* bigint, cat_* string (null =
    empty), plus `row_order`, increasing in file order (the test/validation split of a day is by file order), its
    low 33 bits counting the good rows of its partition from 0. Lines over `max_line_bytes` are never read whole."""
    from pyspark.sql import functions as F

    lines = raw_lines(spark, path, max_line_bytes).where(~F.col("value").rlike(LINE_TERMINATORS))
    fields = lines.select(F.split(F.col("value"), "\t", -1).alias("f")).where(F.size("f") == len(RAW_COLUMNS))
    named = fields.select(*[F.col("f")[i].alias(name) for i, name in enumerate(RAW_COLUMNS)])
    valid = F.col(LABEL).rlike(LABEL_PATTERN)
    for name in INT_COLUMNS:
        valid = valid & ((F.col(name) == "") | F.col(name).rlike(INT_PATTERN))
    for name in CAT_COLUMNS:
        valid = valid & ((F.col(name) == "") | F.col(name).rlike(CAT_PATTERN))
    good = named.where(valid)

    def empty_to_null(name: str):
        return F.when(F.col(name) == "", None).otherwise(F.col(name))

    # The id after the filter: one file's splits become partitions in offset order, so (partition, index among the
    # partition's good rows) increases down the file and each partition's indexes are dense (0, 1, 2, ...).
    return good.select(
        F.col(LABEL).cast("tinyint").alias(LABEL),
        *[empty_to_null(name).cast("bigint").alias(name) for name in INT_COLUMNS],
        *[empty_to_null(name).alias(name) for name in CAT_COLUMNS],
        F.monotonically_increasing_id().alias(ROW_ORDER),
    )


def value_counts(columnar):
    """(column, value, count) over the 26 categoricals; nulls (missing values) are not counted."""
    from pyspark.sql import functions as F

    exploded = columnar.select(F.posexplode(F.array(*[F.col(c) for c in CAT_COLUMNS])).alias("column", "value"))
    return exploded.where(F.col("value").isNotNull()).groupBy("column", "value").agg(F.count("*").alias("count"))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="typed parquet copy + categorical value counts of one Criteo day")
    parser.add_argument("--input", required=True, help="raw day file (TSV)")
    parser.add_argument("--output", required=True, type=Path, help="output directory (replaced atomically)")
    parser.add_argument("--day", required=True, type=int)
    parser.add_argument("--inputs-json", default="{}", help="what identifies this work, recorded in the manifest")
    parser.add_argument("--max-line-bytes", type=int, default=None,
                        help="lines longer than this are skipped unread (default: RECFLOW_MAX_LINE_BYTES, 64 KiB)")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> DayStatsResult:
    args = parse_args(argv)
    configure_logging(f"day_stats day={args.day}")
    spark = spark_session(f"recflow day_stats day={args.day}")
    with atomic_directory(args.output) as tmp:
        log.info("reading %s", args.input)
        typed_rows(spark, args.input, args.max_line_bytes).write.parquet(str(tmp / COLUMNAR))
        columnar = spark.read.parquet(str(tmp / COLUMNAR))
        rows = columnar.count()
        log.info("columnar copy: %d rows", rows)
        value_counts(columnar).write.parquet(str(tmp / COUNTS))
        counts = spark.read.parquet(str(tmp / COUNTS))
        per_column = {int(r["column"]): int(r["n"]) for r in counts.groupBy("column").count()
                      .withColumnRenamed("count", "n").collect()}
        distinct = {CAT_COLUMNS[i]: per_column.get(i, 0) for i in range(len(CAT_COLUMNS))}
        log.info("distinct values per column: %s", distinct)
        manifest = Manifest(kind="criteo_day_stats", inputs=json.loads(args.inputs_json), rows={"good": rows},
                            extra={"day": args.day, "distinct_values": distinct, "engine": "spark"})
        write_manifest(tmp, manifest, checksum=False)  # sizes only: docs/ARCHITECTURE.md "Manifests"
    spark.stop()
    return DayStatsResult(args.day, rows, distinct, str(args.output))


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result)))
