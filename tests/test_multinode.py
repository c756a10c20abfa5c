"""Launching training across processes and machines: a trainer that aborts at exit after finishing (accepted, with
a warning) or before (a failure), the multi-node settings, and two "nodes" on this machine (two launchers on
127.0.0.1 meeting at one rendezvous) training one DLRM and, with TF_CONFIG across both, one NCF model."""

from __future__ import annotations

import json
import logging
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.core.config import load_settings
from tasks.core.launch import (NodeLayout, TrainingFailed, aborted, free_port, outputs_complete, tf_worker_envs,
                               torchrun_command, train_with_tf_workers, train_with_torchrun)
from tasks.core.process import ProcessResult
from tasks.core.storage import Manifest, write_manifest

# A trainer stand-in: writes model.pt then metrics.json (as models.dlrm.train does) unless told not to, then dies
# the way TorchRec's CPU builds sometimes do at exit (C++ terminate -> abort -> SIGABRT).
FAKE_TRAINER = textwrap.dedent('''
    import argparse, json, os
    from pathlib import Path

    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", type=Path)
    parser.add_argument("--mode")
    args, _ = parser.parse_known_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.mode in ("abort_after_outputs", "exit_1_after_outputs"):
        for name in ("model.pt", "model.weights.h5"):
            (args.output_dir / name).write_bytes(b"weights")
        (args.output_dir / "metrics.json").write_text(json.dumps({"auc": 0.75}))
    print("terminate called without an active exception", flush=True)
    if args.mode == "exit_1_after_outputs":
        raise SystemExit(1)
    os.abort()
''')


@pytest.fixture
def fake_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """(module name, dataset dir with a manifest) of the abort-at-exit trainer, importable by the children."""
    package = tmp_path / "fakes"
    package.mkdir()
    (package / "abort_trainer.py").write_text(FAKE_TRAINER)
    monkeypatch.setenv("PYTHONPATH", str(package))
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    write_manifest(dataset, Manifest(kind="test-dataset", inputs={"rows": 1}))
    return "abort_trainer", dataset


@pytest.mark.parametrize("launcher", ["torchrun", "tf_workers"])
def test_abort_after_complete_outputs_is_a_finished_training(fake_trainer, tmp_path: Path, launcher: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    module, dataset = fake_trainer
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="tasks.core.launch"):
        if launcher == "torchrun":
            result = train_with_torchrun(module, dataset, out, {"mode": "abort_after_outputs"}, nodes=NodeLayout())
        else:
            result = train_with_tf_workers(module, dataset, out, {"mode": "abort_after_outputs"}, nodes=NodeLayout())
    assert result["metrics"] == {"auc": 0.75}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "SIGABRT" in r.getMessage()]
    assert len(warnings) == 1 and "accepting the finished training" in warnings[0], warnings
    assert json.loads((out / "_MANIFEST.json").read_text())["extra"]["metrics"] == {"auc": 0.75}


@pytest.mark.parametrize("mode", ["abort_before_outputs", "exit_1_after_outputs"])
def test_abort_before_outputs_or_another_failure_fails(fake_trainer, tmp_path: Path, mode: str) -> None:
    module, dataset = fake_trainer
    with pytest.raises(TrainingFailed, match="training exited"):
        train_with_torchrun(module, dataset, tmp_path / "out", {"mode": mode}, nodes=NodeLayout())


def test_abort_with_outputs_left_by_an_earlier_launch_fails(fake_trainer, tmp_path: Path) -> None:
    module, dataset = fake_trainer
    out = tmp_path / "out"
    out.mkdir()
    for name, text in (("model.pt", "old"), ("metrics.json", "{}")):
        (out / name).write_text(text)
        os.utime(out / name, (time.time() - 3600, time.time() - 3600))
    with pytest.raises(TrainingFailed, match="exited"):
        train_with_torchrun(module, dataset, out, {"mode": "abort_before_outputs"}, nodes=NodeLayout())


def test_abort_detection_reads_torchruns_failure_report(tmp_path: Path) -> None:
    report = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
              "  exitcode  : -6 (pid: 4242)", "  traceback : Signal 6 (SIGABRT) received by PID 4242"]
    assert aborted(ProcessResult(1, "", tuple(report)))
    assert aborted(ProcessResult(-6, "", ()))
    assert not aborted(ProcessResult(1, "", tuple(r.replace("-6", "1") for r in report)))
    assert not aborted(ProcessResult(1, "", ("exitcode  : -6",)))  # not torchrun's report: no root cause
    assert outputs_complete(tmp_path, "model.pt", 0.0) == f"{tmp_path / 'model.pt'} is missing"
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "model.pt").write_bytes(b"w")
    os.utime(tmp_path / "metrics.json", (time.time() - 10, time.time() - 10))
    assert "older than model.pt" in outputs_complete(tmp_path, "model.pt", 0.0)


