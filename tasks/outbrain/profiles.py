"""outbrain_wide_deep's knobs and its named profiles: the one home of the pipeline's configuration.

`full` follows NVIDIA's Wide & Deep TF2 recipe on Outbrain: NVIDIA's features (13 one-hot, 3 multi-hot, 13
numerical; hash buckets and embedding dimensions per feature), records prebatched by 4096 rows, global batch
131072, 20 epochs, the wide part trained with FTRL at 0.02, the deep part (5 x 1024 ReLU, dropout 0.1) with RMSProp
at 0.00012 after 6 warmup epochs; MAP@12 over the whole validation set. NVIDIA reports MAP@12 ≈ 0.655 on the real
data (TF2, AMP); the gate asks for 0.63. It is what an asset-triggered run uses unless the deployment names another
profile (RECFLOW_PROFILE). `demo` is sized for one CPU machine and the demo's small synthetic snapshot: the same
features and hash buckets, a small model.
"""

from __future__ import annotations

from typing import Any

from tasks.core.profiles import Knob, check_profiles

_LAYERS = {"type": "string", "pattern": r"^\d{1,5}(,\d{1,5}){0,9}$"}

KNOBS: dict[str, Knob] = {
    "split_seed": Knob({"type": "integer", "minimum": 0},
                       "Seed of the per-display uniform that splits days 0-10 into train (r > 0.2) and validation."),
    "prebatch_size": Knob({"type": "integer", "minimum": 1, "maximum": 1 << 16},
                          "Rows per TFRecord example (NVIDIA: 4096); the reader cuts blocks into batches of any "
                          "size."),
    "tfrecord_shards": Knob({"type": "integer", "minimum": 1, "maximum": 4096},
                            "TFRecord files per split (at least the number of workers, so each reads its own)."),
    "epochs": Knob({"type": "integer", "minimum": 1, "maximum": 1000}, "Passes over the training rows."),
    "batch_size": Knob({"type": "integer", "minimum": 1, "maximum": 1 << 24},
                       "Global training batch, split across workers."),
    "eval_batch_size": Knob({"type": "integer", "minimum": 1, "maximum": 1 << 24}, "Evaluation batch."),
    "linear_lr": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 10},
                      "FTRL learning rate of the wide (linear) part."),
    "deep_lr": Knob({"type": "number", "exclusiveMinimum": 0, "maximum": 10},
                    "Peak RMSProp learning rate of the deep part, reached at the end of warmup; the trainer's "
                    "schedule then steps it down to 1/4, and to 1/8 halfway through the rest."),
    "deep_warmup_epochs": Knob({"type": "number", "minimum": 0, "maximum": 1000},
                               "Epochs of linear learning-rate warmup of the deep part."),
    "deep_hidden_units": Knob(_LAYERS, "Widths of the deep part's ReLU layers."),
    "deep_dropout": Knob({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "Dropout after each deep layer."),
    "embedding_dim": Knob({"type": "integer", "minimum": 0, "maximum": 1024},
                          "Embedding size of every categorical (0 = NVIDIA's per-feature sizes: 128 for "
                          "document_id, ad_id, document_id_promo, campaign_id; 19 for platform; 64 for the rest)."),
    "precision": Knob({"type": "string", "enum": ["fp32", "amp"]},
                      "fp32, or amp: mixed precision (bf16 on CPU, fp16 with loss scaling on GPU).",
                      title="Precision (amp)"),
    "xla": Knob({"type": "boolean"}, "Compile the train step with XLA (jit_compile)."),
    "checkpoint_every_steps": Knob({"type": "integer", "minimum": 0},
                                   "Checkpoint interval in steps; a retried train task resumes from the last one "
                                   "(0 = at the end of each epoch only)."),
    "seed": Knob({"type": "integer", "minimum": 0}, "Seed of the weights, dropout and the training order."),
    "map_k": Knob({"type": "integer", "minimum": 1, "maximum": 100},
                  "Cut-off of the ranking metric (Outbrain's Kaggle metric: MAP@12)."),
    "min_map": Knob({"type": "number", "minimum": 0, "maximum": 1},
                    "Publish only if validation MAP@k reaches this.", release="min"),
    "max_regression": Knob({"type": "number", "minimum": 0, "maximum": 1},
                           "Publish only if MAP@k is at most this much below the published model's on the same "
                           "validation displays.", release="max"),
}

# Knobs the features read; the trainer's flags are built by tasks.outbrain.wide_deep.trainer_config. The features'
# engine is not a knob: it is the deployment's (RECFLOW_OUTBRAIN_FEATURES_ENGINE) unless a run's `engine` param names
# one (tasks.outbrain.wide_deep.resolve_run), whatever the profile.
FEATURE_KNOBS = ("split_seed", "prebatch_size", "tfrecord_shards")

_FULL: dict[str, Any] = {
    "split_seed": 0, "prebatch_size": 4096, "tfrecord_shards": 16,
    "epochs": 20, "batch_size": 131072, "eval_batch_size": 131072, "linear_lr": 0.02, "deep_lr": 0.00012,
    "deep_warmup_epochs": 6, "deep_hidden_units": "1024,1024,1024,1024,1024", "deep_dropout": 0.1,
    "embedding_dim": 0, "precision": "fp32", "xla": False, "checkpoint_every_steps": 500, "seed": 1,
    "map_k": 12, "min_map": 0.63, "max_regression": 0.01,
}

PROFILES: dict[str, dict[str, Any]] = {
    "full": _FULL,
    # One CPU machine, a synthetic snapshot of a few thousand displays: small records, model and batch.
    "demo": {**_FULL, "prebatch_size": 256, "tfrecord_shards": 4, "epochs": 4, "batch_size": 1024,
             "eval_batch_size": 4096, "linear_lr": 0.05, "deep_lr": 0.002, "deep_warmup_epochs": 1,
             "deep_hidden_units": "64,32", "deep_dropout": 0.0, "embedding_dim": 8, "checkpoint_every_steps": 100,
             "min_map": 0.5},
}

check_profiles(KNOBS, PROFILES)
