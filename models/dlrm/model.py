"""DLRM as NVIDIA DeepLearningExamples' PyTorch DLRM builds it.

numericals -> bottom MLP (512-256-128) -> d-vector; each categorical -> its own nn.Embedding of width d;
dot interaction over the 1 + n_cat vectors (pairwise dot products, strict lower triangle) concatenated with the
bottom-MLP output -> top MLP (1024-1024-512-256-1) -> one click logit per row.

Differences from NVIDIA, on purpose: no zero padding of the interaction output to a multiple of 8 (it only aligns
tensor-core tiles; the padded columns are always 0), and no fused CUDA kernels (plain PyTorch ops on any device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

FLOAT32_BYTES = 4


def init_linear(linear: nn.Linear) -> nn.Linear:
    """NVIDIA/facebookresearch DLRM init: Glorot-normal weights, bias ~ N(0, 1/fan_out)."""
    fan_out, fan_in = linear.weight.shape
    nn.init.normal_(linear.weight, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
    nn.init.normal_(linear.bias, 0.0, math.sqrt(1.0 / fan_out))
    return linear


def mlp(in_features: int, sizes: Sequence[int], relu_last: bool) -> nn.Sequential:
    """Linear+ReLU stack; the last layer's ReLU is optional (the top MLP ends in a raw logit)."""
    layers: list[nn.Module] = []
    for i, out_features in enumerate(sizes):
        layers.append(init_linear(nn.Linear(in_features, out_features)))
        if relu_last or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        in_features = out_features
    return nn.Sequential(*layers)


def interaction_output_size(num_categorical: int, embedding_dim: int) -> int:
    """Width of the dot interaction's output: d (bottom MLP) + n(n-1)/2 pairwise dots, n = 1 + num_categorical."""
    n = num_categorical + 1
    return embedding_dim + n * (n - 1) // 2


def table_sizes(cardinalities: Sequence[int], max_table_size: int | None) -> list[int]:
    """Rows per embedding table: the cardinality, capped at max_table_size when given (NVIDIA --max_table_size)."""
    if max_table_size is None:
        return [int(c) for c in cardinalities]
    return [min(int(c), int(max_table_size)) for c in cardinalities]


def embedding_table_bytes(
    cardinalities: Sequence[int],
    embedding_dim: int,
    max_table_size: int | None = None,
    bytes_per_value: int = FLOAT32_BYTES,
) -> int:
    """Total size of the embedding tables' weights (rows x dim x bytes).

    Criteo 1TB with frequency threshold 15 (criteo_f15.yaml) at d=128 is ~16.7 GB in fp32.
    """
    return sum(table_sizes(cardinalities, max_table_size)) * embedding_dim * bytes_per_value


class DotInteraction(nn.Module):
    """Pairwise dot products of the bottom-MLP output and the embeddings, without self-products."""

    def __init__(self, num_categorical: int, embedding_dim: int) -> None:
        super().__init__()
        n = num_categorical + 1
        rows, cols = torch.tril_indices(n, n, offset=-1)
        # Buffers, not parameters: they move with .to(device) and are saved, but nothing trains them.
        self.register_buffer("tril_rows", rows, persistent=False)
        self.register_buffer("tril_cols", cols, persistent=False)
        self.output_size = interaction_output_size(num_categorical, embedding_dim)

    def forward(self, bottom_out: torch.Tensor, embeddings: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack([bottom_out, *embeddings], dim=1)  # [b, n, d]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # [b, n, n]
        flat = dots[:, self.tril_rows, self.tril_cols]  # [b, n(n-1)/2]
        return torch.cat([bottom_out, flat], dim=1)


class Dlrm(nn.Module):
    """DLRM: forward(numerical float [b, n_num], categorical int32 or int64 [b, n_cat]) -> logits [b]."""

    def __init__(
        self,
        num_numerical: int,
        categorical_cardinalities: Sequence[int],
        bottom_mlp_sizes: Sequence[int] = (512, 256, 128),
        top_mlp_sizes: Sequence[int] = (1024, 1024, 512, 256, 1),
        max_table_size: int | None = None,
        hash_indices: bool = False,
        sparse_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if num_numerical < 1:
            raise ValueError("DLRM needs at least one numerical feature (the bottom MLP feeds the interaction)")
        if not bottom_mlp_sizes or not top_mlp_sizes or top_mlp_sizes[-1] != 1:
            raise ValueError(f"bottom MLP {bottom_mlp_sizes} must be non-empty; top MLP {top_mlp_sizes} must end in 1")
        sizes = table_sizes(categorical_cardinalities, max_table_size)
        if not hash_indices and any(s < int(c) for s, c in zip(sizes, categorical_cardinalities)):
            raise ValueError(
                f"max_table_size {max_table_size} is below some cardinalities: set hash_indices so ids wrap around"
            )
        self.hparams: dict[str, Any] = {
            "num_numerical": int(num_numerical),
            "categorical_cardinalities": [int(c) for c in categorical_cardinalities],
            "bottom_mlp_sizes": [int(s) for s in bottom_mlp_sizes],
            "top_mlp_sizes": [int(s) for s in top_mlp_sizes],
            "max_table_size": None if max_table_size is None else int(max_table_size),
            "hash_indices": bool(hash_indices),
            "sparse_embeddings": bool(sparse_embeddings),
        }
        self.embedding_dim = int(bottom_mlp_sizes[-1])
        self.hash_indices = hash_indices
        self.bottom_mlp = mlp(num_numerical, bottom_mlp_sizes, relu_last=True)
        # Sparse gradients: an SGD step touches only the rows a batch used, not a whole (possibly GB-sized) table.
        self.embeddings = nn.ModuleList(nn.Embedding(s, self.embedding_dim, sparse=sparse_embeddings) for s in sizes)
        for table, rows in zip(self.embeddings, sizes):
            bound = math.sqrt(1.0 / rows)
            nn.init.uniform_(table.weight, -bound, bound)
        self.register_buffer("rows_per_table", torch.tensor(sizes, dtype=torch.int64), persistent=False)
        self.interaction = DotInteraction(len(sizes), self.embedding_dim)
        self.top_mlp = mlp(self.interaction.output_size, top_mlp_sizes, relu_last=False)

    def embedding_bytes(self) -> int:
        return sum(t.weight.numel() * t.weight.element_size() for t in self.embeddings)

    def sparse_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of the embedding tables when their gradients are sparse, else []."""
        if not self.embeddings or not self.embeddings[0].sparse:
            return []
        return [(f"embeddings.{i}.weight", table.weight) for i, table in enumerate(self.embeddings)]

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        if self.hash_indices:
            categorical = torch.remainder(categorical, self.rows_per_table)
        bottom_out = self.bottom_mlp(numerical)
        embedded = [table(categorical[:, i]) for i, table in enumerate(self.embeddings)]
        # Under autocast the bottom MLP yields bf16/fp16 while lookups stay fp32; bmm needs one dtype.
        embedded = [e.to(bottom_out.dtype) for e in embedded]
        return self.top_mlp(self.interaction(bottom_out, embedded)).squeeze(1)


def build_model(hparams: dict[str, Any]) -> Dlrm:
    """Rebuild a model from the `hparams` dict stored in checkpoints and model.pt."""
    return Dlrm(**hparams)
