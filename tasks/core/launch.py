"""Launch a model's trainer and evaluator from an Airflow task: torchrun / TensorFlow workers / python children,
logs streamed live.

Model-neutral: the caller names the trainer module (e.g. `models.dlrm.train`) and hands it a config mapping that
becomes `--name value` flags. The trainer runs in its own processes (torchrun with `--nproc_per_node N`: gloo on
CPU, NCCL on CUDA; or N TensorFlow worker processes, each with its TF_CONFIG naming localhost ports for
MultiWorkerMirroredStrategy, started and stopped together), never in the Airflow worker's interpreter, so a crash
or OOM of training cannot take the worker down and the task log shows every line as it is printed. A retried task
resumes from the trainer's latest checkpoint (the trainer looks for one in its output directory); a finished
training with a manifest for the same inputs is not redone.

Several machines ("nodes"): each node's launcher starts its own processes with the same call plus a NodeLayout
(from the deployment's settings: RECFLOW_TRAIN_NNODES, _NODE_RANK, _RDZV_ENDPOINT, _NODE_HOSTS, _TF_PORT).
torchrun's processes meet at a c10d rendezvous hosted by node 0's launcher; TensorFlow's workers get one TF_CONFIG
naming every worker of every node. The output directory must be one shared directory that every node sees.

Before launching, a caller that can size its model (`MemoryNeed`, e.g. tasks.core.dlrm_knobs.dlrm_memory_need from the
FeatureSpec's cardinalities and the MLP widths) has the bytes checked against the node's memory (`check_memory`):
a model far above the machine fails with one line naming what to lower, not in an allocation inside the trainer.

A trainer that aborts while tearing down after it wrote its outputs (TorchRec's CPU builds raise SIGABRT at exit
now and then) does not fail the task: the launcher accepts a SIGABRT exit when the run's outputs were written by this
launch and are complete, and logs a warning line; any other abort, or one before the outputs exist, fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.core.process import (CANNOT_RUN_HERE, TOO_SLOW, ChildCommand, ProcessResult, run_streaming,
                                run_streaming_group)
from tasks.core.storage import Manifest, completed_manifest, read_manifest, write_manifest

if TYPE_CHECKING:
    from tasks.core.config import Settings

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
TORCH_MODEL_FILE = "model.pt"
OUTPUT_WAIT_S = 600.0  # how long a node waits for outputs that another node's rank 0 writes


class TrainingFailed(RuntimeError):
    """The trainer exited non-zero; the message is its last error line."""


class TrainingTooSlow(ValueError):
    """The trainer measured that the run cannot finish in the time its task has left over its attempts (bad input
    for this deployment: a retry cannot help). One line: the rate, the time needed and the budget, what to change."""


class CannotRunHere(ValueError):
    """The training job cannot run on this node as configured (bad input: a retry cannot help): more torchrun
    processes than GPUs, device auto on GPUs the framework cannot use, a flag the device cannot honour. Raised by
    the launcher's checks, or from a trainer's CANNOT_RUN_HERE line. One line naming what to change."""


def _training_failed(what: str, line: str) -> Exception:
    """The exception of a trainer that failed with `line` (its error line): TrainingTooSlow for models'
    time-budget stop, CannotRunHere for its refusal of the node, TrainingFailed (retried) otherwise."""
    if TOO_SLOW in line:
        return TrainingTooSlow(line[line.index(TOO_SLOW):])
    if CANNOT_RUN_HERE in line:
        return CannotRunHere(line[line.index(CANNOT_RUN_HERE):])
    return TrainingFailed(f"{what}: {line}")


class ModelTooLarge(ValueError):
    """The model needs more memory than the training node has (bad input: a retry cannot help). One line naming the
    bytes on both sides and what to lower or set."""


def check_one_gpu_each(nproc: int, device: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse (CannotRunHere) nproc torchrun processes that would train on fewer GPUs than nproc; the TensorFlow
    workers may share one (tf_worker_envs). Unchecked where nvidia-smi cannot tell: the trainer checks again
    (models.torchkit.distributed.init_distributed)."""
    from tasks.core.gpus import trains_on_gpu, visible_gpus

    if nproc <= 1 or not trains_on_gpu(device, environ):
        return
    view, _ = visible_gpus(environ)
    if view is not None and nproc > len(view.gpus):
        raise CannotRunHere(f"{CANNOT_RUN_HERE} nproc {nproc} GPU process(es) on this node, but they see "
                            f"{len(view.gpus)} GPU(s) ({', '.join(g.index for g in view.gpus)}): NCCL runs one "
                            f"process per GPU; lower nproc to {len(view.gpus)}, or train on the CPU (device cpu)")


