"""What bounds the training figure: the model's FLOPs per sample, the cores' peak FLOP/s (derived from the CPU and
measured with a large torch.mm), and the dense-only ceiling.

  python -m bench.train_ceiling --num_numerical 13 --num_categorical 26 --batch_size B \
      --bottom_mlp_sizes ... --top_mlp_sizes ... --processes 1 2 --json OUT

dense-only ceiling  the trainer's own model (models.dlrm.model.Dlrm: bottom MLP, dot interaction, top MLP) doing
                    forward + backward + SGD step on tensors made once, the embedding outputs given as inputs that
                    take gradients (so the interaction's backward is all there): every FLOP the trainer does and
                    nothing else (no lookups, no sparse gradients or updates, no loader, no schedule, no
                    collectives). For P processes x T threads: P processes at once, each on B/P rows and T threads,
                    summed (ranks sharing the machine, with a free all-reduce). Rows over the median step time. The
                    trainer does a superset of this work, so it cannot run faster; the ratio says what the
                    embeddings, the loader and DDP cost.
GEMM peak           fp32 torch.mm (GEMM_SIZE squared), median of GEMM_REPEATS calls, in the same P processes x T
                    threads at once: the FLOP/s this machine's BLAS reaches on the best-shaped work there is (with
                    every core busy: one core alone clocks higher).

A plain process (no torchrun) that spawns the P measuring processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

GEMM_SIZE = 2048       # 17 GFLOP per mm: ~0.1-0.2 s on 2 cores, large enough for the BLAS's best blocking
GEMM_REPEATS = 5
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class ModelFlops:
    """Forward multiply-accumulates per sample by part; training FLOPs = 3 x forward (backward = 2 x forward:
    one GEMM for the input gradient, one for the weight gradient) x 2 FLOPs per MAC."""

    bottom_mlp_macs: int
    interaction_macs: int  # the full [n, d] x [d, n] batched GEMM the model computes (both triangles)
    top_mlp_macs: int
    embedding_bytes_read: int  # forward lookups per sample; the sparse update rewrites about twice as much

    @property
    def forward_macs(self) -> int:
        return self.bottom_mlp_macs + self.interaction_macs + self.top_mlp_macs

    @property
    def train_flops(self) -> int:
        return 3 * 2 * self.forward_macs


def model_flops(num_numerical: int, num_categorical: int, bottom_mlp: Sequence[int],
                top_mlp: Sequence[int], padded: bool = True) -> ModelFlops:
    """Per-sample FLOPs of models.dlrm.model.Dlrm (and of TorchRec's DLRM of the same sizes: same layers). padded:
    the top MLP reads the interaction padded to a multiple of 8, as Dlrm computes it (Criteo: 480 columns, not
    479; what the hardware does, 0.05% more than the useful work at NVIDIA's sizes)."""
    from models.dlrm.model import interaction_output_size

    def mlp_macs(width: int, sizes: Sequence[int]) -> int:
        total = 0
        for size in sizes:
            total, width = total + width * size, size
        return total

    dim = bottom_mlp[-1]
    vectors = num_categorical + 1
    return ModelFlops(bottom_mlp_macs=mlp_macs(num_numerical, bottom_mlp),
                      interaction_macs=vectors * vectors * dim,
                      top_mlp_macs=mlp_macs(interaction_output_size(num_categorical, dim, padded), top_mlp),
                      embedding_bytes_read=num_categorical * dim * FLOAT32_BYTES)


@dataclass(frozen=True)
class CpuPeak:
    """Theoretical fp32 peak of the cores: cores x FMA units x fp32 lanes per unit x 2 FLOPs x clock."""

    cores: int
    fma_units: int
    lanes: int
    clock_hz: float
    derivation: str

    @property
    def flops(self) -> float:
        return self.cores * self.fma_units * self.lanes * 2 * self.clock_hz

    @property
    def flops_per_core(self) -> float:
        return self.flops / self.cores


def cpu_peak(cpuinfo: str, cores: int) -> CpuPeak:
    """The peak from /proc/cpuinfo's first processor: vector width from the flags, FMA units per core from the
    vendor and family, and the clock the kernel reports (under a hypervisor: the nominal clock, boost unseen)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    vendor, family = fields.get("vendor_id", ""), int(fields.get("cpu family", "0") or 0)
    clock_hz = float(fields.get("cpu MHz", "0") or 0) * 1e6
    if "fma" not in flags:
        raise ValueError("no FMA in the CPU flags: no fp32 peak derivation for this CPU")
    if vendor == "AuthenticAMD" and family == 0x19:
        # Zen 3 / Zen 4: two 256-bit FMA pipes; Zen 4 runs AVX-512 as two 256-bit halves (no wider math).
        units, lanes, why = 2, 8, "AMD family 0x19 (Zen 3/4): 2 x 256-bit FMA pipes per core"
    elif vendor == "AuthenticAMD" and family >= 0x1A:
        units, lanes, why = 2, 16 if "avx512f" in flags else 8, "AMD family 0x1a (Zen 5): 2 FMA pipes, 512-bit"
    elif "avx512f" in flags:
        units, lanes, why = 2, 16, "AVX-512: 2 x 512-bit FMA units per core (Xeon Gold/Platinum; some have 1)"
    else:
        units, lanes, why = 2, 8, "AVX2 + FMA: 2 x 256-bit FMA units per core"
    peak = CpuPeak(cores=cores, fma_units=units, lanes=lanes, clock_hz=clock_hz, derivation="")
    text = (f"{cores} cores x {units} FMA units x {lanes} fp32 lanes x 2 FLOPs x {clock_hz / 1e9:.2f} GHz "
            f"(/proc/cpuinfo 'cpu MHz': under a hypervisor the nominal clock; a boosting core beats it) = "
            f"{peak.flops / 1e9:.0f} GFLOP/s; {why}")
    return CpuPeak(cores, units, lanes, clock_hz, text)


def gemm_flops(threads: int, size: int = GEMM_SIZE, repeats: int = GEMM_REPEATS,
               barrier: Any = None) -> float:
    """fp32 torch.mm FLOP/s on `threads` threads: the median of `repeats` timed calls after an untimed one (which
    warms the BLAS up); with a barrier, the timed calls start when every process sharing it is ready."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    if barrier is not None:
        barrier.wait()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(seconds)


def dense_rate(num_numerical: int, num_categorical: int, bottom_mlp: Sequence[int], top_mlp: Sequence[int],
               rows: int, threads: int, warmup_steps: int, measured_steps: int, barrier: Any = None) -> float:
    """Samples/s of the dense part of the trainer's model (see the module docstring) on `rows` rows per step: rows
    over the median step time (a step is synchronous on the CPU); with a barrier, as gemm_flops."""
    from models.dlrm.model import Dlrm

    torch.set_num_threads(threads)
    torch.manual_seed(12345)
    model = Dlrm(num_numerical, [1] * num_categorical, bottom_mlp, top_mlp)  # 1-row tables: only the MLPs are used
    dense = [p for part in (model.bottom_mlp, model.top_mlp) for p in part.parameters()]
    optimizer = torch.optim.SGD(dense, lr=0.01)
    numerical = torch.randn(rows, num_numerical)
    embedded = [torch.randn(rows, bottom_mlp[-1], requires_grad=True) for _ in range(num_categorical)]
    label = torch.randint(0, 2, (rows,)).float()

    def step() -> None:
        logits = model.top_mlp(model.interaction(model.bottom_mlp(numerical), embedded)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, label)
        optimizer.zero_grad(set_to_none=True)
        for tensor in embedded:
            tensor.grad = None
        loss.backward()
        optimizer.step()

    for _ in range(warmup_steps):
        step()
    if barrier is not None:
        barrier.wait()
    seconds = []
    for _ in range(measured_steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return rows / statistics.median(seconds)


def _worker(measure: Callable[..., float], args: tuple[Any, ...], barrier: Any, results: Any) -> None:
    results.put(measure(*args, barrier=barrier))


def concurrently(processes: int, measure: Callable[..., float], *args: Any) -> float:
    """The sum of `measure(*args)` run in `processes` fresh processes at once (spawned, so each sets its own
    threads), timed from a common barrier: P ranks sharing the machine, without their collectives."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_worker, args=(measure, args, barrier, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        rates = [results.get(timeout=600) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        raise RuntimeError(f"{measure.__name__}: worker processes exited {failed}")
    return sum(rates)


@dataclass
class Ceilings:
    dense_samples_per_second: dict[str, float]  # str(processes) -> P x rate(B/P rows, cores/P threads)
    gemm_flops: dict[str, float]                # str(processes) -> P x mm FLOP/s on cores/P threads
    threads: dict[str, int]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_numerical", type=int, required=True)
    parser.add_argument("--num_categorical", type=int, required=True)
    parser.add_argument("--batch_size", type=int, required=True, help="global batch, split across processes")
    parser.add_argument("--bottom_mlp_sizes", type=int, nargs="+", required=True)
    parser.add_argument("--top_mlp_sizes", type=int, nargs="+", required=True)
    parser.add_argument("--processes", type=int, nargs="+", required=True, help="process counts to bound")
    parser.add_argument("--cores", type=int, required=True, help="threads per process = cores / processes")
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--measured_steps", type=int, default=10)
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Ceilings:
    args = parse_args(argv)
    result = Ceilings({}, {}, {})
    for processes in args.processes:
        threads = max(1, args.cores // processes)
        result.dense_samples_per_second[str(processes)] = concurrently(
            processes, dense_rate, args.num_numerical, args.num_categorical, args.bottom_mlp_sizes,
            args.top_mlp_sizes, args.batch_size // processes, threads, args.warmup_steps, args.measured_steps)
        result.gemm_flops[str(processes)] = concurrently(processes, gemm_flops, threads)
        result.threads[str(processes)] = threads
    args.json.write_text(json.dumps(asdict(result)))
    return result


if __name__ == "__main__":
    main()
