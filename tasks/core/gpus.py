"""This node's GPUs as a training job's processes will see them, read with nvidia-smi (no torch or TensorFlow import):
what the launcher's memory preflight compares a model with (tasks.core.launch.check_memory), and the one GPU each
local TensorFlow worker gets (`worker_devices`), as torchrun's ranks each take one (models.torchkit.distributed).

CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and nvidia-smi by PCI bus, so an index in
CUDA_VISIBLE_DEVICES names the same GPU for both only in PCI order; a UUID always does. Where the mapping is not
certain and the GPUs differ, the smallest of them is assumed for every process (`GpuView.certain`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

QUERY_TIMEOUT_S = 30.0
NONE_VISIBLE = "no GPU visible to the processes"
# The launcher tells each local TensorFlow worker how to all-reduce (tasks.core.launch.tf_worker_envs ->
# models.tfkit.cluster.collective_implementation): "nccl" where each has a GPU of its own, "ring" where they share.
TF_COLLECTIVE_ENV = "TF_WORKER_COLLECTIVE"
_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_DEV = Path("/dev")  # nvidiactl and nvidia<N>: what a process given GPUs can open


@dataclass(frozen=True)
class Gpu:
    index: str  # nvidia-smi's (PCI bus order)
    uuid: str
    total: int  # bytes
    free: int | None  # bytes free now (None: nvidia-smi does not say)


@dataclass(frozen=True)
class GpuView:
    gpus: list[Gpu]  # the GPUs the processes see, in CUDA's numbering where `certain`
    certain: bool    # False: the order may differ from CUDA's (index entries, fastest-first order, unlike GPUs)
    smallest: int    # memory.total of the node's smallest GPU: what any index entry may name when not certain


def has_gpu() -> bool:
    """The NVIDIA driver lists a GPU on this node and this process may use one (no CUDA library loaded): the
    driver's /proc entries show through into a container given no GPU (Docker without --gpus, a pod without a GPU
    request), which has no /dev/nvidiactl; a Slurm job without GPUs has the device nodes, but its cgroup refuses to
    open them."""
    if not ((_DEV / "nvidiactl").exists() and _PROC_GPUS.is_dir() and any(_PROC_GPUS.iterdir())):
        return False
    for node in sorted(_DEV.glob("nvidia[0-9]*")):
        try:
            os.close(os.open(node, os.O_RDWR))
            return True
        except OSError:
            continue
    return False


def hidden_by_environment(environ: Mapping[str, str] | None = None) -> bool:
    """CUDA_VISIBLE_DEVICES hides every GPU: it is set and its first entry names none ("", "-1", "none"), as
    users hide them to run on the CPU."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return False
    first = visible.split(",")[0].strip()
    return not (first.isdigit() or first.startswith(("GPU-", "MIG-")))


