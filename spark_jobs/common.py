"""What every recflow Spark job shares: the session; logging and the failure line are every job's
(tasks.core.job_main, re-exported here for the jobs)."""

from __future__ import annotations

import logging

from tasks.core.job_main import configure_logging, run_job  # noqa: F401 - re-exported for the jobs

log = logging.getLogger("recflow.spark")


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
