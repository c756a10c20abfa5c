"""When criteo_dlrm retrains: once a complete window of new days has landed, at most once per window.

A window is `window_days` train days and the test day right after them (the deployment profile's window_days). It
is complete when every one of its days has a day_stats manifest. criteo_ingest's last task (a teardown, so it runs
whatever happened upstream) asks `decide_retrain`: while any criteo_ingest day is still in flight, the last run to
finish decides; then the newest complete window is trained if its test day is newer than the newest test day the
registry has a trained run for. So a backfill of N days yields one retrain, on the newest complete window, and a
re-run of finished days yields none. The triggered run's conf names the window and why it started, and so does its
note in the UI.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.criteo.window import ingested_days, resolve_window

log = logging.getLogger(__name__)

INGEST_DAG = "criteo_ingest"
TRAIN_DAG = "criteo_dlrm"  # also the pipeline its runs are registered under (tasks.criteo.dlrm.PIPELINE)


def days_text(days: list[int]) -> str:
    """[0, 1, 2] -> '0-2'; [0, 2] -> '0,2' (the train_days param's syntax)."""
    if days == list(range(days[0], days[-1] + 1)):
        return f"{days[0]}-{days[-1]}" if len(days) > 1 else str(days[0])
    return ",".join(map(str, days))


def newest_complete_window(landed: list[int], window_days: int) -> tuple[dict[str, Any] | None, str]:
    """The newest window whose days have all landed ({train_days, test_day}, why), or (None, why not). Newest
    *complete* window, not the newest day: a day that landed beyond a hole must not block a backfilled window."""
    if not landed:
        return None, "no Criteo day has landed yet"
    have = set(landed)
    for test_day in reversed(landed):
        train = list(range(test_day - window_days, test_day))
        if train[0] >= 0 and have.issuperset(train):
            why = f"days {days_text(train)} + test day {test_day} have all landed"
            if test_day != landed[-1]:
                why += f" (newer days {[d for d in landed if d > test_day]} have incomplete windows)"
            return {"train_days": train, "test_day": test_day}, why
    newest = landed[-1]
    missing = sorted(set(range(max(0, newest - window_days), newest)) - have)
    return None, (f"no complete window of {window_days} train days: the newest day {newest} "
                  + (f"misses days {missing}" if missing else f"has fewer than {window_days} days before it"))


def last_trained_test_day(settings, model_name: str = TRAIN_DAG) -> int | None:
    """The newest test day of a criteo_dlrm run of `model_name` (the one automatic runs publish under, the DAG's
    default) the registry records as trained (gated out and published count): a run under another name, an
    experiment, does not make the production model's windows old."""
    from tasks.release.runs import trained_windows

    windows = trained_windows(settings, TRAIN_DAG, model_name)
    days = [w["test_day"] for w in windows if w.get("test_day") is not None]
    return max(days) if days else None


def stale_reason(window: dict[str, Any], last_test_day: int | None) -> str | None:
    if last_test_day is not None and window["test_day"] <= last_test_day:
        return f"test day {window['test_day']} is not newer than the last trained window's ({last_test_day})"
    return None


def retrain_run_id(window: dict[str, Any]) -> str:
    return f"retrain__test_{window['test_day']}__train_{days_text(window['train_days'])}"


def decide_retrain(context: dict[str, Any]):
    """criteo_ingest's retrain gate: a TriggerDecision for criteo_dlrm, or the reason not to retrain now."""
    from tasks.core.config import load_settings
    from tasks.criteo.profiles import PROFILES
    from tasks.dagkit.retrain import UNFINISHED_TI_STATES, TriggerDecision

    ti = context["ti"]
    # Only this run active: it is the last to finish and decides (a day_stats task left unfinished in a run that is
    # no longer active cannot block every gate). Otherwise any unfinished day_stats means "not yet"; of several
    # runs finishing together the first decides and the others find its run id taken.
    active = ti.get_dr_count(dag_id=INGEST_DAG, states=["queued", "running"])
    in_flight = 0 if active <= 1 else ti.get_ti_count(dag_id=INGEST_DAG, task_ids=["day_stats"],
                                                      states=UNFINISHED_TI_STATES)
    if in_flight:
        return f"no retrain yet: {in_flight} {INGEST_DAG} day(s) still in flight; the last run to finish decides"
    settings = load_settings()
    window, why = newest_complete_window(ingested_days(settings), PROFILES[settings.profile]["window_days"])
    if window is None:
        return f"no retrain: {why}"
    last = last_trained_test_day(settings)
    if stale := stale_reason(window, last):
        return f"no retrain: {stale}"
    dag_run = context["dag_run"]
    reason = (f"{INGEST_DAG} run {dag_run.run_id} finished with no other day in flight; {why}; newer than the last "
              f"trained window ({'test day %d' % last if last is not None else 'none'})")
    train = days_text(window["train_days"])
    return TriggerDecision(run_id=retrain_run_id(window),
                           conf={"train_days": train, "test_day": window["test_day"], "reason": reason},
                           note=f"Retrain on days {train}, test day {window['test_day']}. Why: {reason}.")


def plan_run(settings, params: dict[str, Any], window_days: int, run_type: str) -> tuple[dict[str, Any] | None, str]:
    """criteo_dlrm's own check, for every way a run starts: ({train_days, test_day} or None to skip, why).

    - from the retrain gate (conf with a reason): re-checked, since another run may have trained it meanwhile;
    - explicit train_days / test_day without a reason: the operator's choice, trained as asked;
    - the cron safety net (or any run not started by hand) with an empty conf: the newest complete window, if it is
      newer than the last trained one;
    - a manual run with an empty window: the newest complete window, trained as asked even if it was trained
      before (a person trying another framework or knob on the current window expects a run, not a skip).
    """

    if params.get("test_day") is not None or params.get("train_days"):
        window = resolve_window(settings, params.get("train_days") or "", params.get("test_day"), window_days)
        if params.get("reason"):
            if stale := stale_reason(window, last_trained_test_day(settings, params.get("model_name") or TRAIN_DAG)):
                return None, f"skipped: {stale}"
            return window, params["reason"]
        return window, f"{run_type} run with an explicit window"
    window, why = newest_complete_window(ingested_days(settings), window_days)
    if window is None:
        return None, f"skipped: {why}"
    if run_type != "manual":
        if stale := stale_reason(window, last_trained_test_day(settings, params.get("model_name") or TRAIN_DAG)):
            return None, f"skipped: {stale}"
    return window, f"{run_type} run: {why}"
