"""NeuMF (He et al. 2017) as NVIDIA DeepLearningExamples builds it, in Keras 3 layers.

GMF branch: user and item embeddings of `factors` dims, multiplied elementwise. MLP branch: user and item
embeddings of mlp_sizes[0]/2 dims each, concatenated (mlp_sizes[0] wide) and fed through Dense layers of
mlp_sizes[1:] with ReLU and dropout. Both branch outputs are concatenated into one Dense(1) logit.
Initialisers follow NVIDIA: embeddings N(0, 0.01), MLP kernels Glorot-uniform, the final layer LeCun-uniform.

Dropout is stateless, seeded per step by the trainer (`dropout_seed`): the masks depend only on (seed, step),
so a resumed run repeats nothing and a restarted worker draws what it would have drawn. The training loop is the
trainer's (a custom loop under tf.distribute), not `model.fit`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import keras
import tensorflow as tf

from models.tfkit.training import seeded_dropout


@dataclass(frozen=True)
class NeuMFConfig:
    users: int
    items: int
    factors: int = 64
    mlp_sizes: tuple[int, ...] = (256, 256, 128, 64)
    dropout: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_sizes", tuple(int(s) for s in self.mlp_sizes))
        if self.users < 1 or self.items < 1 or self.factors < 1:
            raise ValueError(f"users, items and factors must be positive: {self}")
        if len(self.mlp_sizes) < 1 or self.mlp_sizes[0] % 2 or min(self.mlp_sizes) < 1:
            raise ValueError(f"mlp_sizes {self.mlp_sizes}: the first size is split between user and item "
                             "embeddings, so it must be even (NVIDIA: 256 256 128 64)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} must be in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mlp_sizes": list(self.mlp_sizes)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> NeuMFConfig:
        return cls(**{k: values[k] for k in ("users", "items", "factors", "mlp_sizes", "dropout")})


def _embedding(rows: int, dims: int, name: str) -> keras.layers.Embedding:
    return keras.layers.Embedding(rows, dims, embeddings_initializer=keras.initializers.RandomNormal(stddev=0.01),
                                  name=name)


class NeuMF(keras.Model):
    """call((users, items), training, dropout_seed) -> logits [batch] (float32 under any precision policy)."""

    def __init__(self, config: NeuMFConfig, **kwargs: Any) -> None:
        super().__init__(name="neumf", **kwargs)
        self.config = config
        half = config.mlp_sizes[0] // 2
        self.gmf_user = _embedding(config.users, config.factors, "gmf_user_embedding")
        self.gmf_item = _embedding(config.items, config.factors, "gmf_item_embedding")
        self.mlp_user = _embedding(config.users, half, "mlp_user_embedding")
        self.mlp_item = _embedding(config.items, half, "mlp_item_embedding")
        self.mlp_layers = [keras.layers.Dense(size, activation="relu", kernel_initializer="glorot_uniform",
                                              name=f"mlp_{index}")
                           for index, size in enumerate(config.mlp_sizes[1:])]
        # The logit stays float32 under mixed precision: BCE and ranking compare small differences.
        self.final = keras.layers.Dense(1, kernel_initializer="lecun_uniform", dtype="float32", name="final")

    def call(self, inputs: tuple[tf.Tensor, tf.Tensor], training: bool = False,
             dropout_seed: tf.Tensor | None = None) -> tf.Tensor:
        users, items = inputs
        gmf = self.gmf_user(users) * self.gmf_item(items)
        x = tf.concat([self.mlp_user(users), self.mlp_item(items)], axis=-1)
        for index, layer in enumerate(self.mlp_layers):
            x = layer(x)
            if training and self.config.dropout > 0:
                x = seeded_dropout(x, self.config.dropout, dropout_seed, index)
        logits = self.final(tf.concat([gmf, tf.cast(x, gmf.dtype)], axis=-1))
        return tf.squeeze(logits, axis=-1)

    def build_weights(self) -> NeuMF:
        """Create every variable now (inside a strategy scope, before the first replica call)."""
        self((tf.zeros([1], tf.int64), tf.zeros([1], tf.int64)))
        return self


def build_model(config: NeuMFConfig) -> NeuMF:
    return NeuMF(config).build_weights()
