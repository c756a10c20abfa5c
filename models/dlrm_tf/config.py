"""DlrmTfConfig: the TF2 DLRM's knobs as the trainer's command line.

Every models.dlrm.config.DlrmConfig field is a field here too, with the same name, default and meaning where
TensorFlow has one, so the Criteo DAG's model_config (--batch_size, --lr, --warmup_steps, ..., --amp, --device)
drives either framework, and the learning-rate schedule is the same object (models.dlrm.config.resolve_schedule:
NVIDIA's warmup + polynomial decay, scaled to the run). Fields that only mean something to the PyTorch trainer
(PYTORCH_ONLY) are accepted and ignored with one log line. The TF-only fields follow NVIDIA's TF2 main.py / dlrm.py
flags: precision (their --amp), --xla, --interaction (dot or DCNv2 cross, --num_cross_layers,
--cross_layer_projection_dim) and the host-memory threshold for embedding tables (their
--cpu_offloading_threshold_gb, here in bytes).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from models.common.config_flags import add_config_flags, config_from_dict, namespace_values, option
from models.dlrm.config import DlrmConfig, LrSchedule, resolve_schedule
from tasks.core.dlrm_knobs import HOST_TABLE_THRESHOLD_BYTES

# DlrmConfig fields with no TensorFlow meaning here, and why (logged once when set away from their default).
PYTORCH_ONLY = {
    "sparse_embeddings": "TF always computes IndexedSlices gradients for embedding lookups",
    "torch_threads": "TF threads are --intra_op_threads / --inter_op_threads",
    "shuffle_batch_order": "the tf.data reader streams batches in file order, as NVIDIA's TfRawBinaryDataset does",
    "drop_last_train_batch": "training always drops the short last batch (NVIDIA's TF2 reader does too)",
    "sharding": "TorchRec table sharding; the TF2 DLRM is data parallel with host-memory tables (docs/dlrm_tf.md)",
    "compile": "torch.compile of the dense layers; TF compiles its step with --xla",
    "cuda_graphs": "torch.compile's CUDA graphs; TF compiles its step with --xla",
    "dense_table_limit_mb": "the refusal of dense NCCL table gradients; the TF2 DLRM keeps big tables on the host",
    "copy_ahead": "the PyTorch loop's pinned batches copied on a CUDA side stream; tf.data prefetches the TF2 batches",
    "tf32": "torch's TF32 switch; TensorFlow runs fp32 matmuls on TF32 tensor cores by default",
}


@dataclass
class DlrmTfConfig(DlrmConfig):
    # TensorFlow execution (NVIDIA TF2 flags)
    precision: str = option("auto", "fp32, bf16 (mixed), fp16 (mixed, loss scaling), or auto: fp32, or with --amp "
                                    "bf16 on CPU / fp16 on GPU (what --amp means to the PyTorch trainer)",
                            choices=("auto", "fp32", "bf16", "fp16"))
    xla: bool = option(False, "compile the forward/backward step with XLA (jit_compile)")
    intra_op_threads: int = option(0, "TF intra-op threads per worker (0: TF's default / TF_NUM_INTRAOP_THREADS)")
    inter_op_threads: int = option(0, "TF inter-op threads per worker (0: TF's default / TF_NUM_INTEROP_THREADS)")
    # model
    interaction: str = option("dot", "dot (DLRM) or cross (DCNv2 cross network)", choices=("dot", "cross"))
    num_cross_layers: int = option(3, "DCNv2 cross layers (interaction=cross)")
    cross_layer_projection_dim: int = option(512, "DCNv2 low-rank projection (0: full rank)")
    host_table_threshold_bytes: int = option(HOST_TABLE_THRESHOLD_BYTES,
                                             "embedding tables live on the strategy's devices up to this many "
                                             "bytes in all (rows x dim x 4, smallest first); the largest, beyond "
                                             "it, in host memory (/CPU:0): NVIDIA's --cpu_offloading_threshold_gb")
    # accepted for the PyTorch trainer's command line, ignored here (PYTORCH_ONLY)
    sharding: str = option("data_parallel", "PyTorch (TorchRec) embedding sharding: ignored by the TF2 trainer")
    # test hook
    stop_after_steps: int | None = option(None, "test hook: checkpoint and stop once this many steps are done, "
                                                "without final outputs (a rerun resumes and finishes)", type=int)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.host_table_threshold_bytes < 0 or self.num_cross_layers < 1:
            raise ValueError("host_table_threshold_bytes must be >= 0 and num_cross_layers >= 1")

    def schedule(self, total_steps: int) -> LrSchedule:
        return resolve_schedule(self, total_steps)

    def resolved_precision(self, on_gpu: bool) -> str:
        """The Keras precision this run trains in: an explicit --precision, else --amp in an explicit --amp_dtype,
        else --amp's TF meaning on this device: bf16 on CPU, fp16 on GPU (NVIDIA's TF2 choice; unlike the PyTorch
        trainer's auto, bf16 on recent GPUs is not measured for TF here)."""
        if self.precision != "auto":
            return self.precision
        if not self.amp:
            return "fp32"
        if self.amp_dtype != "auto":
            return self.amp_dtype
        return "fp16" if on_gpu else "bf16"

    def ignored_settings(self) -> dict[str, str]:
        """PyTorch-only fields set away from their defaults: {name: why it has no effect here}."""
        defaults = DlrmTfConfig()
        return {name: why for name, why in PYTORCH_ONLY.items() if getattr(self, name) != getattr(defaults, name)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DlrmTfConfig:
        return config_from_dict(cls, values, "DLRM (TF2)")


def build_parser(description: str) -> argparse.ArgumentParser:
    """One `--<field>` per DlrmTfConfig field (the PyTorch trainer's flags plus the TF ones)."""
    return add_config_flags(argparse.ArgumentParser(description=description), DlrmTfConfig)


def parse_args(argv: list[str] | None = None) -> DlrmTfConfig:
    parser = build_parser("train DLRM in TensorFlow 2 on a split-binary dataset (NVIDIA DeepLearningExamples recipe)")
    return DlrmTfConfig(**namespace_values(DlrmTfConfig, parser.parse_args(argv)))
