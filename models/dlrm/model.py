"""DLRM as NVIDIA DeepLearningExamples' PyTorch DLRM builds it.

numericals -> bottom MLP (512-256-128) -> d-vector; each categorical -> its own nn.Embedding of width d;
dot interaction over the 1 + n_cat vectors (pairwise dot products, strict lower triangle) concatenated with the
bottom-MLP output -> top MLP (1024-1024-512-256-1) -> one click logit per row.

Like NVIDIA, the interaction output is padded with zero columns to a multiple of 8 (479 -> 480 for Criteo), which
keeps the top MLP's first GEMM on aligned tensor-core kernels; models saved before the padding (no
`interaction_padding` in their hparams) are rebuilt unpadded. Different from NVIDIA on purpose: no fused CUDA
kernels (plain PyTorch ops on any device).

The tables live in one joint [sum(rows), d] weight (`JointEmbedding`; table i starts at row offsets[i]): one
lookup per batch for all tables, and with `sparse_embeddings` an SGD update fused into one `index_add_` of the
batch's gradient rows (`apply_sparse_update`) instead of a sparse gradient tensor per table. The state dict keeps
one `embeddings.<i>.weight` entry per table (views of the joint weight: saved once, same keys as before), so
checkpoints and model.pt files of either layout load into either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# The interaction's output width is padded to a multiple of this (fp16/bf16 tensor-core GEMMs want 8).
PAD_TO = 8

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


def top_mlp(interaction: DotInteraction, sizes: Sequence[int]) -> nn.Sequential:
    """The top MLP over the interaction's output. With padding, the first layer is drawn as for the unpadded width
    (same random numbers as an unpadded model of the same seed) and the padded inputs get zero weight columns: a
    padded model starts, and trains, exactly as the unpadded one does; only its GEMMs are aligned."""
    layers = mlp(interaction.output_size - interaction.padding, sizes, relu_last=False)
    if interaction.padding:
        first = layers[0]
        with torch.no_grad():
            zeros = first.weight.new_zeros(first.out_features, interaction.padding)
            first.weight = nn.Parameter(torch.cat([first.weight, zeros], dim=1))
        first.in_features += interaction.padding
    return layers


def interaction_output_size(num_categorical: int, embedding_dim: int, padded: bool = False) -> int:
    """Width of the dot interaction's output: d (bottom MLP) + n(n-1)/2 pairwise dots, n = 1 + num_categorical;
    padded: rounded up to a multiple of 8 with zero columns (NVIDIA's DLRM pads 479 to 480 the same way)."""
    n = num_categorical + 1
    width = embedding_dim + n * (n - 1) // 2
    return -(-width // PAD_TO) * PAD_TO if padded else width


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
    """Pairwise dot products of the bottom-MLP output and the embeddings, without self-products.

    padded: zero columns bring the output width to a multiple of 8, so the top MLP's first GEMM runs on aligned
    tensor-core kernels (with 479 columns an H200 ran sm75-era align1 kernels; docs/PERFORMANCE-gpu.md). A zero
    input column changes no output, and its weight column gets a zero gradient."""

    def __init__(self, num_categorical: int, embedding_dim: int, padded: bool = False) -> None:
        super().__init__()
        n = num_categorical + 1
        rows, cols = torch.tril_indices(n, n, offset=-1)
        # The strict lower triangle as positions in the flattened [n, n] dot matrix: an index_select over one dim,
        # whose backward is one index_add, not the sort-and-accumulate of a 2-D advanced index. A buffer, not a
        # parameter: it moves with .to(device) and nothing trains it.
        self.register_buffer("tril_flat", rows * n + cols, persistent=False)
        self.output_size = interaction_output_size(num_categorical, embedding_dim, padded)
        self.padding = self.output_size - interaction_output_size(num_categorical, embedding_dim)

    def forward(self, bottom_out: torch.Tensor, embeddings: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """bottom_out [b, d]; embeddings [b, n_cat, d] (or a list of n_cat [b, d])."""
        if isinstance(embeddings, (list, tuple)):
            embeddings = torch.stack(embeddings, dim=1)
        stacked = torch.cat([bottom_out.unsqueeze(1), embeddings], dim=1)  # [b, n, d]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # [b, n, n]
        flat = dots.flatten(1).index_select(1, self.tril_flat)  # [b, n(n-1)/2]
        if self.padding:
            return torch.cat([bottom_out, flat, flat.new_zeros(flat.shape[0], self.padding)], dim=1)
        return torch.cat([bottom_out, flat], dim=1)


class _FusedLookup(torch.autograd.Function):
    """weight[ids] whose backward hands the gradient rows to the table (for `apply_sparse_update`) instead of
    building a gradient of the whole weight."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, table: JointEmbedding) -> torch.Tensor:
        ctx.ids, ctx.table = ids, table
        return weight.index_select(0, ids)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.table.pending.append((ctx.ids, grad))
        return None, None, None


class JointEmbedding(nn.Module):
    """All embedding tables in one [sum(rows), d] weight, table i at rows offsets[i]..offsets[i+1].

    fused=True: the weight gets no gradient; backward leaves the batch's (row ids, gradient rows) in `pending` and
    `apply_sparse_update` applies plain SGD with one index_add_ (duplicate ids add up, as a coalesced sparse
    gradient does). fused=False: an ordinary dense gradient (what DDP all-reduces).
    """

    def __init__(self, sizes: Sequence[int], dim: int, fused: bool, init: bool = True) -> None:
        """init=False: the weight is left uninitialised (untouched memory), for a loader that assigns the file's."""
        super().__init__()
        self.sizes = [int(s) for s in sizes]
        self.fused = fused
        starts = [0]
        for rows in self.sizes:
            starts.append(starts[-1] + rows)
        self.register_buffer("offsets", torch.tensor(starts[:-1], dtype=torch.int64), persistent=False)
        self._starts = starts
        # Allocated where the caller's device context says (train: the training device), never twice.
        self.weight = nn.Parameter(torch.empty(starts[-1], dim))
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        if init:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """NVIDIA's table init, per table: uniform(-sqrt(1/rows), sqrt(1/rows)); a no-op on the meta device."""
        for i, rows in enumerate(self.sizes):
            bound = math.sqrt(1.0 / rows)
            nn.init.uniform_(self.table(i), -bound, bound)

    def table(self, i: int) -> torch.Tensor:
        return self.weight[self._starts[i]:self._starts[i + 1]]

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        """[b, n_cat] ids -> [b, n_cat, d] rows."""
        ids = (categorical + self.offsets).reshape(-1)
        if self.fused and torch.is_grad_enabled() and self.weight.requires_grad:
            rows = _FusedLookup.apply(self.weight, ids, self)
        else:
            rows = F.embedding(ids, self.weight)
        return rows.view(*categorical.shape, self.weight.shape[1])

    def take_pending(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(row ids, gradient rows) of the backward passes since the last call, or None."""
        if not self.pending:
            return None
        ids = torch.cat([i for i, _ in self.pending]) if len(self.pending) > 1 else self.pending[0][0]
        grads = torch.cat([g for _, g in self.pending]) if len(self.pending) > 1 else self.pending[0][1]
        self.pending = []
        return ids, grads

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        # One entry per table, as views of the joint weight: torch.save writes the shared storage once.
        weight = self.weight if keep_vars else self.weight.detach()
        for i in range(len(self.sizes)):
            destination[f"{prefix}{i}.weight"] = weight[self._starts[i]:self._starts[i + 1]]

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        names = [f"{prefix}{i}.weight" for i in range(len(self.sizes))]
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in names)
        missing_keys.extend(k for k in names if k not in state_dict)
        if any(k not in state_dict for k in names):
            return
        for i, name in enumerate(names):
            value = state_dict[name]
            expected = (self.sizes[i], self.weight.shape[1])
            if tuple(value.shape) != expected:
                error_msgs.append(f"size mismatch for {name}: copying a param with shape {tuple(value.shape)}, "
                                  f"the model's is {expected}")
        if error_msgs:
            return
        if local_metadata.get("assign_to_params_buffers", False) or self.weight.is_meta:
            # assign=True (a model built on the meta device, or a loader that keeps the file's memory-mapped
            # tensors): one joint tensor from the tables, on their device.
            joined = _joint_view([state_dict[name].detach() for name in names])
            if joined is None:
                joined = torch.cat([state_dict[name].detach() for name in names])
            self.weight = nn.Parameter(joined, requires_grad=self.weight.requires_grad)
            return
        with torch.no_grad():
            for i, name in enumerate(names):
                self.table(i).copy_(state_dict[name])


def _joint_view(tables: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tables as one [sum(rows), d] tensor without a copy when they lie back to back in one storage (as
    `_save_to_state_dict` saves them: views of the joint weight, so a loaded file's tables do), else None."""
    first = tables[0]
    dim, offset = first.shape[1], first.storage_offset()
    for table in tables:
        if (table.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or table.dim() != 2
                or table.shape[1] != dim or table.dtype != first.dtype or table.stride() != (dim, 1)
                or table.storage_offset() != offset):
            return None
        offset += table.shape[0] * dim
    return first.as_strided((sum(t.shape[0] for t in tables), dim), (dim, 1))


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
        interaction_padding: bool = True,
        init_tables: bool = True,
    ) -> None:
        """init_tables=False leaves the tables uninitialised: for a loader about to replace them (build_model)."""
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
            "interaction_padding": bool(interaction_padding),
        }
        self.embedding_dim = int(bottom_mlp_sizes[-1])
        self.hash_indices = hash_indices
        self.bottom_mlp = mlp(num_numerical, bottom_mlp_sizes, relu_last=True)
        # With sparse_embeddings an SGD step touches only the rows a batch used (`apply_sparse_update`), never a
        # whole (possibly GB-sized) table; without, the joint weight gets a dense gradient.
        self.embeddings = JointEmbedding(sizes, self.embedding_dim, fused=sparse_embeddings, init=init_tables)
        self.register_buffer("rows_per_table", torch.tensor(sizes, dtype=torch.int64), persistent=False)
        self.interaction = DotInteraction(len(sizes), self.embedding_dim, interaction_padding)
        self.top_mlp = top_mlp(self.interaction, top_mlp_sizes)

    @property
    def table_sizes(self) -> list[int]:
        return list(self.embeddings.sizes)

    def embedding_bytes(self) -> int:
        weight = self.embeddings.weight
        return weight.numel() * weight.element_size()

    def sparse_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of the tables when their update is the fused sparse one (no autograd gradient:
        DDP must leave them alone), else []."""
        return [("embeddings.weight", self.embeddings.weight)] if self.embeddings.fused else []

    @torch.no_grad()
    def apply_sparse_update(self, lr: float, world_size: int = 1, inv_scale: torch.Tensor | None = None,
                            max_rows: int | None = None, found_inf: torch.Tensor | None = None) -> None:
        """Plain SGD on the rows the last backward looked up: weight[ids] -= lr * mean over ranks of their gradient
        rows (one index_add_; duplicates add up). Every rank calls this after backward; with world_size > 1 the
        rows of all ranks are gathered first (identical on every rank). max_rows: a bound on any rank's looked-up
        rows (batch rows x tables), which spares the gather its count exchange (`gather_rows`).

        inv_scale: 1 / the loss scale of an fp16 GradScaler; a step whose rows hold inf/nan is then skipped (no
        sync with the host). found_inf: the scaler's flag of this step after `unscale_` (the dense gradients'): the
        tables are skipped with the dense layers, and their own overflow is added to it, so that the scaler skips
        the dense step too and lowers its scale. Checked after the gather: every rank decides the same."""
        taken = self.embeddings.take_pending()
        if taken is None:
            return
        ids, grads = taken
        weight = self.embeddings.weight
        grads = grads.to(weight.dtype)
        if world_size > 1:
            from models.torchkit.distributed import gather_rows

            ids, grads = gather_rows(ids, grads, world_size, max_rows)
            lr = lr / world_size
        if inv_scale is not None:
            grads = grads * inv_scale
            overflow = ~torch.isfinite(grads).all()
            if found_inf is not None:
                found_inf.add_(overflow.to(found_inf.dtype))
                overflow = found_inf > 0
            grads = torch.where(overflow, torch.zeros((), dtype=grads.dtype, device=grads.device), grads)
        weight.index_add_(0, ids, grads, alpha=-lr)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        if self.hash_indices:
            categorical = torch.remainder(categorical, self.rows_per_table)
        bottom_out = self.bottom_mlp(numerical)
        # Under autocast the bottom MLP yields bf16/fp16 while lookups stay fp32; bmm needs one dtype.
        embedded = self.embeddings(categorical).to(bottom_out.dtype)
        return self.top_mlp(self.interaction(bottom_out, embedded)).squeeze(1)


def build_model(hparams: dict[str, Any], init_tables: bool = True) -> Dlrm:
    """Rebuild a model from the `hparams` dict stored in checkpoints and model.pt. Models saved before the
    interaction was padded have no `interaction_padding`: they are rebuilt unpadded, as they were trained.
    init_tables=False: the tables are left uninitialised, for a caller that loads the file's into them."""
    return Dlrm(**{"interaction_padding": False, **hparams}, init_tables=init_tables)