@dataclass(frozen=True)
class MemoryNeed:
    """The least memory a training job needs, by how it scales: `replicated` bytes in every process (dense layers,
    data-parallel embedding tables), `sharded` bytes split across all processes of the job (sharded tables).
    `what` describes the model, `lower` names the knobs that make it smaller (both for the refusal's line).
    `host`: bytes every process holds in host memory beside what it holds on its GPU (the TF2 DLRM's host-memory
    tables), checked against the host's memory when the job trains on GPUs."""

    replicated: int
    sharded: int
    what: str
    lower: str
    host: int = 0

    def per_node(self, nproc: int, nnodes: int = 1) -> int:
        return self.replicated * nproc + -(-self.sharded // nnodes)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def gpu_memory_bytes(nproc: int, environ: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """(what nproc processes of one node can hold on its GPUs, where that comes from): process i on GPU i mod the
    GPUs it sees (tasks.core.gpus), each GPU's memory.total shared by its processes; None and why when nvidia-smi
    cannot tell. The total, not what is free now: another job on the GPU is a reason to wait, not to refuse."""
    from tasks.core.gpus import per_process_memory, visible_gpus

    view, why = visible_gpus(environ)
    if view is None:
        return None, f"GPU memory ({why}; set RECFLOW_TRAIN_MEMORY_BYTES to check it)"
    each = per_process_memory(view, nproc)
    used = view.gpus[:nproc]
    return each * nproc, (f"nvidia-smi memory.total: {nproc} process(es) on GPU(s) "
                          f"{', '.join(g.index for g in used)}, {_gib(each)} each; free now "
                          f"{', '.join('?' if g.free is None else _gib(g.free) for g in used)}")


def node_memory_bytes(device: str, settings: Settings | None = None, nproc: int = 1) -> tuple[int | None, str]:
    """(bytes a training node may use, where that figure comes from): RECFLOW_TRAIN_MEMORY_BYTES when set, else the
    GPUs' memory for GPU training (gpu_memory_bytes), the host's MemAvailable for CPU training."""
    from tasks.core.gpus import trains_on_gpu

    if settings is None:
        from tasks.core.config import load_settings

        settings = load_settings()
    if settings.train_memory_bytes:
        return settings.train_memory_bytes, "RECFLOW_TRAIN_MEMORY_BYTES"
    if trains_on_gpu(device):
        return gpu_memory_bytes(nproc)
    return host_memory_bytes()


def host_memory_bytes() -> tuple[int | None, str]:
    """(this host's MemAvailable, where it comes from)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    return None, "unknown (no /proc/meminfo)"


def check_memory(need: MemoryNeed, nproc: int, *, device: str = "cpu", nodes: NodeLayout | None = None,
                 available: int | None = None, source: str = "") -> None:
    """Refuse (ModelTooLarge) a job whose least memory on this node is above what the node has; `available`
    None = node_memory_bytes(device). Logs the comparison either way."""
    nnodes = nodes.nnodes if nodes is not None else 1
    needed = need.per_node(nproc, nnodes)
    if need.host:  # set for GPU training only (tasks.core.dlrm_knobs.dlrm_memory_need)
        host, host_source = host_memory_bytes()
        if host is not None and need.host * nproc > host:
            raise ModelTooLarge(f"{need.what} needs at least {_gib(need.host * nproc)} of host memory on this node "
                                f"({nproc} process(es) x {_gib(need.host)}), more than the {_gib(host)} it has "
                                f"({host_source}): lower {need.lower}")
    if available is None:
        available, source = node_memory_bytes(device, nproc=nproc)
    if available is None:
        log.info("memory preflight: %s needs at least %s on this node; not checked against %s", need.what,
                 _gib(needed), source)
        return
    if needed > available:
        shape = f"{nproc} process(es) x {_gib(need.replicated)}" + (
            f" + {_gib(need.sharded / nnodes)} of sharded tables" if need.sharded else "")
        raise ModelTooLarge(f"{need.what} needs at least {_gib(needed)} on this node ({shape}), more than the "
                            f"{_gib(available)} it has ({source}): lower {need.lower}, or set "
                            "RECFLOW_TRAIN_MEMORY_BYTES if the worker has more")
    log.info("memory preflight: %s needs at least %s on this node of %s available (%s)", need.what, _gib(needed),
             _gib(available), source)


@dataclass(frozen=True)
class NodeLayout:
    """Where this launcher's processes sit in a training job spread over `nnodes` machines.

    rdzv_endpoint: host:port of torchrun's c10d rendezvous, served by node 0's launcher (required when nnodes > 1
    for torchrun). node_hosts: each node's address in node-rank order, and tf_port the first of the consecutive
    ports of the TensorFlow workers (worker k of the whole job listens on tf_port + k; required when nnodes > 1 for
    TensorFlow). rdzv_id: the job's name at
    the rendezvous, the same on every node (default: derived from the output directory)."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    node_hosts: tuple[str, ...] = ()
    tf_port: int = 0
    rdzv_id: str = ""

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"invalid node layout: node_rank {self.node_rank} of {self.nnodes} node(s)")
        if self.node_hosts and len(self.node_hosts) != self.nnodes:
            raise ValueError(f"{len(self.node_hosts)} node hosts {list(self.node_hosts)} for {self.nnodes} nodes")

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @classmethod
    def from_settings(cls, settings: Settings) -> NodeLayout:
        return cls(nnodes=settings.train_nnodes, node_rank=settings.train_node_rank,
                   rdzv_endpoint=settings.train_rdzv_endpoint, node_hosts=settings.train_node_hosts,
                   tf_port=settings.train_tf_port)

    def torchrun_rdzv(self, output_dir: Path) -> dict[str, str]:
        """torchrun_command's rendezvous arguments of this node (empty on a single node)."""
        if not self.multi_node:
            return {}
        if not self.rdzv_endpoint:
            raise ValueError(f"training on {self.nnodes} nodes needs a rendezvous endpoint host:port "
                             "(RECFLOW_TRAIN_RDZV_ENDPOINT, usually node 0's address)")
        job = self.rdzv_id or "recflow-" + hashlib.sha256(str(output_dir).encode()).hexdigest()[:16]
        return {"rdzv_endpoint": self.rdzv_endpoint, "rdzv_id": job}

    def tf_cluster(self, workers_per_node: int) -> tuple[list[str], list[int]]:
        """(every worker's host:port, in TF_CONFIG order; the indices of this node's workers)."""
        if not self.node_hosts or not self.tf_port:
            raise ValueError(f"TensorFlow workers on {self.nnodes} nodes need every node's host "
                             "(RECFLOW_TRAIN_NODE_HOSTS) and a first worker port (RECFLOW_TRAIN_TF_PORT)")
        # Worker k listens on tf_port + k: distinct even when two "nodes" share a host (tests, one big machine).
        cluster = [f"{host}:{self.tf_port + node * workers_per_node + i}"
                   for node, host in enumerate(self.node_hosts) for i in range(workers_per_node)]
        first = self.node_rank * workers_per_node
        return cluster, list(range(first, first + workers_per_node))


def _node_layout(nodes: NodeLayout | None) -> NodeLayout:
    if nodes is not None:
        return nodes
    from tasks.core.config import load_settings

    return NodeLayout.from_settings(load_settings())


_TORCHRUN_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_ABORT_CODES = (-signal.SIGABRT, 128 + signal.SIGABRT)


def aborted(result: ProcessResult) -> bool:
    """Whether a child died of SIGABRT: its own exit status, or (torchrun) the first failure torchrun reports."""
    if result.returncode in _ABORT_CODES:
        return True
    lines = list(result.tail)
    if not any("Root Cause (first observed failure)" in line for line in lines):
        return False
    root = lines[max(i for i, line in enumerate(lines) if "Root Cause (first observed failure)" in line):]
    codes = [int(m.group(1)) for line in root if (m := _TORCHRUN_EXITCODE.match(line))]
    return bool(codes) and codes[0] in _ABORT_CODES


def outputs_complete(output_dir: Path, model_file: str, since: float) -> str | None:
    """None when the run's outputs are complete and written at or after `since` (this launch): the model file,
    then metrics.json (written last, a JSON object); else the reason they are not."""
    model, metrics = output_dir / model_file, output_dir / METRICS_FILE
    for path in (model, metrics):
        if not path.is_file() or path.stat().st_size == 0:
            return f"{path} is missing"
        if path.stat().st_mtime < since:
            return f"{path} is older than this launch"
    if metrics.stat().st_mtime < model.stat().st_mtime:
        return f"{metrics} is older than {model.name}"
    try:
        if not isinstance(json.loads(metrics.read_text()), dict):
            return f"{metrics} is not a JSON object"
    except (OSError, ValueError) as exc:
        return f"{metrics} is unreadable ({exc})"
    return None


def _accept_abort(results: Sequence[ProcessResult], output_dir: Path, model_file: str, since: float,
                  what: str) -> bool:
    """True when every failed child aborted (SIGABRT) and the outputs are complete: logged as a warning."""
    failed = [r for r in results if r.returncode != 0]
    if not failed or not all(aborted(r) for r in failed):
        return False
    reason = outputs_complete(output_dir, model_file, since)
    if reason is not None:
        log.error("%s aborted (SIGABRT) before its outputs were complete: %s", what, reason)
        return False
    log.warning("%s aborted (SIGABRT) after writing complete outputs to %s (a known teardown crash of TorchRec's "
                "CPU builds): accepting the finished training", what, output_dir)
    return True


def _wait_for_outputs(output_dir: Path, model_file: str, since: float, timeout_s: float = OUTPUT_WAIT_S) -> None:
    """On a multi-node job this node's processes may finish before the rank that writes the outputs (which can
    live on another node): wait for them."""
    deadline = time.monotonic() + timeout_s
    while (reason := outputs_complete(output_dir, model_file, since)) is not None:
        if time.monotonic() > deadline:
            raise TrainingFailed(f"this node's training processes finished, but after {timeout_s:.0f}s: {reason}")
        time.sleep(1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_args(config: Mapping[str, Any]) -> list[str]:
    """`--name value` flags for a trainer's config dataclass fields (lists as several values, bools as
    --flag / --no-flag, None left out)."""
    args: list[str] = []
    for name, value in config.items():
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            args += [f"--{name}", *[str(v) for v in value]]
        else:
            args += [f"--{name}", str(value)]
    return args


def torchrun_command(nproc: int, module: str, args: list[str], *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None,
                     python: str | None = None, rdzv_endpoint: str = "", rdzv_id: str = "") -> list[str]:
    """torchrun argv (as a list: no shell) that runs `python -m module args` on nproc local processes.

    With rdzv_endpoint the nodes meet at a c10d rendezvous there (hosted by node 0, which must be reachable at that
    address) under the job name rdzv_id; without it, at master_addr:master_port (one node)."""
    if not 1 <= nproc <= 64 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"invalid launch shape: nproc={nproc} nnodes={nnodes} node_rank={node_rank}")
    head = [python or sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            f"--node_rank={node_rank}"]
    if rdzv_endpoint:
        if not rdzv_id:
            raise ValueError("a c10d rendezvous needs a job id (rdzv_id), the same on every node")
        # is_host: node 0 serves the rendezvous store, the others connect to it (no guessing from host names).
        head += ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}",
                 f"--rdzv_conf=is_host={'true' if node_rank == 0 else 'false'}"]
    else:
        head += [f"--master_addr={master_addr}", f"--master_port={master_port or free_port()}"]
    return [*head, "-m", module, *args]


