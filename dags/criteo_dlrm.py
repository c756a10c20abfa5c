"""
### criteo_dlrm — from ingested Criteo days to a published DLRM checkpoint

`build_dictionary` (Spark: sum of the window's per-day value counts, frequency threshold, ids by descending
frequency from 1, 0 = missing/rare/unseen) → `transform` (Spark: dictionary applied, log(x+3) numericals,
train shuffled, test day split into test/validation by file order, split-binary + FeatureSpec) →
`validate_dataset` → `train` (`framework` pytorch: torchrun, `nproc` processes, gloo on CPU, NCCL on CUDA;
tensorflow: `nproc` TensorFlow workers under MultiWorkerMirroredStrategy; either resumes from its last checkpoint on
retry) → `evaluate` (ROC AUC, logloss on the test mapping) → `export` (TorchScript, or a TensorFlow SavedModel, as
a Triton model repository; before the gate, which registers the run) → `gate` (AUC threshold, and no worse than the published model scored on the same test rows
through its own dictionary; a failed gate skips publishing) → `publish` (a self-contained version: weights,
dictionary, preprocessing, FeatureSpec, export; `latest` moved last) → `prune` (also after a gate that held the
model back: the run is marked finished, and the datasets of finished runs older than the newest
RECFLOW_KEEP_RUN_DATASETS, 2, are deleted: ~390 GB each for a 24-day window). `python -m tasks.criteo.predict` scores
raw rows with any published version.

Preprocessing engine (`engine`): `arrow` (the same jobs on one machine without a JVM; the default when the
`spark_default` connection names no master or a local[...] one), `spark` (the default with a cluster master or a
cluster / gpu Spark profile; CPU, or GPU through the RAPIDS Accelerator with the gpu profile) or `nvtabular`
(NVIDIA's NVTabular workflow for DLRM, run in NVTabular's own environment, on the GPU where the worker has one). All three write the same dataset and
dictionary (docs/nvtabular.md); an nvtabular model also publishes its fitted workflow.

Configuration: a `profile` (`full`: NVIDIA's recipe, the default of scheduled runs; `demo`: one CPU machine) gives
every knob a value; a knob param left empty takes the profile's. Retraining: `criteo_ingest`'s retrain gate
triggers a run once a complete new window of days has landed; the timetable below (`RECFLOW_RETRAIN_CRON`) is a
safety net that trains the newest complete window only if it is newer than the last trained one. With
`train_days` / `test_day` empty, the newest complete window is trained (its test day and the `window_days` days
before it all ingested); a run triggered by hand trains it even if it was trained before. Needs `criteo_ingest` to
have run for every day of the window. Outputs live under `<data root>/runs/criteo_dlrm/<run id>/`.
"""

from __future__ import annotations

from airflow.sdk import CronTriggerTimetable, Param, dag, task

from tasks.core.config import load_settings
from tasks.core.settings_registry import value
from tasks.criteo.profiles import KNOBS, PROFILES
from tasks.criteo.preprocess import ENGINE_ENV, PREPROCESS_ENGINES
from tasks.dagkit import (DEFAULT_ARGS, MODEL_TASK, SPARK_TASK, device_param, engine_param, knob_params,
                          profile_param, reason_param, release_params, spark_master)
from tasks.dagkit.training import training_tasks
from tasks.release.steps import failure_callback
from tasks.dagkit.docs import document


record_failure = failure_callback("criteo_dlrm")


