"""The global training step of a custom multi-worker loop (strategy.run around a @tf.function step; Keras 3's
`fit` under MultiWorkerMirroredStrategy has open failure reports), and the dropout its models draw from the
step's seed."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, strategy: tf.distribute.Strategy,
                    global_batch: int, jit_compile: bool = False):
    """A @tf.function `train_step(inputs, labels, seed)`: each worker's replica computes sigmoid BCE with logits of
    `model(inputs, training=True, dropout_seed=seed)` on its share, scaled by the global batch; the optimizer sums
    the gradients across workers and applies them; the mean loss of the global batch comes back on every worker.
    With `jit_compile` the forward/backward is compiled; the cross-worker update stays outside (collectives are
    not XLA ops on CPU)."""
    global_batch = float(global_batch)

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def loss_and_gradients(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True, dropout_seed=seed)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
            loss = tf.reduce_sum(losses) / global_batch
            scaled = optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def replica_step(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        loss, gradients = loss_and_gradients(inputs, labels, seed)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function(reduce_retracing=True)
    def train_step(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        per_replica = strategy.run(replica_step, args=(inputs, labels, seed))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def seeded_dropout(x: tf.Tensor, rate: float, dropout_seed: tf.Tensor | None, layer: int) -> tf.Tensor:
    """Dropout after hidden layer `layer` in training, its mask drawn from `dropout_seed` (the trainer passes
    (seed, step)) offset per layer: a resumed run draws the masks a straight run would."""
    if dropout_seed is None:
        raise ValueError("training with dropout needs a dropout_seed (the trainer passes (seed, step))")
    seed = tf.cast(dropout_seed, tf.int64) + tf.constant([0, layer * 1_000_003], tf.int64)
    return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed)