def _child_env(nproc: int) -> dict[str, str]:
    from tasks.core.config import REPO_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if nproc > 1:
        # One intra-op thread per rank per core: more ranks x threads than cores only adds contention.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def _record_finished_training(output_dir: Path, module: str, inputs: dict[str, Any], model_file: str,
                              started: float, multi_node: bool) -> dict[str, Any]:
    """Once the training children exited well: on a multi-node run wait for the chief's outputs, then mark the
    output folder done with the run's metrics; its manifest."""
    if multi_node:
        _wait_for_outputs(output_dir, model_file, started)
    metrics = json.loads((output_dir / METRICS_FILE).read_text())
    done_manifest = Manifest(kind=f"training:{module}", inputs=inputs, extra={"metrics": metrics})
    # Checkpoints are excluded from the checksummed file list: they rotate and can be large.
    write_manifest(output_dir, done_manifest, checksum=False)
    return read_manifest(output_dir)


def _training_result(output_dir: Path, model_file: str, done: dict[str, Any]) -> dict[str, Any]:
    """What a training task returns through XCom: paths and the metrics of its done manifest."""
    return {"output_dir": str(output_dir), "model_path": str(output_dir / model_file),
            "metrics": done["extra"]["metrics"], "plot": str(output_dir / "training_curves.png")}


