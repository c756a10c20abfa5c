"""The DLRM step of issue #28: one joint table with a fused index_add_ SGD update and the flat-index interaction
compute what the previous step computed (per-table sparse-gradient nn.Embedding + torch.optim.SGD, the lower
triangle by a 2-D advanced index), checkpoints of that layout still load, and a run writes its weights once."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from models.dlrm import evaluate
from models.dlrm.model import Dlrm
from models.dlrm.synthetic import make_synthetic_dataset
from models.dlrm.train import check_table_layout, main
from models.dlrm.config import DlrmConfig
from models.torchkit.checkpoint import latest_checkpoint, load_checkpoint, state_checksum
from models.torchkit.distributed import DistContext, amp_dtype, make_grad_scaler

CARDS = [7, 50, 3, 1000]
# fp32 on the CPU: the two paths add the same gradient rows in a different order (a coalesced sparse tensor vs
# index_add_), so they may differ in the last bits; 5 steps of lr 0.5 keep that below 1e-5.
TOLERANCE = 1e-5


class PreviousDlrm(nn.Module):
    """The step as it was before the joint table, written from the math: one sparse-gradient nn.Embedding per
    table, the interaction's lower triangle by dots[:, rows, cols]. Same state-dict keys as Dlrm."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__()
        self.bottom_mlp = _copy(model.bottom_mlp)
        self.embeddings = nn.ModuleList(nn.Embedding(rows, model.embedding_dim, sparse=True)
                                        for rows in model.table_sizes)
        self.top_mlp = _copy(model.top_mlp)
        n = len(model.table_sizes) + 1
        self.rows, self.cols = torch.tril_indices(n, n, offset=-1)
        self.load_state_dict(model.state_dict())

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom_mlp(numerical)
        stacked = torch.stack([bottom, *(t(categorical[:, i]) for i, t in enumerate(self.embeddings))], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        return self.top_mlp(torch.cat([bottom, dots[:, self.rows, self.cols]], dim=1)).squeeze(1)


def _copy(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module)


def _batches(steps: int, batch: int = 64) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(batch, 5, generator=generator),
             torch.stack([torch.randint(0, c, (batch,), generator=generator) for c in CARDS], dim=1),
             torch.randint(0, 2, (batch,), generator=generator).float()) for _ in range(steps)]


def test_new_step_equals_the_previous_step() -> None:
    torch.manual_seed(0)
    model = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1), interaction_padding=False)
    previous = PreviousDlrm(model)
    new_sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    old_sgd = torch.optim.SGD(previous.parameters(), lr=0.5)
    initial = model.embeddings.weight.detach().clone()
    losses = []
    for numerical, categorical, label in _batches(5):
        pair = []
        for net, sgd in ((model, new_sgd), (previous, old_sgd)):
            sgd.zero_grad(set_to_none=True)
            loss = nn.functional.binary_cross_entropy_with_logits(net(numerical, categorical), label)
            loss.backward()
            sgd.step()
            pair.append(loss.item())
        model.apply_sparse_update(lr=0.5)
        losses.append(pair)
    for new, old in losses:
        assert new == pytest.approx(old, abs=TOLERANCE)
    ours, theirs = model.state_dict(), previous.state_dict()
    assert ours.keys() == theirs.keys()
    assert (model.embeddings.weight - initial).abs().max() > 1e-3  # the tables did train
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=TOLERANCE, rtol=0, msg=name)


def test_previous_layout_checkpoints_load_and_saved_state_keeps_its_keys(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1), interaction_padding=False)
    old_state = PreviousDlrm(model).state_dict()  # what a model.pt of the previous layout holds
    rebuilt = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1), interaction_padding=False)
    rebuilt.load_state_dict(old_state)
    numerical, categorical, _ = _batches(1)[0]
    with torch.no_grad():
        assert torch.equal(rebuilt(numerical, categorical), model(numerical, categorical))
    # Saved, the tables are views of one storage: written once, read back under the per-table keys.
    path = tmp_path / "model.pt"
    evaluate.save_model_file(path, model, {"dataset_dir": ""}, step=3)
    assert path.stat().st_size < 1.2 * sum(v.numel() * 4 for v in old_state.values()) + 20_000
    loaded, payload = evaluate.load_model_file(path)
    assert set(payload["state_dict"]) == set(old_state)
    assert state_checksum(payload["state_dict"]) == state_checksum(old_state)
    with pytest.raises(RuntimeError, match="size mismatch for embeddings.1.weight"):
        rebuilt.load_state_dict({**old_state, "embeddings.1.weight": torch.zeros(49, 8)})
    with pytest.raises(RuntimeError, match="Missing key"):
        rebuilt.load_state_dict({k: v for k, v in old_state.items() if k != "embeddings.2.weight"})


