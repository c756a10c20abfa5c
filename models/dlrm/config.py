"""DlrmConfig: the one home of DLRM model and training knobs, and the command line generated from it.

NVIDIA's recipe (PyTorch DLRM main.py, Criteo 1TB on 8 GPUs): batch 65536, plain SGD, lr 24, linear warmup 8000
steps, polynomial (power 2) decay from step 48000 over 24000 steps, one epoch. We keep that schedule *shape* and
scale the defaults for CPU demos on one machine:
  * batch_size 8192: a 65536-row batch of the default model needs ~2-3 GB of activations and ~10 s per step on a
    few CPU cores; 8192 keeps steps around a second and the log lines frequent.
  * lr 3.0 = 24 x 8192/65536 (linear scaling with the batch, as NVIDIA's own lr/batch pairs follow).
  * warmup 500 / decay_start 3000 / decay_steps 1500: NVIDIA's 1 : 6 : 3 proportions at 1/16 of the length, so a
    run of a few thousand steps sees warmup, plateau and decay. Set them to NVIDIA's values for full-scale runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _opt(default: Any, help: str, **extra: Any) -> Any:  # noqa: A002 - argparse's own word
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class DlrmConfig:
    # data and outputs
    dataset_dir: str = _opt("", "directory holding feature_spec.yaml and the split-binary mappings")
    feature_spec: str = _opt("feature_spec.yaml", "feature spec file name inside dataset_dir")
    output_dir: str = _opt("", "run directory: checkpoints/, model.pt, metrics.json, train_log.jsonl, plot")
    train_mapping: str = _opt("train", "source_spec mapping to train on")
    test_mapping: str = _opt("test", "source_spec mapping to evaluate on")
    # model (NVIDIA defaults)
    bottom_mlp_sizes: tuple[int, ...] = _opt((512, 256, 128), "bottom MLP widths; the last is the embedding dim")
    top_mlp_sizes: tuple[int, ...] = _opt((1024, 1024, 512, 256, 1), "top MLP widths; must end in 1")
    max_table_size: int | None = _opt(None, "cap on rows per embedding table (needs hash_indices)", type=int)
    hash_indices: bool = _opt(False, "index := index %% table size (with max_table_size)")
    sparse_embeddings: bool = _opt(True, "sparse embedding gradients: only looked-up rows are updated "
                                         "(ignored on multi-GPU NCCL runs, which cannot all-reduce sparse tensors)")
    # optimisation (NVIDIA: SGD, lr 24, warmup 8000, decay 48000 + 24000, power 2, batch 65536)
    batch_size: int = _opt(8192, "global training batch (split evenly across ranks)")
    eval_batch_size: int = _opt(16384, "evaluation batch")
    lr: float = _opt(3.0, "base SGD learning rate")
    warmup_steps: int = _opt(500, "linear warmup steps")
    decay_start_step: int = _opt(3000, "step at which polynomial decay starts")
    decay_steps: int = _opt(1500, "steps over which lr decays to end_lr_factor x lr (0 disables decay)")
    poly_power: float = _opt(2.0, "polynomial decay power")
    end_lr_factor: float = _opt(0.0, "lr floor after decay, as a fraction of lr (NVIDIA: 0)")
    # run length and cadence
    epochs: int = _opt(1, "passes over the training mapping")
    limit_train_batches: int | None = _opt(None, "stop each epoch after this many steps", type=int)
    limit_eval_batches: int | None = _opt(None, "evaluate on at most this many batches", type=int)
    log_every_steps: int = _opt(100, "progress line / train_log.jsonl record interval")
    eval_every_steps: int = _opt(0, "evaluate during training every N steps (0: only at the end)")
    checkpoint_every_steps: int = _opt(1000, "save a checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = _opt(3, "how many step checkpoints to keep (0: all)")
    # execution
    device: str = _opt("auto", "cpu, cuda or auto", choices=("cpu", "cuda", "auto"))
    amp: bool = _opt(False, "mixed precision: fp16 + GradScaler on CUDA, bf16 autocast on CPU")
    seed: int = _opt(12345, "seed for weights, batch order and RNG state")
    shuffle_batch_order: bool = _opt(False, "shuffle the order of whole batches each epoch (seeded)")
    drop_last_train_batch: bool = _opt(True, "drop the short last training batch (eval always keeps it)")
    prefetch_depth: int = _opt(4, "batches read ahead by the loader thread (0: no thread)")
    torch_threads: int = _opt(0, "intra-op CPU threads per process (0: torch's default; torchrun sets 1)")

    def __post_init__(self) -> None:
        self.bottom_mlp_sizes = tuple(int(s) for s in self.bottom_mlp_sizes)
        self.top_mlp_sizes = tuple(int(s) for s in self.top_mlp_sizes)
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise ValueError(
                f"decay_start_step {self.decay_start_step} is before warmup ends at {self.warmup_steps} "
                "(NVIDIA's scheduler rejects this too)"
            )
        if self.batch_size < 1 or self.eval_batch_size < 1 or self.epochs < 1:
            raise ValueError("batch_size, eval_batch_size and epochs must be positive")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of ints/floats/strs/lists/None (safe for JSON and for torch weights_only loading)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DlrmConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown DLRM config keys {unknown}")
        return cls(**values)


def build_parser(description: str) -> argparse.ArgumentParser:
    """An argparse parser with one `--<field>` per DlrmConfig field (NVIDIA-style underscore flags)."""
    parser = argparse.ArgumentParser(description=description)
    defaults = DlrmConfig()
    for f in dataclasses.fields(DlrmConfig):
        default = getattr(defaults, f.name)
        kwargs: dict[str, Any] = {"help": f"{f.metadata['help']} (default: {default})", "default": default}
        if isinstance(default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, tuple):
            kwargs.update(nargs="+", type=int)
        else:
            kwargs["type"] = f.metadata.get("type", type(default))
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(f"--{f.name}", **kwargs)
    return parser


def config_from_namespace(namespace: argparse.Namespace) -> DlrmConfig:
    names = {f.name for f in dataclasses.fields(DlrmConfig)}
    return DlrmConfig(**{k: v for k, v in vars(namespace).items() if k in names})
