"""
### movielens_ingest — a MovieLens snapshot, downloaded and validated

`download` (GroupLens's zip from file / http(s) / s3, its md5 checked against the published `<zip>.md5`, unzipped
atomically; cached when the verified archive is already here) → `validate` (every rating row checked: columns,
types, ids positive, rating range, plausible timestamps; duplicates counted; bad rows quarantined with their line;
a Great Expectations report; fails with one line when bad rows exceed the budget; the good rows kept as typed
parquet) → `announce` (an event on the `movielens_ratings` asset, for lineage; skipped when this run found
nothing new: the same archive, already validated) → `train_gate` (triggers `movielens_ncf` on the snapshot, one run
per validated snapshot; skipped with `announce`).

Runs weekly (`RECFLOW_MOVIELENS_INGEST_CRON`, default Mondays 05:00 UTC) so a new snapshot on the source is picked
up; trigger it by hand with a `dataset` to ingest ml-1m or another source. Outputs live under
`<data root>/movielens/`, keyed by snapshot name, each with a manifest.
"""

from __future__ import annotations

from functools import partial

from airflow.sdk import CronTriggerTimetable, Param, dag, task

from tasks.core.config import load_settings
from tasks.core.settings_registry import value
from tasks.dagkit import (DEFAULT_ARGS, DOWNLOAD_TASK, aws_conn_param, bad_row_budget_param, fail_without_retry,
                          source_url_param)
from tasks.dagkit.retrain import TriggerWhenReady, snapshot_decision
from tasks.movielens.dagkit import MOVIELENS_RATINGS, announcement
from tasks.movielens.schema import DATASETS
from tasks.dagkit.docs import document


@dag(
    dag_id="movielens_ingest",
    schedule=CronTriggerTimetable(value("RECFLOW_MOVIELENS_INGEST_CRON"), timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "movielens", "ingest"],
    params={
        "dataset": Param(None, type=["null", "string"], enum=[None, *DATASETS], title="Snapshot",
                         values_display={"None": "(the deployment's RECFLOW_MOVIELENS_DATASET)"},
                         description="MovieLens snapshot: ml-20m (NVIDIA's NCF recipe) or ml-1m. Empty = "
                                     "RECFLOW_MOVIELENS_DATASET (ml-20m)."),
        "source_url": source_url_param("The zip for this run (file://, http(s)://, s3://); its md5 is read from the "
                                       "same URL + '.md5'. Empty = RECFLOW_MOVIELENS_SOURCE with {name}. file:// "
                                       "paths must lie under RECFLOW_FILE_SOURCE_ROOTS, http(s)/s3 URLs under "
                                       "RECFLOW_SOURCE_ALLOWED_PREFIXES."),
        "bad_row_budget": bad_row_budget_param(None, "Fraction of malformed rating rows tolerated (quarantined) "
                                                     "before failing. Empty = RECFLOW_MOVIELENS_BAD_ROW_BUDGET, "
                                                     "else the deployment's RECFLOW_BAD_ROW_BUDGET."),
        "aws_conn_id": aws_conn_param("s3:// sources"),
    },
)
def movielens_ingest():
    @task(**DOWNLOAD_TASK)
    def download(**context) -> dict:
        from tasks.core.config import NotAllowed
        from tasks.core.validation import ArchiveUnusable
        from tasks.movielens.ingest import ChecksumMismatch, download_snapshot
        from tasks.movielens.settings import load_movielens_settings

        params = context["params"]
        # A refused source, a wrong checksum, an archive that cannot be unpacked as it is: a retry fetches the same.
        fetch = fail_without_retry(NotAllowed, ChecksumMismatch, ArchiveUnusable)(download_snapshot)
        return fetch(load_settings(), params["dataset"] or load_movielens_settings().dataset,
                     source=params["source_url"] or None, aws_conn_id=params["aws_conn_id"])

    @task
    def validate(downloaded: dict, **context) -> dict:
        from tasks.movielens.ingest import DataQualityError, validate_snapshot
        from tasks.movielens.settings import load_movielens_settings

        settings, budget = load_settings(), context["params"]["bad_row_budget"]
        check = fail_without_retry(DataQualityError)(validate_snapshot)
        return check(settings, downloaded["name"],
                     bad_row_budget=load_movielens_settings().budget(settings) if budget is None else budget)

    @task(outlets=[MOVIELENS_RATINGS])
    def announce(downloaded: dict, validated: dict, **context) -> dict:
        event = announcement(downloaded, validated)  # raises AirflowSkipException when nothing is new
        context["outlet_events"][MOVIELENS_RATINGS].extra = event
        return event

    downloaded = download()
    announce(downloaded, validate(downloaded)) >> TriggerWhenReady(
        task_id="train_gate", trigger_dag_id="movielens_ncf", decide=partial(snapshot_decision, param="dataset"))


document(movielens_ingest(), __doc__)
