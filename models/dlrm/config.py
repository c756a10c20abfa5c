"""DlrmConfig: DLRM's model and training knobs as the trainer's command line, and the learning-rate schedule.

The defaults are NVIDIA's recipe (PyTorch DLRM main.py, Criteo 1TB on 8 GPUs): batch 65536, plain SGD, lr 24,
linear warmup 8000 steps, polynomial (power 2) decay from step 48000 over 24000 steps, one epoch. Pipelines pick
their values from named profiles (tasks/criteo/profiles.py: `full` is this recipe, `demo` is sized for one CPU
machine) and pass every knob explicitly.

The schedule is a *shape*: with `schedule_scaling="run"` (default) the warmup / decay positions are scaled to the
run's own step count (NVIDIA's 8000 : 48000 : 24000 over 72000 steps becomes 1/9 : 2/3 : 1/3 of any run), so the
learning rate reaches 0 at the last step of a run of any window size, never before it. With "fixed" the steps are
taken as written and a schedule that would reach 0 before the run's last step is refused before training starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from models.common.config_flags import add_config_flags, config_dict, config_from_dict, namespace_values, option

# How the embedding tables are laid out over the ranks (models/dlrm/sharding.py); data_parallel replicates them.
SHARDINGS = ("data_parallel", "table_wise", "column_wise", "auto", "row_wise")


@dataclass
class DlrmConfig:
    # data and outputs
    dataset_dir: str = option("", "directory holding feature_spec.yaml and the split-binary mappings")
    feature_spec: str = option("feature_spec.yaml", "feature spec file name inside dataset_dir")
    output_dir: str = option("", "run directory: checkpoints/, model.pt, metrics.json, train_log.jsonl, plot")
    train_mapping: str = option("train", "source_spec mapping to train on")
    test_mapping: str = option("test", "source_spec mapping to evaluate on")
    # model (NVIDIA defaults)
    bottom_mlp_sizes: tuple[int, ...] = option((512, 256, 128), "bottom MLP widths; the last is the embedding dim")
    top_mlp_sizes: tuple[int, ...] = option((1024, 1024, 512, 256, 1), "top MLP widths; must end in 1")
    max_table_size: int | None = option(None, "cap on rows per embedding table (needs hash_indices)", type=int)
    hash_indices: bool = option(False, "index := index %% table size (with max_table_size)")
    sharding: str = option("data_parallel", "embedding tables: data_parallel (every rank holds all, DDP), or split "
                                          "across ranks by TorchRec: table_wise, column_wise, auto (the planner "
                                          "picks), row_wise (CUDA only)", choices=SHARDINGS)
    sparse_embeddings: bool = option(True, "sparse embedding gradients: only looked-up rows are updated "
                                         "(ignored on multi-GPU NCCL runs, which cannot all-reduce sparse tensors)")
    # optimisation (NVIDIA: SGD, lr 24, warmup 8000, decay 48000 + 24000, power 2, batch 65536)
    batch_size: int = option(65536, "global training batch (split evenly across ranks)")
    eval_batch_size: int = option(65536, "evaluation batch")
    lr: float = option(24.0, "base SGD learning rate")
    warmup_steps: int = option(8000, "linear warmup steps")
    decay_start_step: int = option(48000, "step at which polynomial decay starts")
    decay_steps: int = option(24000, "steps over which lr decays to end_lr_factor x lr (0 disables decay)")
    schedule_scaling: str = option("run", "run: scale warmup/decay positions to the run's step count; fixed: take "
                                        "them as written (refused if lr would reach 0 before the last step)",
                                 choices=("run", "fixed"))
    poly_power: float = option(2.0, "polynomial decay power")
    end_lr_factor: float = option(0.0, "lr floor after decay, as a fraction of lr (NVIDIA: 0)")
    # run length and cadence
    epochs: int = option(1, "passes over the training mapping")
    limit_train_batches: int | None = option(None, "stop each epoch after this many steps", type=int)
    limit_eval_batches: int | None = option(None, "evaluate on at most this many batches", type=int)
    log_every_steps: int = option(100, "progress line / train_log.jsonl record interval")
    eval_every_steps: int = option(0, "evaluate during training every N steps (0: only at the end, if final_eval)")
    final_eval: bool = option(True, "score the test mapping once training ends (the pipelines turn it off: their "
                                    "evaluate task scores the written model on the same rows)")
    checkpoint_every_steps: int = option(0, "also save a checkpoint every N steps (0: none by steps)")
    checkpoint_every_minutes: float = option(15.0, "save a checkpoint once this many minutes have passed since the "
                                                   "last, checked at log intervals (0: none by time); with "
                                                   "checkpoint_every_steps 0 too, only at the end")
    keep_checkpoints: int = option(3, "how many step checkpoints to keep (0: all)")
    time_budget_s: float = option(0.0, "seconds this run may still take (its task's attempts): stop with one line "
                                       "once the measured rate says it needs more (0: no check)")
    # execution
    device: str = option("auto", "cpu, cuda or auto", choices=("cpu", "cuda", "auto"))
    amp: bool = option(False, "mixed precision (autocast in --amp_dtype)")
    amp_dtype: str = option("auto", "type of --amp: bf16, fp16 (CUDA, with a loss scaler) or auto (bf16 where the "
                                  "device computes it natively: the CPU, CUDA compute capability >= 8; fp16 on "
                                  "older GPUs)", choices=("auto", "bf16", "fp16"))
    seed: int = option(12345, "seed for weights, batch order and RNG state")
    shuffle_batch_order: bool = option(False, "shuffle the order of whole batches each epoch (seeded)")
    drop_last_train_batch: bool = option(True, "drop the short last training batch (eval always keeps it)")
    prefetch_depth: int = option(4, "batches read ahead by the loader thread (0: no thread)")
    copy_ahead: bool = option(True, "CUDA: batches read into pinned host memory, each copied to the GPU on a side "
                                    "stream a step ahead (overlapping the step); off: pageable batches copied on "
                                    "the compute stream before each step, which blocks the host (the CPU: no effect)")
    torch_threads: int = option(0, "intra-op CPU threads per process (0: torch's default; torchrun sets 1)")
    compile: str = option("auto", "torch.compile the dense layers: on, off, auto (on for CUDA, off for CPU, where it "
                                "measured no faster; docs/PERFORMANCE-gpu.md)", choices=("auto", "on", "off"))
    tf32: bool = option(True, "CUDA: fp32 matmuls (all of them without --amp, the fp32 ones with it) on TF32 "
                              "tensor cores, as NVIDIA's PyTorch containers run them and its fp32 figures are; "
                              "off: strict fp32 (torch's own default)")
    cuda_graphs: bool = option(False, "with compile on CUDA: capture the dense layers as CUDA graphs (torch.compile "
                                    "mode reduce-overhead); off until measured on a GPU")
    dense_table_limit_mb: int = option(256, "largest embedding tables (MB, fp32, all tables together) a multi-GPU "
                                          "NCCL run may train data parallel with dense table gradients; above it "
                                          "the run is refused unless the tables are sharded (--sharding)")

    def __post_init__(self) -> None:
        self.bottom_mlp_sizes = tuple(int(s) for s in self.bottom_mlp_sizes)
        self.top_mlp_sizes = tuple(int(s) for s in self.top_mlp_sizes)
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise ValueError(
                f"decay_start_step {self.decay_start_step} is before warmup ends at {self.warmup_steps} "
                "(NVIDIA's scheduler rejects this too)"
            )
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding {self.sharding!r}: expected one of {', '.join(SHARDINGS)}")
        if self.batch_size < 1 or self.eval_batch_size < 1 or self.epochs < 1:
            raise ValueError("batch_size, eval_batch_size and epochs must be positive")

    def schedule(self, total_steps: int) -> LrSchedule:
        """The learning-rate schedule of a run of `total_steps` optimizer steps (see the module docstring)."""
        return resolve_schedule(self, total_steps)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of ints/floats/strs/lists/None (safe for JSON and for torch weights_only loading)."""
        return config_dict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DlrmConfig:
        return config_from_dict(cls, values, "DLRM")


