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


def SUCCESS(run_id: str) -> str:  # noqa: N802 - what Airflow says of a DAG run that ended well
    return "success"


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

    result = prune(settings, PIPELINE, RunPaths, "scheduled__4", SUCCESS)

    assert json.loads((current.root / FINISHED).read_text())["run_id"] == "scheduled__4"
    assert result["kept"] == ["scheduled__4", "scheduled__2"]
    assert result["deleted"] == [str(oldest.dataset)] and result["freed_bytes"] > 1000
    assert not oldest.dataset.exists() and (oldest.train / "model.pt").is_file()  # results stay
    assert all(p.dataset.is_dir() for p in (older, failed, cli, current))
    again = prune(settings, PIPELINE, RunPaths, "scheduled__4", SUCCESS)  # a retry: nothing more to do
    assert again["kept"] == result["kept"] and again["deleted"] == []


def test_zero_keeps_every_runs_dataset_and_pipelines_without_per_run_datasets_delete_nothing(tmp_path,
                                                                                            monkeypatch):
    from tasks.release.runs import RunPaths as GenericRunPaths

    monkeypatch.setenv("RECFLOW_KEEP_RUN_DATASETS", "0")
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    settings = load_settings()
    assert settings.keep_run_datasets == 0
    runs = [make_run(tmp_path, f"scheduled__{i}", float(i)) for i in range(4)]
    assert prune(settings, PIPELINE, RunPaths, "scheduled__3", SUCCESS)["deleted"] == []
    one = Settings(data_root=tmp_path, keep_run_datasets=1)
    assert prune(one, PIPELINE, GenericRunPaths, "scheduled__3", SUCCESS)["deleted"] == []  # nothing declared
    assert all(r.dataset.is_dir() for r in runs)
    assert len(prune(one, PIPELINE, RunPaths, "scheduled__3", SUCCESS)["deleted"]) == 3


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
            prune(settings, PIPELINE, RunPaths, "scheduled__2", SUCCESS)
    assert old.dataset.is_dir() and completed_manifest(old.dataset, {"run": "scheduled__1"}) is None
    assert prune(settings, PIPELINE, RunPaths, "scheduled__2", SUCCESS)["deleted"] == [str(old.dataset)]
    assert not old.dataset.exists()


def test_a_run_cleared_since_it_finished_keeps_its_dataset_and_counts_as_new_when_it_finishes_again(tmp_path):
    """Airflow's word decides: a finished run that was cleared (running again, or failed waiting for its retry) or
    that Airflow no longer knows is not pruned; once it finishes again it is the newest."""
    from tasks.release.runs import RunPruned, check_not_pruned

    settings = Settings(data_root=tmp_path, keep_run_datasets=1)
    runs = {name: make_run(tmp_path, name, t) for name, t in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))}
    states = {"a": "failed", "b": "running", "c": None}  # c: the API could not answer
    result = prune(settings, PIPELINE, RunPaths, "d", states.get)
    assert result["deleted"] == [] and all(r.dataset.is_dir() for r in runs.values())

    states["a"] = "success"  # a finished again: its prune marks it newest, and deletes b, c and d once they ended
    states.update(b="success", c="absent", d="success")  # well or were removed from Airflow's database
    result = prune(settings, PIPELINE, RunPaths, "a", states.get)
    assert result["kept"] == ["a"] and sorted(result["deleted"]) == sorted(str(runs[n].dataset) for n in "bcd")

    check_not_pruned(settings, PIPELINE, RunPaths, "a")  # its dataset is there
    with pytest.raises(RunPruned, match=r"run b finished earlier and retention deleted its dataset "
                                        r"\(RECFLOW_KEEP_RUN_DATASETS=1\): clear the run from `transform`"):
        check_not_pruned(settings, PIPELINE, RunPaths, "b")
    (runs["a"].dataset / "_MANIFEST.json").unlink()  # what a prune killed while deleting it leaves
    with pytest.raises(RunPruned, match="run a finished earlier and retention deleted its dataset"):
        check_not_pruned(settings, PIPELINE, RunPaths, "a")


def test_a_run_cleared_from_its_rebuilding_task_is_not_finished_until_it_ends_well_again(tmp_path):
    """reopen (first in `transform`): the cleared run neither takes a kept slot with its old time while it reruns
    nor is refused by its later tasks once its dataset is rebuilt; cleared from a later task, it is refused."""
    from tasks.release.runs import RunPruned, check_not_pruned, reopen

    settings = Settings(data_root=tmp_path, keep_run_datasets=2)
    runs = {name: make_run(tmp_path, name, t) for name, t in (("a", 1.0), ("b", 2.0), ("c", 3.0))}
    prune(settings, PIPELINE, RunPaths, "c", SUCCESS)  # c finished again (time now): a's dataset goes
    assert not runs["a"].dataset.exists()
    with pytest.raises(RunPruned, match="clear the run from `transform`"):
        check_not_pruned(settings, PIPELINE, RunPaths, "a")  # cleared from validate_dataset or train

    reopen(settings, PIPELINE, RunPaths, "c")  # c cleared from transform: rerunning, not finished
    reopen(settings, PIPELINE, RunPaths, "a")  # a cleared from transform: the dataset is being rebuilt
    reopen(settings, PIPELINE, RunPaths, "a")  # (a retry of that transform)
    check_not_pruned(settings, PIPELINE, RunPaths, "a")
    make_run(tmp_path, "d", None)
    rerunning = {"a": "running", "c": "running"}
    result = prune(settings, PIPELINE, RunPaths, "d", lambda run: rerunning.get(run, "success"))
    assert result["kept"] == ["d", "b"] and result["deleted"] == []  # c's old time takes no slot: b keeps its data
    assert runs["c"].dataset.is_dir()  # and nothing of c goes while it reruns

    # a's rerun rebuilds its dataset and ends well: its prune makes it the newest. c's transform alone was cleared
    # (no downstream tasks) and the run is `success` again without a prune of its own: its dataset goes as an older
    # finished run's would, unless every dataset is kept.
    (runs["a"].dataset / "train").mkdir(parents=True)
    write_manifest(runs["a"].dataset, Manifest(kind="dataset", inputs={"run": "a"}, rows={"train": 1000}))
    assert prune(Settings(data_root=tmp_path, keep_run_datasets=0), PIPELINE, RunPaths, "a", SUCCESS)["deleted"] == []
    result = prune(settings, PIPELINE, RunPaths, "a", SUCCESS)
    assert result["kept"] == ["a", "d"] and sorted(result["deleted"]) == sorted(str(runs[n].dataset) for n in "bc")


