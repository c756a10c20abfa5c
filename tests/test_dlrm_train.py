"""DLRM training: learns the planted signal, DDP on 2 gloo processes, kill-and-resume, safe checkpoint loading,
mixed precision, the lr schedule and torchrun command lines."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tasks.core.launch import torchrun_command

from models.torchkit.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from models.torchkit.distributed import (amp_dtype, autocast_context, backend_for, make_grad_scaler,
                                       select_device, use_tf32)
from models.dlrm import evaluate
from models.dlrm.config import DlrmConfig
from models.dlrm.model import Dlrm
from models.dlrm.sharding import fbgemm_gpu_available
from models.dlrm.synthetic import make_synthetic_dataset
from models.dlrm.train import lr_factor, main, make_scheduler, parse_args
from tests.ranks import spawn_ranks
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[1]
TINY = ["--bottom_mlp_sizes", "16", "8", "--top_mlp_sizes", "16", "1", "--lr", "0.5", "--warmup_steps", "20",
        "--batch_size", "8192", "--eval_batch_size", "16384",
        "--decay_start_step", "200", "--decay_steps", "100", "--device", "cpu", "--log_every_steps", "50",
        "--torch_threads", "1"]  # tiny models gain nothing from threads; on a busy machine they only spin


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    make_synthetic_dataset(out, train_rows=20_000, test_rows=5_000, seed=0)
    return out


def _args(dataset: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset_dir", str(dataset), "--output_dir", str(out), *TINY, *extra]


def test_lr_schedule_is_nvidias_warmup_then_polynomial_decay() -> None:
    curve = [lr_factor(k, warmup_steps=4, decay_start_step=8, decay_steps=4, power=2.0) for k in range(14)]
    # step k uses NVIDIA's counter k+1: warmup 1/4..4/4, flat to step 8, ((12 - (k+1)) / 4)^2 down to 0, then 0.
    assert curve == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0, 0.0]
    assert lr_factor(100, 4, 8, 0) == 1.0  # decay_steps 0: no decay
    assert lr_factor(100, 4, 8, 4, end_lr_factor=0.01) == 0.01
    cfg = DlrmConfig(lr=2.0, warmup_steps=4, decay_start_step=8, decay_steps=4, schedule_scaling="fixed")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    scheduler = make_scheduler(optimizer, cfg, total_steps=12)
    used = []
    for _ in range(12):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert used == pytest.approx([2.0 * f for f in curve[:12]])


def test_config_cli_roundtrip() -> None:
    cfg = parse_args(["--dataset_dir", "d", "--output_dir", "o", "--bottom_mlp_sizes", "32", "16", "--amp",
                      "--no-sparse_embeddings", "--limit_train_batches", "7"])
    assert cfg.bottom_mlp_sizes == (32, 16) and cfg.amp and not cfg.sparse_embeddings
    assert cfg.limit_train_batches == 7 and cfg.limit_eval_batches is None and cfg.batch_size == 65536
    assert DlrmConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="decay_start_step"):
        DlrmConfig(warmup_steps=100, decay_start_step=50)


def test_tiny_run_learns_planted_signal_and_writes_outputs(dataset: Path, tmp_path: Path, capsys) -> None:
    result = main(_args(dataset, tmp_path, "--batch_size", "128", "--epochs", "2", "--eval_every_steps", "150",
                        "--checkpoint_every_steps", "100"))
    out = capsys.readouterr().out
    assert result.steps == 2 * (20_000 // 128) and result.resumed_from_step is None
    assert result.final_metrics["auc"] >= 0.7, result.final_metrics
    lines = out.splitlines()
    assert lines and all(line.startswith("[rank 0] ") for line in lines)
    assert "embedding tables: 5 tables" in lines[0]  # logged before training starts
    assert any(re.search(r"step 100/312 epoch 0 loss [\d.]+ lr .* samples/s [\d,]+ eta \d:\d\d:\d\d", l) for l in lines)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["auc"] == result.final_metrics["auc"] and metrics["steps"] == 312
    records = [json.loads(l) for l in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [150, 300, 312]
    assert all(r["samples_per_second"] > 0 for r in records if r["kind"] == "train")
    png = (tmp_path / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1000  # loss and AUC panels
    assert latest_checkpoint(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step_00000312.pt"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))[-1] == "step_00000312.pt"
    evaluated = evaluate.main(["--model_path", str(result.model_path), "--device", "cpu"])
    assert evaluated.auc == pytest.approx(result.final_metrics["auc"], abs=1e-6) and evaluated.rows == 5_000
    assert json.loads(evaluated.metrics_path.read_text())["auc"] == evaluated.auc


def test_without_final_eval_the_test_rows_are_left_to_the_evaluator(dataset: Path, tmp_path: Path, capsys) -> None:
    # What the pipelines run (dlrm_model_config): their evaluate task scores the written model, so the trainer
    # does not score the same test rows first.
    result = main(_args(dataset, tmp_path, "--batch_size", "512", "--limit_train_batches", "5", "--no-final_eval"))
    assert result.steps == 5 and "auc" not in result.final_metrics and "mapping" not in result.final_metrics
    assert "eval" not in {json.loads(l)["kind"] for l in (tmp_path / "train_log.jsonl").read_text().splitlines()}
    assert "done: 5 steps, no final evaluation" in capsys.readouterr().out
    png = (tmp_path / "training_curves.png").read_bytes()
    assert int.from_bytes(png[16:20], "big") == 500  # the loss panel alone (with evaluations: 1000 px, two panels)
    assert evaluate.main(["--model_path", str(result.model_path), "--device", "cpu"]).rows == 5_000


def test_a_run_that_cannot_finish_in_its_time_budget_stops_with_one_line(dataset: Path, tmp_path: Path, capsys,
                                                                          monkeypatch) -> None:
    # The rate is trusted from the first log interval here (300 s of training in a real run), and a budget of 1 ms
    # is spent by then: the run stops at step 10, before its last step, printing the launcher's marked line.
    from models.common import time_budget
    from tasks.core.launch import TrainingTooSlow, _training_failed
    from tasks.core.process import ERROR_MARKER

    monkeypatch.setattr(time_budget, "MIN_MEASURED_S", 0.0)
    with pytest.raises(time_budget.TrainingTooSlowError, match="at [\\d,]+ samples/s this run needs"):
        main(_args(dataset, tmp_path, "--batch_size", "128", "--log_every_steps", "10", "--time_budget_s", "0.001"))
    [line] = [line for line in capsys.readouterr().out.splitlines() if ERROR_MARKER in line]
    failure = _training_failed("training exited 1", line.split(ERROR_MARKER, 1)[1].strip())
    assert isinstance(failure, TrainingTooSlow) and str(failure).startswith("training too slow: at ")
    assert "more than the 0:00:00 its task has left" in str(failure)
    assert not (tmp_path / "model.pt").exists()
    # With a budget it fits, the same run trains to the end.
    assert main(_args(dataset, tmp_path / "ok", "--batch_size", "1024", "--log_every_steps", "10",
                      "--time_budget_s", "3600")).steps == 20_000 // 1024


def test_cpu_amp_uses_bf16_matmuls_and_trains(dataset: Path, tmp_path: Path) -> None:
    model = Dlrm(4, [40, 25, 12, 8, 300], bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1))
    seen: list[torch.dtype] = []
    for layer in (model.bottom_mlp[0], model.top_mlp[0]):
        layer.register_forward_hook(lambda _m, _i, output: seen.append(output.dtype))
    numerical, categorical = torch.randn(8, 4), torch.zeros(8, 5, dtype=torch.long)
    with autocast_context(torch.device("cpu"), enabled=True):
        model(numerical, categorical)
    with autocast_context(torch.device("cpu"), enabled=False):
        model(numerical, categorical)
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    assert make_grad_scaler(torch.device("cpu"), amp=True) is None  # bf16 keeps fp32's exponent: no loss scaling
    result = main(_args(dataset, tmp_path, "--amp", "--batch_size", "256", "--limit_train_batches", "40"))
    assert result.steps == 40 and 0 < result.final_metrics["logloss"] < 1


def _torchrun_failure(proc: subprocess.CompletedProcess) -> str:
    """What a failed torchrun printed, led by every rank's error lines: a rank that aborts (C++ terminate) writes
    its reason early in stderr, before the other ranks' tracebacks that a plain tail would keep."""
    errors = [line for line in proc.stderr.splitlines()
              if re.search(r"terminate called|what\(\)|Error|rank\d\]:|enforce fail|Signal \d+", line)]
    return "\n".join(["stdout (tail):", proc.stdout[-1500:], "error lines of stderr:", *errors[:60],
                      "stderr (tail):", proc.stderr[-2500:]])


