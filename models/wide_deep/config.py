"""WideDeepConfig: the Wide & Deep trainer's command line (one `--<field>` per field), NVIDIA's TF2 defaults.

Defaults are NVIDIA's TF2 Wide & Deep recipe on Outbrain (8 GPUs): global and eval batch 131072, 20 epochs, FTRL
at 0.02 for the wide part, RMSProp (rho 0.5) at 0.00012 for the deep part with 6 warmup epochs, 5 x 1024 ReLU
layers with dropout 0.1, per-feature embedding dims (128 for the four big id features, 19 for platform, 64 for the
rest), multi-hot embeddings summed. Pipelines choose their values from named profiles and pass every knob.

Flags accept what both callers send: `--xla 1` / `--xla 0` (NVIDIA-style and docs/OUTBRAIN.md) as well as
`--xla` / `--no-xla` (tasks.core.launch.config_args for a bool); `--deep_hidden_units 1024,1024` or
`1024 1024`; `--embedding_dims` as JSON (or Python's repr of a dict, which config_args produces).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import yaml

from models.common.config_flags import add_config_flags, config_dict, namespace_values, option

# NVIDIA's EMBEDDING_DIMENSIONS (data/outbrain/embedding_sizes.json); features not named here get DEFAULT_EMBEDDING_DIM.
NVIDIA_EMBEDDING_DIMS = {"document_id": 128, "ad_id": 128, "document_id_promo": 128, "campaign_id": 128,
                         "platform": 19}
DEFAULT_EMBEDDING_DIM = 64
PRECISIONS = ("fp32", "amp")


@dataclass
class WideDeepConfig:
    # data and outputs
    dataset_dir: str = option("", "tfrecords directory holding feature_spec.yaml (docs/OUTBRAIN.md)")
    feature_spec: str = option("feature_spec.yaml", "feature spec file name inside dataset_dir")
    output_dir: str = option("", "run directory: checkpoints/, model.weights.h5, metrics.json, train_log.jsonl, plot")
    train_mapping: str = option("train", "source_spec mapping to train on")
    test_mapping: str = option("test", "source_spec mapping to evaluate on (needs the map channel: display_id)")
    # model (NVIDIA defaults)
    deep_hidden_units: tuple[int, ...] = option((1024,) * 5, "deep MLP widths (ReLU)")
    deep_dropout: float = option(0.1, "dropout after each deep layer")
    embedding_dims: dict[str, int] = option({}, "JSON {feature: dim} overriding NVIDIA's per-feature dims "
                                                "(128 for document_id, ad_id, document_id_promo, campaign_id; platform "
                                                "19; rest 64)", type=str)
    embedding_dim: int = option(0, "one dim for every deep embedding (0: the per-feature dims)")
    combiner: str = option("sum", "pooling of a multi-hot feature's embeddings over its non-padding values",
                           choices=("sum", "mean"))
    # optimisation (NVIDIA TF2: FTRL 0.02 wide, RMSProp rho 0.5 at 0.00012 deep, 6 warmup epochs)
    global_batch_size: int = option(131072, "global training batch, split evenly across workers")
    eval_batch_size: int = option(131072, "evaluation batch (the chief scores the whole test mapping)")
    epochs: int = option(20, "passes over the training mapping")
    linear_learning_rate: float = option(0.02, "FTRL learning rate of the wide (linear) part")
    deep_learning_rate: float = option(0.00012, "RMSProp learning rate of the deep part after warmup (NVIDIA's "
                                                "schedule: then /4, and /8 from halfway through the rest)")
    deep_warmup_epochs: float = option(6.0, "epochs of linear deep learning-rate warmup from 0")
    seed: int = option(12345, "seed for weights, shuffling and dropout")
    # evaluation
    map_k: int = option(12, "k of MAP@k over displays")
    eval_every: int = option(1, "evaluate every N epochs (the last epoch always)")
    # execution
    device: str = option("auto", "cpu (hides any GPU), cuda, or auto: a GPU where TensorFlow sees one "
                                 "(models.tfkit.cluster.use_device)", choices=("auto", "cpu", "cuda"))
    precision: str = option("fp32", "fp32, or amp: mixed precision (bf16 on CPU, fp16 with loss scaling on GPU)",
                            choices=PRECISIONS)
    xla: bool = option(False, "compile the forward/backward step with XLA (jit_compile): --xla 1|0 or --[no-]xla")
    intra_op_threads: int = option(0, "TF intra-op threads per worker (0: TF's default / TF_NUM_INTRAOP_THREADS)")
    inter_op_threads: int = option(0, "TF inter-op threads per worker (0: TF's default / TF_NUM_INTEROP_THREADS)")
    shuffle_blocks: int = option(64, "shuffle buffer of the training reader, in prebatched blocks (records)")
    # run length and cadence
    limit_train_batches: int | None = option(None, "stop each epoch after this many steps", type=int)
    limit_eval_batches: int | None = option(None, "score only this many eval batches (smoke runs)", type=int)
    log_every_steps: int = option(100, "progress line interval in steps")
    checkpoint_every_steps: int = option(0, "also checkpoint every N steps (0: at the end of each epoch only)")
    keep_checkpoints: int = option(3, "how many checkpoints to keep (0: all)")
    stop_after_steps: int | None = option(None, "test hook: checkpoint and stop once this many steps are done, "
                                                "without final outputs (a resumed run finishes)", type=int)

    def __post_init__(self) -> None:
        self.deep_hidden_units = tuple(int(u) for u in self.deep_hidden_units)
        self.embedding_dims = parse_embedding_dims(self.embedding_dims)
        if min(self.global_batch_size, self.eval_batch_size, self.epochs, self.map_k, self.eval_every,
               self.shuffle_blocks, self.log_every_steps) < 1:
            raise ValueError("global_batch_size, eval_batch_size, epochs, map_k, eval_every, shuffle_blocks and "
                             "log_every_steps must be positive")
        if not self.deep_hidden_units or min(self.deep_hidden_units) < 1:
            raise ValueError(f"deep_hidden_units must be positive widths, got {self.deep_hidden_units}")
        if not 0.0 <= self.deep_dropout < 1.0:
            raise ValueError(f"deep_dropout {self.deep_dropout} must be in [0, 1)")
        if self.embedding_dim < 0 or not 0 <= self.deep_warmup_epochs <= self.epochs:
            raise ValueError(f"embedding_dim must be >= 0 and deep_warmup_epochs within [0, epochs], got "
                             f"{self.embedding_dim} and {self.deep_warmup_epochs}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


def parse_embedding_dims(value: str | dict[str, Any] | None) -> dict[str, int]:
    """{feature: dim} from a dict, JSON text or a Python dict repr ('' or None: no overrides)."""
    if isinstance(value, str):
        value = yaml.safe_load(value) if value.strip() else {}  # YAML reads JSON and {'a': 1} alike
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"embedding_dims must map feature names to dims, got {value!r}")
    dims = {str(k): int(v) for k, v in value.items()}
    if any(d < 1 for d in dims.values()):
        raise ValueError(f"embedding_dims must be positive, got {dims}")
    return dims


def _hidden_units(values: list[str]) -> tuple[int, ...]:
    return tuple(int(x) for value in values for x in str(value).split(",") if x.strip())


def _flag_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0/1 or true/false, got {text!r}")


def _add_bool_flag(parser: argparse.ArgumentParser, name: str, kwargs: dict[str, Any]) -> None:
    """`--<name>` alone, `--<name> 1|0|true|false` (NVIDIA-style) or `--no-<name>`."""
    parser.add_argument(f"--{name}", nargs="?", const=True, type=_flag_bool, **kwargs)
    parser.add_argument(f"--no-{name}", dest=name, action="store_false", help=argparse.SUPPRESS)


def build_parser(description: str) -> argparse.ArgumentParser:
    # a tuple flag takes strings: `1024,1024` or `1024 1024` (config_from_namespace splits them)
    return add_config_flags(argparse.ArgumentParser(description=description), WideDeepConfig,
                            add_bool=_add_bool_flag, tuple_item=str)


def config_from_namespace(namespace: argparse.Namespace) -> WideDeepConfig:
    values = namespace_values(WideDeepConfig, namespace)
    values["deep_hidden_units"] = _hidden_units(list(values["deep_hidden_units"]))
    return WideDeepConfig(**values)
