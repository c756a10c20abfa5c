"""byo_dlrm's knobs and named profiles: the one home of the pipeline's configuration.

`full` is NVIDIA's DLRM recipe (tasks/core/dlrm_knobs.py, shared with every DLRM pipeline: batch 65536, SGD lr 24,
warmup 8000, decay from 48000 over 24000 steps, scaled to the run's step count), for a dataset of Criteo's size;
`demo` is sized for one CPU machine and the small generated datasets of the demo and the tests. byo leaves out
TorchRec's table sharding knob.
"""

from __future__ import annotations

from typing import Any

from tasks.core.dlrm_knobs import RELEASE_KNOBS, dlrm_knobs, model_knobs, nvidia_recipe
from tasks.core.profiles import Knob, check_profiles

KNOBS: dict[str, Knob] = {**dlrm_knobs(sharding=False), **RELEASE_KNOBS}

# Knobs handed to the trainer (models.dlrm.config.DlrmConfig fields of the same name); the rest are the pipeline's.
MODEL_KNOBS = model_knobs(sharding=False)

_FULL: dict[str, Any] = {**nvidia_recipe(sharding=False), "min_auc": 0.75, "max_regression": 0.005}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    "demo": {**_FULL, "bottom_mlp": "32,16", "top_mlp": "64,32,1", "batch_size": 1024, "lr": 0.5, "epochs": 3,
             "warmup_steps": 10, "decay_start_step": 40, "decay_steps": 20, "checkpoint_every_steps": 50,
             "log_every_steps": 10, "min_auc": 0.65},
}

check_profiles(KNOBS, PROFILES)
