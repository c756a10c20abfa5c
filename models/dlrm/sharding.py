"""Hybrid-parallel DLRM: embedding tables sharded across ranks by TorchRec, MLPs data parallel.

`ShardedDlrm` is models.dlrm.model.Dlrm with its tables held in one TorchRec EmbeddingBagCollection (one bag of one
id per row and feature, which is an embedding lookup) and the same dense layers under the same names. `shard`
wraps it in TorchRec's DistributedModelParallel with a plan from TorchRec's planner restricted by constraints to the
requested sharding type:

  table_wise   each table lives whole on one rank (the planner balances tables over ranks)
  column_wise  each table is split by embedding columns, a slice per rank
  auto         the planner chooses per table among the types that run on CPU (table-wise, column-wise)
  row_wise     tables split by rows: FBGEMM's CPU build has no row-wise kernels, so CUDA only

The tables train with FBGEMM's fused SGD inside the backward pass (DMP's fused optimizer; TorchRec divides the
embedding gradients of its all-to-all by the world size, so they are averaged over ranks as the data-parallel
path's sparse gradients are), the dense layers with torch.optim.SGD under DDP.

Checkpoints and model.pt stay in the plain (unsharded) Dlrm format: `gather_plain_state` collects every table on
rank 0 under Dlrm's own names, and `load_plain_state` copies each rank's slices out of such a state. A sharded run
can therefore resume from a data-parallel checkpoint and the other way round, with any world size, and evaluate,
export and predict read its model.pt unchanged. The price: rank 0 holds the whole model while it saves (see
docs/scale_out.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from models.dlrm.config import SHARDINGS
from models.dlrm.model import DotInteraction, Dlrm, mlp, top_mlp
from models.torchkit.distributed import DistContext

DATA_PARALLEL = "data_parallel"
CPU_SHARDING_TYPES = ("table_wise", "column_wise")
CUDA_ONLY_SHARDINGS = ("row_wise",)
_TABLES = "embedding_bags.embedding_bags."  # state-dict prefix of the tables inside ShardedDlrm


def check_sharding(sharding: str, device: torch.device) -> None:
    """Refuse a sharding type that cannot run on `device`, before any process builds a model."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding {sharding!r}: expected one of {', '.join(SHARDINGS)}")
    if sharding in CUDA_ONLY_SHARDINGS and device.type != "cuda":
        raise ValueError(f"sharding {sharding!r} needs CUDA (FBGEMM's CPU build has no row-wise kernels); on CPU use "
                         f"{' or '.join(CPU_SHARDING_TYPES)}")


def table_name(index: int) -> str:
    return f"t{index}"


def feature_name(index: int) -> str:
    # By position: a FeatureSpec's names may hold characters TorchRec's module names cannot.
    return f"f{index}"


class ShardedDlrm(nn.Module):
    """Dlrm with a TorchRec EmbeddingBagCollection for its tables (on the meta device until DMP shards it)."""

    def __init__(self, hparams: Mapping[str, Any], device: torch.device) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        with torch.device("meta"):  # validates the hparams as Dlrm does, allocating nothing
            template = Dlrm(**hparams)
        self.hparams: dict[str, Any] = template.hparams
        sizes = _table_sizes(template)
        dim = template.embedding_dim
        self.embedding_dim = dim
        self.hash_indices = template.hash_indices
        self.keys = [feature_name(i) for i in range(len(sizes))]
        self.bottom_mlp = mlp(self.hparams["num_numerical"], self.hparams["bottom_mlp_sizes"],
                              relu_last=True).to(device)
        tables = [EmbeddingBagConfig(name=table_name(i), embedding_dim=dim, num_embeddings=rows,
                                     feature_names=[feature_name(i)], pooling=PoolingType.SUM)
                  for i, rows in enumerate(sizes)]
        # TorchRec initialises each shard where it lands: uniform(+-sqrt(1/rows)), NVIDIA's table init.
        self.embedding_bags = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.register_buffer("rows_per_table", torch.tensor(sizes, dtype=torch.int64, device=device),
                             persistent=False)
        self.interaction = DotInteraction(len(sizes), dim, self.hparams["interaction_padding"]).to(device)
        self.top_mlp = top_mlp(self.interaction, self.hparams["top_mlp_sizes"]).to(device)

    def sparse_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return []  # the tables are updated by the fused optimizer in the backward pass, not by gradients

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("embedding_bags.")]

    def embedding_bytes(self) -> int:
        """Bytes of the table slices this rank holds (after sharding; the whole tables before)."""
        total = 0
        for key, value in self.state_dict().items():
            if key.startswith(_TABLES):
                shards = [s.tensor for s in value.local_shards()] if _is_sharded(value) else [value]
                total += sum(t.numel() * t.element_size() for t in shards)
        return total

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if self.hash_indices:
            categorical = torch.remainder(categorical, self.rows_per_table)
        rows = categorical.shape[0]
        features = KeyedJaggedTensor(keys=self.keys, values=categorical.T.reshape(-1),
                                     lengths=torch.ones(rows * len(self.keys), dtype=torch.int32,
                                                        device=categorical.device))
        pooled = self.embedding_bags(features).to_dict()
        bottom_out = self.bottom_mlp(numerical)
        embedded = [pooled[key].to(bottom_out.dtype) for key in self.keys]
        return self.top_mlp(self.interaction(bottom_out, embedded)).squeeze(1)


