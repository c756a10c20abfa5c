"""criteo_dlrm's registry statuses that the DAG's failure callback sets: a run that fails after `gate` registered it
ends `failed` (the e2e test in tests/test_e2e_criteo_dlrm.py drives the same path through dag.test())."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.core.config import Settings
from tasks.criteo.dlrm import PIPELINE, SPEC
from tasks.release.steps import open_registry

record_failure = SPEC.record_failure


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_root=tmp_path)


def register(settings: Settings, run_id: str, status: str | None = None) -> None:
    with open_registry(settings, "") as registry:
        registry.register_run(PIPELINE, "criteo_dlrm", run_id, dataset="criteo",
                              window={"train_days": [0, 1], "test_day": 2}, config_hash="c0ffee")
        if status:
            registry.set_run_status(PIPELINE, run_id, status, metrics={"auc": 0.8})


def status(settings: Settings, run_id: str) -> str | None:
    with open_registry(settings, "") as registry:
        record = registry.get_run(PIPELINE, run_id)
    return record and record.status


@pytest.mark.parametrize("before", [None, "trained"])
def test_a_registered_run_that_fails_ends_failed(settings, before) -> None:
    register(settings, "manual__1", before)
    assert record_failure(settings, "manual__1", reason="publish: PublishNotAllowed", registry_conn_id="")
    assert status(settings, "manual__1") == "failed"
    assert not record_failure(settings, "manual__1", registry_conn_id="")  # once is enough


@pytest.mark.parametrize("final", ["published", "gated_out"])
def test_a_finished_run_keeps_its_status(settings, final) -> None:
    register(settings, "manual__2", final)
    assert not record_failure(settings, "manual__2", registry_conn_id="")
    assert status(settings, "manual__2") == final


def test_a_run_that_failed_before_the_gate_is_not_registered(settings) -> None:
    assert not record_failure(settings, "manual__3", registry_conn_id="")
    assert status(settings, "manual__3") is None


def test_a_registry_that_cannot_be_opened_does_not_hide_the_task_error(tmp_path, caplog) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    settings = Settings(data_root=blocked)  # <data root>/registry.db cannot be created
    assert not record_failure(settings, "manual__4", registry_conn_id="")
    assert "could not mark run manual__4 of criteo_dlrm failed in the registry" in caplog.text
