"""Batches moved to the device a step ahead, and results read back a batch behind: the CPU paths are plain maps;
the CUDA paths (gpu-marked) hand out the same values without the host waiting on the copies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.dlrm.data import PrefetchingReader, SplitBinaryDataset, to_device
from models.dlrm.synthetic import make_synthetic_dataset
from models.torchkit.device_batches import ahead_on_device, to_host_behind
from tasks.formats.feature_spec import FeatureSpec


def test_on_the_cpu_each_batch_is_moved_in_order_as_it_is_asked_for() -> None:
    moved: list[int] = []

    def move(i: int) -> tuple[torch.Tensor, ...]:
        moved.append(i)
        return (torch.tensor([i]),)

    batches = ahead_on_device(range(4), move, "cpu")
    assert next(batches)[0].item() == 0 and moved == [0]  # nothing read ahead: no streams to overlap with
    assert [b[0].item() for b in batches] == [1, 2, 3] and moved == [0, 1, 2, 3]
    assert list(ahead_on_device([], move, "cpu")) == []


def test_on_the_cpu_results_come_back_as_arrays_in_order_as_they_are_made() -> None:
    made: list[int] = []

    def results():
        for i in range(3):
            made.append(i)
            yield torch.full((2,), float(i), requires_grad=True) * 2, torch.tensor([i], dtype=torch.uint8)

    back = to_host_behind(results(), "cpu")
    logits, labels = next(back)
    assert made == [0]  # not read behind on the CPU: there is no queue to keep fed
    assert logits.tolist() == [0.0, 0.0] and labels.dtype == np.uint8
    assert [(a.tolist(), b.tolist()) for a, b in back] == [([2.0, 2.0], [1]), ([4.0, 4.0], [2])]
    assert list(to_host_behind(iter(()), "cpu")) == []


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> FeatureSpec:
    out = tmp_path_factory.mktemp("split_binary")
    make_synthetic_dataset(out, train_rows=4096, test_rows=64, n_numerical=3, cardinalities=(40, 300, 70_000),
                           seed=2)
    return FeatureSpec.from_yaml(Path(out) / "feature_spec.yaml")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_pinned_batches_arrive_equal_and_the_host_never_waits(spec: FeatureSpec) -> None:
    device = torch.device("cuda")
    with (SplitBinaryDataset(spec, "train", 256) as pageable,
          SplitBinaryDataset(spec, "train", 256, pin_memory=True) as pinned):
        expected = [tuple(t.cpu() for t in to_device(pageable.raw(i), device)) for i in range(len(pageable))]
        order = list(range(len(pinned)))
        reader = PrefetchingReader(pinned, order, depth=2, raw=True)
        assert all(t.is_pinned() for t in (reader.dataset.raw(0)[0], reader.dataset.raw(0)[2]))
        got = []
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call on the way raises
        try:
            for numerical, categorical, label in ahead_on_device(reader, lambda b: to_device(b, device), device):
                got.append(torch.stack([numerical.sum(), categorical.float().sum(), label.sum()]))
                torch.cuda._sleep(1_000_000)  # a slow step: the next batch's copy overlaps it
        finally:
            torch.cuda.set_sync_debug_mode(0)
        sums = torch.stack(got).cpu()
    assert len(sums) == len(expected)
    for row, (numerical, categorical, label) in zip(sums, expected):
        assert torch.allclose(row, torch.stack([numerical.sum(), categorical.float().sum(), label.sum()]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_results_are_read_a_batch_behind_and_own_their_memory() -> None:
    made: list[int] = []

    def results():
        for i in range(5):
            made.append(i)
            torch.cuda._sleep(1_000_000)  # a slow batch: the previous one's copy is waited for while it runs
            yield torch.arange(4, device="cuda", dtype=torch.float32) + i, torch.full((4,), i, device="cuda")

    back = to_host_behind(results(), "cuda")
    first = next(back)
    assert made == [0, 1]  # batch 0 is handed out once batch 1's work is queued
    rest = list(back)
    got = [first, *rest]
    assert [a.tolist() for a, _ in got] == [[i, i + 1, i + 2, i + 3] for i in range(5)]
    assert [b.tolist() for _, b in got] == [[i] * 4 for i in range(5)]
    assert all(a.flags.owndata and b.flags.owndata for a, b in got)  # copies, not views of pinned buffers
