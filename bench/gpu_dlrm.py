"""DLRM at Criteo 1TB table size on one GPU (issue #28): steady samples/s of models.dlrm.train, the model step
alone, and the fixed cost of the train command broken down, as one JSON line naming the device.

  python3 -m bench.gpu_dlrm --device cuda --json gpu_dlrm.json            # ~8M rows at criteo_f15 size, <= 6 min
  python3 -m bench.gpu_dlrm --device cpu --table_scale 16 --train_rows 32768 --batch_size 4096   # CPU mode

Needs only torch, numpy, pandas, pyarrow, pyyaml (no Airflow, TensorFlow or fbgemm-gpu): the data come from the
project's own writer (models.dlrm.synthetic: split-binary, feature_spec.yaml) at NVIDIA's criteo_f15 cardinalities
divided by --table_scale, and the trainer runs in this process exactly as `python -m models.dlrm.train` would.

What is measured, in this order, in one process:
  data        the synthetic dataset (not counted in anything below)
  train       models.dlrm.train main(): its wall time, and from its metrics.json the phases it timed (build_model,
              train_loop, final_write, final_eval). steady samples/s = median of the interval lines after the first.
  fixed cost  train wall - train_loop - final_write: everything the command does besides training and one write
              of the weights (build, reading the spec, final evaluation, plot, metrics), as a ratio to `save`.
  save        one torch.save of the same weights (model.pt's state dict, on the training device), the reference.
  checksum    state_checksum of those weights alone (in the trainer it runs while model.pt is written).
  step        the model step alone: forward, backward, dense SGD and the tables' index_add_ update on a batch
              already on the device (AMP on CUDA), after warm-up.
  variants    (--variants, before the trainer) the model step of the previous layout (one sparse-gradient
              nn.Embedding per table + torch.optim.SGD, the triangle by a 2-D advanced index, fp16) beside each
              change of issue #28 added in turn (STEP_VARIANTS: joint table, compile, padding, bf16, CUDA graphs):
              before/after and the knobs' defaults, side by side. A variant that fails is recorded with its error;
              if compiling fails the trainer runs --compile off.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# NVIDIA's criteo_f15.yaml (Criteo 1TB, frequency threshold 15): 32,709,138 rows, 16.7 GB at d=128 in fp32.
CRITEO_F15 = (7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667, 104,
              4, 968, 15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35)
NUM_NUMERICAL = 13
# NVIDIA's lr 24 diverges on a run of a few (CPU mode) to ~128 (8M rows / 65536) steps of synthetic data, and 1.0
# did on some initialisations of the tiny CPU test; the rate does not depend on it.
LR = 0.25


@dataclass(frozen=True)
class Shape:
    device: str
    table_scale: int
    train_rows: int
    test_rows: int
    batch_size: int
    step_iterations: int
    amp: bool
    log_every_steps: int


# The `make bench` CPU mode: tables 1/16 of criteo_f15 (1.05 GB): big enough that the write of the weights, not
# the constant costs (importing torch._dynamo with the optimizer, matplotlib), is what the ratio compares against.
CPU_MODE = Shape(device="cpu", table_scale=16, train_rows=8 * 4096, test_rows=4096, batch_size=4096,
                 step_iterations=5, amp=False, log_every_steps=2)


def cardinalities(table_scale: int) -> list[int]:
    return [max(2, c // table_scale) for c in CRITEO_F15]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_data(root: Path, shape: Shape) -> Path:
    from models.dlrm.synthetic import make_synthetic_dataset

    make_synthetic_dataset(root, train_rows=shape.train_rows, test_rows=shape.test_rows, n_numerical=NUM_NUMERICAL,
                           cardinalities=cardinalities(shape.table_scale), seed=0, chunk_rows=65536)
    return root


def run_trainer(data: Path, out: Path, shape: Shape, extra: list[str] | None = None) -> dict[str, Any]:
    """models.dlrm.train in this process; its wall time, metrics.json and the steady rate of its interval lines."""
    from models.dlrm.train import main

    argv = ["--dataset_dir", str(data), "--output_dir", str(out), "--device", shape.device,
            "--batch_size", str(shape.batch_size), "--eval_batch_size", str(shape.batch_size), "--epochs", "1",
            "--log_every_steps", str(shape.log_every_steps), "--checkpoint_every_steps", "0",
            "--checkpoint_every_minutes", "0", "--lr", str(LR),
            "--amp" if shape.amp else "--no-amp", *(extra or [])]
    started = time.perf_counter()
    result = main(argv)
    wall = time.perf_counter() - started
    rates = [json.loads(line)["samples_per_second"] for line in (out / "train_log.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    steady = rates[1:] or rates
    return {"wall_s": wall, "seconds": result.final_metrics["seconds"], "steps": result.steps,
            "steady_samples_per_second": statistics.median(steady), "interval_rates": rates,
            "loop_samples_per_second": result.samples_per_second, "auc": result.final_metrics.get("auc"),
            "embedding_bytes": result.embedding_bytes}


def reference_costs(model_path: Path, device: torch.device, scratch: Path) -> dict[str, float]:
    """One plain torch.save of model.pt's weights from the training device, and their checksum alone."""
    from models.torchkit.checkpoint import state_checksum

    state = torch.load(model_path, weights_only=True, mmap=True)["state_dict"]
    state = {k: v.to(device) for k, v in state.items()}
    _sync(device)
    started = time.perf_counter()
    torch.save(state, scratch / "reference.pt")
    save = time.perf_counter() - started
    (scratch / "reference.pt").unlink()
    cpu_state = {k: v.cpu() for k, v in state.items()}
    started = time.perf_counter()
    state_checksum(cpu_state)
    checksum = time.perf_counter() - started
    return {"save_s": save, "checksum_s": checksum}


