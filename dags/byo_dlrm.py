"""
### byo_dlrm — bring your own dataset: a CSV FeatureSpec and its CSV files to a published DLRM checkpoint

`resolve_run` (the URIs checked against the deployment's allow-lists, the profile's knobs) → `fetch` (the spec,
then every CSV file it names, from file://, http(s):// or s3:// — relative paths resolved against `data_uri`, else
the spec's own folder; resumable and checksummed) → `validate` (every row against the spec: field count, ids are
non-negative integers below a declared cardinality, numericals parse and fit float16, label 0/1; bad rows
quarantined within RECFLOW_BAD_ROW_BUDGET, a Great Expectations report kept; one error line naming file, line and
column otherwise) → `transcode` (arrow on one machine, Spark with a cluster master, the same bytes: NVIDIA's transcode semantics — `auto` cardinality = max id + 1, a
declared one must cover the ids found, dtypes by cardinality, features renamed num_i / cat_i.bin / label; the
dataset replaced atomically, never appended to; every value checked as it is written) → `validate_dataset`
(NVIDIA's FeatureSpec checks, sizes and rows; a full scan of a dataset whose writer did not check it)
→ `train` (DLRM, torchrun with `nproc` processes; resumes from its last checkpoint on retry) → `evaluate` (ROC AUC,
logloss on the test mapping) → `gate` (AUC threshold, and no worse than the published model scored on the same
test rows) → `publish` (weights, both FeatureSpecs, curves, gate record; `latest` moved last) → `prune` (also after a
gate that held the model back: the run is marked finished, and the fetched files, validated tables and dataset of
finished runs older than the newest RECFLOW_KEEP_RUN_DATASETS, 2, are deleted).

The spec is NVIDIA's yaml with `type: csv` chunks (see NVIDIA's DLRM README, "BYO dataset", and
docs/byo.md). Outputs live under `<data root>/runs/byo_dlrm/<run id>/`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from tasks.byo.pipeline import ENGINE_ENV, TRANSCODE_ENGINES
from tasks.byo.profiles import KNOBS, PROFILES
from tasks.core.config import load_settings
from tasks.dagkit import (DEFAULT_ARGS, DOWNLOAD_TASK, SPARK_TASK, device_param, engine_param, fail_without_retry,
                          knob_params, profile_param, release_params, spark_master)
from tasks.dagkit.training import training_tasks
from tasks.release.steps import failure_callback
from tasks.dagkit.docs import document

record_failure = failure_callback("byo_dlrm")


@dag(
    dag_id="byo_dlrm",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "byo", "dlrm", "training"],
    params={
        "spec_uri": Param(None, type=["null", "string"], maxLength=2000, title="FeatureSpec URI",
                          description="The CSV FeatureSpec yaml: file://, http(s):// or s3:// (under the "
                                      "deployment's RECFLOW_FILE_SOURCE_ROOTS / RECFLOW_SOURCE_ALLOWED_PREFIXES). "
                                      "Empty = RECFLOW_BYO_SPEC_URI."),
        "data_uri": Param(None, type=["null", "string"], maxLength=2000, title="Data base URI",
                          description="Folder the spec's relative file paths are resolved against. Empty = the "
                                      "spec's own folder."),
        "profile": profile_param(PROFILES),
        "nproc": Param(None, type=["null", "integer"], minimum=1, maximum=64, title="Training processes",
                       description="torchrun --nproc_per_node. Empty = the deployment's RECFLOW_TRAIN_NPROC (1)."),
        "device": device_param(),
        "engine": engine_param(TRANSCODE_ENGINES, ENGINE_ENV,
                               "arrow: the transcode in the worker's process, no JVM; spark: spark-submit. Both "
                               "write the same bytes.",
                               default="arrow on one machine (spark_default names no master or a local[...] one, "
                                       "local Spark profile), else spark"),
        **knob_params(KNOBS, PROFILES),
        **release_params("byo_dlrm"),
    },
)
def byo_dlrm():
    shared = training_tasks("tasks.byo.pipeline", record_failure=record_failure)

    @task(**DOWNLOAD_TASK)
    def fetch(run: dict, **context) -> dict:
        from tasks.byo.pipeline import fetch_sources
        from tasks.core.config import NotAllowed
        from tasks.core.download import ChecksumMismatch, SourceNotFound
        from tasks.formats.feature_spec import FeatureSpecError

        shared.reopen(context["run_id"])  # rebuilds what retention deletes: the run is not finished any more
        download = fail_without_retry(FeatureSpecError, NotAllowed, SourceNotFound, ChecksumMismatch)(fetch_sources)
        return download(load_settings(), context["run_id"], run, aws_conn_id=context["params"]["aws_conn_id"])

    @task
    def validate(fetched: dict, **context) -> dict:
        from tasks.byo.pipeline import validate as check
        from tasks.core.validation import DataQualityError

        shared.not_pruned(context["run_id"])
        return fail_without_retry(DataQualityError)(check)(load_settings(), context["run_id"], fetched)

    @task(**SPARK_TASK)
    def transcode(validated: dict, **context) -> dict:
        from tasks.byo.pipeline import transcode as run_transcode
        from tasks.core.validation import DataQualityError
        from tasks.formats.feature_spec import FeatureSpecError

        shared.not_pruned(context["run_id"])
        # What the data holds (an id past its declared cardinality, a damaged file): a retry reads the same bytes.
        refused = fail_without_retry(FeatureSpecError, DataQualityError)(run_transcode)
        return refused(load_settings(), context["run_id"], spark_master=spark_master(),
                       engine=context["params"]["engine"])

    @task
    def validate_dataset(dataset: dict, **context) -> dict:
        from tasks.byo.pipeline import DatasetInvalid, run_paths, validate_dataset as check

        shared.not_pruned(context["run_id"])
        return fail_without_retry(DatasetInvalid)(check)(run_paths(load_settings(), context["run_id"]).dataset)

    run = shared.resolve_run()
    dataset = transcode(validate(fetch(run)))
    trained = shared.train(run, validate_dataset(dataset))
    metrics = shared.evaluate(run, trained)
    shared.gate(run, metrics) >> shared.publish(run, metrics) >> shared.prune()


document(byo_dlrm(), __doc__)
