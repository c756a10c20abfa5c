"""criteo_dlrm's knobs and its named profiles: the one home of the pipeline's configuration.

`full` follows NVIDIA's DLRM recipe for Criteo 1TB (train on days 0-22, test on day 23, frequency threshold 15,
batch 65536, SGD lr 24, warmup 8000 / decay from 48000 over 24000 steps, scaled to the run's step count: see
models/dlrm/config.py). It is what a scheduled or asset-triggered retrain uses unless the deployment names another
profile (RECFLOW_PROFILE). `demo` is sized for one CPU machine: the demo's and the tests' small synthetic days.
The model knobs map one-to-one onto models.dlrm.config.DlrmConfig fields (MODEL_KNOBS); the MLP sizes are given as
comma-separated text in the form and parsed into lists.
"""

from __future__ import annotations

from typing import Any

from tasks.core.profiles import Knob, check_profiles

_MLP = {"type": "string", "pattern": r"^\d{1,5}(,\d{1,5}){0,7}$"}

KNOBS: dict[str, Knob] = {
    "window_days": Knob({"type": "integer", "minimum": 1, "maximum": 366},
                        "Train days before the test day when train_days is empty."),
    "frequency_threshold": Knob({"type": "integer", "minimum": 0, "maximum": 1_000_000},
                                "Keep categorical values seen at least this often in the window (0 = keep all); "
                                "rarer values map to id 0."),
    "threshold_overrides": Knob({"type": "string", "pattern": r"^$|^cat_\d{1,2}:\d+(,cat_\d{1,2}:\d+)*$"},
                                "Per-column thresholds, e.g. 'cat_3:2,cat_7:0'."),
    "dictionary_days": Knob({"type": "string", "enum": ["train", "all"]},
                            "Count values over the train days only, or also the test day (NVIDIA's scripts do "
                            "'all', which leaks the test vocabulary)."),
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
    "checkpoint_every_steps": Knob({"type": "integer", "minimum": 0},
                                   "Checkpoint interval in steps; a retried train task resumes from the last one "
                                   "(0 = only at the end)."),
    "log_every_steps": Knob({"type": "integer", "minimum": 1}, "Progress line interval in steps."),
    "seed": Knob({"type": "integer", "minimum": 0}, "Seed for weights and batch order."),
    "amp": Knob({"type": "boolean"}, "Mixed precision: bf16 on the CPU and on GPUs of compute capability >= 8 "
                                     "(A100, H100), fp16 with loss scaling on older GPUs."),
    "sharding": Knob({"type": "string", "enum": ["data_parallel", "table_wise", "column_wise", "auto", "row_wise"]},
                     "Embedding tables: data_parallel (every process holds all), or split across the training "
                     "processes by TorchRec: table_wise, column_wise, auto (TorchRec's planner picks), row_wise "
                     "(CUDA only). The MLPs stay data parallel."),
    "min_auc": Knob({"type": "number", "minimum": 0, "maximum": 1}, "Publish only if test AUC reaches this.",
                     release="min"),
    "max_regression": Knob({"type": "number", "minimum": 0, "maximum": 1},
                           "Publish only if AUC is at most this much below the published model.",
                           release="max"),
}

# Knobs handed to the trainer (models.dlrm.config.DlrmConfig fields of the same name); the rest are the pipeline's.
MODEL_KNOBS = ("batch_size", "lr", "epochs", "warmup_steps", "decay_start_step", "decay_steps", "schedule_scaling",
               "limit_train_batches", "checkpoint_every_steps", "log_every_steps", "seed", "amp", "sharding")

_FULL: dict[str, Any] = {
    "window_days": 23, "frequency_threshold": 15, "threshold_overrides": "", "dictionary_days": "train",
    "bottom_mlp": "512,256,128", "top_mlp": "1024,1024,512,256,1", "batch_size": 65536, "lr": 24.0, "epochs": 1,
    "warmup_steps": 8000, "decay_start_step": 48000, "decay_steps": 24000, "schedule_scaling": "run",
    "limit_train_batches": None, "checkpoint_every_steps": 1000, "log_every_steps": 100, "seed": 12345,
    "amp": False, "sharding": "data_parallel", "min_auc": 0.79, "max_regression": 0.005,
}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    "demo": {**_FULL, "window_days": 2, "batch_size": 4096, "lr": 1.0, "warmup_steps": 20, "decay_start_step": 40,
             "decay_steps": 20, "checkpoint_every_steps": 50, "log_every_steps": 10, "min_auc": 0.70},
}

check_profiles(KNOBS, PROFILES)
