"""The training figure's peer: TorchRec's DLRM trained on the same split-binary data, sizes, batch and schedule.

  torchrun --nproc_per_node N -m bench.torchrec_dlrm --variant {plain,fused,dmp} --dataset_dir D --json OUT \
      [models.dlrm.train's own flags: --batch_size --bottom_mlp_sizes --top_mlp_sizes --lr --limit_train_batches
       --log_every_steps --eval_batch_size --limit_eval_batches --torch_threads ...]

The model is `torchrec.models.dlrm.DLRM` over an EmbeddingBagCollection of the dataset's tables (dim = the bottom
MLP's last width, TorchRec's default initialisation), as a TorchRec user builds it; three ways of training it:

  plain  EmbeddingBagCollection (nn.EmbeddingBag tables, dense gradients) and torch.optim.SGD over everything;
         DistributedDataParallel over the whole model on 2+ processes.
  fused  FusedEmbeddingBagCollection: FBGEMM's CPU table-batched embedding kernel with SGD fused into its backward
         (the tables are never given a gradient); SGD for the dense part. One process only: its tables are not
         shared by a data-parallel wrapper.
  dmp    DistributedModelParallel: the planner shards the tables over the ranks (CPU: gloo), FBGEMM's fused
         kernel with exact SGD in the backward (`apply_optimizer_in_backward`), DDP for the dense part.

Everything around the model is recflow's trainer's: the batches come from models.dlrm.data (SplitBinaryDataset +
PrefetchingReader, the same shard of batches per rank), the learning rate follows DlrmConfig's schedule step by
step (base lr x factor(step), every optimizer, fused ones included), the loss is the mean BCE of the logits, and
the test AUC is models.common.metrics' roc_auc over the same test rows. Timing is the trainer's too: the steps after
the first log interval, with the loss synchronised at the end of every interval. Rank 0 writes the JSON result.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from models.dlrm.config import DlrmConfig, build_parser, config_from_namespace
from models.dlrm.data import Batch, PrefetchingReader, SplitBinaryDataset, shard_batch_indices
from models.torchkit.distributed import DistContext, init_distributed, shutdown_distributed
from tasks.formats.feature_spec import FeatureSpec

VARIANTS = ("plain", "fused", "dmp")
SINGLE_PROCESS_ONLY = ("fused",)


@dataclass
class PeerResult:
    variant: str
    world_size: int
    threads: int
    steps: int
    warmup_steps: int
    samples_per_second: float  # global samples over the steps after the warm-up interval
    auc: float
    eval_rows: int
    sharding: dict[str, str]   # table -> sharding type (dmp), else empty


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, DlrmConfig]:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--json", type=Path, required=True, help="rank 0 writes the PeerResult here")
    namespace = parser.parse_args(argv)
    return namespace, config_from_namespace(namespace)


class KjtBatches:
    """Turns the trainer's decoded batches into TorchRec's input: one id per feature per row (a KeyedJaggedTensor
    whose values are the column-major categorical block, so no copy), lengths all 1."""

    def __init__(self, feature_names: Sequence[str]) -> None:
        self.keys = list(feature_names)
        self._lengths: dict[int, torch.Tensor] = {}

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, Any, torch.Tensor]:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        numerical, categorical, label = batch
        rows = len(label)
        lengths = self._lengths.get(rows)
        if lengths is None:
            lengths = self._lengths[rows] = torch.ones(rows * len(self.keys), dtype=torch.int32)
        values = categorical.T.reshape(-1)  # [n_cat, b] is contiguous: a view
        return numerical, KeyedJaggedTensor(keys=self.keys, values=values, lengths=lengths), label


def table_configs(spec: FeatureSpec, dim: int) -> list[Any]:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=f"table_{i}", embedding_dim=dim, num_embeddings=int(rows), feature_names=[key])
            for i, (key, rows) in enumerate(zip(feature_keys(spec), spec.get_categorical_sizes()))]


def feature_keys(spec: FeatureSpec) -> list[str]:
    """KeyedJaggedTensor keys by position (the spec's names may hold dots, which TorchRec's module names cannot)."""
    return [f"cat_{i}" for i in range(len(spec.get_categorical_feature_names()))]


def build_model(variant: str, cfg: DlrmConfig, spec: FeatureSpec, ctx: DistContext) -> tuple[torch.nn.Module, Any,
                                                                                              dict[str, str]]:
    """(model to call, optimizer whose param_groups carry the lr, table -> sharding type)."""
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = table_configs(spec, cfg.bottom_mlp_sizes[-1])
    torch.manual_seed(cfg.seed)
    dense_in = spec.get_number_of_numerical_features()
    bottom, top = list(cfg.bottom_mlp_sizes), list(cfg.top_mlp_sizes)
    if variant == "plain":
        model = nvidia_init(DLRM(EmbeddingBagCollection(tables=tables), dense_in, bottom, top))
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        if ctx.is_distributed:
            model = torch.nn.parallel.DistributedDataParallel(model)
        return model, optimizer, {}
    if variant == "fused":
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

        ebc = FusedEmbeddingBagCollection(tables=tables, optimizer_type=torch.optim.SGD,
                                          optimizer_kwargs={"lr": cfg.lr})
        model = nvidia_init(DLRM(ebc, dense_in, bottom, top))
        dense = {name: p for name, p in model.named_parameters() if not name.startswith("sparse_arch.")}
        optimizer = CombinedOptimizer([ebc.fused_optimizer(),
                                       KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=cfg.lr))])
        return model, optimizer, {}
    from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    model = nvidia_init(DLRM(EmbeddingBagCollection(tables=tables, device=torch.device("meta")), dense_in, bottom, top))
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": cfg.lr})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=ctx.world_size, compute_device="cpu",
                                                         local_world_size=ctx.world_size),
                                       batch_size=cfg.batch_size // ctx.world_size)
    plan = planner.collective_plan(model, get_default_sharders(), torch.distributed.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan)
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    optimizer = CombinedOptimizer([dmp.fused_optimizer,
                                   KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=cfg.lr))])
    sharding = {table: str(param.sharding_type) for module_plan in plan.plan.values()
                for table, param in module_plan.items()}
    return dmp, optimizer, sharding


def nvidia_init(model: torch.nn.Module) -> torch.nn.Module:
    """recflow's (NVIDIA's) MLP initialisation for DLRM's dense layers instead of nn.Linear's default, so that both
    sides start from the same distribution and their AUCs after a few dozen steps compare learning, not luck;
    TorchRec's table init (uniform +-sqrt(1 / rows)) is already NVIDIA's."""
    from models.dlrm.model import init_linear

    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.device.type != "meta":
            init_linear(module)
    return model


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def evaluate_auc(model: torch.nn.Module, test_data: SplitBinaryDataset, to_input: KjtBatches,
                 limit_batches: int | None) -> tuple[float, int]:
    """Every rank runs the same test batches (a sharded model needs all ranks in each forward); rank 0's AUC."""
    from models.common.metrics import roc_auc

    batches = range(len(test_data) if limit_batches is None else min(limit_batches, len(test_data)))
    logits, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in PrefetchingReader(test_data, batches, depth=2):
            numerical, kjt, label = to_input(batch)
            logits.append(model(numerical, kjt).squeeze(1).float())
            labels.append(label)
    model.train()
    all_labels, all_logits = torch.cat(labels).numpy(), torch.cat(logits).numpy()
    return float(roc_auc(all_labels, all_logits)), len(all_labels)


