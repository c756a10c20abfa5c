"""Process-group setup from torchrun's environment, device / mixed-precision choice, and torchrun command lines.

One code path for every launch: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; called
in-process (tests, a single-worker Airflow task) those are absent and we run as world size 1 without a process group.
Backend: gloo on CPU, NCCL on CUDA (NCCL cannot move CPU tensors; gloo is the CPU collective library).
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist



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
    """'cpu', 'cuda' (error if absent) or 'auto' (CUDA when present); each local rank gets its own GPU."""
    if preference not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be cpu, cuda or auto, not {preference!r}")
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device (CPU build or no driver)")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


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


def autocast_context(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """Mixed precision: fp16 on CUDA (with a GradScaler), bf16 on CPU (bf16 keeps fp32's range: no scaler)."""
    if not enabled:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(device: torch.device, amp: bool) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 on CUDA; None elsewhere (bf16 and fp32 do not underflow the way fp16 does)."""
    if amp and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def launch_command(
    nproc: int,
    module: str,
    args: list[str],
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    python: str | None = None,
) -> list[str]:
    """The argv that starts `python -m <module> <args>` under torchrun on this node (argument list, no shell).

    Multi-node: run the same command on every node with its own node_rank and node 0's address as master_addr.
    The argv itself is built by tasks.training.torchrun_command, which Airflow tasks use without importing torch.
    """
    from tasks.training import torchrun_command

    return torchrun_command(nproc, module, [str(a) for a in args], nnodes=nnodes, node_rank=node_rank,
                            master_addr=master_addr, master_port=master_port, python=python)
