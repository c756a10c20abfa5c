"""Which worker this process is, and its tf.distribute strategy, from TF_CONFIG.

TF_CONFIG = {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}} names a
multi-worker job: MultiWorkerMirroredStrategy (collective all-reduce; gradients summed across workers), with
worker 0 as the chief (it alone writes the run's outputs). No TF_CONFIG, or one naming a single worker, means a
single process: a one-device strategy, so the trainer's code path (scope, run, reduce) is the same.

Order matters and is enforced here: thread pools are sized and the strategy created before any other TensorFlow
op runs (TF fixes both when its runtime starts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tasks.core.gpus import TF_COLLECTIVE_ENV, check_usable, refuse_cuda


class ClusterConfigError(ValueError):
    """TF_CONFIG that does not describe a worker of a worker-only cluster."""


@dataclass(frozen=True)
class WorkerContext:
    index: int
    workers: int
    strategy: tf.distribute.Strategy
    intra_op_threads: int
    inter_op_threads: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def is_distributed(self) -> bool:
        return self.workers > 1


def read_tf_config(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(this worker's index, number of workers) from TF_CONFIG; (0, 1) when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not raw:
        return 0, 1
    try:
        config: Any = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterConfigError(f"TF_CONFIG is not a worker cluster description ({exc}): {raw[:200]}") from None
    other = sorted(set(config["cluster"]) - {"worker"})
    if other or task.get("type") != "worker":
        raise ClusterConfigError(f"TF_CONFIG: only 'worker' tasks are supported, got roles {other} and task "
                                 f"type {task.get('type')!r}")
    index = int(task.get("index", -1))
    if not isinstance(workers, list) or not workers or not 0 <= index < len(workers):
        raise ClusterConfigError(f"TF_CONFIG: task index {index} is outside the {len(workers)} workers listed")
    return index, len(workers)


def configure_threads(intra_op: int = 0, inter_op: int = 0) -> tuple[int, int]:
    """Size TF's thread pools (0: keep TF's choice, which also honours TF_NUM_INTRAOP_THREADS /
    TF_NUM_INTEROP_THREADS). Only possible before the runtime starts; afterwards the sizes stay as they are (a
    trainer called twice in one process, as tests do). Returns the sizes in effect (0: TF's default)."""
    try:
        if intra_op > 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op > 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        pass  # runtime already started in this process
    return (tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads())


def use_device(device: str) -> None:
    """A trainer's or evaluator's --device, before TensorFlow's runtime starts: cpu hides any GPU; cuda needs a GPU
    TensorFlow sees; auto uses one where TensorFlow sees it and refuses a node whose GPUs it cannot use
    (tasks.core.gpus.check_usable: tensorflow-cpu on a GPU node), as the PyTorch trainers do."""
    if device == "cpu":
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # a second run in one process, as tests do, keeps the first one's devices
            if tf.config.list_logical_devices("GPU"):
                print("[rank 0] --device cpu: TensorFlow's runtime already started with a GPU; it stays visible",
                      flush=True)
        return
    if tf.config.list_physical_devices("GPU"):
        return
    framework, cpu_build = f"TensorFlow {tf.__version__}", not tf.test.is_built_with_cuda()
    if device == "cuda":
        raise refuse_cuda(framework, cpu_build, cuda_build="tensorflow[and-cuda] in place of tensorflow-cpu")
    check_usable(framework, cpu_build)


def collective_implementation(environ: Mapping[str, str] | None = None) -> Any:
    """How MultiWorkerMirroredStrategy all-reduces: NCCL where the launcher gave each worker a GPU of its own
    (TF_COLLECTIVE_ENV=nccl, tasks.core.launch.tf_worker_envs) and TensorFlow may use it (not hidden by device
    cpu), else AUTO, which in TF2 is its ring over gRPC (NCCL only when asked for: the collective_nccl config is set
    in TF1 graph mode alone)."""
    environ = os.environ if environ is None else environ
    implementation = tf.distribute.experimental.CommunicationImplementation
    if environ.get(TF_COLLECTIVE_ENV) == "nccl" and tf.config.get_visible_devices("GPU"):
        return implementation.NCCL
    return implementation.AUTO


def start_worker(intra_op_threads: int = 0, inter_op_threads: int = 0,
                 environ: Mapping[str, str] | None = None, device: str = "auto") -> WorkerContext:
    """The device (use_device), threads, then the strategy, before any other TF op; call once at the start of a
    trainer's main."""
    use_device(device)
    index, workers = read_tf_config(environ)
    intra, inter = configure_threads(intra_op_threads, inter_op_threads)
    if workers > 1:
        options = tf.distribute.experimental.CommunicationOptions(implementation=collective_implementation(environ))
        strategy: tf.distribute.Strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        gpus = tf.config.list_logical_devices("GPU")
        strategy = tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    return WorkerContext(index=index, workers=workers, strategy=strategy, intra_op_threads=intra,
                         inter_op_threads=inter)


_COLLECTIVES: dict[int, tuple[Any, Any]] = {}


def _collectives(strategy: tf.distribute.Strategy) -> tuple[Any, Any]:
    """(barrier, sum) as tf.functions of this strategy (run eagerly, MultiWorkerMirroredStrategy warns on every
    call and is slow)."""
    if id(strategy) not in _COLLECTIVES:
        @tf.function
        def all_sum(value: tf.Tensor) -> tf.Tensor:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(value,)), axis=None)

        _COLLECTIVES[id(strategy)] = (strategy, all_sum)
    return _COLLECTIVES[id(strategy)]


def barrier(ctx: WorkerContext) -> None:
    """Wait until every worker gets here (an all-reduce of a constant); a no-op on one worker.

    Used where one worker works alone (the chief's evaluation and output writing) so that no worker leaves the job
    while another still needs the collective runtime.
    """
    if ctx.is_distributed:
        _collectives(ctx.strategy)[1](tf.constant(1.0, tf.float32))


def sum_over_workers(ctx: WorkerContext, value: float) -> float:
    """Sum a number across workers (every worker must call it, in the same order)."""
    if not ctx.is_distributed:
        return float(value)
    return float(_collectives(ctx.strategy)[1](tf.constant(float(value), tf.float32)))
