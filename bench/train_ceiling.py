"""The compute-only ceiling of the training figure: the trainer's model fed random tensors already in memory.

  torchrun --nproc_per_node N -m bench.train_ceiling --dataset_dir D --batch_size B --bottom_mlp_sizes ... \
      --top_mlp_sizes ... --torch_threads T --warmup_steps W --measured_steps M --json OUT

Same model class (models.dlrm.model.Dlrm with the dataset's numerical count and cardinalities), same sparse
embeddings, optimizer, global batch, DDP over gloo and threads as models/dlrm/train.py, and nothing else: no
reader, no schedule, no progress lines, no checkpoint. W untimed steps, then M timed ones; rank 0 writes the
global samples/s.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from models.torchkit.distributed import average_sparse_gradients, data_parallel, init_distributed, shutdown_distributed
from models.dlrm.model import Dlrm
from tasks.formats.feature_spec import FeatureSpec

DISTINCT_BATCHES = 4  # cycled, so every step looks rows up in more than one place


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset_dir", type=Path, required=True)
    parser.add_argument("--batch_size", type=int, required=True, help="global batch, split across ranks")
    parser.add_argument("--bottom_mlp_sizes", type=int, nargs="+", required=True)
    parser.add_argument("--top_mlp_sizes", type=int, nargs="+", required=True)
    parser.add_argument("--torch_threads", type=int, required=True)
    parser.add_argument("--warmup_steps", type=int, default=5)
    parser.add_argument("--measured_steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def random_batches(rows: int, num_numerical: int, cardinalities: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
    batches = []
    for _ in range(DISTINCT_BATCHES):
        numerical = torch.randn(rows, num_numerical)
        categorical = torch.stack([torch.randint(0, int(c), (rows,), dtype=torch.int32) for c in cardinalities], dim=1)
        label = torch.randint(0, 2, (rows,)).float()
        batches.append((numerical, categorical, label))
    return batches


def main(argv: Sequence[str] | None = None) -> float:
    args = parse_args(argv)
    ctx = init_distributed("cpu")
    torch.set_num_threads(args.torch_threads)
    try:
        spec = FeatureSpec.from_yaml(args.dataset_dir / "feature_spec.yaml")
        cardinalities = spec.get_categorical_sizes()
        torch.manual_seed(12345)
        core = Dlrm(spec.get_number_of_numerical_features(), cardinalities, args.bottom_mlp_sizes,
                    args.top_mlp_sizes, sparse_embeddings=True)
        # the trainer's gradient exchange: DDP for the dense layers, the sparse embedding gradients after backward
        model = data_parallel(core, ctx, [name for name, _ in core.sparse_parameters()]) if ctx.is_distributed else core
        sparse = [param for _, param in core.sparse_parameters()]
        optimizer = torch.optim.SGD(core.parameters(), lr=args.lr)
        batches = random_batches(args.batch_size // ctx.world_size, spec.get_number_of_numerical_features(),
                                 cardinalities)

        def step(index: int) -> torch.Tensor:
            numerical, categorical, label = batches[index % DISTINCT_BATCHES]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(numerical, categorical), label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_sparse_gradients(sparse, ctx.world_size)
            optimizer.step()
            return loss.detach()

        for i in range(args.warmup_steps):
            step(i)
        if ctx.is_distributed:
            torch.distributed.barrier()
        start = time.perf_counter()
        for i in range(args.measured_steps):
            loss = step(i)
        loss.item()
        seconds = time.perf_counter() - start
        samples_per_second = args.measured_steps * args.batch_size / seconds
        if ctx.is_main:
            args.json.write_text(json.dumps({"samples_per_second": samples_per_second, "seconds": seconds,
                                             "world_size": ctx.world_size, "threads": torch.get_num_threads()}))
        return samples_per_second
    finally:
        shutdown_distributed(ctx)


if __name__ == "__main__":
    main()
