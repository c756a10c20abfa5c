"""What the snapshot pipelines' end-to-end tests check alike: a training run that trained on two workers, its
published version, and a second run gated against production on its own rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.core import layout
from tests.conftest import run_dag


def check_trained_on_two_workers(env: dict[str, str], run: dict, pipeline: str) -> tuple[Path, dict[str, Any]]:
    """A training DAG run whose every task succeeded and whose trainer ran 2 workers and drew its curves; its run
    folder and its evaluation's metrics."""
    assert run["state"] == "success", run["log"][-6000:]
    assert all(t["state"] == "success" for t in run["tasks"].values()), run["tasks"]
    run_dir = layout.run_dir(Path(env["RECFLOW_DATA_ROOT"]), pipeline, run["run_id"])
    trained = json.loads((run_dir / "train" / "metrics.json").read_text())
    assert trained["workers"] == 2
    assert (run_dir / "train" / "training_curves.png").stat().st_size > 0
    return run_dir, json.loads((run_dir / "eval" / "metrics.json").read_text())


def latest_published(env: dict[str, str], pipeline: str) -> tuple[Path, set[str], dict[str, Any]]:
    """The pipeline's latest published version: its folder, the files it holds, its lineage."""
    store = Path(env["RECFLOW_DATA_ROOT"]) / "published" / pipeline
    version = store / "versions" / json.loads((store / "latest.json").read_text())["version"]
    files = {p.relative_to(version).as_posix() for p in version.rglob("*") if p.is_file()}
    return version, files, json.loads((version / "lineage.json").read_text())


def check_gated_against_production(env: dict[str, str], first_run: dict, pipeline: str, cache: Path,
                                   conf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A second run that changes only model knobs (`conf`): it succeeds, reuses the first run's preprocessed data
    (the entries of `cache` stay as they were: found complete) and is gated against production scored on its own
    rows. Returns (production's metrics as the gate scored them, the first run's own evaluation)."""
    assert first_run["state"] == "success", first_run["log"][-4000:]
    root = Path(env["RECFLOW_DATA_ROOT"])
    cached = sorted(cache.iterdir())
    second = run_dag(env, pipeline, conf)
    assert second["state"] == "success", second["log"][-6000:]
    assert sorted(cache.iterdir()) == cached
    gate = json.loads((layout.run_dir(root, pipeline, second["run_id"]) / "gate" / "gate.json").read_text())
    assert gate["baseline_basis"].startswith("production ") and "scored on the same" in gate["baseline_basis"], gate
    first_metrics = json.loads((layout.run_dir(root, pipeline, first_run["run_id"]) / "eval" / "metrics.json")
                               .read_text())
    return gate["baseline_metrics"], first_metrics
