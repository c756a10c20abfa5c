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
