"""
### movielens_ncf — from a validated MovieLens snapshot to a published NeuMF recommender

`preprocess` (Spark: users with fewer than `min_ratings` ratings dropped, users and items factorized in order of
first appearance, interactions sorted by time (ties by file line), duplicates dropped, each user's last
interaction held out as the test positive, `test_negatives` items per user sampled from those not rated in
training (seeded), NVIDIA's NCF FeatureSpec + torch_tensor files; keyed by snapshot and these knobs, so runs that
change only the model share it) → `validate_dataset` → `train` (NeuMF in TensorFlow 2 / Keras 3, `workers`
processes under tf.distribute's MultiWorkerMirroredStrategy, `negatives` fresh negatives per positive every epoch;
resumes from its last checkpoint on retry) → `evaluate` (HR@10 and NDCG@10: the positive ranked among its
1 + test_negatives candidates, duplicates masked, ties counted against it; with the random-ranking baseline) →
`gate` (HR@10 >= min_hr, and no worse than the published model scored on the same test rows through its own id
mappings) → `publish` (a self-contained version: weights, id mappings, the items each user rated; `latest` moved
last). `python -m tasks.movielens.predict recommend` gives any published version's top-k movies for a user.

Configuration: a `profile` (`full`: NVIDIA's recipe, the default of triggered runs; `demo`: one CPU machine)
gives every knob a value; a knob param left empty takes the profile's. `movielens_ingest`'s `train_gate` triggers a
run for each newly validated snapshot, with a `reason`; such a run for a snapshot that was already trained with the
same profile and model name does nothing (a run triggered by hand trains as asked). Outputs live under
`<data root>/runs/movielens_ncf/<run id>/`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from tasks.core.config import load_settings
from tasks.dagkit import (DEFAULT_ARGS, SPARK_TASK, device_param, fail_without_retry, knob_params, profile_param,
                          reason_param, release_params, spark_master, workers_param)
from tasks.dagkit.training import snapshot_params, training_tasks
from tasks.movielens.dagkit import snapshot_of_run
from tasks.movielens.profiles import KNOBS, PROFILES
from tasks.movielens.schema import DATASETS
from tasks.release.steps import failure_callback
from tasks.dagkit.docs import document

record_failure = failure_callback("movielens_ncf")


@dag(
    dag_id="movielens_ncf",
    schedule=None,  # triggered by movielens_ingest's train_gate: an asset event that lands while a run is active
    # would be dropped (apache/airflow#56050), a triggered run waits in the queue
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "movielens", "ncf", "training"],
    params={
        "profile": profile_param(PROFILES),
        "dataset": Param(None, type=["null", "string"], enum=[None, *DATASETS], title="Snapshot",
                         values_display={"None": "(the announced one, else RECFLOW_MOVIELENS_DATASET)"},
                         description="MovieLens snapshot to train on (ingested by movielens_ingest). Empty = "
                                     "RECFLOW_MOVIELENS_DATASET."),
        "reason": reason_param("movielens_ingest's train_gate (which snapshot it validated)"),
        "workers": workers_param(),
        "device": device_param(),
        **knob_params(KNOBS, PROFILES),
        **release_params("movielens_ncf"),
    },
)
def movielens_ncf():
    shared = training_tasks("tasks.movielens.ncf", params_of=snapshot_params("dataset", snapshot_of_run),
                            record_failure=record_failure)

    @task(**SPARK_TASK)
    def preprocess(run: dict) -> dict:
        from tasks.movielens.ncf import preprocess as run_preprocess

        return run_preprocess(load_settings(), run, spark_master=spark_master())

    @task
    def validate_dataset(run: dict, dataset: dict) -> dict:
        from tasks.movielens.ncf import validate_dataset as check
        from tasks.movielens.preprocess import DatasetInvalid

        return fail_without_retry(DatasetInvalid)(check)(load_settings(), run)

    run = shared.resolve_run()
    trained = shared.train(run, validate_dataset(run, preprocess(run)))
    metrics = shared.evaluate(run, trained)
    shared.gate(run, metrics) >> shared.publish(run, metrics)

document(movielens_ncf(), __doc__)
