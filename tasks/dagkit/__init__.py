"""The Airflow glue every pipeline's DAG file shares (imported only by dags/ and tests): default task arguments,
pools, Celery queues, fail-without-retry for bad input, the Spark master from a connection.

Importing this must stay cheap (no torch, pyspark, tensorflow, no connections): it runs at DAG-parse time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from tasks.core.config import load_settings
from tasks.core.profiles import Knob
from tasks.core.settings_registry import value

SPARK_POOL = "spark"
TRAIN_POOL = "train"


def _queue(variable: str) -> dict[str, str]:
    """A task's Celery queue from the environment at parse time ({} = Airflow's [operators] default_queue).
    LocalExecutor ignores queues; under CeleryExecutor, RECFLOW_TRAIN_QUEUE=gpu sends training (and the tasks
    that load its model) to the GPU workers (docker-compose.yml's `gpu` profile) and RECFLOW_SPARK_QUEUE=gpu the
    Spark jobs (RAPIDS profile)."""
    queue = value(variable).strip()
    return {"queue": queue} if queue else {}


def _timeout(seconds: float) -> dict[str, timedelta]:
    """A task's execution_timeout: past it Airflow fails the attempt (and retries it), so no stalled source,
    hung Spark job or stuck training holds a pool slot forever."""
    return {"execution_timeout": timedelta(seconds=seconds)}


# Every task gets an execution_timeout by kind, from the deployment's settings (RECFLOW_*_TASK_TIMEOUT_S, sized for
# full-scale runs): DEFAULT_ARGS for the light tasks, these for the heavy ones.
_LIMITS = load_settings()
SPARK_TASK: dict[str, Any] = {"pool": SPARK_POOL, **_queue("RECFLOW_SPARK_QUEUE"),
                              **_timeout(_LIMITS.spark_task_timeout_s)}
TRAIN_TASK: dict[str, Any] = {"pool": TRAIN_POOL, **_queue("RECFLOW_TRAIN_QUEUE"),
                              **_timeout(_LIMITS.train_task_timeout_s)}
# The tasks that load a trained model (evaluate, the gate's production score, export): on the training queue, where
# the model fits (a full-size DLRM holds ~16 GB of tables; a GPU worker scores the test rows on its GPU), outside the
# train pool (they hold no training slot) and with the light tasks' timeout.
MODEL_TASK: dict[str, Any] = _queue("RECFLOW_TRAIN_QUEUE")
DOWNLOAD_TASK: dict[str, Any] = _timeout(_LIMITS.download_task_timeout_s)

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "recflow",
    **_timeout(_LIMITS.task_timeout_s),
    "retries": int(value("RECFLOW_TASK_RETRIES")),
    "retry_delay": timedelta(seconds=float(value("RECFLOW_RETRY_DELAY_S"))),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=10),
}


def fail_without_retry(*errors: type[BaseException]) -> Callable:
    """Bad input does not get better on retry: turn these errors into AirflowFailException (no retries)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                from airflow.sdk.exceptions import AirflowFailException

                raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc

        return wrapper

    return decorate


def spark_master(conn_id: str = "spark_default") -> str:
    """The Spark master named by an Airflow connection (host[:port]); local[*] when there is none."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return "local[*]"
    host = conn.host or "local[*]"
    return f"{host}:{conn.port}" if conn.port else host


def _shown(value: Any) -> str:
    return "empty" if value in (None, "") else repr(value)


def knob_params(knobs: Mapping[str, Knob], profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One nullable trigger-form Param per knob: empty means "the profile's value", and the description says what
    each profile sets, so the form shows every knob without a second copy of the defaults."""
    from airflow.sdk import Param

    params = {}
    for name, knob in knobs.items():
        schema = dict(knob.schema)
        schema["type"] = ["null", schema["type"]]
        if "enum" in schema:
            schema["enum"] = [None, *schema["enum"]]
            schema["values_display"] = {"None": "(the profile's value)"}  # the UI would show the word "null"
        by_profile = ", ".join(f"{profile}: {_shown(values[name])}" for profile, values in profiles.items())
        only = {"min": " A run may only raise it above the deployment's (RECFLOW_RELEASE_MIN_VALUE, else "
                       "RECFLOW_PROFILE's value).",
                "max": " A run may only lower it below the deployment's (RECFLOW_RELEASE_MAX_REGRESSION, else "
                       "RECFLOW_PROFILE's value)."}.get(knob.release or "", "")
        params[name] = Param(None, **schema, title=knob.title or name,
                             description=f"{knob.description} Empty = the profile's value ({by_profile}).{only}")
    return params


def profile_param(profiles: Mapping[str, Mapping[str, Any]]) -> Any:
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], enum=[None, *profiles], title="Profile",
                 values_display={"None": "(the deployment's RECFLOW_PROFILE)"},
                 description="Named set of knob values: " + ", ".join(profiles) + ". Empty = the deployment's "
                             "RECFLOW_PROFILE (default full); single knobs below override it.")