def trains_on_gpu(device: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a job given `device` (cpu, cuda, auto) runs on this node's GPUs: cuda always; auto wherever this
    process may use one (has_gpu) and CUDA_VISIBLE_DEVICES does not hide them, where the trainer takes the GPU or
    refuses (check_usable), never falls back to the CPU. The one place that rule is spelled."""
    return device == "cuda" or (device == "auto" and has_gpu() and not hidden_by_environment(environ))


def check_usable(framework: str, cpu_build: bool, environ: Mapping[str, str] | None = None) -> None:
    """Refuse device 'auto' falling back to the CPU when `framework` (e.g. "torch 2.13.0+cpu") sees no GPU on a node
    that offers this process GPUs (has_gpu, not hidden by CUDA_VISIBLE_DEVICES): a GPU-sized model would otherwise
    train on the CPU, many times slower, until its time budget stops it. A CPU build, or CUDA_VISIBLE_DEVICES naming
    none of the node's GPUs, is the deployment's to fix: cannot_run_here (no retry). A CUDA build that cannot start
    CUDA (a driver too old for it, GPUs not ready yet) may recover: a plain error, retried."""
    from tasks.core.process import cannot_run_here

    environ = os.environ if environ is None else environ
    if not trains_on_gpu("auto", environ):
        return
    count = len(list(_PROC_GPUS.iterdir()))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed, _ = query_gpus(environ)
        view, why = _view_of(listed, environ) if listed else (None, "")
        if view is None and why == NONE_VISIBLE:
            raise cannot_run_here(f"device auto: CUDA_VISIBLE_DEVICES={visible!r} names none of the {len(listed)} "
                                  f"GPU(s) nvidia-smi lists ({', '.join(g.index for g in listed)}): name one of "
                                  "them, or set it empty / choose device cpu to run on the CPU")
    if cpu_build:
        raise cannot_run_here(f"device auto: the NVIDIA driver lists {count} GPU(s) on this node but {framework} is a "
                              "CPU build: install its CUDA build, or choose device cpu (or set "
                              "CUDA_VISIBLE_DEVICES=) to run on the CPU")
    raise RuntimeError(f"device auto: the NVIDIA driver lists {count} GPU(s) on this node but {framework} cannot "
                       "start CUDA on them (a driver older than its CUDA, or GPUs not ready); choose device cpu to "
                       "run on the CPU")


def refuse_cuda(framework: str, cpu_build: bool, cuda_build: str = "its CUDA build") -> RuntimeError:
    """The error for device cuda where `framework` (e.g. "torch 2.13.0+cpu") sees no GPU: a CPU build is the
    deployment's to fix (cannot_run_here, no retry; `cuda_build` names what to install); a CUDA build without a usable
    driver or GPU may recover (a plain error, retried)."""
    from tasks.core.process import cannot_run_here

    if cpu_build:
        return cannot_run_here(f"device 'cuda' requested but {framework} sees no CUDA device: it is a CPU build; "
                               f"install {cuda_build}, or choose device cpu or auto")
    return RuntimeError(f"device 'cuda' requested but {framework} sees no CUDA device (no driver, or GPUs not "
                        "ready); choose device cpu or auto to run without one")


def query_gpus(environ: Mapping[str, str]) -> tuple[list[Gpu] | None, str]:
    """(every GPU nvidia-smi lists, in its order; or None and why). A hung nvidia-smi (a faulted driver) is left
    behind after QUERY_TIMEOUT_S: the task does not wait for it."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return None, "no nvidia-smi"
    try:
        child = subprocess.Popen([smi, "--query-gpu=index,uuid,memory.total,memory.free,mig.mode.current",
                                  "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
    except OSError as exc:
        return None, f"nvidia-smi failed: {exc}"
    try:
        out, err = child.communicate(timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()  # not waited for: a process stuck in the driver may never be reaped
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
        return None, f"nvidia-smi did not answer in {QUERY_TIMEOUT_S:.0f} s"
    if child.returncode != 0:
        return None, f"nvidia-smi exited {child.returncode}: {(err or out).strip()[:200]}"
    if not out.strip():
        return None, "nvidia-smi listed no GPU"
    gpus, mig = [], False
    try:
        for line in out.splitlines():
            if not line.strip():
                continue
            index, uuid, total, free, mig_mode = (part.strip() for part in line.split(","))
            mig = mig or mig_mode == "Enabled"
            gpus.append(Gpu(index, uuid, int(total) << 20, int(free) << 20 if free.isdigit() else None))
    except ValueError:
        return None, f"nvidia-smi answered {out.strip()[:200]!r}"
    if mig:
        return None, "MIG instances (nvidia-smi reports whole GPUs)"
    return gpus, "nvidia-smi"


def visible_gpus(environ: Mapping[str, str] | None = None) -> tuple[GpuView | None, str]:
    """The GPUs a process started with `environ` sees (CUDA_VISIBLE_DEVICES: indices or UUIDs, as CUDA reads it,
    up to its first entry that names no GPU); None and why when they cannot be told."""
    environ = os.environ if environ is None else environ
    listed, why = query_gpus(environ)
    if listed is None:
        return None, why
    return _view_of(listed, environ)


def _view_of(listed: list[Gpu], environ: Mapping[str, str]) -> tuple[GpuView | None, str]:
    """visible_gpus for the GPUs nvidia-smi has listed."""
    pci_order = environ.get("CUDA_DEVICE_ORDER", "") == "PCI_BUS_ID"
    alike = len({g.total for g in listed}) <= 1
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen, by_index = listed, True
    else:
        chosen, by_index = [], False
        for entry in (e.strip() for e in visible.split(",")):
            if entry.startswith("MIG-"):
                return None, "MIG instances (nvidia-smi reports whole GPUs)"
            if entry.startswith("GPU-"):
                matches = [g for g in listed if g.uuid.startswith(entry)]
            else:
                matches = [g for g in listed if g.index == entry]
                by_index = True
            if len(matches) != 1 or matches[0] in chosen:
                break  # CUDA ignores this entry and every one after it
            chosen.append(matches[0])
    if not chosen:
        return None, NONE_VISIBLE
    return GpuView(chosen, certain=alike or pci_order or not by_index,
                   smallest=min(g.total for g in listed)), "nvidia-smi"


def per_process_memory(view: GpuView, nproc: int) -> int:
    """Bytes each of `nproc` processes can hold when process i uses GPU i mod (GPUs seen), as torchrun's ranks and
    the TensorFlow workers do: a GPU shared by k processes gives each 1/k of its memory."""
    shares = [len(range(j, nproc, len(view.gpus))) for j in range(len(view.gpus))]
    if view.certain:
        return min(gpu.total // share for gpu, share in zip(view.gpus, shares) if share)
    return view.smallest // max(shares)


def worker_devices(workers: int, environ: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each of `workers` local processes, worker k getting the k-th GPU (mod the GPUs
    seen) of this node; None on a node without a GPU. Made from the parent's CUDA_VISIBLE_DEVICES entries (up to
    the first that names no GPU, as CUDA reads them), or CUDA's own indices, so each worker's single GPU is
    numbered as CUDA numbers it."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    view, _ = visible_gpus(environ) if visible is not None or has_gpu() else (None, "")
    if visible is not None:
        entries = []
        for entry in (e.strip() for e in visible.split(",")):
            if not entry or entry.startswith("-"):
                break
            entries.append(entry)
        if view is not None:
            entries = entries[:len(view.gpus)]
    elif has_gpu():
        entries = [str(i) for i in range(len(view.gpus) if view is not None else len(list(_PROC_GPUS.iterdir())))]
    else:
        return None
    return [entries[k % len(entries)] for k in range(workers)] if entries else None
