"""
### outbrain_wide_deep — from a validated Outbrain snapshot to a published Wide & Deep model

`features` (Spark SQL in `sql/outbrain/`, or NVIDIA's NVTabular Workflow with `engine=nvtabular`: clicks ⨝ events ⨝
promoted_content ⨝ documents_meta twice; the split — days 0-10 with a per-display uniform r > 0.2 → train, the rest →
validation, seeded; CTRs fitted on train only with NVIDIA's count thresholds, days since published, geo country /
state, TF-IDF similarities of the event and the ad document over categories, topics and entities, counts, NVIDIA's
hash buckets; written as parquet + FeatureSpec and as TFRecords prebatched by `prebatch_size` rows; keyed by
snapshot, engine and these knobs, so runs that change only the model share it) → `validate_dataset` → `train` (Wide &
Deep in TensorFlow 2 / Keras 3: the wide part FTRL, the deep part RMSProp with warmup; `workers` processes under
tf.distribute's MultiWorkerMirroredStrategy; resumes from its last checkpoint on retry) → `evaluate` (MAP@k over the
whole validation set grouped by display, ties counted against the clicked ad, with the MAP of a random ranking of the
same displays; AUC, logloss) → `gate` (MAP@k >= min_map, and no worse than the published model scored on the same
displays through its own feature statistics) → `publish` (a self-contained version: weights, FeatureSpec, the fitted
feature statistics; `latest` moved last). `python -m tasks.outbrain.predict` scores raw Outbrain rows with any
published version.

Configuration: a `profile` (`full`: NVIDIA's recipe, the default of triggered runs; `demo`: one CPU machine)
gives every knob a value; a knob param left empty takes the profile's. `outbrain_ingest`'s `train_gate` triggers a
run for each newly validated snapshot, with a `reason`; such a run for a snapshot that was already trained with the
same profile and model name does nothing (a run triggered by hand trains as asked). Outputs live under
`<data root>/runs/outbrain_wide_deep/<run id>/`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from tasks.core.config import load_settings
from tasks.dagkit import (DEFAULT_ARGS, SPARK_TASK, device_param, engine_param, fail_without_retry, knob_params,
                          profile_param, reason_param, release_params, spark_master, workers_param)
from tasks.dagkit.training import snapshot_params, training_tasks
from tasks.outbrain.dagkit import snapshot_of_run
from tasks.outbrain.profiles import KNOBS, PROFILES
from tasks.release.steps import failure_callback
from tasks.dagkit.docs import document

record_failure = failure_callback("outbrain_wide_deep")


@dag(
    dag_id="outbrain_wide_deep",
    schedule=None,  # triggered by outbrain_ingest's train_gate: an asset event that lands while a run is active
    # would be dropped (apache/airflow#56050), a triggered run waits in the queue
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "outbrain", "wide_deep", "training"],
    params={
        "profile": profile_param(PROFILES),
        "snapshot": Param(None, type=["null", "string"], pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                          title="Snapshot",
                          description="Outbrain snapshot to train on (ingested by outbrain_ingest). Empty = "
                                      "RECFLOW_OUTBRAIN_SNAPSHOT."),
        "reason": reason_param("outbrain_ingest's train_gate (which snapshot it validated)"),
        "workers": workers_param(),
        "device": device_param(),
        "engine": engine_param(("spark", "nvtabular"), "RECFLOW_OUTBRAIN_FEATURES_ENGINE",
                               "Features engine: spark (the SQL in sql/outbrain/, on the deployment's Spark) or "
                               "nvtabular (NVIDIA's NVTabular Workflow in its own environment; GPU where cudf "
                               "imports, else CPU). Each engine's features are cached apart."),
        **knob_params(KNOBS, PROFILES),
        **release_params("outbrain_wide_deep"),
    },
)
def outbrain_wide_deep():
    shared = training_tasks("tasks.outbrain.wide_deep", params_of=snapshot_params("snapshot", snapshot_of_run),
                            record_failure=record_failure)

    @task(**SPARK_TASK)
    def features(run: dict) -> dict:
        from tasks.outbrain.wide_deep import build_features

        return build_features(load_settings(), run, spark_master=spark_master())

    @task
    def validate_dataset(run: dict, built: dict) -> dict:
        from tasks.outbrain.features import DatasetInvalid
        from tasks.outbrain.wide_deep import validate_dataset as check

        return fail_without_retry(DatasetInvalid)(check)(load_settings(), run)

    run = shared.resolve_run()
    trained = shared.train(run, validate_dataset(run, features(run)))
    metrics = shared.evaluate(run, trained)
    shared.gate(run, metrics) >> shared.publish(run, metrics)

document(outbrain_wide_deep(), __doc__)
