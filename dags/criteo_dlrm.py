"""
### criteo_dlrm — from ingested Criteo days to a published DLRM checkpoint

`build_dictionary` (Spark: sum of the window's per-day value counts, frequency threshold, ids by descending
frequency from 1, 0 = missing/rare/unseen) → `transform` (Spark: dictionary applied, log(x+3) numericals,
train shuffled, test day split into test/validation by file order, split-binary + FeatureSpec) →
`validate_dataset` → `train` (torchrun, `nproc` processes; gloo on CPU, NCCL on CUDA; resumes from its last
checkpoint on retry) → `evaluate` (ROC AUC, logloss on the test mapping) → `gate` (AUC threshold and no worse
than the published model; a failed gate skips publishing) → `publish` (versioned prefix, `latest` moved last).

Schedule: retrains when `criteo_ingest` emits a `criteo_day_stats` asset event (new data landed) and on a cron
(`RECFLOW_RETRAIN_CRON`, default Mondays 06:00 UTC). With `train_days` / `test_day` empty, the newest ingested
day is the test day and the `window_days` days before it are the train days. Needs `criteo_ingest` to have run
for every day of the window. Outputs live under `<data root>/runs/criteo_dlrm/<run id>/`.
"""

from __future__ import annotations

import os

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task

from tasks.config import load_settings
from tasks.dag_support import CRITEO_DAY_STATS, DEFAULT_ARGS, SPARK_TASK, TRAIN_TASK, spark_master

_MLP = r"^\d{1,5}(,\d{1,5}){0,7}$"


