"""
### criteo_ingest — one run per Criteo day

`download` (file / http(s) / s3; resumable, checksummed) → `validate_raw` (every row checked, bad rows
quarantined, Great Expectations report; fails when bad rows exceed the budget) → `day_stats` (typed parquet copy +
categorical value counts). Engine (`RECFLOW_CRITEO_DAY_STATS_ENGINE`; by default `arrow` when the `spark_default`
connection names no master or a local[...] one and the Spark profile is local, else `spark`): with `arrow`
validate_raw writes the stats in the same pass over the rows, so the day is parsed once and day_stats only checks
they are complete; with `spark` day_stats runs a Spark job (spark-submit, e.g. on a cluster). The logical date picks the day (day 0 =
`RECFLOW_CRITEO_EPOCH`); the `day` param overrides it for manual runs. Outputs live under the data root keyed by day, each with a manifest; re-running a
finished day does no work. Each finished day emits an event on the `criteo_day_stats` asset.

Backfill: `airflow backfill create --dag-id criteo_ingest --from-date 2026-01-01 --to-date 2026-01-24
--max-active-runs 3` (a backfill runs under its own limit, 10 unless given, not the DAG's max_active_runs).
"""

from __future__ import annotations

from airflow.sdk import CronDataIntervalTimetable, Param, dag, task

from tasks.core.config import load_settings
from tasks.criteo.dagkit import CRITEO_DAY_STATS, criteo_day
from tasks.criteo.retrain import TRAIN_DAG, decide_retrain
from tasks.criteo.settings import load_criteo_settings
from tasks.dagkit import (DEFAULT_ARGS, DOWNLOAD_TASK, SPARK_TASK, aws_conn_param, bad_row_budget_param,
                          fail_without_retry, source_url_param, spark_master)
from tasks.dagkit.retrain import TriggerWhenReady
from tasks.dagkit.docs import document


@dag(
    dag_id="criteo_ingest",
    # A data-interval timetable: the run that fires at midnight has the day that just ended as its logical date
    # (with "@daily", Airflow 3 would give it the day that just started, whose file is not complete yet).
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=load_criteo_settings().epoch_datetime,
    catchup=False,
    max_active_runs=3,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "criteo", "ingest"],
    params={
        "day": Param(None, type=["null", "integer"], minimum=0, maximum=10_000, title="Criteo day",
                     description="Day index to ingest. Empty = the logical date's day: for a trigger from this "
                                 "form that is the date above (today by default, whose file is not complete "
                                 "yet), so set the day or pick yesterday's date."),
        "source_url": source_url_param("Overrides the configured source template for this run (file://, "
                                       "http(s)://, s3://). Empty = RECFLOW_CRITEO_SOURCE with {day}. file:// paths "
                                       "must lie under RECFLOW_FILE_SOURCE_ROOTS (default: the data root and the "
                                       "configured source folder), http(s)/s3 URLs under "
                                       "RECFLOW_SOURCE_ALLOWED_PREFIXES (default: the configured source's folder)."),
        "expected_sha256": Param(None, type=["null", "string"], pattern=r"^[0-9a-f]{64}$", title="Expected sha256",
                                 description="Checksum of the source file; empty = not checked."),
        "bad_row_budget": bad_row_budget_param(None, "Fraction of malformed rows tolerated (quarantined) before "
                                                      "failing. Empty = the deployment's RECFLOW_BAD_ROW_BUDGET "
                                                      "(0.001 unless set)."),
        "aws_conn_id": aws_conn_param("s3:// sources"),
    },
)
def criteo_ingest():
    @task(**DOWNLOAD_TASK)
    def download(**context) -> dict:
        from tasks.core.config import NotAllowed
        from tasks.core.download_sources import ChecksumMismatch
        from tasks.criteo.ingest import download_day

        settings = load_settings()
        params = context["params"]
        day = fail_without_retry(ValueError)(criteo_day)(context)  # a logical date before the epoch stays so
        # A checksum mismatch deletes what it fetched: a retry would download the whole day again, to the same end.
        fetch = fail_without_retry(NotAllowed, ChecksumMismatch)(download_day)
        return fetch(settings, day, source=params["source_url"] or None,
                     expected_sha256=params["expected_sha256"] or None, aws_conn_id=params["aws_conn_id"])

    @task
    def validate_raw(downloaded: dict, **context) -> dict:
        from tasks.criteo.ingest import validate_day
        from tasks.criteo.raw_validation import DataQualityError

        settings = load_settings()
        validate = fail_without_retry(DataQualityError)(validate_day)
        return validate(settings, downloaded["day"], bad_row_budget=context["params"]["bad_row_budget"],
                        spark_master=spark_master())

    @task(**SPARK_TASK, outlets=[CRITEO_DAY_STATS])
    def day_stats(validated: dict, **context) -> dict:
        from tasks.criteo.ingest import day_stats as compute_day_stats

        result = compute_day_stats(load_settings(), validated["day"], spark_master=spark_master())
        context["outlet_events"][CRITEO_DAY_STATS].extra = {"day": result["day"], "rows": result["rows"],
                                                            "path": result["path"]}
        return result

    # The last ingest run to finish (a teardown runs whatever happened upstream) starts criteo_dlrm on the newest
    # complete window, once per window: a backfill of N days gives one retrain (tasks/criteo/retrain.py).
    stats = day_stats(validate_raw(download()))
    stats >> TriggerWhenReady(task_id="retrain_gate", trigger_dag_id=TRAIN_DAG, decide=decide_retrain).as_teardown()


document(criteo_ingest(), __doc__)
