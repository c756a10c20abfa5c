"""tasks.release.runs.prune: the last task of a training run that ended well deletes the datasets of the pipeline's
finished runs older than the newest RECFLOW_KEEP_RUN_DATASETS, and nothing of a run that is running or failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core.config import Settings, load_settings
from tasks.core.layout import run_dir
from tasks.core.storage import Manifest, write_manifest
from tasks.criteo.dlrm import RunPaths
from tasks.release.runs import FINISHED, prune

PIPELINE = "criteo_dlrm"


def make_run(root: Path, run_id: str, finished_at: float | None) -> RunPaths:
    """A run folder with a complete dataset, a trained model and, when it ended well, the finished marker."""
    paths = RunPaths(run_dir(root, PIPELINE, run_id))
    (paths.dataset / "train").mkdir(parents=True)
    (paths.dataset / "train" / "label.bin").write_bytes(bytes(1000))
    write_manifest(paths.dataset, Manifest(kind="dataset", inputs={"run": run_id}, rows={"train": 1000}))
    paths.train.mkdir()
    (paths.train / "model.pt").write_bytes(b"weights")
    if finished_at is not None:
        (paths.root / FINISHED).write_text(json.dumps({"run_id": run_id, "finished_at": finished_at}))
    return paths


def test_a_finished_run_deletes_the_datasets_of_finished_runs_older_than_the_kept(tmp_path):
    settings = Settings(data_root=tmp_path)  # keeps 2
    oldest, older, failed = (make_run(tmp_path, "scheduled__1", 100.0), make_run(tmp_path, "scheduled__2", 200.0),
                             make_run(tmp_path, "manual__3", None))
    cli = make_run(tmp_path, "cli__test_2__train_0-1", None)  # made outside Airflow: never finished by a DAG
    current = make_run(tmp_path, "scheduled__4", None)

    result = prune(settings, PIPELINE, RunPaths, "scheduled__4")

    assert json.loads((current.root / FINISHED).read_text())["run_id"] == "scheduled__4"
    assert result["kept"] == ["scheduled__4", "scheduled__2"]
    assert result["deleted"] == [str(oldest.dataset)] and result["freed_bytes"] > 1000
    assert not oldest.dataset.exists() and (oldest.train / "model.pt").is_file()  # results stay
    assert all(p.dataset.is_dir() for p in (older, failed, cli, current))
    again = prune(settings, PIPELINE, RunPaths, "scheduled__4")  # a retry: nothing more to do
    assert again["kept"] == result["kept"] and again["deleted"] == []


def test_zero_keeps_every_runs_dataset_and_pipelines_without_per_run_datasets_delete_nothing(tmp_path,
                                                                                            monkeypatch):
    from tasks.release.runs import RunPaths as GenericRunPaths

    monkeypatch.setenv("RECFLOW_KEEP_RUN_DATASETS", "0")
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    settings = load_settings()
    assert settings.keep_run_datasets == 0
    runs = [make_run(tmp_path, f"scheduled__{i}", float(i)) for i in range(4)]
    assert prune(settings, PIPELINE, RunPaths, "scheduled__3")["deleted"] == []
    one = Settings(data_root=tmp_path, keep_run_datasets=1)
    assert prune(one, PIPELINE, GenericRunPaths, "scheduled__3")["deleted"] == []  # nothing rebuildable declared
    assert all(r.dataset.is_dir() for r in runs)
    assert len(prune(one, PIPELINE, RunPaths, "scheduled__3")["deleted"]) == 3


def test_a_negative_count_is_one_line(monkeypatch):
    monkeypatch.setenv("RECFLOW_KEEP_RUN_DATASETS", "-1")
    with pytest.raises(ValueError, match=r"RECFLOW_KEEP_RUN_DATASETS=-1: expected 0 \(keep all\) or more"):
        load_settings()


def test_a_half_deleted_dataset_is_never_taken_as_complete(tmp_path, monkeypatch):
    """The manifest goes first: a prune killed during the delete leaves no complete-looking dataset, and its retry
    deletes the rest."""
    import shutil

    from tasks.core.storage import completed_manifest

    make_run(tmp_path, "scheduled__1", 1.0)
    make_run(tmp_path, "scheduled__2", 2.0)
    old = RunPaths(run_dir(tmp_path, PIPELINE, "scheduled__1"))
    settings = Settings(data_root=tmp_path, keep_run_datasets=1)

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "rmtree", killed)
        with pytest.raises(KeyboardInterrupt):
            prune(settings, PIPELINE, RunPaths, "scheduled__2")
    assert old.dataset.is_dir() and completed_manifest(old.dataset, {"run": "scheduled__1"}) is None
    assert prune(settings, PIPELINE, RunPaths, "scheduled__2")["deleted"] == [str(old.dataset)]
    assert not old.dataset.exists()
