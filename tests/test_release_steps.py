"""tasks.release.steps.gate_run / publish_run as a cleared run meets them: a run cleared after it published (from
its gate, evaluate or earlier) keeps the version it published and its `published` status, even when the rerun's
metrics differ in their last digits (which made every retry of its publish a VersionConflict, and the failure
callback then marked the production version's run failed)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from tasks.core.config import Settings
from tasks.release.steps import gate_run, open_registry, publish_run

PIPELINE, MODEL = "criteo_dlrm", "criteo_dlrm"
WHEN = datetime(2026, 12, 1, 6, tzinfo=timezone.utc)


def _gate(settings: Settings, run_id: str, auc: float) -> dict:
    return gate_run(settings, pipeline=PIPELINE, dataset="criteo", run_id=run_id, model_name=MODEL,
                    metrics={"auc": auc, "rows": 100}, metric="auc", min_value=0.5, max_regression=0.01,
                    window={"test_day": 1}, config_hash="c", gate_dir=settings.data_root / run_id / "gate",
                    score_production=None, registry_conn_id="")


def _publish(settings: Settings, run_id: str, auc: float, when: datetime = WHEN) -> dict:
    run = settings.data_root / run_id
    (run / "model.pt").write_bytes(b"weights of " + run_id.encode())
    files = {"model.pt": run / "model.pt", "gate.json": run / "gate" / "gate.json"}
    return publish_run(settings, pipeline=PIPELINE, run_id=run_id, when=when, metrics={"auc": auc, "rows": 100},
                       lineage_doc={"run_id": run_id}, files=lambda: files, model_name=MODEL, registry_conn_id="")


def test_a_run_cleared_after_it_published_keeps_its_version_and_status(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    monkeypatch.delenv("RECFLOW_REGISTRY_CONN_ID", raising=False)
    settings = Settings(data_root=tmp_path)
    assert _gate(settings, "r1", 0.75)["passed"]
    first = _publish(settings, "r1", 0.75)
    assert not first["cached"] and first["became_latest"]

    # Cleared from evaluate: the re-evaluation differs in its last digits, the re-gate compares r1 with itself.
    regate = _gate(settings, "r1", 0.7500001)
    assert regate["passed"] and regate["baseline_version"] == first["version"]
    with open_registry(settings, "") as registry:
        assert registry.get_run(PIPELINE, "r1").status == "published"  # not set back to trained
    again = _publish(settings, "r1", 0.7500001)
    assert again == {**first, "cached": True}
    with open_registry(settings, "") as registry:
        assert registry.get_run(PIPELINE, "r1").status == "published"
        assert registry.version(MODEL, first["version"])["metrics"]["auc"] == 0.75  # the version is what it was
        assert registry.alias(MODEL)["version"] == first["version"]
    folder = Path(urlparse(first["uri"]).path)  # the first gate's record stays the version's
    assert json.loads((folder / "gate.json").read_text())["baseline_version"] is None

    # A later run publishes as before, and moves latest.
    assert _gate(settings, "r2", 0.76)["passed"]
    second = _publish(settings, "r2", 0.76, datetime(2026, 12, 2, 6, tzinfo=timezone.utc))
    assert not second["cached"] and second["became_latest"] and second["version"] > first["version"]

    # What the demos load: the model by its name in the deployment's store, the registry naming version and digest
    from tasks.release.steps import fetch_model

    local = fetch_model(f"{settings.publish_store.rstrip('/')}/{MODEL}", tmp_path / "cache")
    assert local.name == second["version"] and (local / "model.pt").read_bytes() == b"weights of r2"
