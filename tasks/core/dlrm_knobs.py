"""The DLRM knobs of every DLRM pipeline's form, and NVIDIA's recipe as their full-size values: one home (#25).

Each DLRM pipeline (its profiles.py) puts its own knobs first (windows, thresholds, ...), then these, then its
release thresholds. The model knobs map one-to-one onto models.dlrm.config.DlrmConfig fields of the same name
(`model_knobs`); the MLP widths are comma-separated text in the form, parsed by `dlrm_model_config`, which also
builds the trainer's config from a run's resolved knobs; `dlrm_memory_need` sizes it before launch.
`NVIDIA_RECIPE` is NVIDIA DeepLearningExamples' PyTorch DLRM recipe for the 1TB click logs (batch 65536, plain SGD
lr 24, warmup 8000, polynomial decay from 48000 over 24000 steps, one epoch), with the schedule scaled to the run's
own step count (models/dlrm/config.py): a pipeline's `full` profile starts from it. Checkpoints go by time at full
size (every 15 min: with NVIDIA's 1TB table sizes a save takes ~27 s, as long as ~2,000 steps; see
models/common/checkpoint_clock.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.core.profiles import Knob, layer_sizes

if TYPE_CHECKING:
    from tasks.core.launch import MemoryNeed

_MLP = {"type": "string", "pattern": r"^\d{1,5}(,\d{1,5}){0,7}$"}
SHARDINGS = ["data_parallel", "table_wise", "column_wise", "auto", "row_wise"]

_KNOBS: dict[str, Knob] = {
    "bottom_mlp": Knob(_MLP, "Bottom MLP widths; the last one is the embedding dimension."),
    "top_mlp": Knob(_MLP, "Top MLP widths; must end in 1."),
    "batch_size": Knob({"type": "integer", "minimum": 1, "maximum": 1 << 20},
                       "Global training batch, split across processes."),
    "lr": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 1000}, "Base SGD learning rate."),
    "epochs": Knob({"type": "integer", "minimum": 1, "maximum": 100}, "Passes over the training data."),
    "warmup_steps": Knob({"type": "integer", "minimum": 0},
                         "Linear warmup steps (positions scale to the run's step count: see schedule_scaling)."),
    "decay_start_step": Knob({"type": "integer", "minimum": 0}, "Step where polynomial decay starts."),
    "decay_steps": Knob({"type": "integer", "minimum": 0}, "Steps of polynomial decay (0 = none)."),
    "schedule_scaling": Knob({"type": "string", "enum": ["run", "fixed"]},
                             "run: warmup/decay positions are scaled to the run's step count, so the learning rate "
                             "reaches 0 only at the last step; fixed: steps as written (refused if the rate would "
                             "reach 0 earlier)."),
    "limit_train_batches": Knob({"type": "integer", "minimum": 1},
                                "Stop each epoch after this many steps (0/empty in the profile = whole epoch)."),
    "checkpoint_every_minutes": Knob({"type": "number", "minimum": 0, "maximum": 1440},
                                     "Checkpoint once this many minutes of training have passed since the last; a "
                                     "retried train task resumes from the last one (0 = no time interval)."),
    "checkpoint_every_steps": Knob({"type": "integer", "minimum": 0},
                                   "Also checkpoint every this many steps (0 = no step interval; with no time "
                                   "interval either, only at the end)."),
    "log_every_steps": Knob({"type": "integer", "minimum": 1}, "Progress line interval in steps."),
    "seed": Knob({"type": "integer", "minimum": 0}, "Seed for weights and batch order."),
    "amp": Knob({"type": "boolean"}, "Mixed precision: bf16 on the CPU and on GPUs of compute capability >= 8 "
                                     "(A100, H100), fp16 with loss scaling on older GPUs."),
    "sharding": Knob({"type": "string", "enum": SHARDINGS},
                     "Embedding tables: data_parallel (every process holds all), or split across the training "
                     "processes by TorchRec: table_wise, column_wise, auto (TorchRec's planner picks), row_wise "
                     "(CUDA only). The MLPs stay data parallel."),
}

RELEASE_KNOBS: dict[str, Knob] = {
    "min_auc": Knob({"type": "number", "minimum": 0, "maximum": 1}, "Publish only if test AUC reaches this.",
                     release="min"),
    "max_regression": Knob({"type": "number", "minimum": 0, "maximum": 1},
                           "Publish only if AUC is at most this much below the published model.",
                           release="max"),
}

NVIDIA_RECIPE: dict[str, Any] = {
    "bottom_mlp": "512,256,128", "top_mlp": "1024,1024,512,256,1", "batch_size": 65536, "lr": 24.0, "epochs": 1,
    "warmup_steps": 8000, "decay_start_step": 48000, "decay_steps": 24000, "schedule_scaling": "run",
    "limit_train_batches": None, "checkpoint_every_minutes": 15, "checkpoint_every_steps": 0,
    "log_every_steps": 100, "seed": 12345,
    "amp": False, "sharding": "data_parallel",
}


def dlrm_knobs(sharding: bool = True) -> dict[str, Knob]:
    """The DLRM form knobs, in form order; sharding=False leaves out TorchRec's table sharding."""
    return {name: knob for name, knob in _KNOBS.items() if sharding or name != "sharding"}


def model_knobs(sharding: bool = True) -> tuple[str, ...]:
    """The knobs handed to the trainer as DlrmConfig fields of the same name (the MLP widths go parsed, apart)."""
    return tuple(name for name in dlrm_knobs(sharding) if name not in ("bottom_mlp", "top_mlp"))


