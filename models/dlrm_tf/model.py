"""DLRM (and DCNv2) as NVIDIA's TensorFlow2/Recommendation/DLRM_and_DCNv2 builds it, in Keras 3.

numericals -> bottom MLP (512-256-128, ReLU) -> d-vector; categorical i -> its own [rows_i, d] table, looked up with
tf.gather; interaction -> top MLP (1024-1024-512-256-1, last layer linear) -> one click logit per row.
interaction "dot" (DLRM): NVIDIA's DotInteractionGather - the [n, n] matrix of pairwise dots of the 1 + n_cat
vectors, its strict lower triangle (row-major, the same order as models.dlrm.model) concatenated after the
bottom-MLP output. interaction "cross" (DCNv2): NVIDIA's CrossNetwork (low-rank Cross layers) over the bottom-MLP
output concatenated with every embedding.

Initialisers are NVIDIA's TF2 ones: Dense kernels GlorotNormal, biases RandomNormal(stddev=sqrt(1/width)),
embedding rows Uniform(+-sqrt(1/rows)); Cross kernels truncated normal, biases zero. Not copied, on purpose: the
zero padding of the MLP inputs to a multiple of 8 (tensor-core alignment; the padded columns are always 0) and the
fused CUDA interaction kernel.

Tables bigger than one worker (docs/dlrm_tf.md): the tables beyond `host_table_threshold_bytes` in all (rows x d x 4;
the smallest stay on the device, NVIDIA's --cpu_offloading_threshold_gb rule) are created in host memory
(`HOST_DEVICE`) as plain per-worker variables, outside the strategy's mirrored placement. Their lookups run on the
host, so only the looked-up rows go to the device; the trainer sums their sparse gradients across workers itself
(models.dlrm_tf.train), because the strategy only updates the mirrored variables. All other variables follow the
strategy's devices. Every lookup reads rows of the fp32 table (a sparse read, no whole-table read or cast under a
mixed-precision policy) and casts only those rows to the compute dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from tasks.core.dlrm_knobs import HOST_TABLE_THRESHOLD_BYTES, host_table_indices

HOST_DEVICE = "/CPU:0"
FLOAT32_BYTES = 4


@dataclass
class DlrmTfModelConfig:
    """What it takes to rebuild a model (stored in model_config.json and beside every checkpoint)."""

    num_numerical: int
    categorical_cardinalities: list[int]
    bottom_mlp_sizes: list[int] = field(default_factory=lambda: [512, 256, 128])
    top_mlp_sizes: list[int] = field(default_factory=lambda: [1024, 1024, 512, 256, 1])
    max_table_size: int | None = None
    hash_indices: bool = False
    interaction: str = "dot"
    num_cross_layers: int = 3
    cross_layer_projection_dim: int = 512
    host_table_threshold_bytes: int = HOST_TABLE_THRESHOLD_BYTES

    def __post_init__(self) -> None:
        self.categorical_cardinalities = [int(c) for c in self.categorical_cardinalities]
        self.bottom_mlp_sizes = [int(s) for s in self.bottom_mlp_sizes]
        self.top_mlp_sizes = [int(s) for s in self.top_mlp_sizes]
        if self.num_numerical < 1:
            raise ValueError("DLRM needs at least one numerical feature (the bottom MLP feeds the interaction)")
        if not self.bottom_mlp_sizes or not self.top_mlp_sizes or self.top_mlp_sizes[-1] != 1:
            raise ValueError(f"bottom MLP {self.bottom_mlp_sizes} must be non-empty; top MLP {self.top_mlp_sizes} "
                             "must end in 1")
        if self.interaction not in ("dot", "cross"):
            raise ValueError(f"interaction must be dot or cross, got {self.interaction!r}")
        sizes = self.table_sizes()
        if not self.hash_indices and any(s < c for s, c in zip(sizes, self.categorical_cardinalities)):
            raise ValueError(f"max_table_size {self.max_table_size} is below some cardinalities: set hash_indices "
                             "so ids wrap around")

    @property
    def embedding_dim(self) -> int:
        return self.bottom_mlp_sizes[-1]

    def table_sizes(self) -> list[int]:
        cap = self.max_table_size
        return [c if cap is None else min(c, int(cap)) for c in self.categorical_cardinalities]

    def table_bytes(self) -> list[int]:
        return [rows * self.embedding_dim * FLOAT32_BYTES for rows in self.table_sizes()]

    def host_tables(self) -> list[int]:
        """Indices of the tables placed in host memory: the largest, beyond the threshold's total
        (tasks.core.dlrm_knobs.host_table_indices)."""
        return host_table_indices(self.table_bytes(), self.host_table_threshold_bytes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DlrmTfModelConfig:
        return cls(**values)


@contextlib.contextmanager
def host_placement() -> Iterator[None]:
    """Variables created inside live in host memory, one plain copy per worker, even under a tf.distribute scope.

    A strategy's variable creator places (and mirrors) every variable on its own devices and ignores tf.device;
    asked to colocate with a single device it creates one ordinary variable there instead (the hook TF's own
    host-side numpy datasets use: numpy_dataset.SingleDevice).
    """
    from tensorflow.python.distribute import numpy_dataset  # not exported; the strategies' documented colocate hook

    def on_host(next_creator, **kwargs):
        kwargs["colocate_with"] = numpy_dataset.SingleDevice(HOST_DEVICE)
        return next_creator(**kwargs)

    with tf.device(HOST_DEVICE):  # the initial value too: a table too big for the accelerator is made on the host
        if tf.distribute.has_strategy():
            with tf.variable_creator_scope(on_host):
                yield
        else:
            yield


class EmbeddingTable(keras.layers.Layer):
    """One categorical feature's [rows, dim] table (NVIDIA's uniform init), looked up with tf.gather.

    init=False: zeros instead, for a table the caller is about to overwrite with saved weights (drawing 16.7 GB of
    uniform numbers at Criteo 1TB size costs ~45 s on 2 CPU cores; zeros cost a memset)."""

    def __init__(self, rows: int, dim: int, on_host: bool, hash_indices: bool, init: bool = True,
                 **kwargs: Any) -> None:
        # autocast off, as Keras' own Embedding: under a mixed policy reading the variable would cast the whole table
        super().__init__(autocast=False, **kwargs)
        self.rows, self.dim, self.on_host, self.hash_indices = rows, dim, on_host, hash_indices
        bound = math.sqrt(1.0 / rows)
        initializer = keras.initializers.RandomUniform(-bound, bound) if init else "zeros"
        with host_placement() if on_host else contextlib.nullcontext():
            self.table = self.add_weight(shape=(rows, dim), dtype="float32", name="table", initializer=initializer)

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        if self.hash_indices:
            ids = tf.math.floormod(ids, self.rows)
        # The tf.Variable itself: tf.gather reads its rows where it lives (ResourceGather). On the Keras variable it
        # would read the whole table and gather on the replica's device, copying a host table to the GPU each step.
        # Pinned to the host under a strategy only: a SavedModel's variables carry no device.
        table = self.table.value
        with tf.device(HOST_DEVICE) if self.on_host and tf.distribute.has_strategy() else contextlib.nullcontext():
            rows = tf.gather(table, ids)
        return tf.cast(rows, self.compute_dtype)


class Cross(keras.layers.Layer):
    """DCNv2 cross layer: x0 * (V(U(x)) + b) + x, low rank when projection_dim > 0 (NVIDIA nn/dcn.py)."""

    def __init__(self, width: int, projection_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        init = keras.initializers.TruncatedNormal(stddev=0.05)
        if projection_dim > 0:
            self.u = keras.layers.Dense(projection_dim, use_bias=False, kernel_initializer=init,
                                        dtype=self.dtype_policy)
            self.u.build((None, width))
            width_in = projection_dim
        else:
            self.u, width_in = None, width
        self.v = keras.layers.Dense(width, kernel_initializer=init, bias_initializer="zeros", dtype=self.dtype_policy)
        self.v.build((None, width_in))

    def call(self, x0: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        return x0 * self.v(self.u(x) if self.u is not None else x) + x


def _dense(width: int, activation: str | None, in_width: int) -> keras.layers.Dense:
    layer = keras.layers.Dense(width, activation=activation, kernel_initializer=keras.initializers.GlorotNormal(),
                               bias_initializer=keras.initializers.RandomNormal(stddev=math.sqrt(1.0 / width)))
    layer.build((None, in_width))
    return layer


def dot_interaction_size(num_categorical: int, dim: int) -> int:
    n = num_categorical + 1
    return dim + n * (n - 1) // 2


class DlrmTf(keras.Model):
    """call((numerical float [b, n_num], categorical int32 [b, n_cat])) -> logits float32 [b].

    Every variable is created in the constructor (in whatever strategy scope is active), none on the first call.
    init_tables=False: the tables are zeros, for a model whose saved weights are loaded next.
    """

    def __init__(self, config: DlrmTfModelConfig, init_tables: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        dim, n_cat = config.embedding_dim, len(config.categorical_cardinalities)
        self.bottom_mlp = []
        width = config.num_numerical
        for size in config.bottom_mlp_sizes:
            self.bottom_mlp.append(_dense(size, "relu", width))
            width = size
        host = set(config.host_tables())
        self.tables = [EmbeddingTable(rows, dim, i in host, config.hash_indices, init=init_tables,
                                      name=f"embedding_{i}")
                       for i, rows in enumerate(config.table_sizes())]
        if config.interaction == "dot":
            n = n_cat + 1
            self._tril = tf.constant([i * n + j for i in range(n) for j in range(i)], tf.int32)
            self.cross = []
            width = dot_interaction_size(n_cat, dim)
        else:
            width = dim * (n_cat + 1)
            self.cross = [Cross(width, config.cross_layer_projection_dim, name=f"cross_{i}")
                          for i in range(config.num_cross_layers)]
        self.top_mlp = []
        for i, size in enumerate(config.top_mlp_sizes):
            self.top_mlp.append(_dense(size, "relu" if i < len(config.top_mlp_sizes) - 1 else None, width))
            width = size
        self.built = True

    def host_table_variables(self) -> list[tf.Variable]:
        """The variables of the tables in host memory (updated by the trainer, not the strategy's optimizer)."""
        return [t.table for t in self.tables if t.on_host]

    def call(self, inputs: tuple[tf.Tensor, tf.Tensor], training: bool = False) -> tf.Tensor:
        numerical, categorical = inputs
        x = tf.cast(numerical, self.compute_dtype)
        for layer in self.bottom_mlp:
            x = layer(x)
        embedded = [table(categorical[:, i]) for i, table in enumerate(self.tables)]
        if self.config.interaction == "dot":
            stacked = tf.stack([x, *embedded], axis=1)  # [b, n, d]
            n = len(embedded) + 1
            dots = tf.reshape(tf.matmul(stacked, stacked, transpose_b=True), [-1, n * n])
            z = tf.concat([x, tf.gather(dots, self._tril, axis=1)], axis=1)
        else:
            x0 = tf.concat([x, *embedded], axis=1)
            z = x0
            for layer in self.cross:
                z = layer(x0, z)
        for layer in self.top_mlp:
            z = layer(z)
        return tf.cast(tf.squeeze(z, axis=1), tf.float32)


def build_model(config: DlrmTfModelConfig | dict[str, Any], init_tables: bool = True) -> DlrmTf:
    """A model from its config (or model_config.json's "model" entry), every variable created (the tables left zero
    with init_tables=False, for loading saved weights into)."""
    if isinstance(config, dict):
        config = DlrmTfModelConfig.from_dict(config)
    return DlrmTf(config, init_tables=init_tables)
