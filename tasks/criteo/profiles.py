"""criteo_dlrm's knobs and its named profiles: the one home of the pipeline's configuration.

`full` follows NVIDIA's DLRM recipe for Criteo 1TB (train on days 0-22, test on day 23, frequency threshold 15,
batch 65536, SGD lr 24, warmup 8000 / decay from 48000 over 24000 steps, scaled to the run's step count: see
models/dlrm/config.py). It is what a scheduled or asset-triggered retrain uses unless the deployment names another
profile (RECFLOW_PROFILE). `demo` is sized for one CPU machine: the demo's and the tests' small synthetic days.
The DLRM knobs and NVIDIA's values for them are shared with every DLRM pipeline (tasks/core/dlrm_knobs.py); this
file adds the window and dictionary knobs and the release thresholds' values.
"""

from __future__ import annotations

from typing import Any

from tasks.core.dlrm_knobs import RELEASE_KNOBS, dlrm_knobs, model_knobs, nvidia_recipe
from tasks.core.profiles import Knob, check_profiles

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
    **dlrm_knobs(sharding=True),
    **RELEASE_KNOBS,
}

# Knobs handed to the trainer (models.dlrm.config.DlrmConfig fields of the same name); the rest are the pipeline's.
MODEL_KNOBS = model_knobs(sharding=True)

_FULL: dict[str, Any] = {
    "window_days": 23, "frequency_threshold": 15, "threshold_overrides": "", "dictionary_days": "train",
    **nvidia_recipe(sharding=True), "min_auc": 0.79, "max_regression": 0.005,
}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    "demo": {**_FULL, "window_days": 2, "batch_size": 4096, "lr": 1.0, "warmup_steps": 20, "decay_start_step": 40,
             "decay_steps": 20, "checkpoint_every_steps": 50, "log_every_steps": 10, "min_auc": 0.70},
}

check_profiles(KNOBS, PROFILES)
