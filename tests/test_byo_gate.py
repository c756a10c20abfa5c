"""byo_dlrm's gate against a published BYO model, through the pipeline's own step functions (no scheduler): run A
fetches, validates, transcodes (arrow engine), trains a tiny DLRM (torchrun, 1 process), evaluates and publishes.
Run B, on the same CSV files, is gated against A: the production model is scored on B's test rows (the same rows A
was evaluated on, so its AUC is A's to the last digit). Run C's data has another layout (a larger `auto`
cardinality): A cannot read its rows, and the gate falls back to A's recorded AUC and says so.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.byo import pipeline
from tasks.byo.demo import write_demo_source
from tasks.core.config import Settings

pytestmark = pytest.mark.slow

TINY = {"profile": "demo", "bottom_mlp": "8,4", "top_mlp": "8,1", "batch_size": 256, "lr": 0.5, "epochs": 1,
        "checkpoint_every_steps": 0, "log_every_steps": 5, "min_auc": 0.5, "max_regression": 0.01, "nproc": 1,
        "device": "cpu", "engine": "arrow"}


def _prepare(settings: Settings, run_id: str, spec_path: Path) -> dict:
    """resolve_run -> fetch -> validate -> transcode (arrow) for one run; returns the resolved run."""
    run = pipeline.resolve_run(settings, {"spec_uri": spec_path.as_uri(), **TINY})
    fetched = pipeline.fetch_sources(settings, run_id, run)
    pipeline.validate(settings, run_id, fetched)
    dataset = pipeline.transcode(settings, run_id, engine="arrow")
    assert dataset["engine"] == "arrow"
    pipeline.validate_dataset(pipeline.run_paths(settings, run_id).dataset)
    return run


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Settings, Path, dict]:
    root = tmp_path_factory.mktemp("byo-gate").resolve()
    settings = Settings(data_root=root, profile="demo")
    spec_path = write_demo_source(root / "incoming", 3000, 1000, seed=21)
    run = _prepare(settings, "run_a", spec_path)
    pipeline.train(settings, "run_a", run)
    metrics = pipeline.evaluate(settings, "run_a", run)
    assert pipeline.SPEC.gate(settings, "run_a", metrics, run, model_name="byo_gate_test")["passed"]
    doc = pipeline.SPEC.lineage(settings, "run_a", run, TINY)
    pipeline.SPEC.publish(settings, "run_a", datetime(2026, 11, 27, tzinfo=timezone.utc), metrics, doc,
                          run=run, model_name="byo_gate_test")
    return settings, spec_path, metrics


def test_the_gate_scores_the_published_byo_model_on_the_candidates_rows(published):
    settings, spec_path, metrics_a = published
    run = _prepare(settings, "run_b", spec_path)
    candidate = {**metrics_a, "auc": metrics_a["auc"] - 0.005}  # within max_regression of A
    record = pipeline.SPEC.gate(settings, "run_b", candidate, run, model_name="byo_gate_test")
    assert record["baseline_basis"].endswith(f"scored on the same {metrics_a['rows']} test rows"), record
    assert record["baseline_metrics"]["auc"] == metrics_a["auc"]  # A on the same rows: its own AUC, exactly
    assert record["baseline_metrics"]["rows"] == metrics_a["rows"]
    assert record["passed"]
    worse = pipeline.SPEC.gate(settings, "run_b", {**metrics_a, "auc": metrics_a["auc"] - 0.05}, run,
                          model_name="byo_gate_test")
    assert not worse["passed"] and "scored on the same" in worse["baseline_basis"]


def test_a_published_model_of_another_layout_is_compared_by_its_recorded_auc(published, tmp_path):
    settings, _, metrics_a = published
    wider = write_demo_source(settings.data_root / "incoming-wider", 3000, 1000, seed=22)
    catpart = wider.parent / "test" / "catpart0.csv"
    lines = catpart.read_text().splitlines()
    lines[0] = "1,4321,1"  # an `auto` cardinality grows: another embedding table size
    catpart.write_text("\n".join(lines) + "\n")
    run = _prepare(settings, "run_c", wider)
    record = pipeline.SPEC.gate(settings, "run_c", metrics_a, run, model_name="byo_gate_test")
    assert "recorded auc" in record["baseline_basis"] and "another layout" in record["baseline_basis"], record
    assert record["baseline_auc"] == pytest.approx(metrics_a["auc"])
