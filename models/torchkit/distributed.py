"""Process-group setup from torchrun's environment, device / mixed-precision choice, and torchrun command lines.

One code path for every launch: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; called
in-process (tests, a single-worker Airflow task) those are absent and we run as world size 1 without a process group.
Backend: gloo on CPU, NCCL on CUDA (NCCL cannot move CPU tensors; gloo is the CPU collective library).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tasks.core.gpus import check_usable, refuse_cuda
from tasks.core.process import cannot_run_here


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None: single process, no process group

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def select_device(preference: str, local_rank: int = 0) -> torch.device:
    """'cpu', 'cuda' (error if absent) or 'auto' (CUDA when present); each local rank gets its own GPU. 'auto' on a
    node whose GPUs torch cannot use (a CPU build of torch on a GPU node) is an error, not the CPU
    (tasks.core.gpus.check_usable): the launcher's memory preflight counted the GPUs."""
    if preference not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be cpu, cuda or auto, not {preference!r}")
    if preference == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if preference == "cuda":
            raise refuse_cuda(f"torch {torch.__version__}", cpu_build=torch.version.cuda is None)
        check_usable(f"torch {torch.__version__}", cpu_build=torch.version.cuda is None)
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def data_parallel(module: torch.nn.Module, ctx: DistContext, sparse_names: Sequence[str] = ()) -> torch.nn.Module:
    """DistributedDataParallel over `module`, except the parameters named in `sparse_names` (sparse gradients),
    which DDP ignores and `average_sparse_gradients` / `gather_rows` combine after backward.

    Why not DDP's own sparse all-reduce: with sparse embedding gradients on gloo, DDP's asynchronous sparse
    all-reduce corrupted the heap now and then on torch 2.13 CPU ("malloc(): unaligned tcache chunk detected",
    rank 0 SIGABRT; about 1 in 10-30 two-process runs here, in the trainer and in a minimal DDP loop alike). The
    synchronous path below uses only dense collectives.
    """
    from torch.nn.parallel import DistributedDataParallel

    if sparse_names:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, list(sparse_names))
        # DDP starts every rank from rank 0's weights, but not for parameters it ignores: broadcast those here.
        named = dict(module.named_parameters())
        with torch.no_grad():
            for name in sparse_names:
                dist.broadcast(named[name].data, src=0)
    return DistributedDataParallel(module, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)


def average_sparse_gradients(params: Sequence[torch.nn.Parameter], world_size: int) -> None:
    """Replace each parameter's sparse gradient by the mean over all ranks, identical on every rank.

    Three dense collectives for all parameters together: the row counts, then every rank's row indices and gradient
    rows (each parameter's part padded to the largest count), gathered; each rank then sums the same rows in the
    same rank order. Parameters must be 2-D with one row width (embedding tables of one dim). A parameter without a
    gradient on a rank (no lookup this step) counts as zero rows.
    """
    if world_size == 1 or not params:
        return
    grads = [p.grad.coalesce() if p.grad is not None else None for p in params]
    device, width = params[0].device, params[0].shape[1]
    dtype = next((g.dtype for g in grads if g is not None), params[0].dtype)
    counts = torch.tensor([g._nnz() if g is not None else 0 for g in grads], dtype=torch.int64, device=device)
    all_counts = [torch.empty_like(counts) for _ in range(world_size)]
    dist.all_gather(all_counts, counts)
    widest = torch.stack(all_counts).amax(dim=0).tolist()  # rows per parameter, padded
    total = sum(widest)
    indices = torch.zeros(total, dtype=torch.int64, device=device)
    values = torch.zeros((total, width), dtype=dtype, device=device)
    offset = 0
    for g, rows in zip(grads, widest):
        if g is not None and g._nnz():
            indices[offset:offset + g._nnz()] = g.indices()[0]
            values[offset:offset + g._nnz()] = g.values()
        offset += rows
    all_indices = [torch.empty_like(indices) for _ in range(world_size)]
    all_values = [torch.empty_like(values) for _ in range(world_size)]
    dist.all_gather(all_indices, indices)
    dist.all_gather(all_values, values)
    offset = 0
    for k, (param, rows) in enumerate(zip(params, widest)):
        spans = [slice(offset, offset + int(all_counts[r][k])) for r in range(world_size)]
        parts = [(all_indices[r][spans[r]], all_values[r][spans[r]]) for r in range(world_size)]
        offset += rows
        summed = torch.sparse_coo_tensor(torch.cat([i for i, _ in parts]).unsqueeze(0),
                                         torch.cat([v for _, v in parts]), param.shape).coalesce()
        param.grad = summed / world_size


