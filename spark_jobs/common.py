"""What every recflow Spark job shares: the session; logging and the failure line are every job's
(tasks.core.job_main, re-exported here for the jobs)."""

from __future__ import annotations

import logging

from tasks.core.job_main import configure_logging, run_job  # noqa: F401 - re-exported for the jobs

log = logging.getLogger("recflow.spark")

# Java's `$` (and the RAPIDS Accelerator's, which follows it) also matches before one final line terminator. A line
# split on `\n` can still hold these; no field pattern of a job accepts any of them, so a line holding one is refused
# whole first, and the `$`-anchored field patterns then keep exactly the rows `\z` (end of input only) would, as
# pyarrow's RE2 patterns do in the jobs' arrow peers. `\z` itself has no GPU implementation ("\z is not supported on
# GPU"), which would keep a whole validation filter on the CPU.
LINE_TERMINATORS = "[\r\u0085\u2028\u2029]"
# Hadoop's LineRecordReader appends at most this many bytes of a line and skips a line that reaches it (the length
# it compares counts the line's '\n'); Spark's text source hands read options to it through the Hadoop conf.
_LINE_MAX_OPTION = "mapreduce.input.linerecordreader.line.maxlength"


def text_lines(spark, path: str, max_line_bytes: int):
    """The file's lines split on '\n' (only: a '\r' stays in its line) as Spark's text reader gives them, each line
    longer than `max_line_bytes` (without its '\n') skipped while reading, never held whole."""
    return spark.read.option("lineSep", "\n").option(_LINE_MAX_OPTION, str(max_line_bytes + 2)).text(path)


def spark_session(app_name: str):
    """The session of a spark-submit run (master and conf come from spark-submit; tests pass local[2])."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def reuse_level(spark):
    """Where a job keeps a DataFrame it reads more than once. In a local run (one JVM: the driver's heap, 2g by
    default, is every task's) on disk: cached blocks held in the heap take the storage half of its unified memory,
    and the sorts and joins then spill so often that they run out of heap (two of the jobs died so at their
    datasets' full sizes and pass with the caches on disk: docs/PERFORMANCE-scale.md). On a cluster, memory first,
    then disk."""
    from pyspark import StorageLevel

    local = spark.sparkContext.master.startswith("local")
    return StorageLevel.DISK_ONLY if local else StorageLevel.MEMORY_AND_DISK
