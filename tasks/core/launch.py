"""Launch a model's trainer and evaluator from an Airflow task: torchrun / python children, logs streamed live.

Model-neutral: the caller names the trainer module (e.g. `models.dlrm.train`) and hands it a config mapping that
becomes `--name value` flags. The trainer runs in its own processes (torchrun with `--nproc_per_node N`: gloo on CPU, NCCL on CUDA), never in the
Airflow worker's interpreter, so a crash or OOM of training cannot take the worker down and the task log shows
every rank-0 line as it is printed. A retried task resumes from the trainer's latest checkpoint (the trainer looks
for one in its output directory); a finished training with a manifest for the same inputs is not redone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.core.process import run_streaming
from tasks.core.storage import Manifest, completed_manifest, read_manifest, write_manifest

log = logging.getLogger(__name__)

class TrainingFailed(RuntimeError):
    """The trainer exited non-zero; the message is its last error line."""


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
                     python: str | None = None) -> list[str]:
    """torchrun argv (as a list: no shell) that runs `python -m module args` on nproc local processes."""
    if not 1 <= nproc <= 64 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"invalid launch shape: nproc={nproc} nnodes={nnodes} node_rank={node_rank}")
    return [python or sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            f"--node_rank={node_rank}", f"--master_addr={master_addr}",
            f"--master_port={master_port or free_port()}", "-m", module, *args]


def _child_env(nproc: int) -> dict[str, str]:
    from tasks.core.config import REPO_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if nproc > 1:
        # One intra-op thread per rank per core: more ranks x threads than cores only adds contention.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def train_with_torchrun(module: str, dataset_dir: Path, output_dir: Path, config: Mapping[str, Any], *,
                        nproc: int = 1, label: str = "train") -> dict[str, Any]:
    """Run `module` (a trainer whose main() takes --dataset_dir/--output_dir plus its config flags and writes
    metrics.json) on nproc processes; cached by a manifest of (dataset, config, nproc). Returns metrics + paths."""
    dataset_manifest = read_manifest(dataset_dir)
    if dataset_manifest is None:
        raise FileNotFoundError(f"dataset {dataset_dir} has no manifest: run transform / validate first")
    inputs = {"dataset": dataset_manifest["inputs_fingerprint"], "config": dict(config), "nproc": nproc}
    done = completed_manifest(output_dir, inputs)
    if done is None:
        full = {**config, "dataset_dir": str(dataset_dir), "output_dir": str(output_dir)}
        argv = torchrun_command(nproc, module, config_args(full))
        log.info("launching %d training process(es): %s", nproc, " ".join(argv[:6]))
        result = run_streaming(argv, env=_child_env(nproc), label=label)
        if result.returncode != 0:
            raise TrainingFailed(f"training exited {result.returncode}: {result.last_error_line}")
        metrics = json.loads((output_dir / "metrics.json").read_text())
        done_manifest = Manifest(kind=f"training:{module}", inputs=inputs, extra={"metrics": metrics})
        # Checkpoints are excluded from the checksummed file list: they rotate and can be large.
        write_manifest(output_dir, done_manifest, checksum=False)
        done = read_manifest(output_dir)
    else:
        log.info("training in %s already finished for these inputs: nothing to do", output_dir)
    metrics = done["extra"]["metrics"]
    return {"output_dir": str(output_dir), "model_path": str(output_dir / "model.pt"), "metrics": metrics,
            "plot": str(output_dir / "training_curves.png")}


def run_module(module: str, args: list[str], *, label: str, what: str) -> None:
    """`python -m module args` in one child process (evaluation, export, scoring), its output streamed into the
    task log; a non-zero exit raises TrainingFailed naming `what` and the child's last error line."""
    result = run_streaming([sys.executable, "-m", module, *args], env=_child_env(1), label=label)
    if result.returncode != 0:
        raise TrainingFailed(f"{what} exited {result.returncode}: {result.last_error_line}")


def evaluate_in_child(module: str, model_path: Path, dataset_dir: Path, out_dir: Path, *, mapping: str = "test",
                      label: str = "evaluate") -> dict[str, Any]:
    """Run an evaluator module on a mapping of the dataset in a child process; returns its metrics.json."""
    run_module(module, ["--model_path", str(model_path), "--dataset_dir", str(dataset_dir), "--mapping", mapping,
                        "--output_dir", str(out_dir)], label=label, what="evaluation")
    return json.loads((out_dir / "metrics.json").read_text())
