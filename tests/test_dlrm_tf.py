"""TF2 DLRM (models.dlrm_tf): the tf.data reader yields exactly the split-binary rows, the model learns a planted
signal, tables over the threshold live in host memory (and still train, on one worker and on two), a stopped run
resumes to the same weights, two TensorFlow workers through tasks.core.launch end identical, and the PyTorch and
TensorFlow DLRMs learn the same data and are scored on the same test rows."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from models.dlrm.synthetic import make_synthetic_dataset  # noqa: E402
from models.dlrm_tf.config import DlrmTfConfig, parse_args  # noqa: E402
from tasks.core.launch import config_args, train_with_tf_workers  # noqa: E402
from tasks.core.storage import Manifest, write_manifest  # noqa: E402
from tasks.formats.feature_spec import FeatureSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Synthetic cardinalities (models.dlrm.synthetic): 40, 25, 12, 8, 300 rows x 16 dims x 4 bytes = 2560, 1600, 768,
# 512, 19200. The smallest stay on the device while their total is <= 3000 bytes (8, 12, 25 rows: 2880); table 0, a
# signal feature, and table 4 go to host memory.
HOST_THRESHOLD = 3000
TINY = {"batch_size": 256, "eval_batch_size": 1000, "bottom_mlp_sizes": [32, 16], "top_mlp_sizes": [32, 1],
        "lr": 1.0, "warmup_steps": 10, "decay_start_step": 50, "decay_steps": 20, "log_every_steps": 20,
        "checkpoint_every_steps": 0, "device": "cpu", "intra_op_threads": 1, "inter_op_threads": 1}


def _argv(dataset: Path, out: Path, **overrides) -> list[str]:
    return config_args({"dataset_dir": str(dataset), "output_dir": str(out), **TINY, **overrides})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dlrm_tf_data")
    make_synthetic_dataset(root, train_rows=20_000, test_rows=5_003)  # a short last test batch
    write_manifest(root, Manifest(kind="test:synthetic-dlrm", inputs={"seed": 0}))
    return root


@pytest.fixture(scope="module")
def straight_run(dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    from models.dlrm_tf.train import main

    return main(_argv(dataset, tmp_path_factory.mktemp("dlrm_tf_straight")))


def test_reader_yields_exactly_the_split_binary_rows(dataset: Path) -> None:
    from models.dlrm.data import SplitBinaryDataset
    from models.dlrm_tf import data

    spec = FeatureSpec.from_yaml(dataset / "feature_spec.yaml")
    test = data.mapping_files(spec, "test")
    batches = list(data.eval_batches(test, 1000).as_numpy_iterator())
    assert sum(len(label) for _, label in batches) == 5_003  # the short last batch is kept
    with SplitBinaryDataset(spec, "test", 1000) as reference:
        assert len(batches) == len(reference)
        for i, ((numerical, categorical), label) in enumerate(batches):
            want_numerical, want_categorical, want_label = (t.numpy() for t in reference[i])
            np.testing.assert_array_equal(numerical, want_numerical)
            np.testing.assert_array_equal(categorical, want_categorical)
            np.testing.assert_array_equal(label, want_label)
    # Two workers: worker w's step s is the PyTorch trainer's rank-w batch at step s (local batches of 128).
    train = data.mapping_files(spec, "train")
    shards = [list(data.train_batches(train, 256, w, 2).as_numpy_iterator()) for w in range(2)]
    assert len(shards[0]) == len(shards[1]) == 20_000 // 256 == data.train_steps(train, 256)
    with SplitBinaryDataset(spec, "train", 128, drop_last_batch=True) as reference:
        for w, shard in enumerate(shards):
            for step in (0, 1, len(shard) - 1):
                (numerical, categorical), label = shard[step]
                want_numerical, want_categorical, want_label = (t.numpy() for t in reference[step * 2 + w])
                np.testing.assert_array_equal(numerical, want_numerical)
                np.testing.assert_array_equal(categorical, want_categorical)
                np.testing.assert_array_equal(label, want_label)
    resumed = list(data.train_batches(train, 256, 1, 2, first_batch=5).take(1).as_numpy_iterator())
    np.testing.assert_array_equal(resumed[0][0][1], shards[1][5][0][1])


def test_reader_names_a_file_whose_rows_disagree(dataset: Path, tmp_path: Path) -> None:
    import shutil

    from models.dlrm_tf import data

    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    with open(copy / "test" / "cat_2.bin", "r+b") as f:
        f.truncate(5_000)  # int8 ids: 3 rows short
    spec = FeatureSpec.from_yaml(copy / "feature_spec.yaml")
    with pytest.raises(ValueError, match=r"cat_2\.bin: 5000 rows but .*label\.bin has 5003"):
        data.mapping_files(spec, "test")


def test_config_takes_the_pytorch_trainers_flags_and_ignores_pytorch_only_ones() -> None:
    # What tasks/criteo/dlrm.py's model_config passes, plus a TorchRec --sharding knob.
    flags = config_args({"batch_size": 4096, "lr": 1.0, "epochs": 1, "warmup_steps": 20, "decay_start_step": 40,
                         "decay_steps": 20, "schedule_scaling": "run", "checkpoint_every_steps": 50,
                         "log_every_steps": 10, "seed": 12345, "amp": True, "bottom_mlp_sizes": [512, 256, 128],
                         "top_mlp_sizes": [1024, 1024, 512, 256, 1], "device": "cpu", "sharding": "table_wise"})
    cfg = parse_args(flags)
    assert (cfg.batch_size, cfg.lr, cfg.bottom_mlp_sizes, cfg.device) == (4096, 1.0, (512, 256, 128), "cpu")
    assert cfg.resolved_precision(on_gpu=False) == "bf16" and cfg.resolved_precision(on_gpu=True) == "fp16"
    assert set(cfg.ignored_settings()) == {"sharding"}
    assert parse_args([*flags, "--amp_dtype", "bf16"]).resolved_precision(on_gpu=True) == "bf16"
    assert set(parse_args([*flags, "--compile", "off"]).ignored_settings()) == {"sharding", "compile"}
    assert set(parse_args([*flags, "--no-copy_ahead"]).ignored_settings()) == {"sharding", "copy_ahead"}
    defaults = DlrmTfConfig()  # NVIDIA's recipe, as the PyTorch trainer's
    assert (defaults.batch_size, defaults.lr, defaults.warmup_steps, defaults.top_mlp_sizes) == (
        65536, 24.0, 8000, (1024, 1024, 512, 256, 1))
    assert defaults.schedule(72000).factor(0) == pytest.approx(1 / 8000)


def test_one_worker_learns_the_planted_signal_and_its_evaluator_agrees(straight_run, dataset: Path) -> None:
    from models.dlrm_tf import evaluate

    out = straight_run.output_dir
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["auc"] > 0.7 and metrics["rows"] == 5_003 and metrics["steps"] == 78
    assert metrics["framework"] == "tensorflow" and metrics["precision"] == "fp32"
    assert {"auc", "logloss", "rows", "positive_rate", "steps", "batch_size", "samples_per_second",
            "weights_sha256", "mapping"} <= set(metrics)
    for name in ("model.weights.h5", "model_config.json", "train_log.jsonl", "training_curves.png"):
        assert (out / name).stat().st_size > 0, name
    steps = [r["step"] for r in map(json.loads, (out / "train_log.jsonl").read_text().splitlines())]
    assert steps == [20, 40, 60, 78, 78]  # four loss intervals, then the final evaluation
    result = evaluate.main(["--model_path", str(out / "model.weights.h5"), "--output_dir", str(out / "eval"),
                            "--batch_size", "4096"])
    assert result.rows == 5_003 and result.auc == pytest.approx(metrics["auc"], abs=1e-6)
    written = json.loads(result.metrics_path.read_text())
    assert {"auc", "logloss", "rows", "mapping", "model_path", "step", "seconds"} <= set(written)


def test_stopped_run_resumes_from_its_checkpoint_to_the_same_weights(straight_run, dataset: Path,
                                                                      tmp_path: Path) -> None:
    from models.dlrm_tf.train import main

    stopped = main(_argv(dataset, tmp_path, stop_after_steps=30))
    assert stopped.stopped and stopped.steps == 30 and not (tmp_path / "metrics.json").exists()
    resumed = main(_argv(dataset, tmp_path))
    assert resumed.resumed_from_step == 30 and resumed.steps == 78
    # Same batches, same lr at every step, the optimizer state restored: the weights of an uninterrupted run (bit
    # for bit with one intra-op thread; allclose leaves room for a multi-threaded reduction order).
    from models.dlrm_tf.evaluate import load_model

    ended, straight = (load_model(out / "model.weights.h5") for out in (tmp_path, straight_run.output_dir))
    for a, b in zip(ended.variables, straight.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=a.path)


def test_loading_draws_no_table_and_takes_every_weight_from_the_file(tmp_path: Path, monkeypatch) -> None:
    """evaluate and export overwrite every table they load: drawing them first (~45 s on 2 CPU cores at Criteo
    1TB size) is skipped, and a file that lacks a table is refused, never served with zero tables."""
    import h5py
    import keras

    from models.dlrm_tf import evaluate
    from models.dlrm_tf.model import DlrmTfModelConfig, build_model

    saved = build_model(DlrmTfModelConfig(2, [40, 25, 300], [8, 4], [8, 1]))
    path = evaluate.save_model(tmp_path, saved, {}, step=1)

    def no_draw(*args, **kwargs):
        raise AssertionError("a table was drawn only to be overwritten")

    monkeypatch.setattr(keras.initializers.RandomUniform, "__call__", no_draw)
    loaded = evaluate.load_model(path)
    for a, b in zip(loaded.variables, saved.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)

    with h5py.File(path, "r+") as weights:  # the file loses its second table, and nothing else
        del weights["layers/embedding_table_1"]
    with pytest.raises(ValueError, match="embedding_1"):
        evaluate.load_model(path)


HOST_PLACEMENT_SCRIPT = textwrap.dedent("""
    import json, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from models.dlrm_tf.model import DlrmTfModelConfig, build_model
    config = DlrmTfModelConfig(2, [40, 25, 300], [8, 4], [8, 1], host_table_threshold_bytes=1100)
    found = {}
    for strategy in (tf.distribute.OneDeviceStrategy("/cpu:1"), tf.distribute.MirroredStrategy(["/cpu:1"])):
        with strategy.scope():
            model = build_model(config)
        found[type(strategy).__name__] = {
            "tables": [(t.on_host, type(t.table.value).__name__, t.table.value.device) for t in model.tables],
            "dense": model.top_mlp[0].kernel.value.device}
    # One training step's lookups under a mixed policy, as the trainer runs them (strategy.run, gradient tape)
    import keras
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:1"])
    with strategy.scope():
        model = build_model(config)

    @tf.function
    def step(numerical, categorical):
        def replica(numerical, categorical):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model((numerical, categorical), training=True))
            return tape.gradient(loss, [t.table for t in model.tables])
        return strategy.run(replica, args=(numerical, categorical))

    graph = step.get_concrete_function(tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 3], tf.int32)).graph
    found["lookups"] = [(op.name, op.type, op.device, [o.shape.as_list() for o in op.outputs])
                        for op in graph.get_operations() if "embedding_" in op.name]
    print(json.dumps(found))
