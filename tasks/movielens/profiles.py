"""movielens_ncf's knobs and its named profiles: the one home of the pipeline's configuration.

`full` follows NVIDIA's NCF recipe for ml-20m (TF1 NCF_TF and PyTorch NCF_PT share these numbers): users with at
least 20 ratings, 100 test negatives per user, 4 training negatives per positive resampled every epoch, NeuMF with
64 GMF factors and a 256-256-128-64 MLP, dropout 0.5, Adam (lr 0.0045, beta1 0.25, beta2 0.5, eps 1e-8), global
batch 2^20, 30 epochs, HR@10 / NDCG@10 over 101 candidates. NVIDIA reports HR@10 ≈ 0.958 on ml-20m; the gate asks for
0.90. It is what an asset-triggered or scheduled retrain uses unless the deployment names another profile
(RECFLOW_PROFILE). `demo` is sized for one CPU machine and the demo's small synthetic snapshot.
"""

from __future__ import annotations

from typing import Any

from tasks.core.profiles import Knob, check_profiles

_MLP = {"type": "string", "pattern": r"^\d{1,5}(,\d{1,5}){0,7}$"}

KNOBS: dict[str, Knob] = {
    "min_ratings": Knob({"type": "integer", "minimum": 0, "maximum": 100_000},
                        "Keep users with at least this many ratings (TF1 recipe: 20; 0 = keep all, as the PyTorch "
                        "recipe)."),
    "test_negatives": Knob({"type": "integer", "minimum": 1, "maximum": 10_000},
                           "Negatives sampled per user for evaluation (the positive is ranked among 1 + this)."),
    "negatives": Knob({"type": "integer", "minimum": 1, "maximum": 100},
                      "Training negatives per positive, resampled every epoch."),
    "factors": Knob({"type": "integer", "minimum": 1, "maximum": 4096}, "GMF embedding size."),
    "mlp": Knob(_MLP, "MLP widths; the first is split between the user and the item embedding (must be even)."),
    "dropout": Knob({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "Dropout after each MLP layer."),
    "epochs": Knob({"type": "integer", "minimum": 1, "maximum": 1000}, "Passes over the training positives."),
    "batch_size": Knob({"type": "integer", "minimum": 2, "maximum": 1 << 24},
                       "Global batch (positives and negatives together), split across workers."),
    "lr": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 10}, "Adam learning rate."),
    "beta1": Knob({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "Adam beta1."),
    "beta2": Knob({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "Adam beta2."),
    "eps": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "Adam epsilon."),
    "precision": Knob({"type": "string", "enum": ["fp32", "bf16", "fp16"]},
                      "Mixed precision (amp): fp32, bf16 (CPU and recent GPUs) or fp16 with loss scaling (GPUs).",
                      title="Precision (amp)"),
    "xla": Knob({"type": "boolean"}, "Compile the train step with XLA (jit_compile)."),
    "limit_train_batches": Knob({"type": "integer", "minimum": 1},
                                "Stop each epoch after this many steps (empty in the profile = whole epoch)."),
    "checkpoint_every_steps": Knob({"type": "integer", "minimum": 0},
                                   "Checkpoint interval in steps; a retried train task resumes from the last one "
                                   "(0 = at the end of each epoch only)."),
    "seed": Knob({"type": "integer", "minimum": 0}, "Seed for test negatives, weights, training negatives and order."),
    "min_hr": Knob({"type": "number", "minimum": 0, "maximum": 1}, "Publish only if test HR@10 reaches this.",
                    release="min"),
    "max_regression": Knob({"type": "number", "minimum": 0, "maximum": 1},
                           "Publish only if HR@10 is at most this much below the published model's on the same "
                           "test rows.", release="max"),
}

# Knobs the preprocessing reads; the trainer's flags are built by tasks.movielens.ncf.trainer_config.
PREPROCESS_KNOBS = ("min_ratings", "test_negatives", "seed")

_FULL: dict[str, Any] = {
    "min_ratings": 20, "test_negatives": 100, "negatives": 4, "factors": 64, "mlp": "256,256,128,64",
    "dropout": 0.5, "epochs": 30, "batch_size": 1 << 20, "lr": 0.0045, "beta1": 0.25, "beta2": 0.5, "eps": 1e-8,
    "precision": "fp32", "xla": False, "limit_train_batches": None, "checkpoint_every_steps": 100, "seed": 1,
    "min_hr": 0.90, "max_regression": 0.01,
}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    # One CPU machine, a synthetic snapshot of a few thousand users: a smaller model and batch, a few epochs.
    "demo": {**_FULL, "factors": 16, "mlp": "64,32,16", "dropout": 0.1, "epochs": 6, "batch_size": 4096,
             "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "checkpoint_every_steps": 200, "min_hr": 0.30},
}

check_profiles(KNOBS, PROFILES)