def build_parser(description: str) -> argparse.ArgumentParser:
    """An argparse parser with one `--<field>` per DlrmConfig field (NVIDIA-style underscore flags)."""
    return add_config_flags(argparse.ArgumentParser(description=description), DlrmConfig)


def config_from_namespace(namespace: argparse.Namespace) -> DlrmConfig:
    return DlrmConfig(**namespace_values(DlrmConfig, namespace))


def lr_factor(step: int, warmup_steps: int, decay_start_step: int, decay_steps: int, power: float = 2.0,
              end_lr_factor: float = 0.0) -> float:
    """Multiplier of the base lr used by optimizer step `step` (0-based), as NVIDIA's LearningRateScheduler.

    NVIDIA increments its counter before each step, so step k sees counter k+1: linear warmup (k+1)/warmup up to
    1, flat until decay_start, then ((decay_end - (k+1)) / decay_steps) ** power, floored at end_lr_factor.
    """
    current = step + 1
    if warmup_steps > 0 and current <= warmup_steps:
        return current / warmup_steps
    if decay_steps <= 0 or current <= decay_start_step:
        return 1.0
    decay_end = decay_start_step + decay_steps
    if current > decay_end:
        return end_lr_factor
    return max(((decay_end - current) / decay_steps) ** power, end_lr_factor)