""")


def test_tables_over_the_threshold_live_in_host_memory_and_the_rest_where_the_strategy_puts_them() -> None:
    # Two logical CPUs make placement observable on a CPU-only machine: the strategy owns /cpu:1, the host is /CPU:0.
    result = subprocess.run([sys.executable, "-c", HOST_PLACEMENT_SCRIPT], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # The host table's rows are read where it lives (a sparse read on the host), not the whole table copied to the
    # strategy's device each step; no table is read whole and cast to the policy's bf16 (only looked-up rows are).
    lookups = found.pop("lookups")
    gathers = {name.split("/")[1]: (kind, device) for name, kind, device, _ in lookups if "Gather" in kind
               and "gradient" not in name}
    assert gathers["embedding_2_1"][0] == "ResourceGather" and gathers["embedding_2_1"][1].endswith("CPU:0"), gathers
    assert [name for name, kind, device, shapes in lookups if "embedding_2" in name and kind == "ReadVariableOp"] == []
    casts = [shapes for name, kind, _, shapes in lookups if kind == "Cast"]
    assert casts and all(shape[0] is None for shapes in casts for shape in shapes), casts
    for strategy, placed in found.items():
        big, small, huge = placed["tables"]  # 40x4x4 = 640 B, 25x4x4 = 400 B, 300x4x4 = 4800 B; threshold 1100
        assert placed["dense"].endswith("CPU:1"), strategy
        assert not big[0] and big[2].endswith("CPU:1") and not small[0] and small[2].endswith("CPU:1"), strategy
        assert huge[0] and huge[2].endswith("CPU:0") and huge[1] == "ResourceVariable", strategy
        if strategy == "MirroredStrategy":
            assert big[1] == small[1] == "MirroredVariable"


def test_host_memory_tables_train_exactly_like_mirrored_ones(straight_run, dataset: Path, tmp_path: Path) -> None:
    from models.dlrm_tf.evaluate import load_model
    from models.dlrm_tf.train import main

    result = main(_argv(dataset, tmp_path, host_table_threshold_bytes=HOST_THRESHOLD))
    assert result.final_metrics["host_tables"] == [0, 4] and straight_run.final_metrics["host_tables"] == []
    # The trainer's own all-reduce + SGD scatter update of host tables is the strategy optimizer's update.
    hosted, mirrored = (load_model(out / "model.weights.h5") for out in (tmp_path, straight_run.output_dir))
    for a, b in zip(hosted.variables, mirrored.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=a.path)


@pytest.mark.parametrize("overrides", [
    {"precision": "fp16"},  # loss scaling: host-table gradients are unscaled by the trainer
    {"amp": True, "xla": True, "interaction": "cross", "cross_layer_projection_dim": 8},  # bf16 on CPU, DCNv2
], ids=["fp16", "bf16-xla-dcnv2"])
def test_host_memory_tables_train_in_mixed_precision(overrides: dict, dataset: Path, tmp_path: Path) -> None:
    from models.dlrm_tf.model import DlrmTfModelConfig
    from models.dlrm_tf.train import main

    initial = DlrmTfModelConfig(4, [40, 25, 12, 8, 300], [32, 16], [32, 1], host_table_threshold_bytes=HOST_THRESHOLD)
    assert initial.host_tables() == [0, 4]
    result = main(_argv(dataset, tmp_path, host_table_threshold_bytes=HOST_THRESHOLD, **overrides))
    assert result.final_metrics["host_tables"] == [0, 4]
    assert result.final_metrics["auc"] > 0.7  # table 0 carries planted signal: it must have learned (chance 0.5)
    assert result.final_metrics["precision"] == ("fp16" if "precision" in overrides else "bf16")


def test_xla_with_host_memory_tables_on_a_gpu_is_refused_in_one_line(dataset: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    """An XLA step on a GPU cannot read a variable on the host, so --xla with host-memory tables is refused there
    before anything is built (the GPU is mocked: TensorFlow here is a CPU build; on the CPU the pair trains, above)."""
    import tensorflow as tf

    from models.dlrm_tf.config import parse_args
    from models.dlrm_tf.train import train
    from models.tfkit.cluster import start_worker

    ctx = start_worker()
    listed = tf.config.list_logical_devices
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: [tf.config.LogicalDevice("/device:GPU:0", "GPU")] if kind == "GPU"
                        else listed(kind))
    cfg = parse_args(_argv(dataset, tmp_path, host_table_threshold_bytes=HOST_THRESHOLD, xla=True))
    with pytest.raises(RuntimeError) as caught:
        train(cfg, ctx)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("cannot run here: --xla with 2 embedding table(s) in host memory")
    assert "drop --xla" in line
    assert not list(tmp_path.iterdir())


def test_a_run_that_cannot_finish_in_its_time_budget_stops_at_a_log_interval(dataset: Path, tmp_path: Path,
                                                                              monkeypatch) -> None:
    from models.common import time_budget
    from models.dlrm_tf.train import main

    monkeypatch.setattr(time_budget, "MIN_MEASURED_S", 0.0)  # trusted from the first interval (300 s in a real run)
    with pytest.raises(time_budget.TrainingTooSlowError, match="training too slow: at [\\d,]+ samples/s"):
        main(_argv(dataset, tmp_path, time_budget_s=0.001))
    assert not (tmp_path / "metrics.json").exists()


def test_two_workers_through_the_launcher_end_with_identical_weights(dataset: Path, tmp_path: Path,
                                                                     caplog) -> None:
    # A time interval that is always over: the chief decides at each log interval (20 steps) and the other worker
    # follows (a multi-worker save is collective: a worker that disagreed would hang the job).
    config = {**TINY, "host_table_threshold_bytes": HOST_THRESHOLD, "intra_op_threads": 0, "inter_op_threads": 0,
              "checkpoint_every_minutes": 1e-9}
    caplog.set_level(logging.INFO)
    result = train_with_tf_workers("models.dlrm_tf.train", dataset, tmp_path, config, workers=2)
    assert re.findall(r"\[rank 0\] checkpoint step (\d+)", caplog.text) == ["20", "40", "60", "78"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert result["metrics"] == metrics and metrics["workers"] == 2 and metrics["auc"] > 0.7
    assert metrics["rows"] == 5_003 and metrics["host_tables"] == [0, 4]
    checksums = dict(re.findall(r"\[rank (\d)\] final weights sha256 (\w+)", caplog.text))
    assert set(checksums) == {"0", "1"} and checksums["0"] == checksums["1"] == metrics["weights_sha256"]
    assert not list(tmp_path.glob(".tmp-checkpoints-worker*"))  # the non-chief's throw-away checkpoints are gone
    caplog.clear()
    again = train_with_tf_workers("models.dlrm_tf.train", dataset, tmp_path, config, workers=2)
    assert again["metrics"] == metrics and "already finished" in caplog.text


def test_pytorch_and_tensorflow_dlrm_learn_the_same_data_and_score_the_same_rows(straight_run, dataset: Path,
                                                                                  tmp_path: Path) -> None:
    from models.dlrm.train import main as torch_main

    pt_flags = {k: v for k, v in TINY.items() if k not in ("intra_op_threads", "inter_op_threads")}
    torch_result = torch_main(config_args({"dataset_dir": str(dataset), "output_dir": str(tmp_path), **pt_flags,
                                           "torch_threads": 1}))
    pt, tf_ = torch_result.final_metrics, straight_run.final_metrics
    assert pt["steps"] == tf_["steps"] == 78 and pt["rows"] == tf_["rows"] == 5_003
    assert pt["positive_rate"] == tf_["positive_rate"]  # the same test rows, not only as many
    assert pt["auc"] > 0.7 and tf_["auc"] > 0.7  # both learned (chance is 0.5; seeds vary by +-0.05 at this size)


def _tf_gpus() -> list:
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


@pytest.mark.gpu
@pytest.mark.skipif(not _tf_gpus(), reason="needs a GPU visible to TensorFlow (tensorflow-cpu has none)")
def test_on_a_gpu_big_tables_stay_in_host_memory_and_amp_trains_in_fp16(dataset: Path, tmp_path: Path) -> None:
    import tensorflow as tf

    from models.dlrm_tf.model import DlrmTfModelConfig, build_model
    from models.dlrm_tf.train import main

    with tf.distribute.OneDeviceStrategy("/gpu:0").scope():
        model = build_model(DlrmTfModelConfig(4, [40, 25, 12, 8, 300], [32, 16], [32, 1],
                                              host_table_threshold_bytes=HOST_THRESHOLD))
    devices = [t.table.value.device for t in model.tables]
    assert [("CPU" in d) for d in devices] == [True, False, False, False, True], devices
    assert "GPU" in model.top_mlp[0].kernel.value.device
    flags = {**TINY, "device": "auto", "amp": True, "host_table_threshold_bytes": HOST_THRESHOLD}
    result = main(config_args({"dataset_dir": str(dataset), "output_dir": str(tmp_path), **flags}))
    assert result.final_metrics["precision"] == "fp16" and result.final_metrics["auc"] > 0.7


def test_export_serves_the_trained_models_probabilities(straight_run, tmp_path: Path) -> None:
    import tensorflow as tf

    from models.dlrm_tf import data, evaluate
    from models.dlrm_tf.export import export, load_serving_model

    result = export(straight_run.output_dir / "model.weights.h5", tmp_path / "export", max_batch_size=1024)
    assert result.max_abs_diff <= 1e-6 and (tmp_path / "export" / "dlrm" / "config.pbtxt").is_file()
    assert 'platform: "tensorflow_savedmodel"' in (tmp_path / "export" / "dlrm" / "config.pbtxt").read_text()
    spec = FeatureSpec.from_yaml(Path(json.loads((straight_run.output_dir / "model_config.json").read_text())
                                      ["train_config"]["dataset_dir"]) / "feature_spec.yaml")
    (numerical, categorical), _ = next(iter(data.eval_batches(data.mapping_files(spec, "test"), 64)))
    served = load_serving_model(Path(result.model_file))(input__0=numerical, input__1=tf.cast(categorical, tf.int64))
    model = evaluate.load_model(straight_run.output_dir / "model.weights.h5")
    expected = tf.sigmoid(model((numerical, categorical))).numpy()
    np.testing.assert_allclose(served["output__0"].numpy()[:, 0], expected, atol=1e-6)


def test_criteo_dlrm_steps_train_evaluate_and_export_with_tensorflow(dataset: Path, tmp_path: Path) -> None:
    import shutil

    from tasks.core.config import Settings
    from tasks.criteo import dlrm as steps
    from tasks.criteo.profiles import PROFILES

    settings = Settings(data_root=tmp_path)
    paths = steps.run_paths(settings, "manual__tf")
    shutil.copytree(dataset, paths.dataset)
    paths.dictionary.mkdir(parents=True)
    (paths.dictionary / "cardinalities.json").write_text(json.dumps({f"cat_{i}": c for i, c in
                                                                     enumerate([40, 25, 12, 8, 300])}))
    knobs = {**PROFILES["demo"], "bottom_mlp": "32,16", "top_mlp": "32,1", "batch_size": 512, "warmup_steps": 5,
             "decay_start_step": 20, "decay_steps": 10, "checkpoint_every_steps": 0, "log_every_steps": 10}
    run = {"knobs": knobs, "device": "cpu", "nproc": 1, "framework": "tensorflow", "train_days": [0], "test_day": 1}
    trained = steps.train(settings, "manual__tf", run)
    assert trained["model_path"].endswith("model.weights.h5") and trained["metrics"]["framework"] == "tensorflow"
    metrics = steps.evaluate(settings, "manual__tf", run, trained)
    # The pipeline's trainer leaves the test rows to evaluate (scored once); test_one_worker_learns_* checks the two agree.
    log = [json.loads(line) for line in (paths.train / "train_log.jsonl").read_text().splitlines()]
    assert "auc" not in trained["metrics"] and "eval" not in {r["kind"] for r in log}
    assert metrics["rows"] == 5_003 and metrics["auc"] > 0.6, metrics  # learned: chance is 0.5
    exported = steps.export(settings, "manual__tf", run)
    assert exported["model_file"].endswith("model.savedmodel")
    with pytest.raises(FileNotFoundError) as missing:  # no dictionary values or gate record in this test
        steps.SPEC.publishable_files(settings, "manual__tf", run)
    assert "model.weights.h5" not in str(missing.value) and "model.pt" not in str(missing.value)
    assert "gate.json" in str(missing.value)
    # Until tasks.criteo.predict loads Keras weights, publish refuses a version it could not score (one line).
    from tasks.core.config import NotAllowed

    names = {name: Path(name) for name in ("model.weights.h5", "model_config.json", "preprocessing.json",
                                           "dictionary/values/part-0.parquet")}
    with pytest.raises(NotAllowed, match=r"cannot publish manual__tf: tasks\.criteo\.predict cannot score"):
        steps.check_scorable(names, "manual__tf", "tensorflow")
    pytorch_names = {**names, "model.pt": Path("model.pt")}
    assert steps.check_scorable(pytorch_names, "manual__pt", "pytorch") == pytorch_names
