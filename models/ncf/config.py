"""NcfConfig: NeuMF's model and training knobs as the trainer's command line (one `--<field>` per field).

Defaults are NVIDIA's TensorFlow NCF recipe (ml-20m on 8 GPUs): factors 64, MLP 256-256-128-64, dropout 0.5,
4 negatives per positive, global batch 2^20, Adam lr 0.0045, beta1 0.25, beta2 0.5, eps 1e-8, HR/NDCG@10 over
1 + 100 test items per user. Pipelines choose their values from named profiles and pass every knob explicitly.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from models.common.config_flags import add_config_flags, config_dict, namespace_values, option


@dataclass
class NcfConfig:
    # data and outputs
    dataset_dir: str = option("", "directory holding feature_spec.yaml and the torch_tensor files")
    feature_spec: str = option("feature_spec.yaml", "feature spec file name inside dataset_dir")
    output_dir: str = option("", "run directory: checkpoints/, model.weights.h5, metrics.json, train_log.jsonl, plot")
    train_mapping: str = option("train", "source_spec mapping of positive (user, item) pairs")
    test_mapping: str = option("test", "source_spec mapping of [positive, negatives] series per user")
    # model (NVIDIA defaults)
    factors: int = option(64, "GMF embedding dims")
    mlp_sizes: tuple[int, ...] = option((256, 256, 128, 64), "MLP widths; the first is the concatenated user+item "
                                                             "embedding (half each)")
    dropout: float = option(0.5, "dropout after each MLP layer")
    # optimisation (NVIDIA TF NCF: Adam 0.0045 / 0.25 / 0.5 / 1e-8, batch 2^20, 4 negatives)
    epochs: int = option(30, "passes over the training positives (each with freshly drawn negatives)")
    batch_size: int = option(1 << 20, "global training batch, split evenly across workers")
    learning_rate: float = option(0.0045, "Adam learning rate")
    beta1: float = option(0.25, "Adam beta_1")
    beta2: float = option(0.5, "Adam beta_2")
    eps: float = option(1e-8, "Adam epsilon")
    negatives: int = option(4, "negatives drawn per positive each epoch (uniform over items, unchecked)")
    seed: int = option(12345, "seed for weights, negatives, shuffling and dropout")
    # evaluation
    topk: int = option(10, "k of HR@k / NDCG@k")
    eval_every: int = option(1, "evaluate every N epochs (the last epoch always)")
    users_per_eval_batch: int = option(5000, "users scored per evaluation batch (NVIDIA: 5000)")
    # execution
    device: str = option("auto", "cpu (hides any GPU), cuda, or auto: a GPU where TensorFlow sees one "
                                 "(models.tfkit.cluster.use_device)", choices=("auto", "cpu", "cuda"))
    precision: str = option("fp32", "fp32, bf16 (mixed) or fp16 (mixed, with loss scaling)",
                            choices=("fp32", "bf16", "fp16"))
    xla: bool = option(False, "compile the forward/backward step with XLA (jit_compile)")
    micro_batches: int = option(0, "slices each worker's batch goes through the forward/backward in, one at a time, "
                                   "gradients summed before the one update (bounds the step's memory); 0: auto, 1 "
                                   "on a GPU, on a CPU the fewest slices of at most 131072 samples (NVIDIA's "
                                   "per-GPU batch)")
    intra_op_threads: int = option(0, "TF intra-op threads per worker (0: TF's default / TF_NUM_INTRAOP_THREADS)")
    inter_op_threads: int = option(0, "TF inter-op threads per worker (0: TF's default / TF_NUM_INTEROP_THREADS)")
    # run length and cadence
    limit_train_batches: int | None = option(None, "stop each epoch after this many steps", type=int)
    log_every_steps: int = option(100, "progress line interval in steps")
    checkpoint_every_steps: int = option(0, "also checkpoint every N steps (0: at the end of each epoch only)")
    keep_checkpoints: int = option(3, "how many checkpoints to keep (0: all)")
    stop_after_steps: int | None = option(None, "test hook: checkpoint and stop once this many steps are done, "
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
        return config_dict(self)


def build_parser(description: str) -> argparse.ArgumentParser:
    return add_config_flags(argparse.ArgumentParser(description=description), NcfConfig)


def config_from_namespace(namespace: argparse.Namespace) -> NcfConfig:
    return NcfConfig(**namespace_values(NcfConfig, namespace))
