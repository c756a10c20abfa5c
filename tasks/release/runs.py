"""Training runs, shared by the pipelines: where a run's outputs go, which windows the registry records as trained,
and, for a pipeline that trains on a validated dataset snapshot, what a run trains on and with and when an
automatic run has nothing new to do.

A pipeline that trains on a sliding window of days plans its window itself; a snapshot pipeline's window is simply
{snapshot name, fingerprint of its validation, profile}. An asset-triggered or scheduled run whose window the
registry already records as trained does nothing; a run triggered by hand always trains.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
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
        deleted once newer runs have finished (prune); none for a pipeline whose datasets are not per run. In the
        order the run writes them, the last a folder with a manifest (the dataset): prune deletes them last first,
        that manifest before anything, so a run whose last output lacks it was (partly) pruned."""
        return ()

    rebuilt_by = ""  # the task that writes the first of `rebuildable` (a pruned run is cleared from it; it reopens)


FINISHED = "_FINISHED.json"  # in a run's folder: written by its last task (prune) each time the run ends well
REOPENED = "_REOPENED.json"  # FINISHED renamed by `reopen`: the run was cleared from its rebuilding task


class RunPruned(RuntimeError):
    """A task of a run whose dataset retention deleted (the run was cleared after it finished)."""


def prune(settings: Settings, pipeline: str, paths_of: Callable[[Path], RunPaths], run_id: str,
          run_state: Callable[[str], str | None]) -> dict[str, Any]:
    """The last task of a training run that ended well (published, or held back by its gate): marks the run
    finished (now: a run cleared and finished again counts as the newest), then deletes the rebuildable outputs of
    the pipeline's finished runs older than the newest `settings.keep_run_datasets` (0: none deleted) whose DAG run
    Airflow reports `success`, or no longer knows (`run_state(run_id)`: the state, "absent", or None when it cannot
    say): a run cleared since it finished (running again, or failed and waiting for its retry) keeps everything, and
    so does a folder no DAG run finished (the CLI's `cli__...`). Each dataset loses its manifest first, so one half
    deleted by a killed prune is never taken as complete (a retry deletes the rest); an output that cannot be deleted
    is a warning, not a failed run. A reopened run (`reopen`) takes no kept place: its outputs go as an older
    finished run's do, by Airflow's word (while it reruns, never; a run whose rebuilding task alone was cleared, and
    succeeded, has no prune of its own to finish it again)."""
    import json
    import time

    from tasks.core.storage import write_text_atomic

    own = paths_of(run_dir(settings.data_root, pipeline, run_id))
    write_text_atomic(own.root / FINISHED, json.dumps({"run_id": run_id, "finished_at": time.time()}))
    (own.root / REOPENED).unlink(missing_ok=True)
    finished, reopened = [], []
    for folder in own.root.parent.iterdir():
        if (record := _marker(folder, FINISHED)) is not None:
            finished.append(record)
        elif (record := _marker(folder, REOPENED)) is not None:
            reopened.append(record)
    finished.sort(reverse=True)  # by the clock of the workers that finished them
    kept = [name for _, name, _ in finished[:settings.keep_run_datasets or len(finished)]]
    older = finished[len(kept):] + (sorted(reopened, reverse=True) if settings.keep_run_datasets else [])
    deleted, freed = [], 0
    for _, name, older_run in older:
        paths = [path for path in paths_of(own.root.parent / name).rebuildable if os.path.lexists(path)]
        if not paths:
            continue
        state = run_state(older_run)
        if state not in ("success", "absent"):
            log.info("run %s keeps its outputs: its DAG run is %s since it finished", older_run, state or "unknown")
            continue
        for path in reversed(paths):  # the dataset (and its manifest) first: see RunPaths.rebuildable
            size = _delete_output(path)
            if size is not None:
                deleted.append(str(path))
                freed += size
                log.info("deleted %s (%.1f GB) of finished run %s", path, size / 1e9, older_run)
    log.info("%s: %d finished runs keep their datasets (%s; RECFLOW_KEEP_RUN_DATASETS=%d); %d outputs of older ones "
             "deleted, %.1f GB freed", pipeline, len(kept), ", ".join(kept), settings.keep_run_datasets,
             len(deleted), freed / 1e9)
    return {"kept": kept, "deleted": deleted, "freed_bytes": freed}


def _marker(folder: Path, name: str) -> tuple[float, str, str] | None:
    """(finish time, folder name, run id) from a run folder's marker `name`; None without one (or not a run)."""
    import json

    try:
        record = json.loads((folder / name).read_text())
        return float(record["finished_at"]), folder.name, str(record["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _delete_output(path: Path) -> int | None:
    """Delete one output folder (its manifest first), or the link that stands for it; the bytes this freed (files
    with other hard links free nothing), None when it could not be deleted (logged)."""
    import shutil

    from tasks.core.storage import MANIFEST_NAME

    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
            return 0
        size = 0
        for file in path.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                status = file.lstat()
                if stat.S_ISREG(status.st_mode) and status.st_nlink == 1:
                    size += status.st_size
        (path / MANIFEST_NAME).unlink(missing_ok=True)
        shutil.rmtree(path)
        return size
    except FileNotFoundError:
        return None  # deleted meanwhile
    except OSError as exc:
        log.warning("could not delete %s (%s): left in place; delete it by hand", path, exc)
        return None


def check_not_pruned(settings: Settings, pipeline: str, paths_of: Callable[[Path], RunPaths], run_id: str) -> None:
    """Raises RunPruned (one line saying what to clear) when a task of a finished run whose rebuildable outputs
    retention deleted runs again (the run was cleared from a task after the one that rebuilds them)."""
    from tasks.core.storage import MANIFEST_NAME

    paths = paths_of(run_dir(settings.data_root, pipeline, run_id))
    missing = [path.name for path in paths.rebuildable if not path.exists()]
    if paths.rebuildable and not missing and not (paths.rebuildable[-1] / MANIFEST_NAME).is_file():
        missing = [paths.rebuildable[-1].name]  # a prune killed (or refused) while deleting it
    if missing and (paths.root / FINISHED).is_file():
        raise RunPruned(f"run {run_id} finished earlier and retention deleted its {', '.join(missing)} "
                        f"(RECFLOW_KEEP_RUN_DATASETS={settings.keep_run_datasets}): clear the run from "
                        f"`{paths.rebuilt_by}` (with its downstream tasks) to rebuild them")


def reopen(settings: Settings, pipeline: str, paths_of: Callable[[Path], RunPaths], run_id: str) -> None:
    """Called first by the task that rebuilds a run's rebuildable outputs (`RunPaths.rebuilt_by`): a run cleared
    from there is not finished until its prune runs again. Its marker is renamed REOPENED, so retention neither
    keeps a place for it (it took one with its old time while it reran) nor refuses its later tasks, yet still
    deletes its outputs once Airflow says the run ended (prune). Nothing to do in a run that never finished."""
    root = paths_of(run_dir(settings.data_root, pipeline, run_id)).root
    with contextlib.suppress(FileNotFoundError):
        os.replace(root / FINISHED, root / REOPENED)


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
