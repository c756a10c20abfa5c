"""NVTabular's own environment, reached the Airflow way: its interpreter runs an `nvt_jobs` module as a child process
whose output is streamed into the task log line by line (tasks.core.process), like spark-submit's.

NVTabular 23.08 pins numpy 1.26, pandas 1.5, pyarrow 14 and dask 2023.7, which cannot share recflow's environment
(PySpark needs pandas >= 2.2): it lives in .venv-nvtabular (`make nvt-env`, requirements-nvtabular.txt), and nothing
in the scheduler or the worker's main environment ever imports it. The jobs under nvt_jobs/ import only NVTabular,
the scientific stack and recflow's dependency-free modules (schema, storage, spark_jobs.common's logging), put on the
child's PYTHONPATH.

Settings:
  RECFLOW_NVT_PYTHON   the interpreter of NVTabular's environment (default: <repo>/.venv-nvtabular/bin/python; a
                       GPU image points it at its RAPIDS/Merlin environment)
  RECFLOW_NVT_DEVICE   cpu | gpu | auto (default auto: gpu when cudf imports in that environment). cpu runs
                       `Dataset(..., cpu=True)` on pandas; gpu runs cudf with a dask-cuda cluster.
  RECFLOW_NVT_WORKERS  Dask workers of the local cluster (default: min(cores, 2); 0 = Dask's synchronous scheduler in
                       the job's own process).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from tasks.core.config import REPO_ROOT
from tasks.core.process import run_streaming
from tasks.core.settings_registry import read, value

log = logging.getLogger(__name__)

PYTHON_ENV = "RECFLOW_NVT_PYTHON"
DEVICE_ENV = "RECFLOW_NVT_DEVICE"
WORKERS_ENV = "RECFLOW_NVT_WORKERS"
DEVICES = ("cpu", "gpu", "auto")
DEFAULT_VENV = REPO_ROOT / ".venv-nvtabular"
QUIET_WARNINGS = ("ignore:Tensorflow dtype mappings", "ignore:PyTorch dtype mappings", "ignore:Triton dtype mappings",
                  "ignore:Initializing an NVTabular Dataset in CPU mode")


class NvtEnvironmentMissing(FileNotFoundError):
    """NVTabular's environment is not built where the settings say; the message says how to build it."""


class NvtJobFailed(RuntimeError):
    """An nvt_jobs module exited non-zero; the message carries its one-line reason."""


def nvt_python() -> Path:
    """The interpreter of NVTabular's environment; NvtEnvironmentMissing (one line, with the fix) when absent."""
    configured = read(PYTHON_ENV)
    python = Path(configured) if configured else DEFAULT_VENV / "bin" / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        where = f"{PYTHON_ENV}={configured}" if configured else str(python)
        raise NvtEnvironmentMissing(f"NVTabular's environment is not built ({where} is not an interpreter): run "
                                    "`make nvt-env` (or set RECFLOW_NVT_PYTHON to a Merlin/NVTabular 23.08 "
                                    "environment's python)")
    return python


def nvt_device() -> str:
    device = value(DEVICE_ENV)
    if device not in DEVICES:
        raise ValueError(f"{DEVICE_ENV} {device!r}: expected one of {', '.join(DEVICES)}")
    return device


def nvt_workers() -> int:
    text = read(WORKERS_ENV)
    if text is None:
        return min(os.cpu_count() or 1, 2)
    try:
        workers = int(text)
    except ValueError:
        raise ValueError(f"{WORKERS_ENV} {text!r}: expected a number of Dask workers (0 = synchronous)") from None
    if workers < 0:
        raise ValueError(f"{WORKERS_ENV} {text!r}: cannot be negative")
    return workers


def child_env() -> dict[str, str]:
    """The child's environment: this one, with the repository first on PYTHONPATH and one thread per BLAS pool (the
    Dask workers are the parallelism)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Merlin warns, in every Dask worker, that the TensorFlow / PyTorch / Triton dtype tables it does not need here
    # did not load, and that CPU datasets are experimental (the jobs log the device once themselves).
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), *QUIET_WARNINGS]))
    # distributed's dashboard and its "port in use" chatter are of no use inside a task
    env.setdefault("DASK_DISTRIBUTED__DIAGNOSTICS__NVML", "False")
    return env


def run_nvt_job(module: str, args: Sequence[str], *, label: str = "nvtabular") -> None:
    """`<nvt python> -m <module> --device D --workers N args` with its output in this task's log; NvtJobFailed with
    the job's one-line reason on a non-zero exit."""
    python = nvt_python()
    argv = [str(python), "-m", module, "--device", nvt_device(), "--workers", str(nvt_workers()), *args]
    started = time.monotonic()
    log.info("nvtabular: %s (interpreter %s)", module, python)
    result = run_streaming(argv, env=child_env(), cwd=str(REPO_ROOT), label=label)
    if result.returncode != 0:
        raise NvtJobFailed(f"{module} failed (exit {result.returncode}): {result.last_error_line}")
    log.info("nvtabular: %s finished in %.1f s", module, time.monotonic() - started)
