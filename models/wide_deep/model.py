"""Wide & Deep (Cheng et al. 2016) as NVIDIA's TF2 recipe builds it, in Keras 3 layers (no WideDeepModel there).

Wide: a linear model over every categorical (one weight per hash bucket: the one-hot features' buckets plus the
multi-hot features' non-padding values, summed) and the numericals, plus a bias. All categorical buckets live in one
[sum of cardinalities, 1] table indexed with per-feature offsets, so the wide part is one gather. It stays float32
under mixed precision (it is a sum of many small weights, and cheap). Trained by FTRL.

Deep: one embedding table per categorical with its own dim; a multi-hot feature's embeddings are pooled (`sum`,
NVIDIA's default combiner, or `mean`) over its non-padding values; the pooled embeddings and the numericals are
concatenated into a ReLU MLP with dropout, then Dense(1). Trained by RMSProp. Initialisers are Keras' defaults
(embeddings uniform in +-0.05, Glorot kernels); the wide weights start at zero, as a linear model's usually do.

logit = wide + deep (float32); the trainer applies sigmoid BCE. Dropout is stateless, seeded per step by the
trainer (`dropout_seed`), so a resumed run repeats nothing.

Inputs: {name: [B, 1] int64} per one-hot feature, {name: [B, hotness] int64, padding -1} per multi-hot feature,
{name: [B, 1] float32} per numerical (models.wide_deep.data yields exactly that).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models.tfkit.training import seeded_dropout

WIDE_LAYERS = ("wide_categorical", "wide_numerical")  # variables trained by FTRL; everything else is deep


@dataclass(frozen=True)
class WideDeepModelConfig:
    onehot: dict[str, int]  # feature -> cardinality
    multihot: dict[str, int]  # feature -> cardinality
    hotness: dict[str, int]  # multihot feature -> max_hotness
    numerical: tuple[str, ...]
    embedding_dims: dict[str, int]  # every categorical -> deep embedding dim
    hidden_units: tuple[int, ...] = (1024,) * 5
    dropout: float = 0.1
    combiner: str = "sum"
    multihot_padding: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "numerical", tuple(self.numerical))
        object.__setattr__(self, "hidden_units", tuple(int(u) for u in self.hidden_units))
        missing = [n for n in (*self.onehot, *self.multihot) if n not in self.embedding_dims]
        if missing or set(self.hotness) != set(self.multihot):
            raise ValueError(f"every categorical needs an embedding dim (missing {missing}) and every multi-hot "
                             f"feature a hotness (got {sorted(self.hotness)} for {sorted(self.multihot)})")
        if not self.onehot and not self.multihot:
            raise ValueError("Wide & Deep needs at least one categorical feature")
        if self.combiner not in ("sum", "mean") or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"combiner must be sum or mean and dropout in [0, 1): {self.combiner}, {self.dropout}")

    @property
    def categorical(self) -> tuple[str, ...]:
        """One-hot then multi-hot features, each by name: the order of the embedding layers and of the wide
        part's offsets, so it must not depend on the order a dict was written or read in (model_config.json)."""
        return (*sorted(self.onehot), *sorted(self.multihot))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "numerical": list(self.numerical), "hidden_units": list(self.hidden_units)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> WideDeepModelConfig:
        names = ("onehot", "multihot", "hotness", "numerical", "embedding_dims", "hidden_units", "dropout",
                 "combiner", "multihot_padding")
        return cls(**{k: values[k] for k in names})


