"""Training runs, shared by the pipelines: where a run's outputs go, which windows the registry records as trained,
and, for a pipeline that trains on a validated dataset snapshot, what a run trains on and with and when an
automatic run has nothing new to do.

A pipeline that trains on a sliding window of days plans its window itself; a snapshot pipeline's window is simply
{snapshot name, fingerprint of its validation, profile}. An asset-triggered or scheduled run whose window the
registry already records as trained does nothing; a run triggered by hand always trains.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.layout import run_dir

log = logging.getLogger(__name__)


class SnapshotMissing(FileNotFoundError):
    """A run names a snapshot that its ingest DAG has not validated."""


def validated_snapshot(validated_dir: Path, name: str, *, label: str, ingest_hint: str) -> dict[str, Any]:
    """The validated snapshot a run trains on: its name and the fingerprint of its validation (the raw files'
    checksums + the rules). Raises SnapshotMissing with one line naming the `label`led snapshot and what to run
    (`ingest_hint`) when it has not been ingested."""
    from tasks.core.storage import read_manifest

    manifest = read_manifest(validated_dir)
    if manifest is None:
        raise SnapshotMissing(f"{label} snapshot {name} is not ingested (no validated manifest under "
                              f"{validated_dir}): {ingest_hint}")
    return {"dataset": name, "snapshot": manifest["inputs_fingerprint"]}


@dataclass(frozen=True)
class RunPaths:
    """A training run's folders under <data root>/runs/<pipeline>/<run id>/."""

    root: Path

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def evaluation(self) -> Path:
        return self.root / "eval"

    @property
    def gate(self) -> Path:
        """gate.json, and the production model's metrics on this run's test rows."""
        return self.root / "gate"

    @property
    def rebuildable(self) -> tuple[Path, ...]:
        """The run's outputs its steps rebuild from its inputs (a per-run dataset: hundreds of GB at full size),
        deleted once newer runs have finished (prune); none for a pipeline whose datasets are not per run."""
        return ()


FINISHED = "_FINISHED.json"  # in a run's folder: written by its last task (prune), when the run ended well


def prune(settings: Settings, pipeline: str, paths_of: Callable[[Path], RunPaths], run_id: str) -> dict[str, Any]:
    """The last task of a training run that ended well (published, or held back by its gate): marks the run
    finished, then deletes the rebuildable outputs of the pipeline's finished runs older than the newest
    `settings.keep_run_datasets` (0: none deleted). Only finished runs are touched: a running or failed run (to be
    cleared and retried) keeps everything, and so does a run made outside Airflow (the CLI's). Each dataset loses its
    manifest first, so one half deleted by a killed prune is never taken as complete; a retry deletes the rest."""
    import json
    import shutil
    import time

    from tasks.core.storage import MANIFEST_NAME, write_text_atomic

    runs_root = run_dir(settings.data_root, pipeline, run_id).parent
    own = paths_of(run_dir(settings.data_root, pipeline, run_id))
    marker = own.root / FINISHED
    if not marker.is_file():
        write_text_atomic(marker, json.dumps({"run_id": run_id, "finished_at": time.time()}))
    finished = []
    for folder in runs_root.iterdir() if runs_root.is_dir() else ():
        try:
            finished.append((float(json.loads((folder / FINISHED).read_text())["finished_at"]), folder.name))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not finished (or not a run folder)
    finished.sort(reverse=True)
    kept = [name for _, name in finished[:settings.keep_run_datasets or len(finished)]]
    deleted, freed = [], 0
    for _, name in finished[len(kept):]:
        for path in paths_of(runs_root / name).rebuildable:
            if not path.exists():
                continue
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
            (path / MANIFEST_NAME).unlink(missing_ok=True)
            shutil.rmtree(path)
            deleted.append(str(path))
            freed += size
            log.info("deleted %s (%.1f GB) of finished run %s", path, size / 1e9, name)
    log.info("%s: %d finished runs keep their datasets (%s; RECFLOW_KEEP_RUN_DATASETS=%d); %d outputs of older ones "
             "deleted, %.1f GB freed", pipeline, len(kept), ", ".join(kept), settings.keep_run_datasets,
             len(deleted), freed / 1e9)
    return {"kept": kept, "deleted": deleted, "freed_bytes": freed}


def run_paths(settings: Settings, pipeline: str, run_id: str) -> RunPaths:
    return RunPaths(run_dir(settings.data_root, pipeline, run_id))


def trained_windows(settings: Settings, pipeline: str, model_name: str | None = None) -> list[dict[str, Any]]:
    """Windows ({dataset, snapshot, profile}) of the pipeline's runs the registry records as trained; only those of
    `model_name` when given (an experiment under another name does not make the production model's window old)."""
    from tasks.release.registry import TRAINED_STATUSES
    from tasks.release.steps import open_registry

    with open_registry(settings) as registry:
        return registry.windows(pipeline, TRAINED_STATUSES, model_name)


def plan_snapshot_run(settings: Settings, *, pipeline: str, knobs_of: Callable[[str], dict[str, Any]],
                      snapshot: Callable[[], Mapping[str, Any]], params: Mapping[str, Any],
                      run_type: str) -> dict[str, Any] | None:
    """What a run trains on and with, or None when an automatic run (one not started by hand, or one carrying the
    `reason` its ingest's train gate gives it) finds its snapshot already trained with its profile and model name.
    `knobs_of(profile)` resolves (and checks) the knobs before anything else is looked at, so a bad value
    fails before any work; `snapshot()` names the validated snapshot ({dataset, snapshot}). Workers and device:
    the params, else RECFLOW_TRAIN_NPROC / RECFLOW_TRAIN_DEVICE. The result goes to XCom so every later task uses
    the same values."""
    profile = params.get("profile") or settings.profile
    knobs = knobs_of(profile)
    window = {**snapshot(), "profile": profile}
    automatic = run_type != "manual" or bool(params.get("reason"))
    if automatic and window in trained_windows(settings, pipeline, params.get("model_name") or pipeline):
        log.info("snapshot %s (%s) was trained with profile %s already: nothing new to train",
                 window["dataset"], window["snapshot"][:12], profile)
        return None
    why = (params.get("reason") or f"new snapshot {window['snapshot'][:12]} ({run_type})" if automatic
           else "triggered by hand")
    workers = int(params.get("workers") or settings.train_nproc)
    device = params.get("device") or settings.train_device
    log.info("%s %s, profile %s on %s x %d worker(s): %s", window["dataset"], window["snapshot"][:12], profile,
             device, workers, ", ".join(f"{k}={v}" for k, v in knobs.items()))
    return {"window": window, "why": why, "profile": profile, "knobs": knobs, "workers": workers, "device": device}
