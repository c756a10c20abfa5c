"""Train DLRM on a split-binary dataset: `torchrun ... -m models.dlrm.train --dataset_dir D --output_dir O`.

Also callable in-process as `main(argv)` (world size 1 when torchrun's environment variables are absent). Data
parallel with DDP (gloo on CPU, NCCL on CUDA), plain SGD with NVIDIA's warmup + polynomial-decay schedule,
checkpoints by rank 0 every N minutes and/or steps (models/common/checkpoint_clock.py), and automatic resume from
the newest checkpoint in the output dir (a retried Airflow task continues where the killed one stopped).

With --sharding other than data_parallel the embedding tables are split across the ranks by TorchRec
(models/dlrm/sharding.py) while the MLPs stay data parallel; checkpoints and model.pt keep the plain format.
Every rank waits at a final barrier after rank 0 has written model.pt and metrics.json, so that a process that
dies while tearing down (TorchRec's CPU builds abort at exit now and then) can only do so after the outputs are
complete; the launcher (tasks/core/launch.py) recognises that case.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from models.common.checkpoint_clock import CheckpointClock
from models.common.evaluation import final_eval_words
from models.common.time_budget import measured_too_slow, stop_if_too_slow
from models.torchkit.checkpoint import (CheckpointError, capture_rng_state, device_fingerprint, latest_checkpoint,
                                      link_checkpoint, load_checkpoint, restore_rng_state, save_checkpoint,
                                      state_checksum)
from models.torchkit.device_batches import ahead_on_device
from models.torchkit.distributed import (DistContext, amp_dtype, autocast_context, barrier, broadcast_from_main,
                                        data_parallel, init_distributed, make_grad_scaler, shutdown_distributed,
                                        use_tf32)
from tasks.core.progress import ProgressMeter, RankLog, format_bytes, format_duration
from models.dlrm.config import DlrmConfig, build_parser, config_from_namespace, lr_factor  # noqa: F401
from models.dlrm.data import (Batch, PrefetchingReader, SplitBinaryDataset, decodes_on_device, shard_batch_indices,
                              to_device)
from models.dlrm.evaluate import predict_dataset, write_model_file
from models.dlrm.model import Dlrm, embedding_table_bytes
from models.dlrm import sharding as sharded
from tasks.formats.feature_spec import FeatureSpec
from tasks.core.storage import write_text_atomic


@dataclass
class TrainResult:
    steps: int
    epochs: int
    world_size: int
    resumed_from_step: int | None
    samples_per_second: float
    final_metrics: dict[str, Any]
    embedding_bytes: int
    weights_sha256: str
    output_dir: Path
    model_path: Path | None = None  # paths are set on rank 0 only
    metrics_path: Path | None = None
    checkpoint_path: Path | None = None
    log_path: Path | None = None
    plot_path: Path | None = None


@dataclass
class _Run:
    """Everything one training process holds; `step` counts global optimizer steps."""

    cfg: DlrmConfig
    ctx: DistContext
    log: RankLog
    core: Dlrm | sharded.ShardedDlrm
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    amp_dtype: torch.dtype  # autocast's type: bf16 or fp16 with cfg.amp, else float32 (no autocast)
    train_data: SplitBinaryDataset
    test_data: SplitBinaryDataset
    out: Path
    steps_per_epoch: int
    total_steps: int
    model: torch.nn.Module | None = None  # DDP wrapper (or the core model alone)
    step: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    last_checkpoint_step: int = -1
    fused: Any = None  # the tables' optimizer of a sharded run (it steps inside backward)
    seconds: dict[str, float] = field(default_factory=dict)  # phases of this process (metrics.json "seconds")

    @property
    def sharded(self) -> bool:
        return self.cfg.sharding != sharded.DATA_PARALLEL


def parse_args(argv: list[str] | None = None) -> DlrmConfig:
    parser = build_parser("train DLRM on a split-binary dataset (NVIDIA DeepLearningExamples recipe)")
    return config_from_namespace(parser.parse_args(argv))


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: DlrmConfig,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """NVIDIA's warmup + polynomial decay, positioned for this run's step count (DlrmConfig.schedule)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, cfg.schedule(total_steps).factor)


