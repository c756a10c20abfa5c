"""fp16 loss scaling over several replicas (models.tfkit.precision): every replica skips a step on which any of them
overflowed; and the DLRM's host-memory tables synced across workers (models.dlrm_tf.steps).

Loss scaling: two replicas on two logical CPUs of one process (MirroredStrategy: the decision logic of
MultiWorkerMirroredStrategy's workers, whose divergence would hang the job instead of corrupting it); TensorFlow's
devices are fixed when its runtime starts, so the check runs in a child process. The sync: two real workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import keras
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from models.tfkit.precision import SparseAwareLossScaleOptimizer, agree_on_finite

agree = sys.argv[1] == "agree"
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    w = keras.Variable(tf.ones([3]), name="w")
    table = keras.Variable(tf.ones([5, 2]), name="table")
    optimizer = SparseAwareLossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build([w, table])
scale_before = float(optimizer.dynamic_scale.numpy())

def replica_step(overflow_on, host_overflow_on):
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    dense = tf.ones([3]) * tf.where(replica == overflow_on, float("inf"), 1.0)
    grads = [dense, tf.IndexedSlices(tf.ones([1, 2]), tf.constant([2]), tf.constant([5, 2]))]
    if agree:  # others_finite: this replica's verdict on gradients the optimizer does not apply (host tables)
        grads, _ = agree_on_finite(grads, tf.not_equal(replica, host_overflow_on))
    optimizer.apply_gradients(zip(grads, [w, table]))

@tf.function
def step(overflow_on, host_overflow_on=-1):
    strategy.run(replica_step, args=(overflow_on, host_overflow_on))

step(tf.constant(1))  # replica 1 overflows, replica 0 does not
skipped = {"w": w.numpy().tolist(), "table": table.numpy().tolist(), "scale": float(optimizer.dynamic_scale.numpy())}
step(tf.constant(-1))  # no replica overflows: the step applies
applied = {"w": w.numpy().tolist()}
step(tf.constant(-1), tf.constant(0))  # only replica 0's other gradients overflow: skipped, scale lowered
applied["after_other_overflow"] = {"w": w.numpy().tolist(), "scale": float(optimizer.dynamic_scale.numpy())}
# A sparse gradient of a table far too large to copy densely: checked on its values only
huge = tf.IndexedSlices(tf.constant([[1.0, float("nan")]]), tf.constant([7]), tf.constant([1 << 34, 2], tf.int64))
flags = [bool(optimizer.check_finite([huge])), bool(optimizer.check_finite([tf.IndexedSlices(
    tf.ones([1, 2]), tf.constant([7]), tf.constant([1 << 34, 2], tf.int64))]))]
print(json.dumps({"scale_before": scale_before, "skipped": skipped, "applied": applied, "flags": flags}))
'''


def _run(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_replicas_skip_together_a_step_on_which_one_overflowed() -> None:
    agreed = _run("agree")
    assert agreed["skipped"]["w"] == [1.0, 1.0, 1.0] and agreed["skipped"]["table"] == [[1.0, 1.0]] * 5
    assert agreed["skipped"]["scale"] == agreed["scale_before"] / 2  # lowered once, as on one replica
    assert agreed["applied"]["w"] != [1.0, 1.0, 1.0]  # a finite step still trains
    assert agreed["applied"]["after_other_overflow"] == {"w": agreed["applied"]["w"],
                                                         "scale": agreed["skipped"]["scale"] / 2}
    assert agreed["flags"] == [False, True]  # a sparse gradient's values are checked, not a dense copy
    # Without the agreement, Keras took replica 0's "finite" and applied replica 1's overflow
    alone = _run("alone")
    assert alone["skipped"]["w"] != [1.0, 1.0, 1.0]


SYNC_SCRIPT = r'''
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import keras
import tensorflow as tf
from models.dlrm_tf.model import HOST_DEVICE
from models.dlrm_tf.steps import make_host_table_sync
from models.tfkit.cluster import start_worker

ctx = start_worker(device="cpu")
with tf.device(HOST_DEVICE):  # a plain per-worker variable, as a host table is: each worker starts with its own
    table = keras.Variable(tf.fill([10, 4], float(ctx.index + 1)), name="table")

class Model:
    def host_table_variables(self):
        return [table]

make_host_table_sync(Model(), ctx.strategy, chunk_bytes=3 * 4 * 4)()  # 3 rows per all-reduce: 4 slices
print(json.dumps({"worker": ctx.index, "table": table.value.numpy().tolist()}))
'''


def test_host_tables_of_every_worker_become_the_chiefs_slice_by_slice() -> None:
    """Two real MultiWorkerMirroredStrategy workers (localhost) whose host tables differ end with the chief's,
    synced in row slices (a whole table would be staged on a GPU at once)."""
    from tasks.core.launch import free_port, tf_worker_envs

    envs = tf_worker_envs(2, ports=[free_port(), free_port()], cores=2)
    logs = [tempfile.TemporaryFile("w+") for _ in envs]  # files, not pipes: a worker never blocks on its output
    procs = [subprocess.Popen([sys.executable, "-c", SYNC_SCRIPT], cwd=REPO, env={**os.environ, **env},
                              stdout=log, stderr=subprocess.STDOUT, text=True) for env, log in zip(envs, logs)]
    try:
        deadline = time.monotonic() + 300
        # One worker that dies (e.g. its port taken meanwhile) leaves the other in a collective without a timeout.
        while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
            assert time.monotonic() < deadline, "the workers did not finish in 300 s"
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    outputs = []
    for proc, log in zip(procs, logs):
        log.seek(0)
        outputs.append(log.read())
        log.close()
        assert proc.returncode == 0, outputs[-1][-3000:]
    tables = {doc["worker"]: doc["table"] for doc in (json.loads(out.strip().splitlines()[-1]) for out in outputs)}
    assert tables == {0: [[1.0] * 4] * 10, 1: [[1.0] * 4] * 10}