def _table_sizes(template: Dlrm) -> list[int]:
    return template.table_sizes


def fbgemm_gpu_available() -> bool:
    """True when fbgemm-gpu imports with its CUDA kernels (TorchRec's fused TBE on the GPU). A fbgemm-gpu built for
    another torch fails here with an undefined symbol: that counts as absent (deploy/Dockerfile pairs them)."""
    if not torch.cuda.is_available():
        return False
    try:
        import fbgemm_gpu  # noqa: F401
        return hasattr(torch.ops.fbgemm, "split_embedding_codegen_lookup_sgd_function")
    except (ImportError, OSError, RuntimeError, AttributeError):
        return False


def _is_sharded(value: Any) -> bool:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    return isinstance(value, ShardedTensor)


def sharding_plan(model: ShardedDlrm, sharding: str, ctx: DistContext, local_batch: int) -> Any:
    """TorchRec's planner's plan for the model's tables, restricted to `sharding` (all ranks must call this)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders

    check_sharding(sharding, ctx.device)
    types = list(CPU_SHARDING_TYPES) if sharding == "auto" else [sharding]
    if sharding == "auto" and ctx.device.type == "cuda":
        types.append("row_wise")
    # Column-wise slices of dim / world_size columns (the planner wants a multiple of 4 and at least min_partition).
    min_partition = max(4, model.embedding_dim // ctx.world_size // 4 * 4)
    constraints = {table_name(i): ParameterConstraints(sharding_types=types, min_partition=min_partition)
                   for i in range(len(model.keys))}
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=ctx.world_size, compute_device=ctx.device.type, local_world_size=local_world),
        batch_size=local_batch, constraints=constraints)
    return planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)


def shard(model: ShardedDlrm, sharding: str, ctx: DistContext, local_batch: int, lr: float) -> tuple[nn.Module, Any]:
    """(DistributedModelParallel over the model, its fused table optimizer). The model's tables are replaced by
    their sharded version in place, so `model` itself stays usable (e.g. for evaluation without DDP)."""
    from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel

    apply_optimizer_in_backward(torch.optim.SGD, model.embedding_bags.parameters(), {"lr": lr})
    plan = sharding_plan(model, sharding, ctx, local_batch)
    dmp = DistributedModelParallel(module=model, device=ctx.device, plan=plan)
    return dmp, dmp.fused_optimizer


def plan_summary(model: nn.Module) -> dict[str, str]:
    """table -> 'sharding type on ranks [...]' of a sharded model (for the log and metrics.json)."""
    summary = {}
    for key, value in model.state_dict().items():
        if key.startswith(_TABLES) and _is_sharded(value):
            placements = sorted({int(str(m.placement).split("rank:")[1].split("/")[0])
                                 for m in value.metadata().shards_metadata})
            columns = {tuple(m.shard_sizes) for m in value.metadata().shards_metadata}
            summary[key[len(_TABLES):].split(".")[0]] = f"ranks {placements} shards {sorted(columns)}"
    return summary


def plain_key(key: str) -> str:
    """ShardedDlrm state-dict name -> Dlrm's (embedding_bags.embedding_bags.t3.weight -> embeddings.3.weight)."""
    if key.startswith(_TABLES):
        table = key[len(_TABLES):].split(".")[0]
        return f"embeddings.{int(table[1:])}.weight"
    return key


_HOST_GROUP: list[Any] = []  # [NCCL world, a gloo group over the same ranks] for host-memory transfers