@dag(
    dag_id="criteo_dlrm",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(os.environ.get("RECFLOW_RETRAIN_CRON", "0 6 * * 1"), timezone="UTC"),
        assets=CRITEO_DAY_STATS,
    ),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["recflow", "criteo", "dlrm", "training"],
    doc_md=__doc__,
    params={
        "train_days": Param("", type="string", pattern=r"^$|^\d+(-\d+)?(,\d+(-\d+)?)*$", title="Train days",
                            description="Criteo days to train on: ranges and lists, e.g. '0-22' or '0-3,5'. "
                                        "Empty = the window_days days before the test day."),
        "test_day": Param(None, type=["null", "integer"], minimum=0, maximum=10_000, title="Test day",
                          description="Day held out: first half = test, second half = validation (file order). "
                                      "Empty = the newest ingested day."),
        "window_days": Param(2, type="integer", minimum=1, maximum=366,
                             description="Train days before the test day when train_days is empty."),
        "frequency_threshold": Param(15, type="integer", minimum=0, maximum=1_000_000,
                                     description="Keep categorical values seen at least this often in the window "
                                                 "(0 = keep all); rarer values map to id 0."),
        "threshold_overrides": Param("", type="string", pattern=r"^$|^cat_\d{1,2}:\d+(,cat_\d{1,2}:\d+)*$",
                                     description="Per-column thresholds, e.g. 'cat_3:2,cat_7:0'."),
        "dictionary_days": Param("train", type="string", enum=["train", "all"],
                                 description="Count values over the train days only, or also the test day "
                                             "(NVIDIA's scripts do 'all', which leaks the test vocabulary)."),
        "bottom_mlp": Param("512,256,128", type="string", pattern=_MLP,
                            description="Bottom MLP widths; the last one is the embedding dimension."),
        "top_mlp": Param("1024,1024,512,256,1", type="string", pattern=_MLP,
                         description="Top MLP widths; must end in 1."),
        "batch_size": Param(4096, type="integer", minimum=1, maximum=1 << 20,
                            description="Global training batch, split across processes."),
        "lr": Param(1.0, type="number", exclusiveMinimum=0, maximum=1000, description="Base SGD learning rate."),
        "epochs": Param(1, type="integer", minimum=1, maximum=100, description="Passes over the training data."),
        "warmup_steps": Param(20, type="integer", minimum=0, description="Linear warmup steps."),
        "decay_start_step": Param(40, type="integer", minimum=0, description="Step where polynomial decay starts."),
        "decay_steps": Param(20, type="integer", minimum=0, description="Steps of polynomial decay (0 = none)."),
        "limit_train_batches": Param(None, type=["null", "integer"], minimum=1,
                                     description="Stop each epoch after this many steps (empty = whole epoch)."),
        "checkpoint_every_steps": Param(50, type="integer", minimum=0,
                                        description="Checkpoint interval in steps; a retried train task resumes "
                                                    "from the last one (0 = only at the end)."),
        "log_every_steps": Param(10, type="integer", minimum=1, description="Progress line interval in steps."),
        "seed": Param(12345, type="integer", minimum=0, description="Seed for weights and batch order."),
        "nproc": Param(1, type="integer", minimum=1, maximum=64,
                       description="Training processes (torchrun --nproc_per_node)."),
        "device": Param("cpu", type="string", enum=["cpu", "cuda", "auto"], description="Training device."),
        "amp": Param(False, type="boolean", description="Mixed precision: fp16 on CUDA, bf16 autocast on CPU."),
        "min_auc": Param(0.70, type="number", minimum=0, maximum=1,
                         description="Publish only if test AUC reaches this."),
        "max_regression": Param(0.005, type="number", minimum=0, maximum=1,
                                description="Publish only if AUC is at most this much below the published model."),
        "model_name": Param("criteo_dlrm", type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                            description="Name under which versions are published."),
        "publish_uri": Param("", type="string", pattern=r"^$|^(s3://|/)[A-Za-z0-9_./-]+$",
                             description="Directory or s3://bucket/prefix; empty = RECFLOW_PUBLISH_URI or "
                                         "<data root>/published."),
        "aws_conn_id": Param("aws_default", type="string", pattern=r"^[A-Za-z0-9_.-]{1,200}$",
                             description="Airflow connection with S3 credentials (s3:// publish URIs)."),
    },
)
def criteo_dlrm():
    @task
    def resolve_window(**context) -> dict:
        from tasks.criteo_dlrm import resolve_window as resolve
        from tasks.dag_support import fail_without_retry

        params = context["params"]
        return fail_without_retry(ValueError)(resolve)(load_settings(), params["train_days"], params["test_day"],
                                                       params["window_days"])

    @task(**SPARK_TASK)
    def build_dictionary(window: dict, **context) -> dict:
        from spark_jobs.criteo_dictionary import parse_threshold_overrides
        from tasks.criteo_dlrm import run_paths
        from tasks.criteo_preprocess import build_dictionary as build

        settings, params = load_settings(), context["params"]
        return build(settings, run_paths(settings, context["run_id"]).dictionary, window["train_days"],
                     window["test_day"], frequency_threshold=params["frequency_threshold"],
                     threshold_overrides=parse_threshold_overrides(params["threshold_overrides"]),
                     dictionary_days=params["dictionary_days"], spark_master=spark_master())

    @task(**SPARK_TASK)
    def transform(window: dict, dictionary: dict, **context) -> dict:
        from tasks.criteo_dlrm import run_paths
        from tasks.criteo_preprocess import transform_dataset

        settings, params = load_settings(), context["params"]
        paths = run_paths(settings, context["run_id"])
        return transform_dataset(settings, paths.dataset, paths.dictionary, window["train_days"], window["test_day"],
                                 seed=params["seed"], spark_master=spark_master())

    @task
    def validate_dataset(dataset: dict, **context) -> dict:
        from tasks.criteo_dlrm import run_paths
        from tasks.criteo_preprocess import DatasetInvalid, validate_dataset as check
        from tasks.dag_support import fail_without_retry

        return fail_without_retry(DatasetInvalid)(check)(run_paths(load_settings(), context["run_id"]).dataset)

    @task(**TRAIN_TASK)
    def train(validated: dict, **context) -> dict:
        from tasks.criteo_dlrm import train as run_training

        return run_training(load_settings(), context["run_id"], dict(context["params"]))

    @task
    def evaluate(trained: dict, **context) -> dict:
        from tasks.criteo_dlrm import evaluate as run_evaluation

        return run_evaluation(load_settings(), context["run_id"])

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def gate(window: dict, metrics: dict, **context) -> bool:
        from tasks.criteo_dlrm import gate as decide

        return decide(load_settings(), context["run_id"], metrics, dict(context["params"]), window)["passed"]

    @task
    def publish(window: dict, metrics: dict, **context) -> dict:
        from tasks.criteo_dlrm import lineage, publish as push

        settings, params = load_settings(), context["params"]
        doc = lineage(settings, context["run_id"], dict(params), window["train_days"], window["test_day"])
        return push(settings, context["run_id"], context["dag_run"].run_after, metrics, doc,
                    model_name=params["model_name"], store_uri=params["publish_uri"] or None,
                    aws_conn_id=params["aws_conn_id"])

    window = resolve_window()
    dataset = transform(window, build_dictionary(window))
    metrics = evaluate(train(validate_dataset(dataset)))
    gate(window, metrics) >> publish(window, metrics)


criteo_dlrm()