def test_an_output_that_cannot_be_deleted_is_a_warning_and_a_link_goes_alone(tmp_path, monkeypatch, caplog):
    import os
    import shutil

    settings = Settings(data_root=tmp_path, keep_run_datasets=1)
    linked, stuck = make_run(tmp_path, "a", 1.0), make_run(tmp_path, "b", 2.0)
    elsewhere = tmp_path / "elsewhere"
    linked.dataset.rename(elsewhere)
    linked.dataset.symlink_to(elsewhere)
    os.link(stuck.dataset / "train" / "label.bin", tmp_path / "second-link.bin")  # frees nothing when deleted
    make_run(tmp_path, "c", 3.0)

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "rmtree", refused)
        result = prune(settings, PIPELINE, RunPaths, "c", SUCCESS)
    assert result["deleted"] == [str(linked.dataset)] and result["freed_bytes"] == 0
    assert not os.path.lexists(linked.dataset) and (elsewhere / "train" / "label.bin").is_file()
    assert stuck.dataset.is_dir() and "could not delete" in caplog.text and "Permission denied" in caplog.text
    result = prune(settings, PIPELINE, RunPaths, "c", SUCCESS)  # the next run's prune tries again
    # Its manifest went in the first try; what is left is the file with a second link: nothing freed.
    assert result["deleted"] == [str(stuck.dataset)] and result["freed_bytes"] == 0
    assert (tmp_path / "second-link.bin").stat().st_size == 1000


def test_a_404_of_the_execution_api_reads_as_absent_in_either_shape():
    """Under the supervisor the task sees an AirflowRuntimeError carrying the status code; in-process (dag.test())
    the API client's error with its response. Anything else (a 500, a refused connection) is not a 404."""
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
    from airflow.sdk.execution_time.comms import ErrorResponse

    from tasks.dagkit.training import _not_found

    route = {"reason": "not_found", "message": "Dag run with dag_id 'criteo_dlrm' and run_id 'x' was not found"}

    def runtime_error(status: int, detail: object) -> AirflowRuntimeError:
        return AirflowRuntimeError(ErrorResponse(error=ErrorType.API_SERVER_ERROR,
                                                 detail={"status_code": status, "message": "Server returned error",
                                                         "detail": {"detail": detail}}))

    class ClientError(Exception):
        def __init__(self, status: int, detail: object) -> None:
            self.response, self.detail = type("Response", (), {"status_code": status})(), detail

    assert _not_found(runtime_error(404, route)) and _not_found(ClientError(404, route))
    # A 404 of the router (no such route: another API version), a 500, a refused connection: not "absent".
    assert not _not_found(runtime_error(404, "Not Found")) and not _not_found(ClientError(404, "Not Found"))
    assert not _not_found(runtime_error(500, route)) and not _not_found(ClientError(503, route))
    assert not _not_found(ConnectionRefusedError(111, "Connection refused"))


def test_the_dags_reopen_in_the_rebuilding_task_and_refuse_a_pruned_run_in_the_tasks_between(tmp_path, monkeypatch):
    """The wiring, task by task (each task's callable, as a worker calls it): criteo's `transform` and byo's `fetch`
    reopen the run first, whatever they do next; the tasks between them and train refuse a pruned run with the
    retention line, without retry."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException

    from tests.conftest import REPO

    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    for pipeline, between, rebuilding, call, then in (
            ("criteo_dlrm", ["validate_dataset"], "transform",
             lambda fn: fn({"knobs": {"seed": 1}, "train_days": [0], "test_day": 1}, {}, run_id="r1"),
             "no completed dictionary"),
            ("byo_dlrm", ["validate", "transcode", "validate_dataset"], "fetch",
             lambda fn: fn({}, run_id="r1", params={"aws_conn_id": None}), "spec_uri")):
        dag, root = bag.dags[pipeline], run_dir(tmp_path, pipeline, "r1")
        root.mkdir(parents=True)
        (root / FINISHED).write_text(json.dumps({"run_id": "r1", "finished_at": 1.0}))  # finished, then pruned
        for name in between:
            with pytest.raises(AirflowFailException, match=f"RunPruned: run r1 finished earlier .* from `{rebuilding}`"):
                dag.get_task(name).python_callable({}, run_id="r1", params={"engine": "arrow"})
        with pytest.raises(Exception, match=then):  # what the task does after reopening fails here (no inputs)
            call(dag.get_task(rebuilding).python_callable)
        assert not (root / FINISHED).exists() and (root / "_REOPENED.json").is_file()
        with pytest.raises(Exception) as own_check:  # reopened: the next task's own check speaks, not retention
            dag.get_task(between[-1]).python_callable({}, run_id="r1", params={"engine": "arrow"})
        assert "RunPruned" not in str(own_check.value)
