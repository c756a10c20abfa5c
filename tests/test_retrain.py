"""When criteo_dlrm retrains (tasks/criteo/retrain.py): the newest complete window, once per window, only when no
ingest day is in flight. The real-scheduler test (a 4-day backfill -> one retrain) is in tests/integration."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.core.config import Settings
from tasks.core.storage import Manifest, write_manifest
from tasks.criteo import layout
from tasks.criteo.dlrm import PIPELINE
from tasks.release.steps import open_registry
from tasks.criteo.retrain import decide_retrain, newest_complete_window, plan_run, retrain_run_id
from tasks.dagkit.retrain import TriggerDecision


def land(root: Path, *days: int) -> None:
    for day in days:
        out = layout.stats_day(root, day)
        out.mkdir(parents=True)
        write_manifest(out, Manifest(kind="criteo_day_stats", inputs={"day": day}))


def trained(settings: Settings, run_id: str, train_days: list[int], test_day: int, status: str = "trained",
            model_name: str = "criteo_dlrm") -> None:
    with open_registry(settings) as registry:
        registry.register_run(PIPELINE, model_name, run_id, dataset="criteo",
                              window={"train_days": train_days, "test_day": test_day}, config_hash="c")
        registry.set_run_status(PIPELINE, run_id, status)


def test_newest_complete_window_skips_days_beyond_a_hole():
    assert newest_complete_window([0, 1, 2, 3], 2) == ({"train_days": [1, 2], "test_day": 3},
                                                       "days 1-2 + test day 3 have all landed")
    window, why = newest_complete_window([0, 1, 2, 7], 2)  # yesterday landed while history is being backfilled
    assert window == {"train_days": [0, 1], "test_day": 2} and "newer days [7] have incomplete windows" in why
    assert newest_complete_window([5, 7], 2) == (None, "no complete window of 2 train days: the newest day 7 "
                                                       "misses days [6]")
    assert newest_complete_window([0], 2)[0] is None and newest_complete_window([], 2)[0] is None


class FakeTi:
    """The two execution-API counts the gate asks for (RuntimeTaskInstance.get_dr_count / get_ti_count)."""

    def __init__(self, in_flight: int, active_runs: int) -> None:
        self.in_flight, self.active_runs, self.asked = in_flight, active_runs, None

    def get_dr_count(self, dag_id: str, states: list[str]) -> int:
        assert dag_id == "criteo_ingest" and set(states) == {"queued", "running"}
        return self.active_runs

    def get_ti_count(self, **kwargs) -> int:
        self.asked = kwargs
        return self.in_flight


def context(in_flight: int = 0, active_runs: int = 1) -> dict:
    return {"ti": FakeTi(in_flight, active_runs), "dag_run": SimpleNamespace(run_id="backfill__2026-01-04")}


@pytest.fixture
def deployment(tmp_path, monkeypatch) -> Settings:
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("RECFLOW_PROFILE", "demo")  # window_days 2
    return Settings(data_root=tmp_path.resolve(), profile="demo")


def test_the_last_ingest_run_to_finish_triggers_one_retrain_on_the_newest_window(deployment):
    land(deployment.data_root, 0, 1, 2, 3)
    busy = context(in_flight=2, active_runs=3)
    assert decide_retrain(busy) == ("no retrain yet: 2 criteo_ingest day(s) still in flight; the last run to "
                                    "finish decides")
    assert busy["ti"].asked["dag_id"] == "criteo_ingest" and busy["ti"].asked["task_ids"] == ["day_stats"]
    # The last active run decides even if a day_stats of a run no longer active was left unfinished.
    decision = decide_retrain(context(in_flight=1, active_runs=1))
    assert isinstance(decision, TriggerDecision)
    assert decision.run_id == "retrain__test_3__train_1-2" == retrain_run_id({"train_days": [1, 2], "test_day": 3})
    assert decision.conf["train_days"] == "1-2" and decision.conf["test_day"] == 3
    assert "days 1-2 + test day 3 have all landed" in decision.conf["reason"]
    assert decision.note.startswith("Retrain on days 1-2, test day 3. Why: criteo_ingest run backfill__2026-01-04")


def test_a_window_already_trained_is_not_trained_again(deployment):
    land(deployment.data_root, 0, 1, 2, 3)
    trained(deployment, "r1", [1, 2], 3, status="gated_out")  # a gated-out window was trained all the same
    assert decide_retrain(context()) == ("no retrain: test day 3 is not newer than the last trained window's (3)")
    land(deployment.data_root, 4)
    assert decide_retrain(context()).run_id == "retrain__test_4__train_2-3"


def test_an_experiment_under_another_model_name_does_not_count_as_trained(deployment):
    """A run an operator tried under model_name=dlrm_try on the newest window leaves the production model's window new:
    the retrain gate and the cron still train it (under criteo_dlrm), and a run of dlrm_try sees its own."""
    land(deployment.data_root, 0, 1, 2, 3)
    trained(deployment, "try-1", [1, 2], 3, status="gated_out", model_name="dlrm_try")
    assert decide_retrain(context()).run_id == "retrain__test_3__train_1-2"
    assert plan_run(deployment, {}, 2, "scheduled")[0] == {"train_days": [1, 2], "test_day": 3}
    assert plan_run(deployment, {"model_name": "dlrm_try"}, 2, "scheduled")[0] is None


def test_a_failed_or_unfinished_run_does_not_count_as_trained(deployment):
    land(deployment.data_root, 0, 1, 2)
    trained(deployment, "r1", [0, 1], 2, status="failed")
    assert decide_retrain(context()).run_id == "retrain__test_2__train_0-1"


def test_the_training_dag_rechecks_and_its_cron_trains_only_something_new(deployment):
    land(deployment.data_root, 0, 1, 2, 3)
    assert plan_run(deployment, {}, 2, "scheduled") == ({"train_days": [1, 2], "test_day": 3},
                                                        "scheduled run: days 1-2 + test day 3 have all landed")
    gate_conf = {"train_days": "1-2", "test_day": 3, "reason": "criteo_ingest run x finished ..."}
    assert plan_run(deployment, gate_conf, 2, "manual")[1] == "criteo_ingest run x finished ..."
    trained(deployment, "r1", [1, 2], 3)
    assert plan_run(deployment, {}, 2, "scheduled") == (None, "skipped: test day 3 is not newer than the last "
                                                              "trained window's (3)")
    assert plan_run(deployment, gate_conf, 2, "manual")[0] is None  # trained meanwhile by another run
    # A run triggered by hand with the window left empty trains the newest complete window, trained or not.
    assert plan_run(deployment, {}, 2, "manual") == ({"train_days": [1, 2], "test_day": 3},
                                                     "manual run: days 1-2 + test day 3 have all landed")
    # An operator's explicit window is trained as asked, even an old one.
    assert plan_run(deployment, {"train_days": "0-1", "test_day": 2}, 2, "manual") == (
        {"train_days": [0, 1], "test_day": 2}, "manual run with an explicit window")


def test_a_snapshot_ingests_train_gate_triggers_one_run_per_validated_snapshot():
    """movielens_ingest / outbrain_ingest end with a train gate (a TriggerDagRunOperator: a triggered run waits in
    the queue while the training DAG is busy, where an asset event would be dropped): its run id comes from the
    snapshot's fingerprint, its conf names the snapshot and why; a skipped announce triggers nothing."""
    from tasks.dagkit.retrain import snapshot_decision

    class Ti:
        def __init__(self, event):
            self.event = event

        def xcom_pull(self, task_ids):
            assert task_ids == "announce"
            return self.event

    run = SimpleNamespace(dag_id="outbrain_ingest", run_id="scheduled__2026-11-24")
    event = {"dataset": "kaggle-v2", "snapshot": "11111111222222223333", "rows": 10}
    decision = snapshot_decision({"ti": Ti(event), "dag_run": run}, param="snapshot")
    reason = "outbrain_ingest run scheduled__2026-11-24 validated snapshot kaggle-v2 (fingerprint 111111112222)"
    assert decision == TriggerDecision(run_id="snapshot__kaggle-v2__1111111122222222",
                                       conf={"snapshot": "kaggle-v2", "reason": reason},
                                       note=f"Train on snapshot kaggle-v2. Why: {reason}.")
    assert snapshot_decision({"ti": Ti(None), "dag_run": run}, param="snapshot") == (
        "no training: announce named no validated snapshot")
