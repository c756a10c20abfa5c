"""The tasks every training pipeline's DAG shares (resolve_run → … → train → evaluate → gate → publish, then prune
where its runs hold datasets of their own), made once from the name of the pipeline's steps module, whose `SPEC`
(tasks.release.pipeline.TrainingPipeline) says what is its own. The DAG file keeps the rest (its preprocessing
tasks, its params, the wiring).

Parse-cheap: the steps module is imported inside the task bodies, never at parse time.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.dagkit import MODEL_TASK, TRAIN_TASK, fail_without_retry, spark_master

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingTasks:
    resolve_run: Any
    train: Any
    evaluate: Any
    gate: Any
    publish: Any
    prune: Any
    reopen: Callable[[str], None]  # called first by the task that rebuilds a run's pruned outputs (rebuilt_by)
    not_pruned: Callable[[str], None]  # called first by the tasks after that one, and by the shared ones


def _not_found(exc: BaseException) -> bool:
    """The execution API's DAG run state route answered that the run does not exist (its 404 with reason
    `not_found`; a 404 of any other kind, a routing one, is not that): in a task under the supervisor an
    AirflowRuntimeError whose detail carries the status and the route's body, in-process (`dag.test()`) the API
    client's ServerResponseError with the route's detail."""
    if getattr(getattr(exc, "response", None), "status_code", None) == 404:
        detail = getattr(exc, "detail", None)
    else:
        error = getattr(getattr(exc, "error", None), "detail", None)
        if not isinstance(error, dict) or error.get("status_code") != 404:
            return False
        body = error.get("detail")
        detail = body.get("detail") if isinstance(body, dict) else None
    return isinstance(detail, dict) and detail.get("reason") == "not_found"


def attempts_time_left(ti: Any) -> dict[str, float]:
    """Seconds a task has for its work: `time_budget_s` over this attempt and the retries it has left (its
    execution_timeout each; what a training that resumes from its checkpoints has), `attempt_time_s` this attempt
    alone (what one that starts over has); 0 when it has no timeout."""
    timeout = getattr(ti.task, "execution_timeout", None)
    if not timeout:
        return {"time_budget_s": 0.0, "attempt_time_s": 0.0}
    attempts = max(1, int(ti.max_tries) - int(ti.try_number) + 2)  # try_number counts from 1; max_tries = retries
    return {"time_budget_s": timeout.total_seconds() * attempts, "attempt_time_s": timeout.total_seconds()}


def training_tasks(steps_module: str, *, record_failure: Callable[[dict], None],
                   params_of: Callable[[dict], dict] | None = None) -> TrainingTasks:
    """The shared tasks of a DAG whose steps live in `steps_module`. `params_of(context)` is what resolve_run
    is handed (default: the run's params; a snapshot pipeline adds the snapshot an asset event announced)."""
    from airflow.sdk import task

    def spec() -> Any:
        return importlib.import_module(steps_module).SPEC

    def settings() -> Any:
        from tasks.core.config import load_settings

        return load_settings()

    def not_pruned(run_id: str) -> None:
        """A task of a run whose dataset retention deleted fails at once, saying what to clear (no retry)."""
        from tasks.release.runs import RunPruned, check_not_pruned

        pipeline = spec()
        fail_without_retry(RunPruned)(check_not_pruned)(settings(), pipeline.name, pipeline.paths, run_id)

    def reopen(run_id: str) -> None:
        from tasks.release.runs import reopen as reopen_run

        pipeline = spec()
        reopen_run(settings(), pipeline.name, pipeline.paths, run_id)

    @task.short_circuit
    def resolve_run(**context) -> dict | None:
        pipeline = spec()
        run_type = str(getattr(context["dag_run"].run_type, "value", context["dag_run"].run_type))
        params = params_of(context) if params_of else dict(context["params"])
        # The spec's bad_input (an unknown profile, a bad knob value, a missing snapshot): refused before any work.
        return fail_without_retry(*pipeline.bad_input)(pipeline.resolve_run)(settings(), params, run_type,
                                                                            spark_master=spark_master())

    @task(**TRAIN_TASK)
    def train(run: dict, validated: dict, **context) -> dict:
        from tasks.core.launch import CannotRunHere, ModelTooLarge, TrainingTooSlow

        not_pruned(context["run_id"])
        budget = attempts_time_left(context["ti"])  # a DLRM trainer stops early past it (dlrm_knobs.time_budget)
        refused = fail_without_retry(ModelTooLarge, CannotRunHere, TrainingTooSlow)
        return refused(spec().train)(settings(), context["run_id"], {**run, **budget})

    @task(**MODEL_TASK)
    def evaluate(run: dict, trained: dict, **context) -> dict:
        from tasks.core.launch import CannotRunHere

        not_pruned(context["run_id"])
        # The evaluator's refusal of the node (the run's device cuda on a CPU build) does not get better on retry.
        return fail_without_retry(CannotRunHere)(spec().evaluate)(settings(), context["run_id"], run, trained)

    @task.short_circuit(**MODEL_TASK, ignore_downstream_trigger_rules=False, on_failure_callback=record_failure)
    def gate(run: dict, metrics: dict, **context) -> bool:
        from tasks.core.config import NotAllowed
        from tasks.core.launch import CannotRunHere

        not_pruned(context["run_id"])
        params = context["params"]
        # Another pipeline's model name, a production version changed in the store: no retry makes them right.
        return fail_without_retry(CannotRunHere, NotAllowed)(spec().gate)(settings(), context["run_id"], metrics, run,
                                                              model_name=params["model_name"],
                                                              aws_conn_id=params["aws_conn_id"])["passed"]

    @task(on_failure_callback=record_failure)
    def publish(run: dict, metrics: dict, **context) -> dict:
        from tasks.core.config import NotAllowed
        from tasks.release.publish import VersionConflict

        not_pruned(context["run_id"])
        pipeline, current, params = spec(), settings(), context["params"]
        doc = pipeline.lineage(current, context["run_id"], run, dict(params))
        return fail_without_retry(NotAllowed, VersionConflict)(pipeline.publish)(
            current, context["run_id"], context["dag_run"].run_after, metrics, doc, run=run,
            model_name=params["model_name"], store_uri=params["publish_uri"] or None,
            aws_conn_id=params["aws_conn_id"])

    # After publish, also when the gate held the model back (publish skipped); not after a failure, whose run keeps
    # its dataset for the retry.
    @task(trigger_rule="none_failed")
    def prune(**context) -> dict:
        from tasks.release.runs import prune as prune_runs

        pipeline, ti = spec(), context["ti"]

        def run_state(run_id: str) -> str | None:
            try:
                state = ti.get_dagrun_state(ti.dag_id, run_id)  # this DAG's runs: they share this folder
            except Exception as exc:  # noqa: BLE001 - whatever the API says, the run keeps its outputs unless 404
                if _not_found(exc):
                    return "absent"  # deleted from Airflow's database (`airflow db clean`): no one can clear it
                log.info("the state of run %s is unknown (%s): it keeps its outputs", run_id, exc)
                return None
            return str(getattr(state, "value", state))

        return prune_runs(settings(), pipeline.name, pipeline.paths, context["run_id"], run_state)

    return TrainingTasks(resolve_run=resolve_run, train=train, evaluate=evaluate, gate=gate, publish=publish,
                         prune=prune, reopen=reopen, not_pruned=not_pruned)


def snapshot_params(param: str, snapshot_of_run: Callable[[dict], str | None]) -> Callable[[dict], dict]:
    """params_of for a snapshot pipeline: its `param` names the snapshot the run trains (the form's, else the
    announcing asset event's)."""
    return lambda context: {**context["params"], param: snapshot_of_run(context)}
