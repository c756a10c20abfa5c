"""What the snapshot pipelines' step tests share: the contract of tasks.release.runs.plan_snapshot_run, checked
through a pipeline's own resolve_run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.storage import Manifest, write_manifest
from tasks.release.steps import open_registry


def check_a_trained_snapshot_is_not_retrained(settings: Settings, resolve_run: Callable[..., dict[str, Any] | None],
                                              pipeline: str, dataset: str, validated_dir: Path,
                                              params: dict[str, Any], source_key: str,
                                              status: str) -> dict[str, Any]:
    """An asset-triggered run of a snapshot and profile already trained (its registry run left at `status`) does
    nothing; a manual run, another profile, or a new snapshot (another `source_key` in the validated manifest's
    inputs) is new work. Returns the first run resolved, for the caller's own checks."""
    write_manifest(validated_dir, Manifest(kind="test", inputs={source_key: "a"}))
    run = resolve_run(settings, params, "asset_triggered")
    with open_registry(settings) as registry:
        registry.register_run(pipeline, pipeline, "r1", dataset=dataset, window=run["window"], config_hash="c")
        registry.set_run_status(pipeline, "r1", status)
    assert resolve_run(settings, params, "asset_triggered") is None
    assert resolve_run(settings, {**params, "reason": "ingest run x validated it"}, "manual") is None  # train gate's
    assert resolve_run(settings, params, "manual") is not None  # by hand: the user asked for it
    assert resolve_run(settings, {**params, "profile": "full"}, "asset_triggered") is not None  # another profile
    # a run of another model name (an experiment) trained it: new work for the pipeline's own model, and the other way
    assert resolve_run(settings, {**params, "model_name": "experiment"}, "asset_triggered") is not None
    with open_registry(settings) as registry:
        registry.register_run(pipeline, "experiment", "r2", dataset=dataset, window=run["window"], config_hash="c")
        registry.set_run_status(pipeline, "r2", status)
    assert resolve_run(settings, {**params, "model_name": "experiment"}, "asset_triggered") is None
    write_manifest(validated_dir, Manifest(kind="test", inputs={source_key: "b"}))
    assert resolve_run(settings, params, "asset_triggered") is not None  # a new snapshot: new work
    return run