def device_param() -> Any:
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], enum=[None, "cpu", "cuda", "auto"], title="Device",
                 values_display={"None": "(the deployment's RECFLOW_TRAIN_DEVICE)"},
                 description="Training and evaluation device. Empty = the deployment's RECFLOW_TRAIN_DEVICE (auto: "
                             "the GPUs where the worker may use them; a worker whose torch or TensorFlow is a CPU "
                             "build there refuses, without retry: choose cpu to train on its CPU).")


def engine_param(engines: tuple[str, ...], env_var: str, description: str, default: str = "spark") -> Any:
    """The preprocessing engine of a pipeline: empty = the deployment's setting (env_var, else `default`, which
    says what the default is)."""
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], enum=[None, *engines], title="Preprocessing engine",
                 values_display={"None": f"(the deployment's {env_var}, else {default})"},
                 description=f"{description} Empty = the deployment's {env_var} (default: {default}).")


def reason_param(set_by: str) -> Any:
    """Why an automatic run started, set by the task that triggers it (`set_by`); a run that carries one is checked
    like an automatic run (nothing new to train: it does nothing)."""
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], maxLength=2000, title="Why this run",
                 description=f"Set by {set_by}. Leave empty when triggering by hand.")


def release_params(model_name: str) -> dict[str, Any]:
    """The params every training DAG's publish step reads: the model's name, where to publish, which connection
    holds the S3 credentials (each checked against the deployment's allow-lists where it is used)."""
    from airflow.sdk import Param

    return {
        "model_name": Param(model_name, type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                            description="Name under which versions are published. A name belongs to the "
                                        "pipeline that published it first: another DAG's run under it is refused."),
        "publish_uri": Param(None, type=["null", "string"], pattern=r"^(s3://|/)[A-Za-z0-9_./-]+$",
                             description="Directory or s3://bucket/prefix. Empty = RECFLOW_PUBLISH_URI or "
                                         "<data root>/published. Must lie under RECFLOW_PUBLISH_ALLOWED "
                                         "(default: the configured store only)."),
        "aws_conn_id": aws_conn_param("s3:// publish URIs"),
    }


def aws_conn_param(used_for: str) -> Any:
    """The Airflow connection holding the S3 credentials a DAG uses for `used_for` (checked against the
    deployment's allow-list where it is used)."""
    from airflow.sdk import Param

    return Param("aws_default", type="string", pattern=r"^[A-Za-z0-9_.-]{1,200}$",
                 description=f"Airflow connection with S3 credentials ({used_for}); one of RECFLOW_ALLOWED_CONN_IDS "
                             "(default: aws_default).")


SOURCE_URL_PATTERN = r"^(file|https?|s3)://[^\s;|&$`]+$"  # the schemes downloads accept; no whitespace or shell syntax


def source_url_param(description: str, pattern: str = SOURCE_URL_PATTERN) -> Any:
    """An ingest DAG's source for one run (file://, http(s)://, s3://; empty = the deployment's source), where the
    download then checks it against the allowed roots and prefixes (`description` says which)."""
    from airflow.sdk import Param

    return Param(None, type=["null", "string"], maxLength=2048, pattern=pattern, title="Source URL",
                 description=description)


def bad_row_budget_param(default: float | None, description: str) -> Any:
    """An ingest DAG's tolerated fraction of malformed rows (quarantined) before validation fails; a None default
    makes it nullable (empty = the deployment's setting, which `description` names)."""
    from airflow.sdk import Param

    return Param(default, type="number" if default is not None else ["null", "number"], minimum=0, maximum=1,
                 title="Bad-row budget", description=description)


def workers_param() -> Any:
    """The number of tf.distribute worker processes of a TensorFlow training task."""
    from airflow.sdk import Param

    return Param(None, type=["null", "integer"], minimum=1, maximum=64, title="Training workers",
                 description="tf.distribute worker processes. Empty = the deployment's RECFLOW_TRAIN_NPROC (1).")


def snapshot_of_run(context: Mapping[str, Any], asset: Any, *, param: str, key: str) -> str | None:
    """The snapshot a training run names: its `param` param, else the newest triggering event of `asset` whose
    extra names one under `key` (an asset-triggered run trains the snapshot that landed), else None (the
    deployment's default snapshot)."""
    name = context["params"].get(param)
    if name:
        return name
    events = context.get("triggering_asset_events")
    try:
        received = list(events[asset]) if events else []
    except (KeyError, TypeError):
        received = []
    for event in reversed(received):
        named = (getattr(event, "extra", None) or {}).get(key)
        if named:
            return named
    return None


def skip_when_nothing_new(downloaded: Mapping[str, Any], validated: Mapping[str, Any], what: str) -> None:
    """An ingest run's announcement is skipped (AirflowSkipException) when the run found nothing new: the raw
    files were already here, verified, and their validation was already done. A scheduled check of an unchanged
    source so starts no retraining."""
    if downloaded.get("cached") and validated.get("cached"):
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"{what}: the same files, already validated by an earlier run: nothing new to "
                                   "train on")