class PreviousDlrm(nn.Module):
    """The step before issue #28, for the before/after figure: one sparse-gradient nn.Embedding per table (updated
    by torch.optim.SGD), the interaction's lower triangle by dots[:, rows, cols]; the MLPs are `model`'s."""

    def __init__(self, model: nn.Module, cards: list[int]) -> None:
        super().__init__()
        self.bottom_mlp, self.top_mlp = model.bottom_mlp, model.top_mlp
        self.embeddings = nn.ModuleList(nn.Embedding(rows, model.embedding_dim, sparse=True) for rows in cards)
        for table in self.embeddings:
            nn.init.uniform_(table.weight, -(1.0 / table.num_embeddings) ** 0.5, (1.0 / table.num_embeddings) ** 0.5)
        n = len(cards) + 1
        rows, cols = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom_mlp(numerical)
        looked_up = [table(categorical[:, i]).to(bottom.dtype) for i, table in enumerate(self.embeddings)]
        stacked = torch.stack([bottom, *looked_up], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        return self.top_mlp(torch.cat([bottom, dots[:, self.rows, self.cols]], dim=1)).squeeze(1)


@dataclass(frozen=True)
class Variant:
    layout: str  # "previous" (PreviousDlrm) or "joint" (Dlrm)
    compile: str  # --compile
    cuda_graphs: bool = False
    amp_dtype: str = "auto"  # --amp_dtype
    padded: bool = True  # Dlrm(interaction_padding=...)
    amp: bool = True  # False: fp32 whatever the shape's --amp (the `full` profile trains fp32)
    tf32: bool = True  # --tf32 (CUDA fp32 matmuls on TF32 tensor cores)


# Each change of issue #28 on its own, in the order they were made; "default" is what the trainer does with no knob.
STEP_VARIANTS = {
    "previous": Variant("previous", "off", amp_dtype="fp16", padded=False),
    "joint_fp16_eager": Variant("joint", "off", amp_dtype="fp16", padded=False),
    "joint_fp16_compiled": Variant("joint", "on", amp_dtype="fp16", padded=False),
    "padded_fp16_compiled": Variant("joint", "on", amp_dtype="fp16"),
    "padded_bf16_eager": Variant("joint", "off", amp_dtype="bf16"),
    "padded_bf16_compiled": Variant("joint", "on", amp_dtype="bf16"),
    "padded_bf16_cuda_graphs": Variant("joint", "on", cuda_graphs=True, amp_dtype="bf16"),
    "padded_fp32_tf32_compiled": Variant("joint", "on", amp=False),  # what `full` (fp32) trains with by default
    "padded_fp32_strict_compiled": Variant("joint", "on", amp=False, tf32=False),  # until 2026-11-29
}


def model_step(shape: Shape, device: torch.device, variant: str = "default") -> dict[str, float]:
    """Samples/s of the training step alone on a batch already on the device (the trainer's own step code).
    variant: "default" (what the trainer does with its default knobs) or a key of STEP_VARIANTS."""
    from models.dlrm.config import DlrmConfig
    from models.dlrm.model import Dlrm
    from models.dlrm.train import compile_dense
    from models.torchkit.distributed import DistContext, amp_dtype, autocast_context, make_grad_scaler, use_tf32
    from tasks.core.progress import RankLog

    knobs = STEP_VARIANTS.get(variant, Variant("joint", "auto"))
    cards = cardinalities(shape.table_scale)
    amp = shape.amp and knobs.amp
    cfg = DlrmConfig(device=shape.device, amp=amp, lr=LR, compile=knobs.compile, cuda_graphs=knobs.cuda_graphs,
                     amp_dtype=knobs.amp_dtype, tf32=knobs.tf32)
    dtype = amp_dtype(device, cfg.amp_dtype)
    use_tf32(device, cfg.tf32)
    with torch.device(device):
        if knobs.layout == "previous":
            model: nn.Module = PreviousDlrm(Dlrm(NUM_NUMERICAL, [2] * len(cards), interaction_padding=False), cards)
        else:
            model = Dlrm(NUM_NUMERICAL, cards, interaction_padding=knobs.padded)
            compile_dense(model, cfg, DistContext(0, 0, 1, device, None), RankLog(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    scaler = make_grad_scaler(device, amp, dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    numerical = torch.randn(shape.batch_size, NUM_NUMERICAL, device=device, generator=generator)
    categorical = torch.stack([torch.randint(0, c, (shape.batch_size,), device=device, generator=generator)
                               for c in cards], dim=1)
    label = torch.randint(0, 2, (shape.batch_size,), device=device, generator=generator).float()
    fused = knobs.layout == "joint"

    def step() -> None:
        with autocast_context(device, amp, dtype):
            logits = model(numerical, categorical)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), label)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            if fused:
                model.apply_sparse_update(cfg.lr, inv_scale=scaler._scale.double().reciprocal().float())  # noqa: SLF001
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if fused:
                model.apply_sparse_update(cfg.lr)
            optimizer.step()

    started = time.perf_counter()
    for _ in range(5 if knobs.compile == "on" else 3):  # warm-up (compiling, capturing graphs where on)
        step()
    _sync(device)
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(shape.step_iterations):
        step()
    _sync(device)
    seconds = (time.perf_counter() - started) / shape.step_iterations
    del model, optimizer
    return {"ms_per_step": seconds * 1e3, "samples_per_second": shape.batch_size / seconds,
            "warmup_s": round(warmup, 2)}


def step_variants(shape: Shape, device: torch.device) -> dict[str, dict[str, Any]]:
    """The model step of every STEP_VARIANTS entry, one after the other (each frees its tables before the next)."""
    results: dict[str, dict[str, Any]] = {}
    for name in STEP_VARIANTS:
        knobs = STEP_VARIANTS[name]
        if device.type != "cuda" and (knobs.cuda_graphs or knobs.amp_dtype == "fp16" or not knobs.tf32):
            continue  # CUDA-only knobs
        if not knobs.amp and not shape.amp:
            continue  # the other variants run in fp32 already
        try:
            step = model_step(shape, device, name)
            results[name] = {"samples_per_second": round(step["samples_per_second"]),
                             "ms_per_step": round(step["ms_per_step"], 3), "warmup_s": step["warmup_s"]}
        except Exception as exc:  # noqa: BLE001 - a variant that fails is a figure too (e.g. no compiler for inductor)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        print(json.dumps({"variant": name, **results[name]}), flush=True)
        torch._dynamo.reset()  # noqa: SLF001
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = results.get("previous", {}).get("samples_per_second")
    for figures in results.values():
        if base and "samples_per_second" in figures:
            figures["vs_previous"] = round(figures["samples_per_second"] / base, 3)
    return results


def measure(shape: Shape, work: Path, variants: bool = False,
            partial: Path | None = None) -> dict[str, Any]:
    """Everything the module docstring lists, as one dict (the JSON line). partial: a file rewritten after every
    phase with what is known so far (a run cut short by a time limit still leaves its figures)."""
    device = torch.device(shape.device)
    work.mkdir(parents=True, exist_ok=True)
    known: dict[str, Any] = {"bench": "gpu_dlrm", "device": device_name(device), "torch": torch.__version__,
                             "shape": shape.__dict__}

    def note(**figures: Any) -> None:
        known.update(figures)
        if partial is not None:
            partial.write_text(json.dumps(known, sort_keys=True) + "\n")

    started = time.perf_counter()
    data = write_data(work / "data", shape)
    note(data_seconds=round(time.perf_counter() - started, 2))
    extra: list[str] = []
    if variants:
        note(step_variants=step_variants(shape, device))
        if "error" in known["step_variants"].get("padded_bf16_compiled", {}):
            extra = ["--compile", "off"]
            note(trainer_compile="off (compiling failed in the variants)")
    train = run_trainer(data, work / "run", shape, extra)
    phases = train["seconds"]
    fixed = train["wall_s"] - phases["train_loop"] - phases["final_write"]
    note(table_bytes=train["embedding_bytes"],
         train_steady_samples_per_second=round(train["steady_samples_per_second"]),
         train_loop_samples_per_second=round(train["loop_samples_per_second"]),
         auc=train["auc"], interval_rates=[round(r) for r in train["interval_rates"]],
         fixed_cost={"train_wall_s": round(train["wall_s"], 3), **{f"{k}_s": v for k, v in phases.items()},
                     "fixed_s": round(fixed, 3),
                     "other_s": round(fixed - phases["build_model"] - phases.get("final_eval", 0.0)
                                      - phases.get("resume", 0.0), 3)})
    reference = reference_costs(work / "run" / "model.pt", device, work)
    known["fixed_cost"].update({"reference_save_s": round(reference["save_s"], 3),
                                "checksum_alone_s": round(reference["checksum_s"], 3),
                                "final_write_vs_save": round(phases["final_write"] / reference["save_s"], 3),
                                "fixed_vs_save": round(fixed / reference["save_s"], 3)})
    note()
    step = model_step(shape, device)
    note(model_step_samples_per_second=round(step["samples_per_second"]),
         model_step_ms=round(step["ms_per_step"], 3))
    return known


def parse_args(argv: list[str] | None) -> tuple[Shape, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--table_scale", type=int, default=1, help="criteo_f15 cardinalities divided by this")
    parser.add_argument("--train_rows", type=int, default=8_388_608)
    parser.add_argument("--test_rows", type=int, default=1_048_576)
    parser.add_argument("--batch_size", type=int, default=65536)
    parser.add_argument("--step_iterations", type=int, default=50)
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                        help="mixed precision (default: on for CUDA, off for CPU)")
    parser.add_argument("--log_every_steps", type=int, default=16)
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the JSON line here (rewritten after every phase while the run goes on)")
    parser.add_argument("--variants", action="store_true",
                        help="also time the model step of the previous layout, eager, compiled, with CUDA graphs")
    args = parser.parse_args(argv)
    amp = args.device == "cuda" if args.amp is None else args.amp
    shape = Shape(args.device, args.table_scale, args.train_rows, args.test_rows, args.batch_size,
                  args.step_iterations, amp, args.log_every_steps)
    return shape, args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    shape, args = parse_args(argv)
    if args.work is not None:
        result = measure(shape, args.work, args.variants, args.json)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu_dlrm-") as scratch:
            result = measure(shape, Path(scratch), args.variants, args.json)
    line = json.dumps(result, sort_keys=True)
    if args.json is not None:
        args.json.write_text(line + "\n")
    print(line, flush=True)
    return result


def figures(raw: dict[str, Any]) -> list[Any]:
    """The CPU mode's rows of docs/PERFORMANCE.md (bench.run)."""
    from bench.common import Figure, Stat

    fixed = raw["fixed_cost"]
    return [
        Figure("gpu_dlrm (CPU mode)", f"fixed cost of models.dlrm.train at criteo_f15/{raw['shape']['table_scale']}",
               "s", Stat.of([fixed["fixed_s"]]), "one torch.save of the same weights",
               Stat.of([fixed["reference_save_s"]]), Stat.of([fixed["fixed_vs_save"]]), "paired", "<= 2",
               note="issue #28 §1: everything besides the loop and one write"),
        Figure("gpu_dlrm (CPU mode)", "final write (model.pt = last checkpoint, hashed while written)", "s",
               Stat.of([fixed["final_write_s"]]), "one torch.save of the same weights",
               Stat.of([fixed["reference_save_s"]]), Stat.of([fixed["final_write_vs_save"]]), "paired", "≈ 1"),
        Figure("gpu_dlrm (CPU mode)", "models.dlrm.train steady", "samples/s",
               Stat.of([raw["train_steady_samples_per_second"]]), "the model step alone",
               Stat.of([raw["model_step_samples_per_second"]]),
               Stat.of([raw["train_steady_samples_per_second"] / raw["model_step_samples_per_second"]]), "paired",
               "≈ 1"),
    ]


if __name__ == "__main__":
    main()