def nvidia_recipe(sharding: bool = True) -> dict[str, Any]:
    """NVIDIA_RECIPE's values for `dlrm_knobs(sharding)`."""
    return {name: NVIDIA_RECIPE[name] for name in dlrm_knobs(sharding)}


def dlrm_model_config(knobs: Mapping[str, Any], model_knobs: Sequence[str], device: str) -> dict[str, Any]:
    """A DLRM trainer's config fields from a pipeline's resolved knobs: every model knob explicit, the MLP widths
    parsed (the top MLP must end in 1, the click logit), and the device. Refuses bad sizes with one line."""
    config = {name: knobs[name] for name in model_knobs}
    config["bottom_mlp_sizes"] = layer_sizes(knobs["bottom_mlp"])
    config["top_mlp_sizes"] = layer_sizes(knobs["top_mlp"])
    if config["top_mlp_sizes"][-1] != 1:
        raise ValueError(f"top MLP {knobs['top_mlp']!r} must end in 1 (the click logit)")
    config["device"] = device
    return config


# What a pipeline's DLRM trainer is told besides its config (not part of the config: no weight depends on them, so
# they change neither the run's cache key, its lineage nor the gate's config hash). No final evaluation: the
# pipeline's evaluate task scores the test rows from the written model, once (89M rows at full size).
PIPELINE_TRAINER_FLAGS: dict[str, Any] = {"final_eval": False}


def time_budget(run: Mapping[str, Any]) -> float:
    """The seconds a DLRM training run may take (models/common/time_budget.py): what its task's attempts have left
    when it checkpoints periodically (a retry resumes), this attempt's alone when it does not (a retry starts over);
    0 (no check) outside a train task."""
    knobs = run["knobs"]
    resumes = bool(knobs.get("checkpoint_every_minutes")) or bool(knobs.get("checkpoint_every_steps"))
    return float(run.get("time_budget_s" if resumes else "attempt_time_s", 0.0))


# NVIDIA's TF2 --cpu_offloading_threshold_gb default (75): the TF2 DLRM's tables beyond it in all live in host memory.
HOST_TABLE_THRESHOLD_BYTES = 75 * 10**9


def host_table_indices(table_bytes: Sequence[int], threshold: int) -> list[int]:
    """The tables that live in host memory, NVIDIA's rule for --cpu_offloading_threshold_gb (DualEmbeddingGroup):
    the smallest tables stay on the device while their total is at most `threshold` bytes, and the rest, the
    largest, go to the host. The threshold bounds what the tables take of the device, not any one table."""
    order = sorted(range(len(table_bytes)), key=lambda i: (table_bytes[i], i))
    total = 0
    for position, i in enumerate(order):
        total += table_bytes[i]
        if total > threshold:
            return sorted(order[position:])
    return []


def dlrm_memory_need(dataset_dir: Path, config: Mapping[str, Any], *,
                     host_table_threshold: int | None = None) -> MemoryNeed:
    """The least memory a DLRM trainer needs for the dataset's FeatureSpec and a dlrm_model_config: fp32 embedding
    tables (rows capped by max_table_size; weights only, their gradients are sparse) and the bottom / top MLPs
    (weights and gradients). Replicated in every process with data_parallel, split across the job otherwise.
    host_table_threshold: given for the TF2 trainer, which replicates every table in every process (it ignores
    sharding) and, on a GPU, keeps the tables beyond the threshold in host memory (host_table_indices, NVIDIA's CPU
    offloading): those count against the host's memory (MemoryNeed.host), not the GPU's."""
    from tasks.core.gpus import trains_on_gpu
    from tasks.core.launch import MemoryNeed
    from tasks.formats.feature_spec import FEATURE_SPEC_FILE, FeatureSpec

    spec = FeatureSpec.from_yaml(Path(dataset_dir) / FEATURE_SPEC_FILE)
    cap = config.get("max_table_size")
    rows = [min(card, cap) if cap else card for card in spec.get_categorical_sizes()]
    bottom, top = list(config["bottom_mlp_sizes"]), list(config["top_mlp_sizes"])
    dim, features = bottom[-1], len(rows) + 1
    dense = _mlp_params(spec.get_number_of_numerical_features(), bottom)
    dense += _mlp_params(features * (features - 1) // 2 + dim, top)  # input: the pairwise dots + the bottom output
    table_bytes = [r * dim * 4 for r in rows]
    hosted = (host_table_indices(table_bytes, host_table_threshold)
              if host_table_threshold is not None and trains_on_gpu(str(config.get("device", "auto"))) else [])
    host = sum(table_bytes[i] for i in hosted)
    tables = sum(table_bytes) - host
    tf2 = host_table_threshold is not None  # the TF2 trainer: every table in every process
    replicated = tf2 or config.get("sharding", "data_parallel") == "data_parallel"
    what = f"DLRM with {len(rows)} embedding tables of {sum(rows):,} rows x {dim}"
    if hosted:
        what += f" ({len(hosted)} of them, {host / (1 << 30):.1f} GiB, in host memory)"
    lower = ("max_table_size (with hash_indices) or nproc" if tf2
             else "max_table_size (with hash_indices), the MLP widths or nproc, or shard the tables")
    return MemoryNeed(replicated=dense * 4 * 2 + (tables if replicated else 0), sharded=0 if replicated else tables,
                      what=what, lower=lower, host=host)


def _mlp_params(inputs: int, widths: Sequence[int]) -> int:
    total = 0
    for width in widths:
        total += inputs * width + width
        inputs = width
    return total
