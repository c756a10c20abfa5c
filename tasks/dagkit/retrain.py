"""A trigger decided at run time: the Airflow glue of "retrain once a complete window of new data has landed".

`TriggerWhenReady` is a TriggerDagRunOperator whose run id, conf and note come from a plain function called when the
task runs (`decide(context)` -> `TriggerDecision`, or a string: the reason to skip). A dataset's ingest DAG ends with
one as a teardown, so the last ingest run to finish (whatever happened to it) decides whether a training run
starts; the run id is deterministic per window, so two ingest runs deciding at the same moment create one run
(`skip_when_already_exists`). docs/ARCHITECTURE.md, "When to retrain", says why this and not asset scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

# Task instance states in which a partition "may still land" ("null": its run exists but the task is not scheduled
# yet, get_ti_count's spelling).
UNFINISHED_TI_STATES = ["null", "scheduled", "queued", "running", "up_for_retry", "up_for_reschedule", "deferred",
                        "restarting"]


@dataclass(frozen=True)
class TriggerDecision:
    run_id: str
    conf: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class TriggerWhenReady(TriggerDagRunOperator):
    """Trigger `trigger_dag_id` as `decide(context)` says, or skip with the reason it returns."""

    def __init__(self, *, decide: Callable[[dict[str, Any]], TriggerDecision | str], **kwargs: Any) -> None:
        super().__init__(skip_when_already_exists=True, openlineage_inject_parent_info=False, **kwargs)
        self.decide = decide

    def execute(self, context: Any) -> Any:
        from airflow.sdk.exceptions import AirflowSkipException

        decision = self.decide(context)
        if isinstance(decision, str):
            self.log.info("%s", decision)  # as the log's own line: the skip's reason is only a structured field
            raise AirflowSkipException(decision)
        self.trigger_run_id, self.conf, self.note = decision.run_id, decision.conf, decision.note
        self.log.info("triggering %s run %s: %s", self.trigger_dag_id, decision.run_id, decision.note)
        return super().execute(context)


def snapshot_decision(context: dict[str, Any], *, param: str, announce_task: str = "announce") -> TriggerDecision | str:
    """A snapshot ingest DAG's train gate: trigger the training DAG on the snapshot the run's announce task named
    (its XCom: {"dataset": name, "snapshot": fingerprint, ...}), conf {param: name, "reason": ...}, one run id per
    validated snapshot (a re-run that validated the same files triggers nothing new). A triggered run waits in the
    queue while the training DAG is at max_active_runs; an asset event arriving then would be dropped
    (apache/airflow#56050), which is why the snapshot pipelines are triggered and not asset-scheduled."""
    event = context["ti"].xcom_pull(task_ids=announce_task)
    if not event or not event.get("dataset") or not event.get("snapshot"):
        return f"no training: {announce_task} named no validated snapshot"
    name, fingerprint = event["dataset"], event["snapshot"]
    dag_run = context["dag_run"]
    reason = f"{dag_run.dag_id} run {dag_run.run_id} validated snapshot {name} (fingerprint {fingerprint[:12]})"
    return TriggerDecision(run_id=f"snapshot__{name}__{fingerprint[:16]}", conf={param: name, "reason": reason},
                           note=f"Train on snapshot {name}. Why: {reason}.")