def train_with_torchrun(module: str, dataset_dir: Path, output_dir: Path, config: Mapping[str, Any], *,
                        nproc: int = 1, label: str = "train", nodes: NodeLayout | None = None,
                        memory: MemoryNeed | None = None, time_budget_s: float = 0.0,
                        flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run `module` (a trainer whose main() takes --dataset_dir/--output_dir plus its config flags and writes
    model.pt, then metrics.json) on nproc processes; cached by a manifest of (dataset, config, nproc). Returns
    metrics + paths. `nodes`: this node's place in a multi-node job (default: from the deployment's settings);
    every node calls this with the same arguments. `memory`: the model's least memory, checked before launching.
    `time_budget_s`: the seconds the task has left over its attempts, handed to a trainer that takes it (not part
    of the cache key: a retry has less). `flags`: more config fields for the trainer that change no weight (not
    part of the cache key either)."""
    dataset_manifest = read_manifest(dataset_dir)
    if dataset_manifest is None:
        raise FileNotFoundError(f"dataset {dataset_dir} has no manifest: run transform / validate first")
    nodes = _node_layout(nodes)
    inputs = {"dataset": dataset_manifest["inputs_fingerprint"], "config": dict(config), "nproc": nproc}
    if nodes.multi_node:
        inputs["nnodes"] = nodes.nnodes
    done = completed_manifest(output_dir, inputs)
    if done is None:
        check_one_gpu_each(nproc, str(config.get("device", "auto")))
        if memory is not None:
            check_memory(memory, nproc, device=str(config.get("device", "auto")), nodes=nodes)
        full = {**config, **(flags or {}), "dataset_dir": str(dataset_dir), "output_dir": str(output_dir),
                **({"time_budget_s": time_budget_s} if time_budget_s else {})}
        argv = torchrun_command(nproc, module, config_args(full), nnodes=nodes.nnodes, node_rank=nodes.node_rank,
                                **nodes.torchrun_rdzv(output_dir))
        log.info("launching %d training process(es) on node %d of %d: %s", nproc, nodes.node_rank, nodes.nnodes,
                 " ".join(argv[:6]))
        started = time.time() - 1.0  # file times can be a little coarser than the clock
        result = run_streaming(argv, env=_child_env(nproc), label=label)
        if result.returncode != 0 and not _accept_abort([result], output_dir, TORCH_MODEL_FILE, started, "training"):
            raise _training_failed(f"training exited {result.returncode}", result.last_error_line)
        done = _record_finished_training(output_dir, module, inputs, TORCH_MODEL_FILE, started, nodes.multi_node)
    else:
        log.info("training in %s already finished for these inputs: nothing to do", output_dir)
    return _training_result(output_dir, TORCH_MODEL_FILE, done)


TF_MODEL_FILE = "model.weights.h5"  # Keras weights; the trainer writes model_config.json (the sizes) beside it


def tf_worker_envs(workers: int, *, ports: list[int] | None = None, host: str = "127.0.0.1",
                   cores: int | None = None, cluster: list[str] | None = None,
                   indices: list[int] | None = None, devices: list[str] | None = None) -> list[dict[str, str]]:
    """One environment per local worker: TF_CONFIG naming every worker (localhost ports) and this one's index, and
    thread pools sized so workers x intra-op threads <= cores. One worker gets no TF_CONFIG (single-process
    strategy). Multi-node: `cluster` names every worker of every node (NodeLayout.tf_cluster) and `indices` the
    positions in it of this node's `workers` workers. On a node with GPUs each worker sees one, its
    CUDA_VISIBLE_DEVICES from `devices` (worker k: entry k mod their number; default: tasks.core.gpus.
    worker_devices): without it every worker's MultiWorkerMirroredStrategy would put a replica on every GPU."""
    if not 1 <= workers <= 64:
        raise ValueError(f"invalid number of TensorFlow workers: {workers}")
    cores = cores or os.cpu_count() or 1
    intra = max(1, cores // workers)
    if cluster is None:
        ports = ports or [free_port() for _ in range(workers)]
        if len(set(ports)) != workers:
            raise ValueError(f"need {workers} distinct ports, got {ports}")
        cluster = [f"{host}:{port}" for port in ports]
    indices = list(range(workers)) if indices is None else indices
    if len(indices) != workers or len(set(cluster)) != len(cluster) or not set(indices) <= set(range(len(cluster))):
        raise ValueError(f"workers {indices} do not fit the cluster {cluster}")
    from tasks.core.gpus import TF_COLLECTIVE_ENV, worker_devices

    if devices is None:
        devices = worker_devices(workers)
    # worker_devices repeats GPUs (one entry per worker): workers share one when there are fewer distinct GPUs
    shared = bool(devices) and workers > len(set(devices))
    envs = []
    for local, index in enumerate(indices):
        env = _child_env(1)
        env.pop("TF_CONFIG", None)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices[local % len(devices)]
            if shared:  # TF would otherwise reserve all of the GPU for the first worker on it
                env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
            # All-reduce by NCCL where each worker has a GPU of its own (TF's AUTO is its ring over gRPC through the
            # hosts); NCCL refuses two ranks on one GPU. Every node of a job must decide alike: alike nodes.
            env[TF_COLLECTIVE_ENV] = "ring" if shared else "nccl"
        if len(cluster) > 1:
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}})
        env.update({"TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(min(2, intra)),
                    "OMP_NUM_THREADS": str(intra)})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ INFO lines would drown the progress lines
        envs.append(env)
    return envs


