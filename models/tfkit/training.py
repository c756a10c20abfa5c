"""The global training step of a custom multi-worker loop (strategy.run around a @tf.function step; Keras 3's
`fit` under MultiWorkerMirroredStrategy has open failure reports), and the dropout its models draw from the
step's seed."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from models.tfkit.precision import agree_on_finite, is_loss_scaled


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, strategy: tf.distribute.Strategy,
                    global_batch: int, jit_compile: bool = False, micro_batches: int = 1):
    """A @tf.function `train_step(inputs, labels, seed)`: each worker's replica computes sigmoid BCE with logits of
    `model(inputs, training=True, dropout_seed=seed)` on its share, scaled by the global batch; the optimizer sums
    the gradients across workers and applies them; the mean loss of the global batch comes back on every worker.
    With `jit_compile` the forward/backward is compiled; the cross-worker update stays outside (collectives are
    not XLA ops on CPU).

    With `micro_batches` k > 1 each worker's share goes through the forward/backward in k equal slices, one after
    the other, their gradients summed before the one update: the same loss and update (the loss is a sum over
    samples) with a working set of one slice, which is what bounds a large batch's memory on a CPU. Slice c > 0
    draws its dropout masks from the step's seed offset by c (slice 0 keeps the seed, so k = 1 is unchanged)."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    global_batch = float(global_batch)
    loss_scaled = is_loss_scaled(optimizer)

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def loss_and_gradients(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True, dropout_seed=seed)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
            loss = tf.reduce_sum(losses) / global_batch
            scaled = optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def replica_step(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        # Each worker's rows get masks of their own (one worker, replica 0: the seed as it is). Without the offset
        # every worker drew the same masks, so a global batch held only batch / workers distinct mask rows.
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        seed = seed + tf.stack([replica * _REPLICA_SEED_STRIDE, tf.constant(0, tf.int64)])
        if micro_batches == 1:
            loss, gradients = loss_and_gradients(inputs, labels, seed)
        else:
            loss, gradients = sliced_loss_and_gradients(inputs, labels, seed)
        if loss_scaled:
            gradients, _ = agree_on_finite(gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    def sliced_loss_and_gradients(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        rows = labels.shape[0]
        if rows is not None:  # known when traced: refused before any step
            size = rows // micro_batches
            if size * micro_batches != rows:
                raise ValueError(f"a worker's batch of {rows} does not split into {micro_batches} micro-batches")
        else:  # a trace for any batch size (reduce_retracing relaxes the shape once sizes vary): checked per step
            rows = tf.shape(labels)[0]
            size = rows // micro_batches
            tf.debugging.assert_equal(size * micro_batches, rows,
                                      message=f"a worker's batch does not split into {micro_batches} micro-batches")
        loss, gradients = None, None
        for index in range(micro_batches):
            part = slice(index * size, (index + 1) * size)
            after = [] if gradients is None else [loss, *_dense_parts(gradients)]
            with tf.control_dependencies(after):  # one slice's activations at a time, not k in parallel
                piece, grads = loss_and_gradients(tf.nest.map_structure(lambda t: t[part], inputs), labels[part],
                                                  seed + tf.constant([index * _SLICE_SEED_STRIDE, 0], tf.int64))
            loss = piece if loss is None else loss + piece
            gradients = grads if gradients is None else [_add(a, b) for a, b in zip(gradients, grads)]
        return loss, gradients

    @tf.function(reduce_retracing=True)
    def train_step(inputs: Any, labels: tf.Tensor, seed: tf.Tensor):
        per_replica = strategy.run(replica_step, args=(inputs, labels, seed))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


CPU_SLICE_SAMPLES = 1 << 17  # auto micro-batches on a CPU: at most NVIDIA's per-GPU NCF batch (2^20 over 8 GPUs)


def micro_batches(requested: int, local_batch: int, on_gpu: bool) -> int:
    """How many micro-batches a worker's batch goes through: `requested` when set (>= 1); 0 (auto): 1 on a GPU, on a
    CPU the fewest even slices of at most CPU_SLICE_SAMPLES samples (a 2^20 batch on one CPU worker: 8)."""
    if requested:
        if local_batch % requested:
            raise ValueError(f"a worker's batch of {local_batch} does not split into {requested} micro-batches")
        return requested
    if on_gpu or local_batch <= CPU_SLICE_SAMPLES:
        return 1
    return next(k for k in range(-(-local_batch // CPU_SLICE_SAMPLES), local_batch + 1) if local_batch % k == 0)


_SLICE_SEED_STRIDE = 1_000_000_007  # micro-batch c's dropout seed: (seed + c x this, step)
_REPLICA_SEED_STRIDE = 2_147_483_647  # replica r's: (seed + r x this, step); no (r, c) pair meets another's


def _add(a: Any, b: Any) -> Any:
    """Sum two gradients of one variable; embedding gradients (IndexedSlices) are concatenated, which the optimizer's
    sparse update sums per row."""
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        a, b = (g if isinstance(g, tf.IndexedSlices) else _as_slices(g) for g in (a, b))
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return a + b


def _as_slices(dense: tf.Tensor) -> tf.IndexedSlices:
    shape = tf.shape(dense, out_type=tf.int64)
    return tf.IndexedSlices(dense, tf.range(shape[0]), shape)


def _dense_parts(gradients: list[Any]) -> list[tf.Tensor]:
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]


def seeded_dropout(x: tf.Tensor, rate: float, dropout_seed: tf.Tensor | None, layer: int) -> tf.Tensor:
    """Dropout after hidden layer `layer` in training, its mask drawn from `dropout_seed` (the trainer passes
    (seed, step)) offset per layer: a resumed run draws the masks a straight run would."""
    if dropout_seed is None:
        raise ValueError("training with dropout needs a dropout_seed (the trainer passes (seed, step))")
    seed = tf.cast(dropout_seed, tf.int64) + tf.constant([0, layer * 1_000_003], tf.int64)
    return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed)