def test_two_process_torchrun_keeps_ranks_identical(dataset: Path, tmp_path: Path) -> None:
    # A time interval that is always over: rank 0 decides at each log interval (10 steps) and rank 1 follows, so both
    # save at steps 10 and 20 (step 30, the last, is model.pt) and neither waits for the other.
    argv = torchrun_command(2, "models.dlrm.train", _args(dataset, tmp_path, "--batch_size", "256",
                                                        "--limit_train_batches", "30", "--log_every_steps", "10",
                                                        "--checkpoint_every_minutes", "1e-9"),
                          master_port=free_port(), python=sys.executable)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, _torchrun_failure(proc)
    checksums = dict(re.findall(r"\[rank (\d)\] final weights sha256 (\w+) at step 30", proc.stdout))
    assert set(checksums) == {"0", "1"} and checksums["0"] == checksums["1"], proc.stdout
    # Only the checksum line: progress is logged by rank 0 alone. Searched anywhere, not at line starts: the two
    # ranks share one pipe and rank 0's block-buffered writes can split a line around rank 1's.
    rank1 = re.findall(r"\[rank 1\][^\n]*", proc.stdout)
    assert len(rank1) == 1 and "final weights sha256" in rank1[0], rank1
    assert "on 2 x cpu (gloo)" in proc.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["weights_sha256"] == checksums["0"]
    assert "checkpoints every 1e-09 min" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*.pt")) == [
        "step_00000010.pt", "step_00000020.pt", "step_00000030.pt"]