def train(variant: str, cfg: DlrmConfig, ctx: DistContext) -> PeerResult:
    if variant in SINGLE_PROCESS_ONLY and ctx.world_size > 1:
        raise ValueError(f"variant {variant!r} runs in one process only (its fused tables are not data parallel)")
    spec = FeatureSpec.from_yaml(Path(cfg.dataset_dir) / cfg.feature_spec)
    local_batch = cfg.batch_size // ctx.world_size
    model, optimizer, sharding = build_model(variant, cfg, spec, ctx)
    to_input = KjtBatches(feature_keys(spec))
    with (SplitBinaryDataset(spec, cfg.train_mapping, local_batch, drop_last_batch=True) as train_data,
          SplitBinaryDataset(spec, cfg.test_mapping, cfg.eval_batch_size) as test_data):
        indices = shard_batch_indices(len(train_data), ctx.rank, ctx.world_size)
        total = min(len(indices), cfg.limit_train_batches or len(indices))
        schedule = cfg.schedule(total)
        interval = cfg.log_every_steps
        if total <= interval:
            raise ValueError(f"{total} steps leave nothing to time after the first {interval} (the warm-up)")
        loss_sum = torch.zeros(())
        started = finished = 0.0
        for step, batch in enumerate(PrefetchingReader(train_data, indices[:total], cfg.prefetch_depth)):
            numerical, kjt, label = to_input(batch)
            set_lr(optimizer, cfg.lr * schedule.factor(step))
            optimizer.zero_grad()
            logits = model(numerical, kjt).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            if (step + 1) % interval == 0 or step + 1 == total:
                if ctx.is_distributed:
                    torch.distributed.all_reduce(loss_sum)
                if ctx.is_main:
                    print(f"[torchrec {variant}] step {step + 1}/{total} loss "
                          f"{loss_sum.item() / ctx.world_size / interval:.5f}", flush=True)
                loss_sum.zero_()
                finished = time.perf_counter()
                if step + 1 == interval:
                    started = finished
        seconds = finished - started
        measured = total - interval
        auc, rows = evaluate_auc(model, test_data, to_input, cfg.limit_eval_batches)
    return PeerResult(variant=variant, world_size=ctx.world_size, threads=torch.get_num_threads(), steps=total,
                      warmup_steps=interval, samples_per_second=measured * cfg.batch_size / seconds, auc=auc,
                      eval_rows=rows, sharding=sharding)


def process_group(variant: str) -> DistContext:
    """torchrun's process group; DistributedModelParallel needs one even for a single process (gloo, size 1)."""
    ctx = init_distributed("cpu")
    if variant != "dmp" or ctx.is_distributed:
        return ctx
    torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1)
    return DistContext(rank=0, local_rank=0, world_size=1, device=ctx.device, backend="gloo")


def main(argv: Sequence[str] | None = None) -> PeerResult:
    args, cfg = parse_args(argv)
    ctx = process_group(args.variant)
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    try:
        result = train(args.variant, cfg, ctx)
        if ctx.is_main:
            args.json.write_text(json.dumps(asdict(result)))
            print(f"[torchrec {args.variant}] {result.samples_per_second:,.0f} samples/s, auc {result.auc:.5f} "
                  f"on {result.eval_rows} rows", flush=True)
        return result
    finally:
        shutdown_distributed(ctx)


if __name__ == "__main__":
    main()
