"""NeuMF training: learns a planted signal, evaluates and scores consistently, precision/XLA variants, resumes
exactly after a stop, and trains as 2 TensorFlow worker processes through tasks.core.launch."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("tensorflow")

from models.ncf import evaluate  # noqa: E402
from models.ncf.data import Interactions, epoch_sample, ranking_series, load_mapping, read_spec  # noqa: E402
from models.ncf.metrics import hit_rate_and_ndcg  # noqa: E402
from models.ncf.train import main, parse_args  # noqa: E402
from tasks.core.launch import TrainingFailed, tf_worker_envs, train_with_tf_workers  # noqa: E402
from tasks.core.process import ChildCommand, run_streaming_group  # noqa: E402
from tasks.core.storage import Manifest, write_manifest  # noqa: E402
from tests.conftest import REPO  # noqa: E402

TINY = {"factors": 8, "mlp_sizes": [32, 16, 8], "dropout": 0.2, "batch_size": 512, "learning_rate": 0.01,
        "log_every_steps": 20, "intra_op_threads": 1, "inter_op_threads": 1}


def make_planted_dataset(root: Path, users: int = 200, items: int = 500, clusters: int = 20, per_user: int = 15,
                         samples: int = 101, seed: int = 0) -> Path:
    """Users in `clusters` groups; each likes `per_user` items of its group's block (train) and one more (test,
    column 0), followed by samples-1 negatives drawn from the items it has not trained on (repeats allowed)."""
    import torch

    rng = np.random.default_rng(seed)
    block = items // clusters
    train, test = [], []
    for user in range(users):
        group = user % clusters
        liked = rng.permutation(np.arange(group * block, (group + 1) * block))[: per_user + 1]
        train += [(user, int(i)) for i in sorted(liked[:per_user])]
        pool = np.setdiff1d(np.arange(items), liked[:per_user])
        test += [(user, int(liked[-1]))] + [(user, int(i)) for i in rng.choice(pool, samples - 1)]
    root.mkdir(parents=True, exist_ok=True)
    torch.save(torch.tensor(train, dtype=torch.int64), root / "train_data_0.pt")
    torch.save(torch.ones(len(train), 1), root / "train_data_1.pt")
    torch.save(torch.tensor(test, dtype=torch.int64), root / "test_data_0.pt")
    labels = torch.zeros(users, samples)
    labels[:, 0] = 1
    torch.save(labels.reshape(-1, 1), root / "test_data_1.pt")
    chunks = {m: [{"type": "torch_tensor", "features": ["user", "item"], "files": [f"{m}_data_0.pt"]},
                  {"type": "torch_tensor", "features": ["label"], "files": [f"{m}_data_1.pt"]}]
              for m in ("train", "test")}
    spec = {"feature_spec": {"user": {"dtype": "torch.int64", "cardinality": users},
                             "item": {"dtype": "torch.int64", "cardinality": items},
                             "label": {"dtype": "torch.float32"}},
            "metadata": {"test_samples_per_series": samples}, "source_spec": chunks,
            "channel_spec": {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]}}
    (root / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    write_manifest(root, Manifest(kind="test:planted-ncf", inputs={"seed": seed, "users": users, "items": items}))
    return root


def _flags(config: dict) -> list[str]:
    from tasks.core.launch import config_args

    return config_args(config)


def _args(dataset: Path, out: Path, **overrides) -> list[str]:
    return ["--dataset_dir", str(dataset), "--output_dir", str(out), *_flags({**TINY, **overrides})]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_planted_dataset(tmp_path_factory.mktemp("ncf"))


@pytest.fixture(scope="module")
def straight_run(dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("straight")
    return main(_args(dataset, out, epochs=4, checkpoint_every_steps=25)), out


def test_epoch_sample_is_the_int64_draw_in_int32_and_depends_only_on_seed_and_epoch():
    """The sample is built in place in int32 (a fraction of the memory at ml-20m's size): the same values, in the same
    order, as the straightforward int64 construction of the same draws."""
    rng = np.random.default_rng(3)
    pairs = Interactions(users=rng.integers(0, 40, 300).astype(np.int64),
                         items=rng.integers(0, 25, 300).astype(np.int64), labels=np.ones(300, np.float32))
    users, items, labels = epoch_sample(pairs, 25, 4, seed=9, epoch=2)
    assert users.dtype == items.dtype == np.int32 and labels.dtype == np.float32
    draw = np.random.default_rng([9, 2])
    want_items = np.concatenate([pairs.items, draw.integers(0, 25, size=300 * 4, dtype=np.int64)])
    want_users = np.concatenate([pairs.users, np.repeat(pairs.users, 4)])
    want_labels = np.concatenate([np.ones(300, np.float32), np.zeros(1200, np.float32)])
    order = draw.permutation(1500)
    assert np.array_equal(users, want_users[order]) and np.array_equal(items, want_items[order])
    assert np.array_equal(labels, want_labels[order])
    again = epoch_sample(pairs, 25, 4, seed=9, epoch=2)
    assert all(np.array_equal(a, b) for a, b in zip((users, items, labels), again))
    assert not np.array_equal(epoch_sample(pairs, 25, 4, seed=9, epoch=3)[1], items)


def sliced_ncf_step(slices: int, optimizer: str):
    """A small NeuMF (dropout off, seeded alike every time) and its train step over `slices` micro-batches."""
    import keras
    import tensorflow as tf

    from models.ncf.model import NeuMFConfig, build_model
    from models.tfkit.training import make_train_step

    keras.utils.set_random_seed(5)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = build_model(NeuMFConfig(users=30, items=20, factors=4, mlp_sizes=(8, 8, 4), dropout=0.0))
        opt = keras.optimizers.SGD(0.5) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    return model, make_train_step(model, opt, strategy, 64, micro_batches=slices)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_micro_batches_make_the_update_of_the_whole_batch(optimizer: str):
    """A batch through k slices (gradients summed, embedding IndexedSlices concatenated) gives the loss and the
    weights of the whole batch in one piece, step after step (dropout off: its masks are drawn per slice)."""
    import tensorflow as tf

    rng = np.random.default_rng(4)
    batches = [((tf.constant(rng.integers(0, 30, 64)), tf.constant(rng.integers(0, 20, 64))),
                tf.constant(rng.integers(0, 2, 64).astype(np.float32))) for _ in range(3)]
    runs = {}
    for slices in (1, 4):
        model, step = sliced_ncf_step(slices, optimizer)
        start = [w.numpy() for w in model.weights]
        losses = [float(step(inputs, labels, tf.constant([1, i], tf.int64))) for i, (inputs, labels) in
                  enumerate(batches)]
        runs[slices] = losses, [w.numpy() for w in model.weights]
    assert np.allclose(runs[1][0], runs[4][0], rtol=1e-5, atol=1e-7)
    for whole, sliced in zip(runs[1][1], runs[4][1]):
        assert np.allclose(whole, sliced, rtol=1e-4, atol=1e-6)
    assert all(not np.allclose(before, after) for before, after in zip(start, runs[4][1]))  # every weight trained


def test_micro_batches_follow_a_batch_size_the_trace_does_not_know():
    """Batches of varying size make the step's trace relax its batch dimension (reduce_retracing): the slices are
    then cut by the runtime size, with the same losses as the whole batch, and a size that does not split fails."""
    import tensorflow as tf

    rng = np.random.default_rng(6)
    batches = [((tf.constant(rng.integers(0, 30, n)), tf.constant(rng.integers(0, 20, n))),
                tf.constant(rng.integers(0, 2, n).astype(np.float32))) for n in (64, 128, 32, 96)]
    losses = {}
    for slices in (1, 4):
        _, step = sliced_ncf_step(slices, "sgd")
        losses[slices] = [float(step(inputs, labels, tf.constant([1, i], tf.int64)))
                          for i, (inputs, labels) in enumerate(batches)]
    assert np.allclose(losses[1], losses[4], rtol=1e-5, atol=1e-7)
    odd = ((tf.constant(rng.integers(0, 30, 30)), tf.constant(rng.integers(0, 20, 30))), tf.zeros(30))
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not split into 4 micro-batches"):
        step(*odd, tf.constant([1, 9], tf.int64))


_TWO_REPLICA_DROPOUT = """
import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras

from models.ncf.model import NeuMFConfig, build_model
from models.tfkit.training import make_train_step

rng = np.random.default_rng(4)
inputs = (tf.constant(rng.integers(0, 30, 64)), tf.constant(rng.integers(0, 20, 64)))
labels = tf.constant(rng.integers(0, 2, 64).astype(np.float32))
losses, weights = [], None
for devices in (["/cpu:0"], ["/cpu:0", "/cpu:1"]):
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        keras.utils.set_random_seed(5)
        model = build_model(NeuMFConfig(users=30, items=20, factors=4, mlp_sizes=(8, 8, 4), dropout=0.5))
        if weights is not None:
            model.set_weights(weights)
        weights = model.get_weights()
        step = make_train_step(model, keras.optimizers.SGD(0.0), strategy, 64)
    losses.append(float(step(inputs, labels, tf.constant([1, 7], tf.int64))))
print("LOSSES", *losses)
"""


def test_each_replica_draws_dropout_masks_of_its_own():
    """Two replicas (two logical CPUs, as two workers would be) handed the same rows: with masks of their own their
    summed loss is not twice one replica's, which it was when every worker drew the first worker's masks."""
    out = subprocess.run([sys.executable, "-c", _TWO_REPLICA_DROPOUT], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in out.stdout.splitlines() if line.startswith("LOSSES ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    one, two = map(float, lines[-1].split()[1:])
    assert abs(two - 2 * one) > 1e-5, (one, two)


def test_auto_micro_batches_bound_a_cpu_step_and_leave_a_gpu_alone():
    from models.tfkit.training import micro_batches

    assert micro_batches(0, 1 << 20, on_gpu=False) == 8
    assert micro_batches(0, 1 << 20, on_gpu=True) == 1
    assert micro_batches(0, 65536, on_gpu=False) == 1
    assert micro_batches(0, 3 * 100_000, on_gpu=False) == 3   # the fewest even slices of <= 131072
    assert micro_batches(2, 64, on_gpu=False) == 2
    with pytest.raises(ValueError, match="does not split into 3"):
        micro_batches(3, 64, on_gpu=False)


def test_config_defaults_are_nvidias_and_the_cli_roundtrips():
    cfg = parse_args(["--mlp_sizes", "64", "32", "--no-xla", "--precision", "bf16"])
    assert (cfg.factors, cfg.dropout, cfg.learning_rate, cfg.beta1, cfg.beta2, cfg.eps, cfg.negatives,
            cfg.batch_size, cfg.topk) == (64, 0.5, 0.0045, 0.25, 0.5, 1e-8, 4, 1 << 20, 10)
    assert cfg.mlp_sizes == (64, 32) and cfg.precision == "bf16" and not cfg.xla
    assert parse_args(_flags(cfg.to_dict())) == cfg


def test_one_worker_learns_the_planted_signal_and_writes_outputs(straight_run, dataset: Path):
    result, out = straight_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert result.steps == 4 * (3000 * 5 // 512) == metrics["steps"] and result.resumed_from_step is None
    assert metrics["hr@10"] >= 3 * metrics["random_hr@10"], metrics
    assert metrics["ndcg@10"] > 3 * metrics["random_ndcg@10"]
    assert metrics["users"] == 200 and metrics["workers"] == 1 and metrics["precision"] == "fp32"
    assert {"samples_per_s", "seconds", "best_epoch", "epochs", "xla", "rows"} <= set(metrics)
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1, 2, 3] and all(r["samples_per_second"] > 0 for r in records)
    assert records[-1]["hr@10"] == metrics["hr@10"]
    assert (out / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.model_path == out / "model.weights.h5" and (out / "model_config.json").is_file()
    # the evaluator, from the saved files, agrees; so does numpy on the scoring API's logits
    evaluated = evaluate.main(["--model_path", str(result.model_path), "--dataset_dir", str(dataset),
                               "--output_dir", str(out / "eval")])
    assert evaluated.metrics["hr@10"] == pytest.approx(metrics["hr@10"])
    assert evaluated.metrics["ndcg@10"] == pytest.approx(metrics["ndcg@10"], abs=1e-6)
    assert json.loads((out / "eval" / "metrics.json").read_text())["rows"] == 200 * 101
    spec = read_spec(dataset)
    series = ranking_series(spec, load_mapping(spec, "test"))
    model = evaluate.load_model(result.model_path)
    logits = evaluate.score(model, np.repeat(series.users, 101), series.items.reshape(-1)).reshape(200, 101)
    by_numpy = hit_rate_and_ndcg(logits, series.items, 10)
    assert by_numpy.hit_rate == pytest.approx(metrics["hr@10"]) and by_numpy.ndcg == pytest.approx(
        metrics["ndcg@10"], abs=1e-6)
    with pytest.raises(ValueError, match="model knows"):
        evaluate.score(model, [0], [500])


def test_stopped_run_resumes_from_its_checkpoint_and_ends_like_a_straight_run(straight_run, dataset: Path,
                                                                               tmp_path: Path, capsys):
    straight, straight_out = straight_run
    args = _args(dataset, tmp_path, epochs=4, checkpoint_every_steps=25)
    stopped = main([*args, "--stop_after_steps", "40"])
    assert stopped.stopped and stopped.steps == 40 and not (tmp_path / "metrics.json").exists()
    resumed = main(args)
    assert "resumed from step 40" in capsys.readouterr().out
    assert resumed.resumed_from_step == 40 and resumed.steps == straight.steps
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 40
    expected = json.loads((straight_out / "metrics.json").read_text())
    # negatives, order and dropout depend only on (seed, epoch/step): resuming repeats and loses nothing
    assert metrics["hr@10"] == expected["hr@10"] and metrics["ndcg@10"] == pytest.approx(expected["ndcg@10"])
    records = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    straight_records = [json.loads(line) for line in (straight_out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1, 2, 3]
    # the epoch the stop cut carries its loss over the resume: every epoch's loss is the straight run's
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in straight_records], rel=1e-6)


def test_a_stop_at_an_epochs_end_records_and_evaluates_that_epoch_first(straight_run, dataset: Path,
                                                                        tmp_path: Path):
    """The epoch's end (record, evaluation, checkpoint) comes before the stop: a resume starts the next epoch with
    nothing of the finished one lost."""
    straight, straight_out = straight_run
    end = json.loads((straight_out / "metrics.json").read_text())["steps_per_epoch"]
    args = _args(dataset, tmp_path, epochs=4, checkpoint_every_steps=25)
    assert main([*args, "--stop_after_steps", str(end)]).steps == end
    records = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0] and "hr@10" in records[0]
    main(args)
    records = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    straight_records = [json.loads(line) for line in (straight_out / "train_log.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r.get("hr@10")) for r in records] == [(r["epoch"], r.get("hr@10")) for r in straight_records]


@pytest.mark.parametrize("precision,xla", [("bf16", True), ("fp16", False)])
def test_mixed_precision_and_xla_train(dataset: Path, tmp_path: Path, precision: str, xla: bool):
    import keras

    result = main(_args(dataset, tmp_path, epochs=1, limit_train_batches=10, precision=precision, xla=xla))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert result.steps == 10 and metrics["precision"] == precision and metrics["xla"] is xla
    assert 0 < metrics["final_train_loss"] < 1 and keras.config.dtype_policy().name == "float32"  # restored


def test_two_workers_through_the_launcher(dataset: Path, tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="tasks.core.process")
    config = {**TINY, "epochs": 2, "checkpoint_every_steps": 20}
    started = time.monotonic()
    result = train_with_tf_workers("models.ncf.train", dataset, tmp_path, config, workers=2)
    lines = [r.getMessage() for r in caplog.records]
    finished = dict(re.findall(r"\[worker (\d)\] \[rank \d\] worker \d/2 finished: (\d+) steps", "\n".join(lines)))
    assert finished == {"0": "58", "1": "58"}, lines[-20:]
    assert result["metrics"]["workers"] == 2 and result["metrics"]["steps"] == 58
    assert result["model_path"] == str(tmp_path / "model.weights.h5") and Path(result["model_path"]).is_file()
    assert json.loads((tmp_path / "metrics.json").read_text())["hr@10"] == result["metrics"]["hr@10"]
    assert not list(tmp_path.glob(".tmp-checkpoints-worker*"))  # the non-chief's throw-away checkpoints are gone
    caplog.clear()
    again = train_with_tf_workers("models.ncf.train", dataset, tmp_path, config, workers=2)  # cached: no rerun
    assert again["metrics"] == result["metrics"] and not any("[worker" in r.getMessage() for r in caplog.records)
    assert time.monotonic() - started < 120


def test_worker_environments_name_the_cluster_and_share_the_cores():
    envs = tf_worker_envs(2, ports=[4001, 4002], cores=8)
    configs = [json.loads(env["TF_CONFIG"]) for env in envs]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert configs[0]["cluster"] == {"worker": ["127.0.0.1:4001", "127.0.0.1:4002"]}
    assert all(env["TF_NUM_INTRAOP_THREADS"] == "4" for env in envs)
    assert "TF_CONFIG" not in tf_worker_envs(1, cores=2)[0]


def test_one_failing_worker_stops_the_others_and_names_its_error(dataset: Path, tmp_path: Path):
    sleeper = [sys.executable, "-c", "import time; print('waiting', flush=True); time.sleep(60)"]
    failing = [sys.executable, "-c", "import time; time.sleep(0.5); raise ValueError('worker 1 broke')"]
    started = time.monotonic()
    result = run_streaming_group([ChildCommand(sleeper, label="worker 0"), ChildCommand(failing, label="worker 1")])
    assert time.monotonic() - started < 20
    assert result.first_failed == 1 and result.results[0].returncode < 0
    assert "ValueError: worker 1 broke" in result.results[1].last_error_line
    with pytest.raises(TrainingFailed, match=r"worker \d of 2 exited 1: .*not divisible"):
        train_with_tf_workers("models.ncf.train", dataset, tmp_path, {**TINY, "batch_size": 511}, workers=2)
