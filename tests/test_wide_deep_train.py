"""Wide & Deep training: learns a planted signal (MAP@12 well above the random ranking), evaluates the saved model
to the same numbers, resumes exactly after a stop, runs mixed precision (bf16 on CPU) with XLA, trains as 2
TensorFlow worker processes through tasks.core.launch, and reads the CLI the way both callers write it."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from models.wide_deep import evaluate  # noqa: E402
from models.wide_deep.data import block_rows, make_dataset, read_spec  # noqa: E402
from models.wide_deep.metrics import map_at_k  # noqa: E402
from models.wide_deep.train import main, parse_args  # noqa: E402
from tasks.core.launch import config_args, train_with_tf_workers  # noqa: E402
from tests.wide_deep_fakes import make_planted_tfrecords  # noqa: E402

TINY = {"global_batch_size": 512, "eval_batch_size": 1000, "embedding_dim": 4, "deep_hidden_units": [32, 32],
        "linear_learning_rate": 0.1, "deep_learning_rate": 0.01, "deep_warmup_epochs": 1, "log_every_steps": 20,
        "intra_op_threads": 1, "inter_op_threads": 1}


def _args(dataset: Path, out: Path, **overrides) -> list[str]:
    return ["--dataset_dir", str(dataset), "--output_dir", str(out), *config_args({**TINY, **overrides})]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_planted_tfrecords(tmp_path_factory.mktemp("wide_deep"))


@pytest.fixture(scope="module")
def straight_run(dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("wd_straight")
    return main(_args(dataset, out, epochs=4)), out


def test_learns_the_planted_signal_and_writes_its_outputs(straight_run):
    result, out = straight_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert result.steps == 4 * 19 and metrics["steps_per_epoch"] == 19  # 10116 train rows // 512
    assert metrics["map@12"] > metrics["random_map@12"] + 0.15 and metrics["auc"] > 0.75, metrics
    assert metrics["rows"] == 2388 and metrics["displays"] == 600 and 0 < metrics["logloss"] < 0.6
    assert [r["epoch"] for r in metrics["history"]] == [0, 1, 2, 3]
    for name in ("model.weights.h5", "model_config.json", "training_curves.png", "train_log.jsonl"):
        assert (out / name).is_file(), name
    config = json.loads((out / "model_config.json").read_text())
    assert config["architecture"] == "wide_deep" and config["model"]["hidden_units"] == [32, 32]


def test_evaluate_cli_reproduces_the_training_metrics_over_split_displays(straight_run, dataset: Path,
                                                                          tmp_path: Path):
    _, out = straight_run
    result = evaluate.main(["--model_path", str(out / "model.weights.h5"), "--dataset_dir", str(dataset),
                            "--mapping", "test", "--eval_batch_size", "333", "--output_dir", str(tmp_path)])
    trained = json.loads((out / "metrics.json").read_text())
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert {"map@12", "auc", "logloss", "random_map@12", "rows", "displays"} <= set(written)
    for key in ("map@12", "random_map@12", "auc", "logloss"):
        assert written[key] == pytest.approx(trained[key], abs=1e-6), key
    # the same number from every row at once (batches of 333 and the file boundary both split displays)
    model, spec = evaluate.load_model(out / "model.weights.h5"), read_spec(dataset)
    ids, scores, labels = [], [], []
    for features, batch_labels, display_ids in make_dataset(spec, "test", 10_000, with_display_id=True):
        ids.append(display_ids.numpy()), scores.append(model(features).numpy()), labels.append(batch_labels.numpy())
    whole = map_at_k(np.concatenate(ids), np.concatenate(scores), np.concatenate(labels), 12)
    assert result.metrics["map@12"] == pytest.approx(whole.map, abs=1e-6)


def test_stopped_run_resumes_from_its_checkpoint_and_ends_like_a_straight_run(straight_run, dataset: Path,
                                                                               tmp_path: Path, capsys):
    straight, straight_out = straight_run
    args = _args(dataset, tmp_path, epochs=4, checkpoint_every_steps=10)
    stopped = main([*args, "--stop_after_steps", "30"])
    assert stopped.stopped and stopped.steps == 30 and not (tmp_path / "metrics.json").exists()
    resumed = main(args)
    assert "resumed from step 30" in capsys.readouterr().out
    assert resumed.resumed_from_step == 30 and resumed.steps == straight.steps
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    expected = json.loads((straight_out / "metrics.json").read_text())
    # shuffling and dropout depend only on (seed, epoch/step) and both optimizers' slots are checkpointed
    assert metrics["map@12"] == pytest.approx(expected["map@12"], abs=1e-3)
    assert metrics["final_train_loss"] == pytest.approx(expected["final_train_loss"], rel=1e-3)
    assert metrics["resumed_from_step"] == 30 and [r["epoch"] for r in metrics["history"]] == [0, 1, 2, 3]
    # the epoch the stop cut carries its loss over the resume: every epoch's loss is the straight run's
    assert [r["loss"] for r in metrics["history"]] == pytest.approx([r["loss"] for r in expected["history"]],
                                                                    rel=1e-4)


def test_amp_runs_bf16_on_cpu_with_xla(dataset: Path, tmp_path: Path):
    import keras

    result = main(_args(dataset, tmp_path, epochs=1, limit_train_batches=6, precision="amp", xla=True))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert result.steps == 6 and metrics["precision"] == "bf16" and metrics["xla"] is True
    assert 0 < metrics["final_train_loss"] < 1 and keras.config.dtype_policy().name == "float32"  # restored


def test_fp16_loss_scaling_wraps_both_optimizers(dataset: Path, tmp_path: Path, monkeypatch):
    # what --precision amp means on a GPU, run on CPU: one LossScaleOptimizer around the FTRL + RMSProp pair
    from models.wide_deep import train as train_module

    monkeypatch.setattr(train_module, "resolve_precision", lambda precision: "fp16")
    result = main(_args(dataset, tmp_path, epochs=1, limit_train_batches=6, precision="amp"))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert result.steps == 6 and metrics["precision"] == "fp16" and 0 < metrics["final_train_loss"] < 1


def test_two_workers_through_the_launcher(straight_run, dataset: Path, tmp_path: Path, caplog):
    caplog.set_level(logging.INFO, logger="tasks.core.process")
    config = {**TINY, "epochs": 2, "checkpoint_every_steps": 5}
    result = train_with_tf_workers("models.wide_deep.train", dataset, tmp_path, config, workers=2)
    lines = "\n".join(r.getMessage() for r in caplog.records)
    finished = dict(re.findall(r"\[worker (\d)\] \[rank \d\] worker \d/2 finished: (\d+) steps", lines))
    # 3 files over 2 workers: sharded by record, about half the rows each; both run the smaller shard's steps
    spec = read_spec(dataset)
    per_epoch = min(int(block_rows(spec, "train", index, 2).sum()) for index in (0, 1)) // 256
    assert per_epoch >= 17 and finished == {"0": str(2 * per_epoch), "1": str(2 * per_epoch)}, lines[-2000:]
    assert result["metrics"]["workers"] == 2 and Path(result["model_path"]).is_file()
    one_worker = json.loads((straight_run[1] / "metrics.json").read_text())
    assert set(result["metrics"]) == set(one_worker)
    assert result["metrics"]["map@12"] > result["metrics"]["random_map@12"] + 0.05
    assert not list(tmp_path.glob(".tmp-checkpoints-worker*"))


def test_trains_on_records_written_by_the_tfrecord_writer(tmp_path: Path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from tasks.formats.tfrecord import RecordLayout, write_tfrecords
    from tests.wide_deep_fakes import (DISPLAY_ID, LABEL, MULTIHOT, NUMERICAL, ONEHOT, feature_spec,
                                       planted_rows)

    layout = RecordLayout(int64=[*ONEHOT, DISPLAY_ID], multihot={n: h for n, (_, h) in MULTIHOT.items()},
                          float32=[*NUMERICAL, LABEL])
    files = {}
    for split, displays, seed, shuffle in (("train", 2500, 0, 5), ("valid", 600, 2, None)):
        rows = planted_rows(displays, seed, first_display=1 + seed * 10_000)
        columns = {name: values for name, values in rows.items() if name not in MULTIHOT}
        columns.update({name: pa.array([[int(v) for v in row if v >= 0] for row in rows[name]], pa.list_(pa.int64()))
                        for name in MULTIHOT})
        (tmp_path / "parquet" / split).mkdir(parents=True)
        pq.write_table(pa.table(columns), tmp_path / "parquet" / split / "part-00000.parquet")
        written = write_tfrecords(tmp_path / "parquet" / split, tmp_path / "tfrecords" / split, layout,
                                  prebatch_size=256, shards=2, shuffle_seed=shuffle)
        files[split] = [f"{split}/{name}" for name in written["files"]]
    dataset = tmp_path / "tfrecords"
    (dataset / "feature_spec.yaml").write_text(yaml.safe_dump(feature_spec(files["train"], files["valid"], 256)))
    main(_args(dataset, tmp_path / "run", epochs=3))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["rows"] == 2388 and metrics["map@12"] > metrics["random_map@12"] + 0.15, metrics


def test_cli_reads_both_flag_styles():
    base = ["--dataset_dir", "d", "--output_dir", "o"]
    assert parse_args([*base, "--xla", "1"]).xla is True and parse_args([*base, "--xla", "0"]).xla is False
    assert parse_args([*base, "--xla"]).xla is True and parse_args([*base, "--no-xla"]).xla is False
    assert parse_args([*base, "--deep_hidden_units", "64,32"]).deep_hidden_units == (64, 32)
    assert parse_args([*base, "--deep_hidden_units", "64", "32"]).deep_hidden_units == (64, 32)
    dims = {"ad_id": 8, "platform": 2}
    assert parse_args([*base, "--embedding_dims", json.dumps(dims)]).embedding_dims == dims
    assert parse_args([*base, *config_args({"embedding_dims": dims})]).embedding_dims == dims  # str(dict)
    defaults = parse_args(base)
    assert (defaults.global_batch_size, defaults.epochs, defaults.deep_hidden_units, defaults.map_k) == \
        (131072, 20, (1024,) * 5, 12)
    with pytest.raises(SystemExit):
        parse_args([*base, "--precision", "fp64"])


def test_a_saved_model_loads_the_same_whatever_order_its_feature_dicts_are_in(tmp_path: Path):
    # model_config.json is written with sorted keys; the trainer built the model from the FeatureSpec's order.
    from models.wide_deep.model import WideDeepModelConfig, build_model, dummy_features

    config = WideDeepModelConfig(onehot={"b": 7, "a": 5}, multihot={"z": 9, "y": 4}, hotness={"z": 2, "y": 3},
                                 numerical=("n",), embedding_dims={"a": 3, "b": 2, "y": 4, "z": 3},
                                 hidden_units=(8,), dropout=0.0)
    model = build_model(config)
    for variable in model.weights:  # distinct values everywhere, so a swapped table cannot go unnoticed
        variable.assign(np.random.default_rng(len(variable.path)).normal(size=variable.shape).astype("float32"))
    evaluate.save_model(tmp_path, model, {}, step=1)
    loaded = evaluate.load_model(tmp_path / evaluate.MODEL_WEIGHTS_FILE)
    assert list(loaded.config.onehot) == ["a", "b"]  # read back in another order than it was built in
    rng = np.random.default_rng(0)
    features = dummy_features(config, 6)
    features.update({"a": rng.integers(0, 5, (6, 1)), "b": rng.integers(0, 7, (6, 1)),
                     "y": rng.integers(-1, 4, (6, 3)), "z": rng.integers(-1, 9, (6, 2)),
                     "n": rng.normal(size=(6, 1)).astype("float32")})
    np.testing.assert_allclose(loaded(features).numpy(), model(features).numpy(), rtol=1e-6)