@dag(
    dag_id="criteo_dlrm",
    # Retrains are started by criteo_ingest's retrain gate once a complete new window has landed; the cron is a
    # safety net that trains the newest complete window only if it is newer than the last trained one.
    schedule=CronTriggerTimetable(value("RECFLOW_RETRAIN_CRON"), timezone="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "criteo", "dlrm", "training"],
    params={
        "profile": profile_param(PROFILES),
        "train_days": Param(None, type=["null", "string"], pattern=r"^\d+(-\d+)?(,\d+(-\d+)?)*$", title="Train days",
                            description="Criteo days to train on: ranges and lists, e.g. '0-22' or '0-3,5'. "
                                        "Empty = the window_days days before the test day."),
        "test_day": Param(None, type=["null", "integer"], minimum=0, maximum=10_000, title="Test day",
                          description="Day held out: first half = test, second half = validation (file order). "
                                      "Empty = the test day of the newest complete window (it and the "
                                      "window_days days before it ingested); a run triggered here trains it even "
                                      "if it was trained before."),
        "reason": reason_param("criteo_ingest's retrain gate (which window landed, and why it is new)"),
        "nproc": Param(None, type=["null", "integer"], minimum=1, maximum=64, title="Training processes",
                       description="torchrun --nproc_per_node. Empty = the deployment's RECFLOW_TRAIN_NPROC (1)."),
        "device": device_param(),
        "framework": Param("pytorch", type="string", enum=["pytorch", "tensorflow"], title="Framework",
                           description="pytorch: models.dlrm (torchrun, nproc processes); tensorflow: models.dlrm_tf "
                                       "(nproc TensorFlow workers, MultiWorkerMirroredStrategy). Same dataset, "
                                       "knobs and test rows."),
        "engine": engine_param(PREPROCESS_ENGINES, ENGINE_ENV,
                               "spark: the Spark jobs (CPU, or GPU with the gpu Spark profile); arrow: the same "
                               "output on one machine without a JVM; nvtabular: NVIDIA's NVTabular workflow in its "
                               "own environment (GPU when the worker has one). All three write the same dataset.",
                               default="arrow on one machine (spark_default names no master or a local[...] one, "
                                       "local Spark profile), else spark"),
        **knob_params(KNOBS, PROFILES),
        **release_params("criteo_dlrm"),
    },
)
def criteo_dlrm():
    shared = training_tasks("tasks.criteo.dlrm", record_failure=record_failure)

    @task(**SPARK_TASK)
    def build_dictionary(run: dict, **context) -> dict:
        from tasks.criteo.contract import parse_threshold_overrides
        from tasks.criteo.dlrm import run_paths
        from tasks.criteo.preprocess import build_dictionary as build

        settings, knobs = load_settings(), run["knobs"]
        return build(settings, run_paths(settings, context["run_id"]).dictionary, run["train_days"],
                     run["test_day"], frequency_threshold=knobs["frequency_threshold"],
                     threshold_overrides=parse_threshold_overrides(knobs["threshold_overrides"]),
                     dictionary_days=knobs["dictionary_days"], spark_master=spark_master(),
                     engine=run.get("engine"))

    @task(**SPARK_TASK)
    def transform(run: dict, dictionary: dict, **context) -> dict:
        from tasks.criteo.dlrm import run_paths
        from tasks.criteo.preprocess import transform_dataset

        shared.reopen(context["run_id"])  # rebuilds what retention deletes: the run is not finished any more
        settings = load_settings()
        paths = run_paths(settings, context["run_id"])
        return transform_dataset(settings, paths.dataset, paths.dictionary, run["train_days"], run["test_day"],
                                 seed=run["knobs"]["seed"], spark_master=spark_master(), engine=run.get("engine"))

    @task
    def validate_dataset(dataset: dict, **context) -> dict:
        from tasks.criteo.dlrm import run_paths
        from tasks.criteo.preprocess import DatasetInvalid, validate_dataset as check
        from tasks.dagkit import fail_without_retry

        shared.not_pruned(context["run_id"])
        return fail_without_retry(DatasetInvalid)(check)(run_paths(load_settings(), context["run_id"]).dataset)

    # Before the gate, which registers the run: an export that fails for good stops the run before it is registered
    # (the gate then runs no more), so no run is left `trained` (which counts as trained: the retrain gate would skip
    # its window) with its publish upstream_failed. The callback covers an export cleared after the gate ran.
    @task(**MODEL_TASK, on_failure_callback=record_failure)
    def export(run: dict, trained: dict, **context) -> dict:
        from tasks.criteo.dlrm import export as export_model

        return export_model(load_settings(), context["run_id"], run)

    run = shared.resolve_run()
    dataset = transform(run, build_dictionary(run))
    trained = shared.train(run, validate_dataset(dataset))
    metrics = shared.evaluate(run, trained)
    exported, gated = export(run, trained), shared.gate(run, metrics)
    exported >> gated >> shared.publish(run, metrics) >> shared.prune()


document(criteo_dlrm(), __doc__)