@dataclass(frozen=True)
class LrSchedule:
    """Warmup / decay positions in optimizer steps of one run, and the factor each step applies to the base lr."""

    total_steps: int
    warmup_steps: int
    decay_start_step: int
    decay_steps: int
    poly_power: float
    end_lr_factor: float

    def factor(self, step: int) -> float:
        return lr_factor(step, self.warmup_steps, self.decay_start_step, self.decay_steps, self.poly_power,
                         self.end_lr_factor)

    def first_zero_step(self) -> int | None:
        """The first 0-based step whose lr factor is 0, or None when the lr stays positive for the whole run."""
        if self.end_lr_factor > 0 or self.decay_steps <= 0:
            return None
        step = self.decay_start_step + self.decay_steps - 1  # counter == decay_end: ((end - end)/n)**p == 0
        return step if step < self.total_steps else None


def resolve_schedule(cfg: DlrmConfig, total_steps: int) -> LrSchedule:
    """Scale (schedule_scaling="run") or check ("fixed") cfg's warmup/decay positions for a run of total_steps."""
    if total_steps < 1:
        raise ValueError(f"a run of {total_steps} steps has no schedule")
    warmup, start, steps = cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps
    if cfg.schedule_scaling == "run":
        reference = start + steps if steps > 0 else max(warmup, 1)
        scale = total_steps / reference
        warmup = max(1, round(warmup * scale)) if warmup > 0 else 0
        if steps > 0:
            steps = max(1, round(steps * scale))
            start = max(warmup, total_steps - steps)
        else:
            warmup = min(warmup, total_steps)
    schedule = LrSchedule(total_steps, warmup, start, steps, cfg.poly_power, cfg.end_lr_factor)
    zero = schedule.first_zero_step()
    if zero is not None and zero < total_steps - 1:
        raise ValueError(f"learning rate schedule reaches 0 at step {zero} of a {total_steps}-step run (decay "
                         f"from step {start} over {steps} steps, end_lr_factor 0): every later step would not "
                         "learn. Use schedule_scaling=run, or move decay_start_step / decay_steps past the run's end")
    return schedule
