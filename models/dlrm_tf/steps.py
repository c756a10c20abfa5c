"""The TF2 DLRM's distributed train step, and keeping host-memory tables identical on every worker.

The step is models.tfkit.training's (strategy.run around a @tf.function forward/backward, BCE with logits over the
global batch, the Keras optimizer summing gradients across workers) plus what that one cannot do: tables in host
memory (models.dlrm_tf.model.host_placement) are plain per-worker variables the strategy does not update, so their
sparse gradients are summed across workers here (an all-gather of the looked-up rows) and applied as a plain SGD
scatter update with the same learning rate - NVIDIA's DLRM trains embeddings with plain SGD too. With fp16 loss
scaling they are unscaled by the optimizer's current scale and skipped on a non-finite step, as the optimizer skips
the mirrored variables.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from models.dlrm_tf.model import HOST_DEVICE, DlrmTf
from models.tfkit.precision import agree_on_finite, all_finite, is_loss_scaled


def _raw(variable: Any) -> tf.Variable:
    """The tf.Variable behind a Keras variable."""
    return getattr(variable, "value", variable)


def make_train_step(model: DlrmTf, optimizer: keras.optimizers.Optimizer, strategy: tf.distribute.Strategy,
                    global_batch: int, jit_compile: bool = False):
    """A @tf.function `train_step(inputs, labels, lr) -> mean loss of the global batch` (on every worker)."""
    host = model.host_table_variables()
    host_ids = {id(v) for v in host}
    mirrored = [v for v in model.trainable_variables if id(v) not in host_ids]
    loss_scaled = is_loss_scaled(optimizer)
    global_batch = float(global_batch)

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def loss_and_gradients(inputs: Any, labels: tf.Tensor):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
            loss = tf.reduce_sum(losses) / global_batch
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, mirrored + host)
        return loss, gradients[:len(mirrored)], gradients[len(mirrored):]

    def update_host_tables(gradients: list[tf.IndexedSlices], lr: tf.Tensor, mirrored_finite: tf.Tensor) -> None:
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        scale = tf.cast(optimizer.dynamic_scale, tf.float32) if loss_scaled else tf.constant(1.0)
        finite = tf.logical_and(all_finite(summed), mirrored_finite)  # skipped with the optimizer's step

        def apply() -> tf.Tensor:
            for variable, gradient in zip(host, summed):
                step = tf.cast(gradient.values, tf.float32) * (lr / scale)
                _raw(variable).scatter_sub(tf.IndexedSlices(step, gradient.indices, gradient.dense_shape))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))

    def replica_step(inputs: Any, labels: tf.Tensor, lr: tf.Tensor):
        loss, mirrored_gradients, host_gradients = loss_and_gradients(inputs, labels)
        mirrored_finite = tf.constant(True)
        if loss_scaled:
            mirrored_gradients, mirrored_finite = agree_on_finite(mirrored_gradients,
                                                                  all_finite(host_gradients) if host else None)
        if host:  # reads the loss scale before the optimizer updates it
            update_host_tables(host_gradients, lr, mirrored_finite)
        optimizer.apply_gradients(zip(mirrored_gradients, mirrored))
        return loss

    @tf.function(reduce_retracing=True)
    def train_step(inputs: Any, labels: tf.Tensor, lr: tf.Tensor):
        optimizer.learning_rate = lr
        per_replica = strategy.run(replica_step, args=(inputs, labels, lr))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


SYNC_CHUNK_BYTES = 64 << 20  # of a host table per all-reduce: what the sync stages on a replica's device at a time


def make_host_table_sync(model: DlrmTf, strategy: tf.distribute.Strategy, chunk_bytes: int = SYNC_CHUNK_BYTES):
    """A function that overwrites every worker's host-memory tables with replica 0's (the chief's; a sum to which
    only it contributes); a no-op without host tables. Called after building or restoring on several workers, so
    all of them start equal.

    In row slices of about `chunk_bytes`: MultiWorkerMirroredStrategy stages an all-reduce's operand on the
    replica's device, and a host table is there because it does not fit a GPU."""
    host = model.host_table_variables()

    def replica_sync(variable: Any, start: tf.Tensor, rows: int) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        with tf.device(HOST_DEVICE):  # not a multiply: 0 x a non-chief's inf would be NaN in the sum
            piece = _raw(variable)[start:start + rows]
            contribution = tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), piece, tf.zeros_like(piece))
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, contribution)
        with tf.device(HOST_DEVICE):
            _raw(variable)[start:start + rows].assign(summed)
        return tf.constant(0.0)

    @tf.function
    def sync_slice(index: int, start: tf.Tensor, rows: int) -> None:
        strategy.run(replica_sync, args=(host[index], start, rows))

    def sync() -> None:
        for index, variable in enumerate(host):
            total, dim = _raw(variable).shape
            step = max(1, chunk_bytes // (dim * _raw(variable).dtype.size))
            for start in range(0, total, step):
                sync_slice(index, tf.constant(start, tf.int64), min(step, total - start))

    return sync if host else (lambda: None)
