"""The tasks every snapshot-trained pipeline's DAG shares (resolve_run → … → train → evaluate → gate → publish),
made once from the name of the pipeline's steps module. The DAG file keeps what is its own (the preprocessing
tasks, the params, the wiring); the steps module provides, with the same signatures in every pipeline:

    resolve_run(settings, params, run_type) -> dict | None
    train(settings, run_id, run) -> dict
    evaluate(settings, run_id, run, trained) -> dict
    gate(settings, run_id, metrics, run, *, model_name, aws_conn_id) -> {"passed": bool, ...}
    lineage(settings, run_id, run, params) -> dict
    publish(settings, run_id, when, metrics, lineage_doc, *, run, model_name, store_uri, aws_conn_id) -> dict

Parse-cheap: the steps module is imported inside the task bodies, never at parse time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.dagkit import TRAIN_TASK, fail_without_retry


@dataclass(frozen=True)
class TrainingTasks:
    resolve_run: Any
    train: Any
    evaluate: Any
    gate: Any
    publish: Any


def snapshot_training_tasks(steps_module: str, *, snapshot_param: str,
                            snapshot_of_run: Callable[[dict], str | None],
                            record_failure: Callable[[dict], None]) -> TrainingTasks:
    """The five shared tasks of a DAG whose steps live in `steps_module`; `snapshot_of_run(context)` names the
    snapshot a run trains (its `snapshot_param` param, else the announcing asset event's)."""
    from airflow.sdk import task

    def steps() -> Any:
        return importlib.import_module(steps_module)

    def settings() -> Any:
        from tasks.core.config import load_settings

        return load_settings()

    @task.short_circuit
    def resolve_run(**context) -> dict | None:
        from tasks.release.runs import SnapshotMissing

        run_type = str(getattr(context["dag_run"].run_type, "value", context["dag_run"].run_type))
        params = {**context["params"], snapshot_param: snapshot_of_run(context)}
        # ValueError: an unknown profile (ProfileError) or a bad knob value, refused before any work.
        return fail_without_retry(SnapshotMissing, ValueError)(steps().resolve_run)(settings(), params, run_type)

    @task(**TRAIN_TASK)
    def train(run: dict, validated: dict, **context) -> dict:
        from tasks.core.launch import ModelTooLarge

        return fail_without_retry(ModelTooLarge)(steps().train)(settings(), context["run_id"], run)

    @task
    def evaluate(run: dict, trained: dict, **context) -> dict:
        return steps().evaluate(settings(), context["run_id"], run, trained)

    @task.short_circuit(ignore_downstream_trigger_rules=False, on_failure_callback=record_failure)
    def gate(run: dict, metrics: dict, **context) -> bool:
        params = context["params"]
        return steps().gate(settings(), context["run_id"], metrics, run, model_name=params["model_name"],
                            aws_conn_id=params["aws_conn_id"])["passed"]

    @task(on_failure_callback=record_failure)
    def publish(run: dict, metrics: dict, **context) -> dict:
        from tasks.core.config import NotAllowed

        module, current, params = steps(), settings(), context["params"]
        doc = module.lineage(current, context["run_id"], run, dict(params))
        return fail_without_retry(NotAllowed)(module.publish)(
            current, context["run_id"], context["dag_run"].run_after, metrics, doc, run=run,
            model_name=params["model_name"], store_uri=params["publish_uri"] or None,
            aws_conn_id=params["aws_conn_id"])

    return TrainingTasks(resolve_run=resolve_run, train=train, evaluate=evaluate, gate=gate, publish=publish)
