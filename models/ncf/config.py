"""NcfConfig: NeuMF's model and training knobs as the trainer's command line (one `--<field>` per field).

Defaults are NVIDIA's TensorFlow NCF recipe (ml-20m on 8 GPUs): factors 64, MLP 256-256-128-64, dropout 0.5,
4 negatives per positive, global batch 2^20, Adam lr 0.0045, beta1 0.25, beta2 0.5, eps 1e-8, HR/NDCG@10 over
1 + 100 test items per user. Pipelines choose their values from named profiles and pass every knob explicitly.
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
class NcfConfig:
    # data and outputs
    dataset_dir: str = _opt("", "directory holding feature_spec.yaml and the torch_tensor files")
    feature_spec: str = _opt("feature_spec.yaml", "feature spec file name inside dataset_dir")
    output_dir: str = _opt("", "run directory: checkpoints/, model.weights.h5, metrics.json, train_log.jsonl, plot")
    train_mapping: str = _opt("train", "source_spec mapping of positive (user, item) pairs")
    test_mapping: str = _opt("test", "source_spec mapping of [positive, negatives] series per user")
    # model (NVIDIA defaults)
    factors: int = _opt(64, "GMF embedding dims")
    mlp_sizes: tuple[int, ...] = _opt((256, 256, 128, 64), "MLP widths; the first is the concatenated user+item "
                                                           "embedding (half each)")
    dropout: float = _opt(0.5, "dropout after each MLP layer")
    # optimisation (NVIDIA TF NCF: Adam 0.0045 / 0.25 / 0.5 / 1e-8, batch 2^20, 4 negatives)
    epochs: int = _opt(30, "passes over the training positives (each with freshly drawn negatives)")
    batch_size: int = _opt(1 << 20, "global training batch, split evenly across workers")
    learning_rate: float = _opt(0.0045, "Adam learning rate")
    beta1: float = _opt(0.25, "Adam beta_1")
    beta2: float = _opt(0.5, "Adam beta_2")
    eps: float = _opt(1e-8, "Adam epsilon")
    negatives: int = _opt(4, "negatives drawn per positive each epoch (uniform over items, unchecked)")
    seed: int = _opt(12345, "seed for weights, negatives, shuffling and dropout")
    # evaluation
    topk: int = _opt(10, "k of HR@k / NDCG@k")
    eval_every: int = _opt(1, "evaluate every N epochs (the last epoch always)")
    users_per_eval_batch: int = _opt(5000, "users scored per evaluation batch (NVIDIA: 5000)")
    # execution
    precision: str = _opt("fp32", "fp32, bf16 (mixed) or fp16 (mixed, with loss scaling)",
                          choices=("fp32", "bf16", "fp16"))
    xla: bool = _opt(False, "compile the forward/backward step with XLA (jit_compile)")
    micro_batches: int = _opt(0, "slices each worker's batch goes through the forward/backward in, one at a time, "
                                 "gradients summed before the one update (bounds the step's memory); 0: auto, 1 on "
                                 "a GPU, on a CPU the fewest slices of at most 131072 samples (NVIDIA's per-GPU "
                                 "batch)")
    intra_op_threads: int = _opt(0, "TF intra-op threads per worker (0: TF's default / TF_NUM_INTRAOP_THREADS)")
    inter_op_threads: int = _opt(0, "TF inter-op threads per worker (0: TF's default / TF_NUM_INTEROP_THREADS)")
    # run length and cadence
    limit_train_batches: int | None = _opt(None, "stop each epoch after this many steps", type=int)
    log_every_steps: int = _opt(100, "progress line interval in steps")
    checkpoint_every_steps: int = _opt(0, "also checkpoint every N steps (0: at the end of each epoch only)")
    keep_checkpoints: int = _opt(3, "how many checkpoints to keep (0: all)")
    stop_after_steps: int | None = _opt(None, "test hook: checkpoint and stop once this many steps are done, "
                                              "without final outputs (a resumed run finishes)", type=int)

    def __post_init__(self) -> None:
        self.mlp_sizes = tuple(int(s) for s in self.mlp_sizes)
        if min(self.batch_size, self.epochs, self.topk, self.eval_every, self.users_per_eval_batch) < 1:
            raise ValueError("batch_size, epochs, topk, eval_every and users_per_eval_batch must be positive")
        if self.micro_batches < 0:
            raise ValueError(f"micro_batches must be >= 0 (0: auto), got {self.micro_batches}")
        if self.negatives < 0:
            raise ValueError(f"negatives must be >= 0, got {self.negatives}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def build_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    defaults = NcfConfig()
    for f in dataclasses.fields(NcfConfig):
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


def config_from_namespace(namespace: argparse.Namespace) -> NcfConfig:
    names = {f.name for f in dataclasses.fields(NcfConfig)}
    return NcfConfig(**{k: v for k, v in vars(namespace).items() if k in names})
