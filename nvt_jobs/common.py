"""What every nvt_jobs job shares: the --device / --workers options, the Dask cluster they select, and datasets on
the chosen device. Logging and the one-line failure reason are every job's (tasks.core.job_main, stdlib only)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence

from tasks.core.job_main import configure_logging, run_job  # noqa: F401 - re-exported for the jobs

log = logging.getLogger("recflow.nvt")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "gpu", "auto"), default="auto",
                        help="cpu: pandas-backed Dataset(cpu=True); gpu: cudf + dask-cuda; auto: gpu if cudf imports")
    parser.add_argument("--workers", type=int, default=2,
                        help="Dask workers of the local cluster (0 = the synchronous scheduler in this process)")


def resolve_device(device: str) -> str:
    """cpu, or gpu where cuDF imports and CUDA shows it a GPU (auto); --device gpu where it cannot is one line.
    Importing cuDF on a machine whose GPUs are hidden or absent can raise CUDA's errors, not only ImportError."""
    if device == "cpu":
        return "cpu"
    try:
        import cudf  # noqa: F401
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("CUDA shows no GPU")
    except Exception as exc:  # noqa: BLE001 - any failure means: not on a GPU
        if device == "gpu":
            raise RuntimeError(f"--device gpu, but cuDF cannot run here ({type(exc).__name__}: {exc}); "
                               "use --device cpu or auto") from None
        return "cpu"
    return "gpu"


@contextlib.contextmanager
def dask_cluster(device: str, workers: int) -> Iterator[object | None]:
    """A Dask client on a local cluster for the job's duration: dask-cuda's (one worker per visible GPU) on gpu,
    distributed's LocalCluster (`workers` processes, one thread each) on cpu; none (synchronous) when workers is 0."""
    import dask

    for noisy in ("distributed", "tornado"):  # per-worker start/stop chatter; warnings and errors still show
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if device == "gpu":
        from dask_cuda import LocalCUDACluster
        from distributed import Client

        with LocalCUDACluster(dashboard_address=None) as cluster, Client(cluster) as client:
            log.info("dask-cuda cluster: %d GPU worker(s)", len(client.scheduler_info()["workers"]))
            yield client
        return
    if workers == 0:
        with dask.config.set(scheduler="synchronous"):
            log.info("dask: synchronous scheduler")
            yield None
        return
    from distributed import Client, LocalCluster

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Port 8787 is already in use" etc.: no dashboard is started
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.WARNING)
    with cluster, Client(cluster) as client:
        log.info("dask local cluster: %d worker process(es), 1 thread each", workers)
        yield client


def dataset(paths: Sequence[str], device: str, **kwargs):
    """merlin.io.Dataset over parquet files, pandas-backed on cpu, cudf-backed on gpu."""
    from merlin.io import Dataset

    return Dataset(list(paths), engine="parquet", cpu=device == "cpu", **kwargs)