def weights_checksum(model: torch.nn.Module) -> str:
    """sha256 over every state tensor in key order: equal on all DDP ranks iff their weights are identical."""
    return state_checksum(model.state_dict())


def _setup(cfg: DlrmConfig, ctx: DistContext) -> _Run:
    if not cfg.dataset_dir or not cfg.output_dir:
        raise ValueError("both --dataset_dir and --output_dir are required")
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by the world size {ctx.world_size}")
    if cfg.sharding != sharded.DATA_PARALLEL:
        sharded.check_sharding(cfg.sharding, ctx.device)
        if cfg.amp and amp_dtype(ctx.device, cfg.amp_dtype) == torch.float16:
            # fp16 needs loss scaling, and the tables' fused optimizer steps inside backward on the scaled gradients.
            raise ValueError(f"--amp in fp16 (with loss scaling) does not combine with --sharding {cfg.sharding}: "
                             "the fused table optimizer would apply scaled gradients; use --amp_dtype bf16 or fp32")
    torch.manual_seed(cfg.seed)
    spec = FeatureSpec.from_yaml(Path(cfg.dataset_dir) / cfg.feature_spec)
    local_batch = cfg.batch_size // ctx.world_size
    pinned = copies_ahead(cfg, ctx)
    train_data = SplitBinaryDataset(spec, cfg.train_mapping, local_batch, drop_last_batch=cfg.drop_last_train_batch,
                                    pin_memory=pinned)
    steps_per_epoch = len(train_data) // ctx.world_size
    if cfg.limit_train_batches is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.limit_train_batches)
    if steps_per_epoch < 1:
        train_data.close()
        raise ValueError(f"{cfg.dataset_dir}/{cfg.train_mapping}: {train_data.rows} rows make no full step of "
                         f"{local_batch} rows x {ctx.world_size} ranks")
    try:
        test_data = SplitBinaryDataset(spec, cfg.test_mapping, cfg.eval_batch_size, drop_last_batch=False,
                                       pin_memory=pinned)
    except BaseException:
        train_data.close()
        raise
    cards = spec.get_categorical_sizes()
    # Logged before allocating: a table set too big for this machine is reported, then fails in the allocation.
    log = RankLog(ctx.rank)
    dim = cfg.bottom_mlp_sizes[-1]
    log(f"embedding tables: {len(cards)} tables, {sum(cards):,} rows x {dim} dims = "
        f"{format_bytes(embedding_table_bytes(cards, dim, cfg.max_table_size))} (fp32)")
    try:
        started = time.perf_counter()
        core, optimizer = _build_model(cfg, ctx, spec, log)
        build_seconds = time.perf_counter() - started
    except BaseException:
        train_data.close()
        test_data.close()
        raise
    total_steps = steps_per_epoch * cfg.epochs
    dtype = amp_dtype(ctx.device, cfg.amp_dtype) if cfg.amp else torch.float32
    schedule = cfg.schedule(total_steps)  # refuses a schedule that would stop learning before the last step
    log(f"lr schedule over {total_steps} steps: warmup {schedule.warmup_steps}, decay from step "
        f"{schedule.decay_start_step} over {schedule.decay_steps} (scaling: {cfg.schedule_scaling})")
    return _Run(cfg=cfg, ctx=ctx, log=log, core=core, optimizer=optimizer,
                scheduler=make_scheduler(optimizer, cfg, total_steps),
                scaler=make_grad_scaler(ctx.device, cfg.amp, dtype), amp_dtype=dtype,
                train_data=train_data, test_data=test_data, out=Path(cfg.output_dir),
                steps_per_epoch=steps_per_epoch, total_steps=total_steps, seconds={"build_model": build_seconds})


def copies_ahead(cfg: DlrmConfig, ctx: DistContext) -> bool:
    """Whether batches come from pinned host memory, copied a step ahead on a side stream (--copy_ahead on CUDA)."""
    return cfg.copy_ahead and torch.device(ctx.device).type == "cuda"