def train_with_tf_workers(module: str, dataset_dir: Path, output_dir: Path, config: Mapping[str, Any], *,
                          workers: int = 1, label: str = "train", manifest_dir: Path | None = None,
                          nodes: NodeLayout | None = None, memory: MemoryNeed | None = None,
                          time_budget_s: float = 0.0, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run `module` (a TensorFlow trainer whose main() takes --dataset_dir/--output_dir plus its config flags,
    reads TF_CONFIG and writes metrics.json on the chief) as `workers` processes; cached by a manifest of
    (dataset, config, workers). `manifest_dir`: where the dataset's manifest is when dataset_dir is a part of a
    larger output (default: dataset_dir). If one worker fails the others are stopped and TrainingFailed names the
    failing worker and its last error line. `nodes`: this node's place in a multi-node job (default: from the
    deployment's settings; `workers` is then the number per node). `memory`: the model's least memory, checked
    before launching. `time_budget_s`, `flags`: as train_with_torchrun's. Returns metrics + paths."""
    manifest_dir = manifest_dir or dataset_dir
    dataset_manifest = read_manifest(manifest_dir)
    if dataset_manifest is None:
        raise FileNotFoundError(f"dataset {manifest_dir} has no manifest: run preprocessing / validate first")
    nodes = _node_layout(nodes)
    inputs = {"dataset": dataset_manifest["inputs_fingerprint"], "config": dict(config), "workers": workers,
              "launcher": "tf_workers"}
    layout: dict[str, Any] = {}
    if nodes.multi_node:
        inputs["nnodes"] = nodes.nnodes
        layout["cluster"], layout["indices"] = nodes.tf_cluster(workers)
    done = completed_manifest(output_dir, inputs)
    if done is None:
        if memory is not None:
            check_memory(memory, workers, device=str(config.get("device", "auto")), nodes=nodes)
        full = {**config, **(flags or {}), "dataset_dir": str(dataset_dir), "output_dir": str(output_dir),
                **({"time_budget_s": time_budget_s} if time_budget_s else {})}
        argv = [sys.executable, "-m", module, *config_args(full)]
        envs = tf_worker_envs(workers, **layout)
        first = layout.get("indices", [0])[0]
        children = [ChildCommand(argv, env, f"worker {first + i}") for i, env in enumerate(envs)]
        log.info("launching %d TensorFlow worker(s) on node %d of %d: %s", workers, nodes.node_rank, nodes.nnodes,
                 " ".join(argv[:3]))
        started = time.time() - 1.0
        result = run_streaming_group(children, label=label)
        if not result.ok and not _accept_abort(result.results, output_dir, TF_MODEL_FILE, started, "training"):
            # The chief's time-budget line (or a refusal) names the cause, whichever worker exited first.
            index = next((i for i, r in enumerate(result.results)
                          if TOO_SLOW in r.last_error_line or CANNOT_RUN_HERE in r.last_error_line),
                         result.first_failed)
            failed = result.results[index]
            raise _training_failed(f"training worker {first + index} of {workers} exited {failed.returncode}",
                                   failed.last_error_line)
        done = _record_finished_training(output_dir, module, inputs, TF_MODEL_FILE, started, nodes.multi_node)
    else:
        log.info("training in %s already finished for these inputs: nothing to do", output_dir)
    return _training_result(output_dir, TF_MODEL_FILE, done)


def run_module(module: str, args: list[str], *, label: str, what: str) -> None:
    """`python -m module args` in one child process (evaluation, export, scoring), its output streamed into the
    task log; a non-zero exit raises TrainingFailed naming `what` and the child's last error line, or CannotRunHere
    for its refusal of the node (device cuda on a CPU build: not retried). A TensorFlow child takes GPU memory as it
    needs it, not nearly all of every GPU it sees at start as TF does by default, which would starve a training or
    Spark job sharing the GPU worker."""
    env = _child_env(1)
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    result = run_streaming([sys.executable, "-m", module, *args], env=env, label=label)
    if result.returncode != 0:
        raise _training_failed(f"{what} exited {result.returncode}", result.last_error_line)


def evaluate_in_child(module: str, model_path: Path, dataset_dir: Path, out_dir: Path, *, mapping: str = "test",
                      label: str = "evaluate", device: str | None = None) -> dict[str, Any]:
    """Run an evaluator module on a mapping of the dataset in a child process; returns its metrics.json. `device`:
    the run's (cpu, cuda, auto), for evaluators that take --device (default: theirs)."""
    run_module(module, ["--model_path", str(model_path), "--dataset_dir", str(dataset_dir), "--mapping", mapping,
                        "--output_dir", str(out_dir), *(["--device", device] if device else [])],
               label=label, what="evaluation")
    return json.loads((out_dir / "metrics.json").read_text())