class WideDeep(keras.Model):
    """call(features, training, dropout_seed) -> logits [B] float32."""

    def __init__(self, config: WideDeepModelConfig, **kwargs: Any) -> None:
        super().__init__(name="wide_deep", **kwargs)
        self.config = config
        cards = [config.onehot.get(n) or config.multihot[n] for n in config.categorical]
        self._wide_offsets = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
        self.wide_categorical = keras.layers.Embedding(int(sum(cards)), 1, embeddings_initializer="zeros",
                                                       dtype="float32", name=WIDE_LAYERS[0])
        self.wide_numerical = keras.layers.Dense(1, kernel_initializer="zeros", dtype="float32", name=WIDE_LAYERS[1])
        self.deep_embeddings = [keras.layers.Embedding(card, config.embedding_dims[name],
                                                       name=f"deep_embedding_{name}")
                                for name, card in zip(config.categorical, cards)]
        self.deep_layers = [keras.layers.Dense(units, activation="relu", name=f"deep_dense_{index}")
                            for index, units in enumerate(config.hidden_units)]
        self.deep_output = keras.layers.Dense(1, dtype="float32", name="deep_output")

    def wide_variables(self) -> list[keras.Variable]:
        return [*self.wide_categorical.trainable_variables, *self.wide_numerical.trainable_variables]

    def _categorical_ids(self, features: dict[str, tf.Tensor]) -> list[tuple[tf.Tensor, tf.Tensor | None]]:
        """(ids with padding replaced by 0, validity mask or None) per categorical, in config order."""
        out = []
        for name in self.config.categorical:
            ids = tf.cast(features[name], tf.int64)
            if name in self.config.multihot:
                valid = tf.not_equal(ids, self.config.multihot_padding)
                out.append((tf.where(valid, ids, tf.zeros_like(ids)), valid))
            else:
                out.append((ids, None))
        return out

    def _numericals(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.concat([tf.cast(tf.reshape(features[n], [-1, 1]), tf.float32) for n in self.config.numerical],
                         axis=1)

    def _wide(self, ids: list[tuple[tf.Tensor, tf.Tensor | None]], numericals: tf.Tensor | None) -> tf.Tensor:
        offsets = tf.constant(self._wide_offsets)
        flat_ids = tf.concat([i + offsets[position] for position, (i, _) in enumerate(ids)], axis=1)
        masks = tf.concat([tf.ones_like(i, tf.float32) if m is None else tf.cast(m, tf.float32) for i, m in ids],
                          axis=1)
        weights = tf.squeeze(self.wide_categorical(flat_ids), axis=-1)  # [B, columns]
        wide = tf.reduce_sum(weights * masks, axis=1)
        if numericals is not None:
            wide += tf.squeeze(self.wide_numerical(numericals), axis=-1)
        return wide

    def _deep(self, ids: list[tuple[tf.Tensor, tf.Tensor | None]], numericals: tf.Tensor | None, training: bool,
              dropout_seed: tf.Tensor | None) -> tf.Tensor:
        parts = []
        for layer, (feature_ids, valid) in zip(self.deep_embeddings, ids):
            vectors = layer(feature_ids)  # [B, hotness or 1, dim]
            if valid is None:
                parts.append(vectors[:, 0, :])
                continue
            mask = tf.cast(valid, vectors.dtype)[:, :, None]
            pooled = tf.reduce_sum(vectors * mask, axis=1)
            if self.config.combiner == "mean":
                pooled /= tf.maximum(tf.reduce_sum(mask, axis=1), tf.ones([], vectors.dtype))
            parts.append(pooled)
        if numericals is not None:
            parts.append(tf.cast(numericals, parts[0].dtype))
        x = tf.concat(parts, axis=1)
        for index, layer in enumerate(self.deep_layers):
            x = layer(x)
            if training and self.config.dropout > 0:
                x = seeded_dropout(x, self.config.dropout, dropout_seed, index)
        return tf.squeeze(self.deep_output(x), axis=-1)

    def call(self, features: dict[str, tf.Tensor], training: bool = False,
             dropout_seed: tf.Tensor | None = None) -> tf.Tensor:
        ids = self._categorical_ids(features)
        numericals = self._numericals(features) if self.config.numerical else None
        return self._wide(ids, numericals) + self._deep(ids, numericals, training, dropout_seed)

    def build_weights(self) -> WideDeep:
        """Create every variable now (inside a strategy scope, before the first replica call)."""
        self(dummy_features(self.config, 1))
        return self


def dummy_features(config: WideDeepModelConfig, rows: int) -> dict[str, tf.Tensor]:
    features = {name: tf.zeros([rows, 1], tf.int64) for name in config.onehot}
    features.update({name: tf.zeros([rows, config.hotness[name]], tf.int64) for name in config.multihot})
    features.update({name: tf.zeros([rows, 1], tf.float32) for name in config.numerical})
    return features


def build_model(config: WideDeepModelConfig) -> WideDeep:
    return WideDeep(config).build_weights()


def warmup_schedule(base_rate: float, warmup_steps: int,
                    total_steps: int) -> keras.optimizers.schedules.LearningRateSchedule:
    """NVIDIA's deep learning-rate schedule (trainer/utils/schedulers.py): linear from 0 to `base_rate` over the
    warmup, then base/4, and base/8 from halfway through the remaining steps."""
    return _DeepSchedule(base_rate, warmup_steps, total_steps)


class _DeepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, base_rate: float, warmup_steps: int, total_steps: int) -> None:
        self.base_rate = float(base_rate)
        self.warmup_steps = int(warmup_steps)
        self.boundary = self.warmup_steps + (int(total_steps) - self.warmup_steps) / 2

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warm = self.base_rate * step / max(self.warmup_steps, 1)
        after = tf.where(step > self.boundary, self.base_rate / 8, self.base_rate / 4)
        return tf.where(step < self.warmup_steps, warm, after)

    def get_config(self) -> dict[str, Any]:
        return {"base_rate": self.base_rate, "warmup_steps": self.warmup_steps,
                "total_steps": int(2 * self.boundary - self.warmup_steps)}


def make_optimizer(model: WideDeep, linear_learning_rate: float, deep_schedule: Any) -> tuple[
        keras.optimizers.MultiOptimizer, keras.optimizers.Optimizer, keras.optimizers.Optimizer]:
    """(MultiOptimizer, its FTRL, its RMSProp): FTRL for the wide variables, RMSProp (rho 0.5, NVIDIA) for the rest.

    Create inside the strategy scope (Keras' TF optimizers bind the strategy at construction). The two inner
    optimizers are returned too because MultiOptimizer does not track them for tf.train.Checkpoint: the trainer
    checkpoints them by name, or their slots (FTRL accumulators, RMSProp velocities) would be lost on resume.
    """
    ftrl = keras.optimizers.Ftrl(linear_learning_rate, name="wide_ftrl")
    rmsprop = keras.optimizers.RMSprop(deep_schedule, rho=0.5, name="deep_rmsprop")
    wide_paths = {v.path for v in model.wide_variables()}
    multi = keras.optimizers.MultiOptimizer(lambda v: ftrl if v.path in wide_paths else rmsprop,
                                            name="wide_deep_optimizer")
    return multi, ftrl, rmsprop