def test_a_model_file_is_scored_on_the_cpu_from_its_own_mapped_memory(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """load_model_file on the CPU neither initialises the tables (45.8 s at criteo_f15 size on the host in issue
    #28) nor copies them: the model's joint table is the memory-mapped file's, and scores as the saved model does.
    A file whose tables are separate tensors (the previous layout's) loads by joining them, once."""
    from models.dlrm.model import JointEmbedding

    torch.manual_seed(3)
    model = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1))
    numerical, categorical, _ = _batches(1)[0]
    with torch.no_grad():
        expected = model(numerical, categorical)
    path = tmp_path / "model.pt"
    evaluate.save_model_file(path, model, {"dataset_dir": ""}, step=1)

    def no_init(self) -> None:
        raise AssertionError("a loaded model's tables were initialised")

    monkeypatch.setattr(JointEmbedding, "reset_parameters", no_init)
    loaded, payload = evaluate.load_model_file(path)
    mapped = payload["state_dict"]["embeddings.0.weight"]
    assert loaded.embeddings.weight.data_ptr() == mapped.data_ptr()  # no copy of the tables
    assert loaded.embeddings.weight.shape == (sum(CARDS), 8)
    with torch.no_grad():
        assert torch.equal(loaded(numerical, categorical), expected)

    from models.torchkit.checkpoint import host_state

    state = host_state(model.state_dict())  # host tensors: not copied, the tables' views still share one storage
    assert {v.untyped_storage().data_ptr() for k, v in state.items() if k.startswith("embeddings.")} == {
        model.embeddings.weight.untyped_storage().data_ptr()}
    previous = tmp_path / "previous.pt"  # per-table tensors, each its own storage
    evaluate.write_model_file(previous, {k: v.clone() for k, v in PreviousDlrm(model).state_dict().items()},
                              model.hparams, {"dataset_dir": ""}, step=1)
    joined, payload = evaluate.load_model_file(previous)
    assert joined.embeddings.weight.data_ptr() != payload["state_dict"]["embeddings.0.weight"].data_ptr()
    with torch.no_grad():
        assert torch.equal(joined(numerical, categorical), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_trained_on_a_gpu_is_written_as_one_table_storage_and_scored_on_the_cpu_without_a_copy(
        tmp_path: Path) -> None:
    """write_model_file copies the GPU's joint table to the host once (models.torchkit.checkpoint.host_state), not
    once per table into separate storages, which a CPU loader would have to join again (16.7 GB at full size)."""
    torch.manual_seed(4)
    model = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1)).cuda()
    numerical, categorical, _ = _batches(1)[0]
    with torch.no_grad():
        expected = model(numerical.cuda(), categorical.cuda()).cpu()
    path = tmp_path / "model.pt"
    checksum = evaluate.write_model_file(path, model.state_dict(), model.hparams, {"dataset_dir": ""}, step=1)
    assert checksum == state_checksum(model.state_dict())
    loaded, payload = evaluate.load_model_file(path, "cpu")
    assert loaded.embeddings.weight.data_ptr() == payload["state_dict"]["embeddings.0.weight"].data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(loaded(numerical, categorical), expected, atol=1e-5, rtol=1e-5)


