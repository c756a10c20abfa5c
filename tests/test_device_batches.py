"""Batches moved to the device a step ahead: the CPU path is a plain map; the CUDA path (gpu-marked) hands out the
same values without the host waiting on the copies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.dlrm.data import PrefetchingReader, SplitBinaryDataset, to_device
from models.dlrm.synthetic import make_synthetic_dataset
from models.torchkit.device_batches import ahead_on_device
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