def gather_rows(ids: torch.Tensor, rows: torch.Tensor, world_size: int,
                max_count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's (row ids [k], rows [k, d]) concatenated in rank order, on every rank: what a fused sparse
    update (a joint embedding table's index_add_) sums. Ranks may hold different k (a short last batch): counts
    first, then the parts padded to the largest; three dense collectives.

    With `max_count` (a bound no rank's k exceeds, the same on every rank: a trainer's ids per batch), each part is
    padded to it with row id 0 and zero rows, which add nothing to a sum, and all of it is returned: two
    collectives, and no count read back to the host. That read is a host sync every step on a GPU (the host waits
    for backward to finish before it can queue the next step)."""
    sizes: list[int] | None = None
    if max_count is not None:
        if ids.numel() > max_count:
            raise ValueError(f"{ids.numel()} row ids exceed max_count {max_count}")
        widest = max_count
    else:
        count = torch.tensor([ids.numel()], dtype=torch.int64, device=ids.device)
        counts = [torch.empty_like(count) for _ in range(world_size)]
        dist.all_gather(counts, count)
        sizes = [int(c) for c in torch.cat(counts).tolist()]
        widest = max(sizes)
    if ids.numel() < widest:
        ids = torch.cat([ids, ids.new_zeros(widest - ids.numel())])
        rows = torch.cat([rows, rows.new_zeros((widest - rows.shape[0], rows.shape[1]))])
    all_ids = [torch.empty_like(ids) for _ in range(world_size)]
    all_rows = [torch.empty_like(rows) for _ in range(world_size)]
    dist.all_gather(all_ids, ids.contiguous())
    dist.all_gather(all_rows, rows.contiguous())
    if sizes is None:
        return torch.cat(all_ids), torch.cat(all_rows)
    return (torch.cat([i[:n] for i, n in zip(all_ids, sizes)]), torch.cat([r[:n] for r, n in zip(all_rows, sizes)]))


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(device_preference: str = "auto", timeout_minutes: int = 30) -> DistContext:
    """Join the process group torchrun describes in the environment, or run alone when there is none."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = select_device(device_preference, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size <= 1:
        return DistContext(rank=0, local_rank=0, world_size=1, device=device, backend=None)
    backend = backend_for(device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if backend == "nccl" and local_world > torch.cuda.device_count():
        raise cannot_run_here(f"{local_world} processes on this node but torch sees {torch.cuda.device_count()} "
                              "GPU(s): NCCL runs one process per GPU; lower nproc, or train on the CPU (device cpu)")
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=timeout_minutes),
            device_id=device if device.type == "cuda" else None,
        )
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device, backend=backend)


def shutdown_distributed(ctx: DistContext) -> None:
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def broadcast_from_main(ctx: DistContext, value: Any) -> Any:
    """rank 0's value on every rank (small picklable values: a path, a step number)."""
    if not ctx.is_distributed:
        return value
    box = [value if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, device=ctx.device if ctx.backend == "nccl" else None)
    return box[0]


AMP_DTYPES = ("auto", "bf16", "fp16")


def use_tf32(device: torch.device, enabled: bool) -> bool:
    """On CUDA, let fp32 matmuls use TF32 tensor cores (`enabled`) or keep them strict fp32; returns whether TF32 is
    on. The legacy switch (allow_tf32), not fp32_precision: the legacy getters, which dynamo's global-state guard
    still reads in torch 2.13, raise once the new API has set a value. Nothing changes on the CPU."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = enabled
    return enabled


def amp_dtype(device: torch.device, name: str = "auto") -> torch.dtype:
    """The autocast type of --amp on `device`. auto: bf16 where the device computes it natively (the CPU; CUDA
    compute capability >= 8: A100, H100, H200), fp16 on older GPUs. bf16 keeps fp32's range, so it needs no loss
    scaling (measured on an H200 with the DLRM trainer: the fp16 loss scaler and the unscaling of the table rows
    cost ~27% of a step; docs/PERFORMANCE-gpu.md)."""
    if name not in AMP_DTYPES:
        raise ValueError(f"amp dtype {name!r}: expected one of {', '.join(AMP_DTYPES)}")
    if name == "fp16" and device.type != "cuda":
        raise ValueError("--amp_dtype fp16 needs CUDA (its loss scaler is CUDA's); use bf16 or auto on the CPU")
    if name == "bf16" or (name == "auto" and (device.type != "cuda" or torch.cuda.get_device_capability(device)[0]
                                              >= 8)):
        return torch.bfloat16
    return torch.float16


def autocast_context(device: torch.device, enabled: bool,
                     dtype: torch.dtype | None = None) -> contextlib.AbstractContextManager:
    """Mixed precision in `dtype`; None: --amp's auto type on this device (amp_dtype: bf16 on the CPU and on GPUs of
    compute capability >= 8, fp16 on older GPUs)."""
    if not enabled:
        return contextlib.nullcontext()
    if dtype is None:
        dtype = amp_dtype(device)
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, amp: bool,
                     dtype: torch.dtype | None = None) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 on CUDA; None elsewhere (bf16 and fp32 do not underflow the way fp16 does)."""
    if amp and device.type == "cuda" and dtype in (None, torch.float16):
        return torch.amp.GradScaler("cuda")
    return None