def test_the_padded_interaction_trains_as_the_unpadded_one_did() -> None:
    """Zero columns bring the interaction to a multiple of 8 (10 + 8 = 18 -> 24 here): same losses and weights as
    the unpadded model whose weights it starts from, whatever the padded columns' weights hold (they never train)."""
    torch.manual_seed(2)
    unpadded = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1), interaction_padding=False)
    padded = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1))
    assert (unpadded.interaction.output_size, padded.interaction.output_size) == (18, 24)
    state = unpadded.state_dict()
    assert torch.equal(padded.state_dict()["top_mlp.0.weight"][:, 18:], torch.zeros(16, 6))
    torch.manual_seed(2)  # the same seed draws the same model: padding changes no weight
    again = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1))
    for name, value in unpadded.state_dict().items():
        got = again.state_dict()[name]
        assert torch.equal(got[:, :18] if name == "top_mlp.0.weight" else got, value), name
    extra = torch.randn(16, 6)
    padded.load_state_dict({**state, "top_mlp.0.weight": torch.cat([state["top_mlp.0.weight"], extra], dim=1)})
    sgds = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (unpadded, padded)]
    for numerical, categorical, label in _batches(5):
        losses = []
        for net, sgd in zip((unpadded, padded), sgds):
            sgd.zero_grad(set_to_none=True)
            loss = nn.functional.binary_cross_entropy_with_logits(net(numerical, categorical), label)
            loss.backward()
            sgd.step()
            net.apply_sparse_update(lr=0.5)
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], abs=TOLERANCE)
    after = padded.state_dict()
    torch.testing.assert_close(after["top_mlp.0.weight"][:, 18:], extra, atol=0, rtol=0)
    for name, value in unpadded.state_dict().items():
        torch.testing.assert_close(after[name][:, :18] if name == "top_mlp.0.weight" else after[name], value,
                                   atol=TOLERANCE, rtol=0, msg=name)


def test_a_model_file_from_before_the_padding_is_rebuilt_unpadded(tmp_path: Path) -> None:
    """Published versions saved before the padding have no `interaction_padding` in their hparams."""
    model = Dlrm(5, CARDS, bottom_mlp_sizes=(16, 8), top_mlp_sizes=(16, 1), interaction_padding=False)
    model.hparams.pop("interaction_padding")  # what the previous code saved
    path = tmp_path / "model.pt"
    evaluate.save_model_file(path, model, {"dataset_dir": ""}, step=1)
    loaded, _ = evaluate.load_model_file(path)
    assert loaded.interaction.output_size == 18
    numerical, categorical, _ = _batches(1)[0]
    with torch.no_grad():
        assert torch.equal(loaded(numerical, categorical), model(numerical, categorical))


def test_amp_type_is_bf16_where_the_device_computes_it_and_fp16_needs_its_scaler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")
    assert amp_dtype(torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        amp_dtype(torch.device("cpu"), "fp16")
    # No GPU here: the device's compute capability is stubbed (an A100/H100 is 8.x/9.x, a V100 7.0).
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert amp_dtype(cuda) == torch.bfloat16 and amp_dtype(cuda, "fp16") == torch.float16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert amp_dtype(cuda) == torch.float16 and amp_dtype(cuda, "bf16") == torch.bfloat16
    assert make_grad_scaler(cuda, True, torch.bfloat16) is None and make_grad_scaler(cuda, False) is None
    with pytest.raises(ValueError, match="expected one of auto, bf16, fp16"):
        amp_dtype(cuda, "fp8")


def test_fp16_loss_scaling_takes_or_skips_the_tables_with_the_dense_layers() -> None:
    """With fp16's loss scaler, an overflow in the table rows or in the dense gradients skips both updates and
    lowers the scale once; a clean step updates both. (CUDA's fp16 path, run with the scaler's CPU kernels; the
    overflow is planted in the gradients after backward.)"""
    from types import SimpleNamespace

    from models.dlrm.train import _scaled_update

    torch.manual_seed(0)
    model = Dlrm(2, CARDS, bottom_mlp_sizes=(8, 4), top_mlp_sizes=(8, 1))
    dense = [p for name, p in model.named_parameters() if name != "embeddings.weight"]
    optimizer = torch.optim.SGD(dense, lr=0.1)
    run = SimpleNamespace(scaler=torch.amp.GradScaler("cpu", init_scale=1024.0), optimizer=optimizer, core=model,
                          cfg=SimpleNamespace(batch_size=4), ctx=SimpleNamespace(world_size=1))

    def step(overflow: str) -> tuple[set[str], float]:
        logits = model(torch.randn(4, 2), torch.tensor([[1, 2, 0, 3]] * 4))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.ones(4))
        optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        if overflow == "tables":
            model.embeddings.pending[0][1][0, 0] = float("inf")
        elif overflow == "dense":
            dense[0].grad[0, 0] = float("inf")
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        _scaled_update(run, 0.1)
        return {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}, \
            run.scaler.get_scale()

    assert step("tables") == (set(), 512.0)
    assert step("dense") == (set(), 256.0)
    changed, scale = step("none")
    assert changed == {name for name, _ in model.named_parameters()} and scale == 256.0


