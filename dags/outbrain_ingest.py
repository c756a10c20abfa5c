"""
### outbrain_ingest — an Outbrain click-log snapshot, downloaded and validated

`download` (Kaggle's files — clicks_train, events, promoted_content, documents_meta / topics / entities /
categories, page_views_sample, clicks_test — from file / http(s) / s3, each as `.csv`, `.csv.gz` or Kaggle's
`.csv.zip`, checked against the source's `SHA256SUMS` when it publishes one; cached when the verified files are
already here) → `validate` (every row of every file checked against its schema; exactly one click per display,
every clicked display in events, every ad in promoted_content; bad rows quarantined with file, line and column; a
Great Expectations report per file; fails with one line when bad rows exceed the budget; the good rows kept as
typed parquet) → `announce` (an event on the `outbrain_clicks` asset, for lineage; skipped when this run found
nothing new) → `train_gate` (triggers `outbrain_wide_deep` on the snapshot, one run per validated snapshot; skipped
with `announce`).

Runs weekly (`RECFLOW_OUTBRAIN_INGEST_CRON`, default Tuesdays 05:00 UTC) so a new snapshot on the source is picked
up; trigger it by hand to ingest another snapshot or source. Outputs live under `<data root>/outbrain/`, keyed by
snapshot name, each with a manifest.
"""

from __future__ import annotations

from functools import partial

from airflow.sdk import CronTriggerTimetable, Param, dag, task

from tasks.core.config import load_settings
from tasks.core.settings_registry import value
from tasks.dagkit import (DEFAULT_ARGS, DOWNLOAD_TASK, aws_conn_param, bad_row_budget_param, fail_without_retry,
                          source_url_param)
from tasks.dagkit.retrain import TriggerWhenReady, snapshot_decision
from tasks.outbrain.dagkit import OUTBRAIN_CLICKS, announcement
from tasks.dagkit.docs import document

SNAPSHOT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


@dag(
    dag_id="outbrain_ingest",
    schedule=CronTriggerTimetable(value("RECFLOW_OUTBRAIN_INGEST_CRON"), timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "outbrain", "ingest"],
    params={
        "snapshot": Param(None, type=["null", "string"], pattern=SNAPSHOT_NAME, title="Snapshot",
                          description="Name under which the files are kept. Empty = RECFLOW_OUTBRAIN_SNAPSHOT "
                                      "(kaggle)."),
        "source_url": source_url_param("Where the files are, with {file} for each file's name without extension "
                                       "(e.g. s3://bucket/outbrain/{file}.csv.zip). Empty = RECFLOW_OUTBRAIN_SOURCE. "
                                       "file:// paths must lie under RECFLOW_FILE_SOURCE_ROOTS, http(s)/s3 URLs under "
                                       "RECFLOW_SOURCE_ALLOWED_PREFIXES.",
                                       pattern=r"^(file|https?|s3)://[^\s;|&$`]*\{file\}[^\s;|&$`]*$"),
        "bad_row_budget": bad_row_budget_param(None, "Fraction of malformed rows per file tolerated (quarantined) "
                                                     "before failing. Empty = RECFLOW_OUTBRAIN_BAD_ROW_BUDGET, "
                                                     "else the deployment's RECFLOW_BAD_ROW_BUDGET."),
        "aws_conn_id": aws_conn_param("s3:// sources"),
    },
)
def outbrain_ingest():
    @task(**DOWNLOAD_TASK)
    def download(**context) -> dict:
        from tasks.core.config import NotAllowed
        from tasks.core.validation import ArchiveUnusable
        from tasks.outbrain.ingest import ChecksumMismatch, download_snapshot
        from tasks.outbrain.settings import load_outbrain_settings

        params = context["params"]
        # A refused source, a wrong checksum, an archive that cannot be unpacked as it is: a retry fetches the same.
        fetch = fail_without_retry(NotAllowed, ChecksumMismatch, ArchiveUnusable)(download_snapshot)
        return fetch(load_settings(), params["snapshot"] or load_outbrain_settings().snapshot,
                     source=params["source_url"] or None, aws_conn_id=params["aws_conn_id"])

    @task
    def validate(downloaded: dict, **context) -> dict:
        from tasks.outbrain.ingest import DataQualityError, validate_snapshot

        check = fail_without_retry(DataQualityError)(validate_snapshot)
        return check(load_settings(), downloaded["snapshot"], bad_row_budget=context["params"]["bad_row_budget"])

    @task(outlets=[OUTBRAIN_CLICKS])
    def announce(downloaded: dict, validated: dict, **context) -> dict:
        event = announcement(downloaded, validated)  # raises AirflowSkipException when nothing is new
        context["outlet_events"][OUTBRAIN_CLICKS].extra = event
        return event

    downloaded = download()
    announce(downloaded, validate(downloaded)) >> TriggerWhenReady(
        task_id="train_gate", trigger_dag_id="outbrain_wide_deep", decide=partial(snapshot_decision, param="snapshot"))


document(outbrain_ingest(), __doc__)
