"""Numeric precision for Keras 3 training: fp32, bf16 or fp16 mixed precision (fp16 with dynamic loss scaling).

Mixed precision computes in 16 bits and keeps float32 variables (Keras' `mixed_*` dtype policies). bf16 has
fp32's exponent range and needs no loss scaling; fp16 does, so its optimizer is wrapped in
`keras.optimizers.LossScaleOptimizer` and the loss passed through `optimizer.scale_loss` (identity for the
others). The policy is process-global in Keras; `precision_policy` restores the previous one on exit.

Loss scaling over several workers needs one thing Keras 3 leaves out: its LossScaleOptimizer decides to apply or
skip a step from each replica's own gradients, before the inner optimizer sums them across replicas. On a step where
one worker overflows and another does not, they take different branches: one enters the gradient all-reduce, the
other does not, and MultiWorkerMirroredStrategy waits forever (and their loss scales drift apart). The train steps
call `agree_on_finite` first, so every replica skips together. Its finiteness check also reads a sparse
gradient's values (`all_finite`): Keras' own builds a dense boolean tensor of the whole table for it, every step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import tensorflow as tf

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def policy_name(precision: str) -> str:
    try:
        return POLICIES[precision]
    except KeyError:
        raise ValueError(f"precision must be one of {sorted(POLICIES)}, got {precision!r}") from None


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[str]:
    """Set Keras' global dtype policy for the layers built inside the block."""
    name = policy_name(precision)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield name
    finally:
        keras.config.set_dtype_policy(previous)


def all_finite(gradients: list) -> tf.Tensor:
    """Every value of every gradient is finite; an IndexedSlices' values only (not its dense shape)."""
    flags = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
             for g in gradients if g is not None]
    return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


class SparseAwareLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling, with `all_finite` as its check (no dense copy of a sparse table gradient)."""

    def check_finite(self, grads):
        return all_finite(list(grads))


def agree_on_finite(gradients: list, others_finite: tf.Tensor | None = None) -> tuple[list, tf.Tensor]:
    """(gradients, finite on every replica), in a replica context (strategy.run), before a loss-scaled
    optimizer's apply: where any replica's gradients are not finite, every replica's smallest dense gradient is
    made NaN, so that all of them skip the step and lower the scale together (see the module's docstring). One
    all-reduce of a scalar. others_finite: this replica's verdict on gradients the optimizer does not apply (the
    DLRM's host tables), counted the same way, so that their overflow also skips the step and lowers the scale."""
    context = tf.distribute.get_replica_context()
    finite = all_finite(gradients)
    if others_finite is not None:
        finite = tf.logical_and(finite, others_finite)
    replicas = 1 if context is None else context.num_replicas_in_sync
    if replicas == 1 and others_finite is None:
        return gradients, finite  # the optimizer's own check sees the same
    bad = tf.logical_not(finite)
    if replicas > 1:
        bad = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(bad, tf.float32)) > 0
    dense = [i for i, g in enumerate(gradients) if g is not None and not isinstance(g, tf.IndexedSlices)]
    if not dense:
        raise ValueError("loss scaling over several replicas needs one dense gradient to mark a skipped step")
    pick = min(dense, key=lambda i: gradients[i].shape.num_elements() or float("inf"))
    marked = list(gradients)
    marked[pick] = marked[pick] + tf.cast(tf.where(bad, float("nan"), 0.0), marked[pick].dtype)
    return marked, tf.logical_not(bad)


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, precision: str) -> keras.optimizers.Optimizer:
    """fp16: dynamic loss scaling around `optimizer` (SparseAwareLossScaleOptimizer; the train step calls
    agree_on_finite before its apply); fp32 / bf16: the optimizer itself."""
    policy_name(precision)
    if precision == "fp16":
        return SparseAwareLossScaleOptimizer(optimizer)
    return optimizer


def is_loss_scaled(optimizer: keras.optimizers.Optimizer) -> bool:
    """`optimizer` scales the loss (fp16): its train step calls agree_on_finite before applying."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