def test_a_run_writes_its_weights_once_and_resumes_from_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_synthetic_dataset(data, train_rows=4_000, test_rows=1_000, seed=0)
    args = ["--dataset_dir", str(data), "--output_dir", str(tmp_path / "run"), "--bottom_mlp_sizes", "16", "8",
            "--top_mlp_sizes", "16", "1", "--batch_size", "512", "--eval_batch_size", "4096", "--device", "cpu",
            "--lr", "0.5", "--warmup_steps", "2", "--decay_start_step", "4", "--decay_steps", "3",
            "--checkpoint_every_steps", "7", "--torch_threads", "1"]
    first = main(args)
    assert first.steps == 7
    last = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert os.path.samefile(last, first.model_path)  # the last checkpoint is model.pt: one write of the weights
    assert state_checksum(load_checkpoint(last)["model"]) == first.weights_sha256
    _, payload = evaluate.load_model_file(first.model_path)
    assert state_checksum(payload["state_dict"]) == first.weights_sha256
    again = main(args)  # a retried task: resumes at the end, trains nothing, same weights
    assert again.resumed_from_step == 7 and again.weights_sha256 == first.weights_sha256


def test_multi_gpu_data_parallel_with_big_dense_tables_is_refused_before_training() -> None:
    cfg = DlrmConfig(bottom_mlp_sizes=(512, 256, 128), dense_table_limit_mb=256)
    nccl = DistContext(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"), backend="nccl")
    with pytest.raises(ValueError, match=r"set --sharding table_wise") as refused:
        check_table_layout(cfg, nccl, [1_000_000, 200_000])  # 586 MiB of tables
    assert "\n" not in str(refused.value) and "--dense_table_limit_mb" in str(refused.value)
    check_table_layout(cfg, nccl, [100_000])  # 49 MiB: dense gradients are acceptable
    check_table_layout(DlrmConfig(sharding="table_wise"), nccl, [1_000_000, 200_000])
    gloo = DistContext(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"), backend="gloo")
    check_table_layout(cfg, gloo, [1_000_000, 200_000])  # gloo keeps sparse updates


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices for a 2-process NCCL run")
def test_nccl_dense_tables_are_refused_and_the_sharded_layout_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tasks.core.launch import free_port, torchrun_command

    data = tmp_path / "data"
    make_synthetic_dataset(data, train_rows=8_192, test_rows=1_024, seed=0)
    base = ["--dataset_dir", str(data), "--bottom_mlp_sizes", "16", "8", "--top_mlp_sizes", "16", "1",
            "--batch_size", "1024", "--device", "cuda", "--lr", "0.5", "--dense_table_limit_mb", "0"]
    repo = Path(__file__).resolve().parents[1]
    refused = subprocess.run(torchrun_command(2, "models.dlrm.train", [*base, "--output_dir", str(tmp_path / "a")],
                                              master_port=free_port(), python=sys.executable),
                             cwd=repo, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "set --sharding table_wise" in refused.stdout + refused.stderr
    assert not (tmp_path / "a" / "model.pt").exists()
    sharded = subprocess.run(torchrun_command(2, "models.dlrm.train", [*base, "--output_dir", str(tmp_path / "b"),
                                                                      "--sharding", "table_wise"],
                                              master_port=free_port(), python=sys.executable),
                             cwd=repo, capture_output=True, text=True, timeout=300)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert (tmp_path / "b" / "model.pt").exists()