def _build_model(cfg: DlrmConfig, ctx: DistContext, spec: FeatureSpec,
                 log: RankLog) -> tuple[Dlrm | sharded.ShardedDlrm, torch.optim.Optimizer]:
    """The model and the optimizer of its gradient-trained parameters (a sharded model's tables train inside
    backward, by the fused optimizer `sharded.shard` adds)."""
    cards = spec.get_categorical_sizes()
    if cfg.sharding != sharded.DATA_PARALLEL:
        hparams = {"num_numerical": spec.get_number_of_numerical_features(), "categorical_cardinalities": cards,
                   "bottom_mlp_sizes": cfg.bottom_mlp_sizes, "top_mlp_sizes": cfg.top_mlp_sizes,
                   "max_table_size": cfg.max_table_size, "hash_indices": cfg.hash_indices,
                   "sparse_embeddings": cfg.sparse_embeddings}
        model = sharded.ShardedDlrm(hparams, ctx.device)
        log(f"embedding tables sharded {cfg.sharding} over {ctx.world_size} rank(s) by TorchRec; MLPs data parallel")
        return model, torch.optim.SGD(model.dense_parameters(), lr=cfg.lr)
    check_table_layout(cfg, ctx, cards)
    sparse = cfg.sparse_embeddings and ctx.backend != "nccl"
    log(f"embedding path: {embedding_path_reason(cfg, ctx, sparse)}")
    with torch.device(ctx.device):  # the tables are created (and initialised) where they train, once
        model = Dlrm(spec.get_number_of_numerical_features(), cards, cfg.bottom_mlp_sizes, cfg.top_mlp_sizes,
                     cfg.max_table_size, cfg.hash_indices, sparse)
    compile_dense(model, cfg, ctx, log)
    return model, torch.optim.SGD(model.parameters(), lr=cfg.lr)


def check_table_layout(cfg: DlrmConfig, ctx: DistContext, cards: list[int]) -> None:
    """Refuse, before anything is allocated, a multi-GPU data-parallel run whose tables would get dense gradients
    (NCCL has no sparse all-reduce, pytorch/pytorch#22400): every step would all-reduce every table."""
    if cfg.sharding != sharded.DATA_PARALLEL or ctx.backend != "nccl" or ctx.world_size < 2:
        return
    size = embedding_table_bytes(cards, cfg.bottom_mlp_sizes[-1], cfg.max_table_size)
    if size > cfg.dense_table_limit_mb * 2**20:
        raise ValueError(f"{format_bytes(size)} of embedding tables would all-reduce as dense gradients every step "
                         f"on {ctx.world_size} NCCL ranks: set --sharding table_wise (or row_wise, column_wise, "
                         f"auto), or raise --dense_table_limit_mb above {size // 2**20 + 1} to accept it")


def embedding_path_reason(cfg: DlrmConfig, ctx: DistContext, sparse: bool) -> str:
    """Which embedding implementation a data-parallel run uses, and why (logged once per run)."""
    if not sparse:
        why = ("NCCL has no sparse all-reduce; the tables are under --dense_table_limit_mb"
               if cfg.sparse_embeddings else "--no-sparse_embeddings")
        return f"joint table with dense gradients (plain PyTorch): {why}"
    if ctx.device.type == "cuda":
        why = ("fbgemm-gpu is installed: TorchRec's fused TBE kernels are used by --sharding table_wise/row_wise/"
               "column_wise/auto" if sharded.fbgemm_gpu_available() else
               "fbgemm-gpu is not installed (or has no CUDA kernels for this torch)")
    else:
        why = "CPU: FBGEMM's CPU kernels measured no faster than one index_add_ (docs/PERFORMANCE-gpu.md)"
    return f"joint table + fused index_add_ SGD update (plain PyTorch): {why}"