def test_multi_node_settings_and_launch_lines() -> None:
    settings = load_settings({"RECFLOW_TRAIN_NNODES": "2", "RECFLOW_TRAIN_NODE_RANK": "1",
                              "RECFLOW_TRAIN_RDZV_ENDPOINT": "10.0.0.5:29400",
                              "RECFLOW_TRAIN_NODE_HOSTS": "10.0.0.5, 10.0.0.6", "RECFLOW_TRAIN_TF_PORT": "23456"})
    nodes = NodeLayout.from_settings(settings)
    rdzv = nodes.torchrun_rdzv(Path("/data/runs/r1/train"))
    assert rdzv == nodes.torchrun_rdzv(Path("/data/runs/r1/train"))  # every node derives the same job id
    argv = torchrun_command(4, "models.dlrm.train", [], nnodes=2, node_rank=1, **rdzv)
    assert {"--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.5:29400",
            "--rdzv_conf=is_host=false"} <= set(argv) and not any(a.startswith("--master") for a in argv)
    cluster, mine = nodes.tf_cluster(2)
    assert cluster == ["10.0.0.5:23456", "10.0.0.5:23457", "10.0.0.6:23458", "10.0.0.6:23459"] and mine == [2, 3]
    envs = tf_worker_envs(2, cluster=cluster, indices=mine, cores=4)
    assert [json.loads(e["TF_CONFIG"])["task"]["index"] for e in envs] == [2, 3]
    assert all(json.loads(e["TF_CONFIG"])["cluster"]["worker"] == cluster for e in envs)
    assert NodeLayout.from_settings(load_settings({})) == NodeLayout()
    for bad in ({"RECFLOW_TRAIN_NNODES": "2", "RECFLOW_TRAIN_NODE_RANK": "2"},
                {"RECFLOW_TRAIN_RDZV_ENDPOINT": "no-port"},
                {"RECFLOW_TRAIN_NNODES": "2", "RECFLOW_TRAIN_NODE_HOSTS": "a"}):
        with pytest.raises(ValueError, match="RECFLOW_TRAIN_"):
            load_settings(bad)
    with pytest.raises(ValueError, match="RECFLOW_TRAIN_RDZV_ENDPOINT"):
        NodeLayout(nnodes=2).torchrun_rdzv(Path("/x"))


def _two_launchers(launch, **layout: Any) -> list[dict[str, Any]]:
    """Run launch(nodes) for node ranks 0 and 1 at once (two threads: two launchers, as on two machines)."""
    results: list[Any] = [None, None]

    def node(rank: int) -> None:
        try:
            results[rank] = launch(NodeLayout(nnodes=2, node_rank=rank, **layout))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread below
            results[rank] = exc

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.fixture(scope="module")
def dlrm_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models.dlrm.synthetic import make_synthetic_dataset

    out = tmp_path_factory.mktemp("dlrm_dataset")
    make_synthetic_dataset(out, train_rows=4096, test_rows=1024, seed=0)
    write_manifest(out, Manifest(kind="test-dataset", inputs={"rows": 4096}))
    return out


def test_two_nodes_train_one_dlrm(dlrm_dataset: Path, tmp_path: Path) -> None:
    config = {"bottom_mlp_sizes": [16, 8], "top_mlp_sizes": [16, 1], "batch_size": 256, "eval_batch_size": 1024,
              "lr": 0.5, "limit_train_batches": 12, "log_every_steps": 4, "device": "cpu", "torch_threads": 1}
    out = tmp_path / "train"
    endpoint = f"127.0.0.1:{free_port()}"
    results = _two_launchers(lambda nodes: train_with_torchrun("models.dlrm.train", dlrm_dataset, out, config,
                                                               nproc=1, nodes=nodes), rdzv_endpoint=endpoint)
    assert results[0]["metrics"] == results[1]["metrics"]  # one run, one set of outputs
    metrics = results[0]["metrics"]
    assert metrics["world_size"] == 2 and metrics["steps"] == 12 and 0 < metrics["auc"] < 1
    from models.dlrm.evaluate import load_model_file

    model, payload = load_model_file(out / "model.pt")
    assert payload["step"] == 12


def test_two_nodes_of_tensorflow_workers_train_one_ncf(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    from tests.test_ncf_train import TINY as NCF_TINY, make_planted_dataset  # the NCF tests' tiny data and config

    dataset = make_planted_dataset(tmp_path / "ncf")
    out = tmp_path / "train"
    config = {**NCF_TINY, "epochs": 1}
    results = _two_launchers(lambda nodes: train_with_tf_workers("models.ncf.train", dataset, out, config,
                                                                 workers=1, nodes=nodes),
                             node_hosts=("127.0.0.1", "127.0.0.1"), tf_port=free_port())
    assert results[0]["metrics"] == results[1]["metrics"] and results[0]["metrics"]["workers"] == 2