def _kill_after_a_checkpoint(args: list[str], out: Path) -> int:
    """Start the trainer with `args` in a child, SIGKILL it once its first checkpoint is written; that step."""
    proc = subprocess.Popen([sys.executable, "-m", "models.dlrm.train", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pointer = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 90
    while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (out / "model.pt").exists()
    return int(load_checkpoint(latest_checkpoint(pointer.parent))["step"])


def test_killed_run_resumes_from_its_last_checkpoint(dataset: Path, tmp_path: Path) -> None:
    args = _args(dataset, tmp_path / "run", "--batch_size", "256", "--epochs", "3", "--checkpoint_every_steps", "20")
    killed_at = _kill_after_a_checkpoint(args, tmp_path / "run")
    total = 3 * (20_000 // 256)
    assert 20 <= killed_at < total
    resumed = main(args)
    assert resumed.resumed_from_step == killed_at and resumed.steps == total
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["resumed_from_step"] == killed_at
    records = [json.loads(l) for l in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == total  # no interval logged twice
    uninterrupted = main(_args(dataset, tmp_path / "straight", "--batch_size", "256", "--epochs", "3"))
    assert uninterrupted.weights_sha256 == resumed.weights_sha256  # resuming lost and repeated nothing


def test_checkpoint_of_a_different_model_is_refused(dataset: Path, tmp_path: Path) -> None:
    main(_args(dataset, tmp_path, "--limit_train_batches", "3", "--batch_size", "512"))
    with pytest.raises(CheckpointError, match="differs from this run"):
        main(_args(dataset, tmp_path, "--limit_train_batches", "3", "--batch_size", "512",
                   "--bottom_mlp_sizes", "16", "4"))


class _Exploit:
    """Unpickling calls open(marker, 'w'), creating the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_safe_loader_rejects_malicious_pickle_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "checkpoints" / "step_00000001.pt"
    bad.parent.mkdir()
    torch.save({"kind": "recflow.checkpoint", "version": 1, "step": 1, "payload": _Exploit(marker)}, bad)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(bad)
    assert not marker.exists()
    message = str(error.value)
    assert "\n" not in message and str(bad) in message and "not a recflow" in message
    torch.load(bad, weights_only=False)["payload"].close()  # the file really is hostile: an unsafe load runs it
    assert marker.exists()


def test_safe_loader_rejects_files_that_are_not_checkpoints(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("just some text\n")
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    for path, reason in ((text, "safe loader refused it"), (foreign, "kind is None")):
        with pytest.raises(CheckpointError, match=reason) as error:
            load_checkpoint(path)
        assert "\n" not in str(error.value) and str(path) in str(error.value)
    plain_pickle = tmp_path / "plain.pkl"
    plain_pickle.write_bytes(pickle.dumps({"kind": "recflow.checkpoint"}, protocol=2))
    with pytest.raises(CheckpointError, match="not a recflow"):
        load_checkpoint(plain_pickle)


def test_checkpoints_rotate_and_pointer_survives_stale_entries(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40):
        save_checkpoint(directory, step, {"weights": torch.ones(2) * step}, keep_last=2)
    assert sorted(p.name for p in directory.glob("step_*.pt")) == ["step_00000030.pt", "step_00000040.pt"]
    assert load_checkpoint(latest_checkpoint(directory))["weights"].tolist() == [40.0, 40.0]
    (directory / "latest").write_text("step_00000099.pt\n")  # pointer to a file that is gone
    (directory / ".tmp-step_00000050.pt-dead").write_bytes(b"half a file")  # a killed writer's leftover
    assert latest_checkpoint(directory) == directory / "step_00000040.pt"


def test_launch_command_for_cuda_nodes() -> None:
    argv = torchrun_command(8, "models.dlrm.train", ["--device", "cuda", "--amp"], master_port=29500,
                          python="/opt/venv/bin/python")
    assert argv == ["/opt/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=8",
                    "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=29500", "-m", "models.dlrm.train",
                    "--device", "cuda", "--amp"]
    second_node = torchrun_command(8, "models.dlrm.train", [], nnodes=2, node_rank=1, master_addr="10.0.0.5")
    assert "--nnodes=2" in second_node and "--node_rank=1" in second_node and "--master_addr=10.0.0.5" in second_node
    assert backend_for(torch.device("cuda", 7)) == "nccl" and backend_for(torch.device("cpu")) == "gloo"
    with pytest.raises(ValueError):
        torchrun_command(8, "models.dlrm.train", [], nnodes=2, node_rank=2)


def test_device_selection_on_this_machine() -> None:
    assert select_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert select_device("auto", local_rank=0).type == "cuda"
    else:
        assert select_device("auto") == torch.device("cpu")
        with pytest.raises(RuntimeError, match="no CUDA device"):
            select_device("cuda")


def test_tf32_is_on_by_default_and_a_cuda_switch_only(dataset: Path, tmp_path: Path) -> None:
    """--tf32 (default) lets CUDA fp32 matmuls use TF32 tensor cores, as NVIDIA's containers do; on the CPU the
    switch changes nothing, and --no-tf32 parses."""
    assert DlrmConfig().tf32 is True and parse_args(_args(dataset, tmp_path, "--no-tf32")).tf32 is False
    before = torch.backends.cuda.matmul.allow_tf32
    assert use_tf32(torch.device("cpu"), True) is False and torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fp32_training_uses_tf32_unless_told_not_to(dataset: Path, tmp_path: Path, capsys) -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    args = [a if a != "cpu" else "cuda" for a in _args(dataset, tmp_path / "tf32", "--batch_size", "128")]
    assert main(args).final_metrics["auc"] >= 0.7
    assert "fp32 matmuls on TF32 tensor cores" in capsys.readouterr().out
    main([a if a != "cpu" else "cuda" for a in _args(dataset, tmp_path / "strict", "--batch_size", "128")]
         + ["--no-tf32"])
    assert "TF32" not in capsys.readouterr().out
    assert torch.backends.cuda.matmul.allow_tf32 == before  # put back after each training


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_amp_training_learns_in_fp16_and_in_the_devices_default(dataset: Path, tmp_path: Path) -> None:
    """fp16 with its loss scaler (NVIDIA's choice) and --amp_dtype auto (bf16 on compute capability >= 8)."""
    model = Dlrm(4, [40, 25, 12, 8, 300], bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1)).cuda()
    with autocast_context(torch.device("cuda"), True, amp_dtype(torch.device("cuda"), "fp16")):
        assert model.bottom_mlp[0](torch.randn(2, 4, device="cuda")).dtype == torch.float16
    for dtype in ("fp16", "auto"):
        args = _args(dataset, tmp_path / dtype, "--batch_size", "128", "--epochs", "2")
        result = main([a if a != "cpu" else "cuda" for a in args] + ["--amp", "--amp_dtype", dtype])
        assert result.final_metrics["auc"] >= 0.7, dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_copied_ahead_train_as_batches_copied_in_line(dataset: Path, tmp_path: Path) -> None:
    """The default (pinned batches, copied a step ahead on a side stream) sees the same batches in the same order
    as --no-copy_ahead: the same losses, up to the order of CUDA's atomic adds in the table update."""
    losses = {}
    for name, extra in (("ahead", []), ("in_line", ["--no-copy_ahead"])):
        args = [a if a != "cpu" else "cuda" for a in _args(dataset, tmp_path / name, "--batch_size", "128",
                                                           "--log_every_steps", "5")]
        result = main(args + extra)
        losses[name] = [r["loss"] for r in result_records(tmp_path / name) if r["kind"] == "train"]
        assert result.final_metrics["auc"] >= 0.7, name
    assert len(losses["ahead"]) >= 3 and losses["ahead"] == pytest.approx(losses["in_line"], rel=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sharding", ["data_parallel", pytest.param("table_wise", marks=pytest.mark.skipif(
    not fbgemm_gpu_available(), reason="TorchRec's tables on CUDA need fbgemm-gpu"))])
def test_cuda_run_resumes_from_its_last_checkpoint(dataset: Path, tmp_path: Path, sharding: str) -> None:
    """A retried GPU run loads its checkpoint onto the CPU and copies what each rank holds (its RNG states, saved
    as CPU tensors, included), so a sharded run's rank never holds the whole model on its GPU."""
    args = [a if a != "cpu" else "cuda" for a in _args(dataset, tmp_path / "run", "--batch_size", "256", "--epochs",
                                                       "3", "--checkpoint_every_steps", "20", "--sharding", sharding)]
    killed_at = _kill_after_a_checkpoint(args, tmp_path / "run")
    resumed = main(args)
    assert resumed.resumed_from_step == killed_at and resumed.steps == 3 * (20_000 // 256)
    assert resumed.final_metrics["auc"] >= 0.7


def result_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for a 2-process NCCL run")
def test_two_process_nccl_run(dataset: Path, tmp_path: Path) -> None:
    args = [a if a != "cpu" else "cuda" for a in _args(dataset, tmp_path, "--batch_size", "256",
                                                       "--limit_train_batches", "30")]
    proc = subprocess.run(torchrun_command(2, "models.dlrm.train", args, master_port=free_port()), cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 0, _torchrun_failure(proc)
    checksums = set(re.findall(r"final weights sha256 (\w+)", proc.stdout))
    assert len(checksums) == 1 and "(nccl)" in proc.stdout


def _sparse_average_rank(rank: int, out_dir: str) -> None:
    from models.torchkit.distributed import DistContext, average_sparse_gradients, data_parallel

    tables = [torch.nn.Embedding(10, 3, sparse=True) for _ in range(3)]
    torch.nn.init.constant_(tables[0].weight, float(rank))  # ranks start apart: data_parallel syncs them
    dense = torch.nn.Linear(3, 1)  # DDP needs at least one parameter of its own
    data_parallel(torch.nn.ModuleList([*tables, dense]), DistContext(rank, rank, 2, torch.device("cpu"), "gloo"),
                  ["0.weight", "1.weight", "2.weight"])
    assert torch.equal(tables[0].weight, torch.zeros(10, 3))
    # rank 0 looks up rows 1, 1, 4 in table 0 and nothing in table 2; rank 1 rows 4, 9 in table 0, 2 in both
    lookups = {0: [[1, 1, 4], [0, 3], None], 1: [[4, 9], [7], [2, 2]]}[rank]
    loss = sum((table(torch.tensor(rows)) * (rank + 1)).sum()
               for table, rows in zip(tables, lookups) if rows is not None)
    loss.backward()
    average_sparse_gradients([t.weight for t in tables], 2)
    torch.save([t.weight.grad.to_dense() for t in tables], f"{out_dir}/rank{rank}.pt")


def test_sparse_gradients_are_averaged_identically_on_every_rank(tmp_path: Path) -> None:
    spawn_ranks(_sparse_average_rank, tmp_path)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    expected = [torch.zeros(10, 3) for _ in range(3)]
    for rank, lookups in ((0, [[1, 1, 4], [0, 3], None]), (1, [[4, 9], [7], [2, 2]])):
        for table, rows in enumerate(lookups):
            for row in rows or []:
                expected[table][row] += (rank + 1) / 2  # d(sum * (rank+1))/d row, averaged over 2 ranks
    for got0, got1, want in zip(rank0, rank1, expected):
        assert torch.equal(got0, got1) and torch.allclose(got0, want)


def _gather_rows_rank(rank: int, out_dir: str) -> None:
    from models.torchkit.distributed import gather_rows

    ids = torch.tensor([[3, 3, 0, 7, 1], [7, 2, 5]][rank])  # rank 1 holds fewer rows (a short last batch)
    rows = torch.arange(len(ids) * 2, dtype=torch.float32).reshape(-1, 2) + 10 * rank - 2
    results = {}
    for name, bound in (("counted", None), ("bounded", 6)):
        all_ids, all_rows = gather_rows(ids, rows, 2, bound)
        results[name] = (all_ids, all_rows, torch.zeros(9, 2).index_add_(0, all_ids, all_rows, alpha=-0.5))
    if rank == 0:  # refused before its first collective (rank 1 joins none here)
        with pytest.raises(ValueError, match="5 row ids exceed max_count 4"):
            gather_rows(ids, rows, 2, 4)
    torch.save(results, f"{out_dir}/gather{rank}.pt")


def test_rows_gathered_against_a_bound_update_the_table_as_counted_ones(tmp_path: Path) -> None:
    """The trainer's gather pads every rank's rows to the batch's bound (row 0, zero rows) instead of exchanging
    counts first (a host sync each step on a GPU): the table update it feeds is the same."""
    spawn_ranks(_gather_rows_rank, tmp_path)
    got = [torch.load(tmp_path / f"gather{r}.pt", weights_only=True) for r in (0, 1)]
    counted_ids, counted_rows, counted_table = got[0]["counted"]
    bounded_ids, bounded_rows, bounded_table = got[0]["bounded"]
    assert counted_ids.tolist() == [3, 3, 0, 7, 1, 7, 2, 5] and len(bounded_ids) == 12
    assert bounded_ids[5:6].tolist() == [0] and not bounded_rows[5].any() and not bounded_rows[9:].any()
    assert torch.equal(bounded_table, counted_table) and counted_table.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(got[0]["bounded"], got[1]["bounded"]))