def _host_group(ctx: DistContext) -> Any:
    """A process group whose collectives take CPU tensors: the world itself on gloo, a gloo group of the same ranks
    beside NCCL (made once per world, by every rank: new_group is collective)."""
    if ctx.backend != "nccl":
        return None  # the default group
    world = dist.GroupMember.WORLD
    if not _HOST_GROUP or _HOST_GROUP[0] is not world:  # a new world (destroyed and made again) gets its own
        _HOST_GROUP[:] = [world, dist.new_group(backend="gloo")]
    return _HOST_GROUP[1]


def _region(full: torch.Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, sizes)):
        full = full.narrow(dim, start, length)
    return full


def _gather_to_host(value: Any, full: torch.Tensor | None, rank: int, group: Any) -> None:
    """Each shard of a ShardedTensor into rank 0's CPU tensor `full`, one shard in host memory at a time.

    Not ShardedTensor.gather: it gathers the shards' device tensors into buffers on `full`'s device, which neither
    backend takes for a GPU model (gloo gathers CPU tensors only, NCCL refuses CPU buffers), and gathering onto rank
    0's GPU would put there a row-wise table that fits no single GPU."""
    local = {(tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor for s in value.local_shards()}
    for meta in value.metadata().shards_metadata:  # the same order on every rank
        owner, where = meta.placement.rank(), (tuple(meta.shard_offsets), tuple(meta.shard_sizes))
        if owner == rank == 0:
            _region(full, *where).copy_(local[where])
        elif owner == rank:
            dist.send(local[where].detach().cpu().contiguous(), dst=0, group=group)
        elif rank == 0:
            piece = torch.empty(where[1], dtype=full.dtype)
            dist.recv(piece, src=owner, group=group)
            _region(full, *where).copy_(piece)


def gather_plain_state(model: ShardedDlrm, ctx: DistContext) -> dict[str, torch.Tensor] | None:
    """The whole model as a Dlrm state dict in rank 0's host memory (None elsewhere). Every rank must call this.
    The tables are gathered into one joint host tensor, in table order, as a Dlrm holds them: model.pt then holds
    them as one storage, which a loader maps back as the joint table without a copy."""
    plain: dict[str, torch.Tensor] = {}
    group = _host_group(ctx)
    state = model.state_dict()
    tables = _joint_host_slots(state) if ctx.is_main else {}
    for key, value in state.items():
        if _is_sharded(value):
            full = None
            if ctx.is_main:
                full = tables[key] if key in tables else torch.empty(value.size(), dtype=value.dtype)
            _gather_to_host(value, full, ctx.rank, group)
            if ctx.is_main:
                plain[plain_key(key)] = full
        elif ctx.is_main:
            plain[plain_key(key)] = tables[key].copy_(value) if key in tables else value.detach().cpu().clone()
    return plain if ctx.is_main else None


def _joint_host_slots(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Each table's rows of one host tensor holding every table back to back in table order (sharded or not), by
    ShardedDlrm key; {} when the tables differ in width or type (then each is gathered on its own)."""
    keys = sorted((k for k in state if plain_key(k) != k), key=lambda k: int(plain_key(k).split(".")[1]))
    if not keys or len({(state[k].size()[1], state[k].dtype) for k in keys}) != 1:
        return {}
    rows = [state[k].size()[0] for k in keys]
    joint = torch.empty(sum(rows), state[keys[0]].size()[1], dtype=state[keys[0]].dtype)
    return dict(zip(keys, torch.split(joint, rows)))


@torch.no_grad()
def load_plain_state(model: ShardedDlrm, plain: Mapping[str, torch.Tensor]) -> None:
    """Copy a Dlrm state dict into the sharded model: each rank takes the slices of the tables it holds."""
    current = model.state_dict()
    expected = {plain_key(k) for k in current}
    if set(plain) != expected:
        raise ValueError(f"state dict keys differ from the model's: missing {sorted(expected - set(plain))}, "
                         f"unexpected {sorted(set(plain) - expected)}")
    for key, target in current.items():
        source = plain[plain_key(key)]
        if not _is_sharded(target):
            target.copy_(source)
            continue
        for piece in target.local_shards():
            (row, col), (rows, cols) = piece.metadata.shard_offsets, piece.metadata.shard_sizes
            piece.tensor.copy_(source[row:row + rows, col:col + cols])


def single_process_group(ctx: DistContext) -> DistContext:
    """DistributedModelParallel needs a process group even for one process: a gloo group of one in memory."""
    if ctx.is_distributed:
        return ctx
    dist.init_process_group(backend="gloo", store=dist.HashStore(), rank=0, world_size=1)
    return DistContext(rank=0, local_rank=0, world_size=1, device=ctx.device, backend="gloo")
