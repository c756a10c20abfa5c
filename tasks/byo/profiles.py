"""byo_dlrm's knobs and named profiles: the one home of the pipeline's configuration.

`full` is NVIDIA's DLRM recipe (models/dlrm/config.py: batch 65536, SGD lr 24, warmup 8000, decay from 48000 over
24000 steps, scaled to the run's step count), for a dataset of Criteo's size; `demo` is sized for one CPU machine
and the small generated datasets of the demo and the tests. The model knobs map one-to-one onto
models.dlrm.config.DlrmConfig fields (MODEL_KNOBS); the MLP sizes are comma-separated text in the form.
"""

from __future__ import annotations

from typing import Any

from tasks.core.profiles import Knob, check_profiles

_MLP = {"type": "string", "pattern": r"^\d{1,5}(,\d{1,5}){0,7}$"}

KNOBS: dict[str, Knob] = {
    "bottom_mlp": Knob(_MLP, "Bottom MLP widths; the last one is the embedding dimension."),
    "top_mlp": Knob(_MLP, "Top MLP widths; must end in 1."),
    "batch_size": Knob({"type": "integer", "minimum": 1, "maximum": 1 << 20},
                       "Global training batch, split across processes."),
    "lr": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 1000}, "Base SGD learning rate."),
    "epochs": Knob({"type": "integer", "minimum": 1, "maximum": 100}, "Passes over the training data."),
    "warmup_steps": Knob({"type": "integer", "minimum": 0}, "Linear warmup steps (scaled to the run's length)."),
    "decay_start_step": Knob({"type": "integer", "minimum": 0}, "Step where polynomial decay starts."),
    "decay_steps": Knob({"type": "integer", "minimum": 0}, "Steps of polynomial decay (0 = none)."),
    "schedule_scaling": Knob({"type": "string", "enum": ["run", "fixed"]},
                             "run: warmup/decay positions are scaled to the run's step count; fixed: as written."),
    "limit_train_batches": Knob({"type": "integer", "minimum": 1}, "Stop each epoch after this many steps."),
    "checkpoint_every_steps": Knob({"type": "integer", "minimum": 0},
                                   "Checkpoint interval in steps; a retried train task resumes from the last one."),
    "log_every_steps": Knob({"type": "integer", "minimum": 1}, "Progress line interval in steps."),
    "seed": Knob({"type": "integer", "minimum": 0}, "Seed for weights and batch order."),
    "amp": Knob({"type": "boolean"}, "Mixed precision: bf16 on the CPU and on GPUs of compute capability >= 8 "
                                     "(A100, H100), fp16 with loss scaling on older GPUs."),
    "min_auc": Knob({"type": "number", "minimum": 0, "maximum": 1}, "Publish only if test AUC reaches this.",
                     release="min"),
    "max_regression": Knob({"type": "number", "minimum": 0, "maximum": 1},
                           "Publish only if AUC is at most this much below the published model.",
                           release="max"),
}

# Knobs handed to the trainer (models.dlrm.config.DlrmConfig fields of the same name); the rest are the pipeline's.
MODEL_KNOBS = ("batch_size", "lr", "epochs", "warmup_steps", "decay_start_step", "decay_steps", "schedule_scaling",
               "limit_train_batches", "checkpoint_every_steps", "log_every_steps", "seed", "amp")

_FULL: dict[str, Any] = {
    "bottom_mlp": "512,256,128", "top_mlp": "1024,1024,512,256,1", "batch_size": 65536, "lr": 24.0, "epochs": 1,
    "warmup_steps": 8000, "decay_start_step": 48000, "decay_steps": 24000, "schedule_scaling": "run",
    "limit_train_batches": None, "checkpoint_every_steps": 1000, "log_every_steps": 100, "seed": 12345,
    "amp": False, "min_auc": 0.75, "max_regression": 0.005,
}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    "demo": {**_FULL, "bottom_mlp": "32,16", "top_mlp": "64,32,1", "batch_size": 1024, "lr": 0.5, "epochs": 3,
             "warmup_steps": 10, "decay_start_step": 40, "decay_steps": 20, "checkpoint_every_steps": 50,
             "log_every_steps": 10, "min_auc": 0.65},
}

check_profiles(KNOBS, PROFILES)