def compile_dense(model: Dlrm, cfg: DlrmConfig, ctx: DistContext, log: RankLog) -> None:
    """torch.compile the dense layers in place (state-dict names unchanged): --compile auto is on for CUDA only."""
    enabled = cfg.compile == "on" or (cfg.compile == "auto" and ctx.device.type == "cuda")
    if not enabled:
        return
    mode = "reduce-overhead" if cfg.cuda_graphs and ctx.device.type == "cuda" else None
    for module in (model.bottom_mlp, model.interaction, model.top_mlp):
        module.compile(mode=mode)
    log(f"torch.compile of the dense layers (mode {mode or 'default'}); the first steps compile")


def _checkpoint_state(run: _Run, model_state: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {
        "model": model_state,
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler is not None else {},
        "epoch": run.step // run.steps_per_epoch,
        "config": run.cfg.to_dict(),
        "hparams": run.core.hparams,
        "world_size": run.ctx.world_size,
        "records": run.records,
        "rng": capture_rng_state(),
    }


def _model_state(run: _Run) -> dict[str, torch.Tensor] | None:
    """The plain Dlrm state dict on rank 0 (a sharded run gathers its tables: every rank must call this)."""
    if run.sharded:
        return sharded.gather_plain_state(run.core, run.ctx)
    return run.core.state_dict() if run.ctx.is_main else None


def _save(run: _Run) -> None:
    """Checkpoint the current step (once); every rank calls this."""
    if run.last_checkpoint_step != run.step:
        _save_state(run, _model_state(run))


def _save_state(run: _Run, model_state: dict[str, torch.Tensor] | None) -> None:
    """Checkpoint the current step with a state already gathered (None on ranks other than 0); every rank calls
    this, rank 0 writes."""
    if run.last_checkpoint_step == run.step:
        return
    if run.ctx.is_main:
        run.last_checkpoint = save_checkpoint(run.out / "checkpoints", run.step,
                                              _checkpoint_state(run, model_state),
                                              keep_last=run.cfg.keep_checkpoints)
        run.log(f"checkpoint step {run.step} -> {run.last_checkpoint}")
    run.last_checkpoint_step = run.step


def _check_compatible(run: _Run, path: Path, state: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model; warn about changed training knobs (they take effect from here)."""
    def shape(hparams: dict[str, Any]) -> dict[str, Any]:
        # sparse_embeddings is the gradient layout, not the weights; a model saved before the padding is unpadded.
        return {k: v for k, v in {"interaction_padding": False, **hparams}.items() if k != "sparse_embeddings"}

    if shape(state["hparams"]) != shape(run.core.hparams):
        raise CheckpointError(f"{path}: model {shape(state['hparams'])} differs from this run's "
                              f"{shape(run.core.hparams)}; use a new output_dir for a different model")
    changed = {k: f"{state['config'].get(k)!r} -> {v!r}" for k, v in run.cfg.to_dict().items()
               if state["config"].get(k) != v and k != "time_budget_s"}  # the budget is each attempt's own
    if state["world_size"] != run.ctx.world_size:
        changed["world_size"] = f"{state['world_size']} -> {run.ctx.world_size}"
    if changed:
        run.log(f"warning: resuming {path.name} with changed settings {changed}")


def _resume(run: _Run) -> int | None:
    """Load the newest checkpoint of the output dir (rank 0 picks it, every rank loads it); its step or None."""
    found = latest_checkpoint(run.out / "checkpoints") if run.ctx.is_main else None
    path = broadcast_from_main(run.ctx, str(found) if found else None)
    if path is None:
        return None
    # Onto the CPU, memory-mapped for a sharded or GPU run: each rank reads only the table slices it holds, and
    # copies them to its device (loaded onto the GPU, every rank would hold the whole model there, and the RNG
    # states would be CUDA tensors).
    state = load_checkpoint(Path(path), map_location="cpu", mmap=run.sharded or run.ctx.device.type != "cpu")
    _check_compatible(run, Path(path), state)
    if run.sharded:
        sharded.load_plain_state(run.core, state["model"])
    else:
        run.core.load_state_dict(state["model"])
    _load_optimizer(run, state)
    if run.scaler is not None and state["scaler"]:
        run.scaler.load_state_dict(state["scaler"])
    restore_rng_state(state["rng"])
    run.step = run.last_checkpoint_step = int(state["step"])
    run.last_checkpoint = Path(path)
    run.records = [r for r in state["records"] if r["step"] <= run.step]
    if run.ctx.is_main:
        _write_log(run)
    run.log(f"resumed from step {run.step} ({path})")
    return run.step


def _load_optimizer(run: _Run, state: dict[str, Any]) -> None:
    """The optimizer and schedule of a checkpoint. Across a change of table layout (data parallel <-> sharded) the
    optimizer holds different parameters; plain SGD keeps no per-parameter state, so only its lr is carried over."""
    saved = state["optimizer"]
    layout = state["config"].get("sharding", sharded.DATA_PARALLEL)
    run.scheduler.load_state_dict(state["scheduler"])
    if layout != run.cfg.sharding and not saved["state"]:
        for group in run.optimizer.param_groups:
            group["lr"] = run.scheduler.get_last_lr()[0]
        return
    run.optimizer.load_state_dict(saved)


def _train_step(run: _Run, batch: Batch) -> torch.Tensor:
    numerical, categorical, label = batch  # on the training device
    if run.fused is not None:
        # The fused table optimizer applies its lr inside backward: give it this step's lr first.
        for group in run.fused.param_groups:
            group["lr"] = run.optimizer.param_groups[0]["lr"]
        run.fused.zero_grad()
    with autocast_context(run.ctx.device, run.cfg.amp, run.amp_dtype):
        logits = run.model(numerical, categorical)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), label)
    run.optimizer.zero_grad(set_to_none=True)
    lr = run.optimizer.param_groups[0]["lr"]
    if run.scaler is not None:
        run.scaler.scale(loss).backward()
        _scaled_update(run, lr)
    else:
        loss.backward()
        _sparse_update(run, lr)  # DDP averaged the dense gradients during backward
        run.optimizer.step()
    run.scheduler.step()
    return loss.detach()


def _amp_name(run: _Run) -> str:
    if not run.cfg.amp:
        return "off"
    return {torch.bfloat16: "bf16", torch.float16: "fp16 + loss scaling"}[run.amp_dtype]


def _sparse_update(run: _Run, lr: float, inv_scale: torch.Tensor | None = None,
                   found_inf: torch.Tensor | None = None) -> None:
    if isinstance(run.core, Dlrm):
        # No rank's batch holds more than its share of the global batch: the rows gather without a count exchange.
        max_rows = run.cfg.batch_size // run.ctx.world_size * len(run.core.table_sizes)
        run.core.apply_sparse_update(lr, run.ctx.world_size, inv_scale, max_rows, found_inf)


def _scaled_update(run: _Run, lr: float) -> None:
    """fp16's loss-scaled update after backward: the dense step and the tables' are taken or skipped together, on
    the overflow of either (the scaler's flag, which the table update adds to), and either lowers the scale."""
    scaler = run.scaler
    scaler.unscale_(run.optimizer)
    flags = list(scaler._found_inf_per_device(run.optimizer).values())  # noqa: SLF001 (the tensor step() reads)
    inv_scale = scaler._scale.double().reciprocal().float()  # noqa: SLF001 (no sync with the host)
    _sparse_update(run, lr, inv_scale=inv_scale, found_inf=flags[0] if len(flags) == 1 else None)
    scaler.step(run.optimizer)
    scaler.update()


def _log_interval(run: _Run, epoch: int, loss_sum: torch.Tensor, count: int, meter: ProgressMeter) -> None:
    """Mean loss over the interval across all ranks (every rank joins the all-reduce), one line, one record."""
    total = torch.stack([loss_sum, torch.tensor(float(count), device=loss_sum.device)])
    if run.ctx.is_distributed:
        torch.distributed.all_reduce(total)
    loss = (total[0] / total[1]).item()
    stats = meter.report(run.step)
    lr = run.optimizer.param_groups[0]["lr"]
    run.log(f"step {run.step}/{run.total_steps} epoch {epoch} loss {loss:.5f} lr {lr:.4g} "
            f"samples/s {stats.samples_per_second:,.0f} eta {format_duration(stats.eta_seconds)}")
    _record(run, {"kind": "train", "step": run.step, "epoch": epoch, "loss": loss, "lr": lr,
                  "samples_per_second": stats.samples_per_second})


def _record(run: _Run, record: dict[str, Any]) -> None:
    run.records.append(record)
    if run.ctx.is_main:
        with open(run.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def _write_log(run: _Run) -> Path:
    path = run.out / "train_log.jsonl"
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in run.records))
    return path


def _evaluate(run: _Run, final: bool = False) -> dict[str, Any] | None:
    """Rank 0 evaluates on the test mapping while the other ranks wait at a barrier. A sharded model needs every
    rank in each forward: all ranks run the same test batches and rank 0 keeps the result."""
    metrics = None
    if run.ctx.is_main or run.sharded:
        started = time.perf_counter()
        predictions = predict_dataset(run.core, run.test_data, run.ctx.device, run.cfg.amp,
                                      run.cfg.limit_eval_batches, run.cfg.prefetch_depth, run.amp_dtype)
    if run.ctx.is_main:
        metrics = predictions.compute()
        run.log(f"eval step {run.step}: auc {metrics['auc']:.5f} logloss {metrics['logloss']:.5f} "
                f"rows {metrics['rows']} in {time.perf_counter() - started:.1f}s")
        if not any(r["kind"] == "eval" and r["step"] == run.step for r in run.records):
            _record(run, {"kind": "eval", "step": run.step, **metrics})
    if not final:
        barrier(run.ctx)
    return metrics


def _train_epochs(run: _Run) -> ProgressMeter:
    cfg = run.cfg
    meter = ProgressMeter(run.total_steps, run.step, cfg.batch_size)
    clock = CheckpointClock(cfg.checkpoint_every_steps, cfg.checkpoint_every_minutes, cfg.log_every_steps,
                            agree=partial(broadcast_from_main, run.ctx), is_main=run.ctx.is_main)
    run.log(f"checkpoints {clock.describe()}")
    started = time.perf_counter()
    loss_sum, count = torch.zeros((), device=run.ctx.device), 0
    for epoch in range(run.step // run.steps_per_epoch, cfg.epochs):
        indices = shard_batch_indices(len(run.train_data), run.ctx.rank, run.ctx.world_size,
                                      cfg.shuffle_batch_order, cfg.seed, epoch)[: run.steps_per_epoch]
        with PrefetchingReader(run.train_data, indices[run.step - epoch * run.steps_per_epoch:],
                               cfg.prefetch_depth, raw=decodes_on_device(run.ctx.device)) as reader:
            for batch in ahead_on_device(reader, partial(to_device, device=run.ctx.device), run.ctx.device,
                                         cfg.copy_ahead):
                loss_sum += _train_step(run, batch)
                count += 1
                run.step += 1
                if run.step % cfg.log_every_steps == 0 or run.step == run.total_steps:
                    _log_interval(run, epoch, loss_sum, count, meter)
                    loss_sum, count = torch.zeros((), device=run.ctx.device), 0
                    if run.step < run.total_steps and (cfg.time_budget_s or run.ctx.is_distributed):
                        _stop_if_too_slow(run, meter, started)
                if cfg.eval_every_steps and run.step % cfg.eval_every_steps == 0 and run.step < run.total_steps:
                    _evaluate(run)
                if run.step < run.total_steps and clock.due(run.step):
                    _save(run)  # the last step's checkpoint is model.pt itself (_finish)
                    clock.saved()
    return meter


def _stop_if_too_slow(run: _Run, meter: ProgressMeter, started: float) -> None:
    """Rank 0 compares the run's need (trained + eta at its measured rate) with cfg.time_budget_s; every rank gets
    its verdict at the same step (models/common/time_budget.py). Every rank of a distributed run comes here at
    every log interval whatever its own budget: the nodes of a multi-node run may be launched with different ones."""
    reason = measured_too_slow(run.cfg.time_budget_s, meter, run.step, started) if run.ctx.is_main else None
    stop_if_too_slow(broadcast_from_main(run.ctx, reason), prints=run.ctx.local_rank == 0)


def _finish(run: _Run, resumed: int | None, meter: ProgressMeter) -> TrainResult:
    # The training loop's rate (periodic evaluations and checkpoints included), taken before the final save.
    rate = meter.overall_samples_per_second(run.step)
    started = time.perf_counter()
    checksum = _write_final(run)
    run.seconds["final_write"] = time.perf_counter() - started
    run.log(f"final weights sha256 {checksum} at step {run.step}", all_ranks=True)
    per_rank = _gather_per_rank(run, run.core.embedding_bytes())
    result = TrainResult(steps=run.step, epochs=run.cfg.epochs, world_size=run.ctx.world_size,
                         resumed_from_step=resumed, samples_per_second=rate,
                         final_metrics={}, embedding_bytes=per_rank[run.ctx.rank], weights_sha256=checksum,
                         output_dir=run.out)
    started = time.perf_counter()
    metrics = _evaluate(run, final=True) if run.cfg.final_eval and (run.ctx.is_main or run.sharded) else None
    run.seconds["final_eval"] = time.perf_counter() - started
    if not run.ctx.is_main:
        barrier(run.ctx)  # wait until rank 0 has written the outputs (see the module docstring)
        return result
    from models.common.plots import plot_training_curves  # matplotlib: rank 0 only, and only at the end

    metrics = metrics or {}
    train_losses = [r["loss"] for r in run.records if r["kind"] == "train"]
    result.final_metrics = {**metrics, "steps": run.step, "world_size": run.ctx.world_size,
                            "batch_size": run.cfg.batch_size, "samples_per_second": result.samples_per_second,
                            "final_train_loss": train_losses[-1] if train_losses else None,
                            "embedding_bytes": result.embedding_bytes, "embedding_bytes_per_rank": per_rank,
                            "sharding": run.cfg.sharding, "resumed_from_step": resumed,
                            "weights_sha256": checksum, **({"mapping": run.cfg.test_mapping} if metrics else {}),
                            "seconds": {k: round(v, 3) for k, v in run.seconds.items()}}
    if run.sharded:
        result.final_metrics["sharding_plan"] = sharded.plan_summary(run.core)
    result.model_path = run.out / "model.pt"
    result.log_path = _write_log(run)
    result.plot_path = plot_training_curves(run.records, run.out / "training_curves.png", title=f"DLRM {run.out.name}")
    result.checkpoint_path = run.last_checkpoint
    # Written last: a metrics.json newer than model.pt means the run's outputs are complete.
    result.metrics_path = run.out / "metrics.json"
    write_text_atomic(result.metrics_path, json.dumps(result.final_metrics, indent=2, sort_keys=True))
    run.log(f"done: {run.step} steps, {final_eval_words(metrics)}, outputs in {run.out}")
    barrier(run.ctx)
    return result


def _write_final(run: _Run) -> str:
    """Write the final weights once: model.pt with a checkpoint section, hashed while written, and the last
    checkpoint as a hard link to it. Returns the weights' sha256 on every rank; a data-parallel rank other than 0
    first proves its weights equal rank 0's by a fingerprint computed on its device (no host copy)."""
    state = _model_state(run)  # rank 0 only (a sharded run gathers its tables here)
    checksum = None
    if run.ctx.is_main:
        run.out.mkdir(parents=True, exist_ok=True)
        section = {k: v for k, v in _checkpoint_state(run, {}).items() if k not in ("model", "config", "hparams")}
        path = run.out / "model.pt"
        checksum = write_model_file(path, state, run.core.hparams, run.cfg.to_dict(), run.step, checkpoint=section)
        run.last_checkpoint = link_checkpoint(run.out / "checkpoints", run.step, path, run.cfg.keep_checkpoints)
        run.last_checkpoint_step = run.step
        run.log(f"model.pt and checkpoint step {run.step} -> {path} (one file, {run.last_checkpoint.name} links it)")
    if run.ctx.is_distributed and not run.sharded:
        _check_ranks_identical(run)
    return broadcast_from_main(run.ctx, checksum)


def _check_ranks_identical(run: _Run) -> None:
    """Every data-parallel rank's weights are rank 0's, bit for bit (fingerprints gathered, not the weights)."""
    mine = device_fingerprint(run.core.state_dict())
    every = [torch.empty_like(mine) for _ in range(run.ctx.world_size)]
    torch.distributed.all_gather(every, mine)
    differing = [rank for rank, other in enumerate(every) if not torch.equal(other, every[0])]
    if differing:
        raise RuntimeError(f"ranks {differing} finished with weights that differ from rank 0's: data-parallel "
                           "training diverged (a collective or a sparse update is broken)")


def _gather_per_rank(run: _Run, value: int) -> list[int]:
    """`value` of every rank, in rank order, on every rank."""
    if not run.ctx.is_distributed:
        return [value]
    values: list[Any] = [None] * run.ctx.world_size
    torch.distributed.all_gather_object(values, value)
    return [int(v) for v in values]


def train(cfg: DlrmConfig, ctx: DistContext) -> TrainResult:
    previous_threads, previous_tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    if cfg.torch_threads > 0:
        # On a shared worker, fewer threads than cores avoids OpenMP threads spinning against other jobs.
        torch.set_num_threads(cfg.torch_threads)
    own_group = cfg.sharding != sharded.DATA_PARALLEL and not ctx.is_distributed
    if own_group:
        ctx = sharded.single_process_group(ctx)
    try:
        return _train(cfg, ctx)
    finally:
        torch.set_num_threads(previous_threads)
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32  # what runs after in this process keeps its precision
        if own_group:
            shutdown_distributed(ctx)


def _train(cfg: DlrmConfig, ctx: DistContext) -> TrainResult:
    if use_tf32(ctx.device, cfg.tf32):
        RankLog(ctx.rank)("fp32 matmuls on TF32 tensor cores (--tf32; --no-tf32: strict fp32)")
    run = _setup(cfg, ctx)
    try:
        run.out.mkdir(parents=True, exist_ok=True)
        if run.sharded:
            # Sharded first: each rank then loads only its own slices from a checkpoint.
            run.model, run.fused = sharded.shard(run.core, cfg.sharding, ctx, cfg.batch_size // ctx.world_size,
                                                 cfg.lr)
            run.log(f"sharding plan ({cfg.sharding}): {sharded.plan_summary(run.core)}; this rank holds "
                    f"{format_bytes(run.core.embedding_bytes())} of tables", all_ranks=True)
            resumed = _resume(run)
        else:
            started = time.perf_counter()
            resumed = _resume(run)
            run.seconds["resume"] = time.perf_counter() - started
            run.model = (data_parallel(run.core, ctx, [name for name, _ in run.core.sparse_parameters()])
                         if ctx.is_distributed else run.core)
        run.log(f"training {run.total_steps} steps ({cfg.epochs} epochs x {run.steps_per_epoch}) of {cfg.batch_size} "
                f"rows on {ctx.world_size} x {ctx.device} ({ctx.backend or 'single process'}), amp={_amp_name(run)}, "
                f"starting at step {run.step}")
        if torch.device(ctx.device).type == "cuda":
            run.log("batches: " + ("pinned host memory, copied a step ahead on a side stream" if copies_ahead(cfg, ctx)
                                   else "pageable host memory, copied before each step (--no-copy_ahead)"))
        started = time.perf_counter()
        meter = _train_epochs(run)
        run.seconds["train_loop"] = time.perf_counter() - started
        read = run.train_data.stats
        run.log(f"train reader: {read.batches_per_second:,.1f} batches/s, {read.megabytes_per_second:,.1f} MB/s")
        return _finish(run, resumed, meter)
    finally:
        run.train_data.close()
        run.test_data.close()


def main(argv: list[str] | None = None) -> TrainResult:
    cfg = parse_args(argv)
    ctx = init_distributed(cfg.device)
    try:
        return train(cfg, ctx)
    finally:
        shutdown_distributed(ctx)


if __name__ == "__main__":
    main()
