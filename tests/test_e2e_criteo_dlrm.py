"""criteo_dlrm end to end through Airflow (dag.test()): ingested synthetic days -> published checkpoint.

The days are ingested with the task functions (the ingest DAG has its own e2e test); the training DAG then runs in
a child process via scripts/run_dag.py with its own AIRFLOW_HOME, data root and publish store.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.core import layout
from tasks.criteo.settings import CriteoSettings
from tasks.core.config import Settings
from tasks.criteo.ingest import day_stats, download_day, validate_day
from tasks.criteo.synthetic import ensure_days
from tests.conftest import airflow_init, airflow_test_env, run_dag

pytestmark = pytest.mark.e2e

ROWS = 20_000
TINY_MODEL = {"profile": "demo", "bottom_mlp": "32,16", "top_mlp": "64,32,1", "batch_size": 1024, "lr": 0.5, "epochs": 3,
              "warmup_steps": 5, "decay_start_step": 30, "decay_steps": 20, "checkpoint_every_steps": 10,
              "log_every_steps": 5, "frequency_threshold": 5, "min_auc": 0.70}


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow")
    data = tmp_path_factory.mktemp("data")
    source = data / "source"
    ensure_days(source, range(3), ROWS, seed=11)
    settings = Settings(data_root=data)
    criteo = CriteoSettings(source=source.as_uri() + "/day_{day}")
    for day in range(3):
        download_day(settings, day, criteo=criteo)
        validate_day(settings, day)
        day_stats(settings, day, spark_master="local[2]")
    return airflow_init(airflow_test_env(home, data))


def run_dlrm(env: dict[str, str], **conf) -> dict:
    return run_dag(env, "criteo_dlrm", {"train_days": "0-1", "test_day": 2, **TINY_MODEL, **conf})


def test_dlrm_trains_evaluates_and_publishes(ingested):
    # A logical date keeps this run in Airflow's database through the later runs (dag.test() replaces an earlier
    # run without one): the next test's retention asks Airflow this run's state, `success`, by its id (with + and :).
    run = run_dag(ingested, "criteo_dlrm", {"train_days": "0-1", "test_day": 2, **TINY_MODEL},
                  logical_date="2026-01-05T00:00:00")
    assert run["state"] == "success", run["log"][-4000:]
    assert set(run["tasks"]) == {"resolve_run", "build_dictionary", "transform", "validate_dataset", "train",
                                 "evaluate", "export", "gate", "publish", "prune"}
    assert all(t["state"] == "success" for t in run["tasks"].values())

    root = Path(ingested["RECFLOW_DATA_ROOT"])
    run_dir = layout.run_dir(root, "criteo_dlrm", run["run_id"])
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["auc"] >= 0.70
    assert metrics["rows"] == ROWS // 2  # test = first half of the test day
    assert (run_dir / "train" / "training_curves.png").stat().st_size > 0

    store = root / "published" / "criteo_dlrm"
    latest = json.loads((store / "latest.json").read_text())
    version_dir = store / "versions" / latest["version"]
    assert {p.name for p in version_dir.iterdir()} >= {"model.pt", "feature_spec.yaml", "metrics.json",
                                                       "lineage.json", "_MANIFEST.json", "dictionary",
                                                       "preprocessing.json", "triton", "gate.json"}
    assert list((version_dir / "dictionary" / "values").glob("*.parquet"))
    assert (version_dir / "triton" / "dlrm" / "config.pbtxt").is_file()
    assert (version_dir / "triton" / "dlrm" / "1" / "model.pt").is_file()
    lineage = json.loads((version_dir / "lineage.json").read_text())
    assert lineage["train_days"] == [0, 1] and lineage["test_day"] == 2
    assert all(lineage["days"][d]["raw"]["sha256"] for d in ("0", "1", "2"))

    # The published checkpoint loads with the safe (weights_only) loader and scores like the evaluation.
    from models.dlrm.evaluate import main as evaluate

    result = evaluate(["--model_path", str(version_dir / "model.pt"), "--dataset_dir", str(run_dir / "dataset"),
                       "--output_dir", str(run_dir / "reeval")])
    assert result.auc == pytest.approx(metrics["auc"], abs=1e-6)
    # --amp takes the trainer's autocast type (auto: bf16 here and on GPUs of compute capability >= 8); fp16 is CUDA's
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        evaluate(["--model_path", str(version_dir / "model.pt"), "--dataset_dir", str(run_dir / "dataset"),
                  "--output_dir", str(run_dir / "reeval-fp16"), "--amp", "--amp_dtype", "fp16"])
    assert not (run_dir / "reeval-fp16").exists()

    # The published version alone scores raw rows: predict on the test day's raw file gives the run's own
    # evaluation scores for the same rows (the test mapping = the first half of the day's rows, in file order),
    # and the TorchScript export gives the eager model's.
    from models.dlrm.data import SplitBinaryDataset
    from models.dlrm.evaluate import load_model_file, predict_dataset
    from tasks.criteo.predict import predict_file
    from tasks.release.steps import fetch_model
    from tasks.formats.feature_spec import FeatureSpec

    model, _ = load_model_file(version_dir / "model.pt")
    spec = FeatureSpec.from_yaml(run_dir / "dataset" / "feature_spec.yaml")
    with SplitBinaryDataset(spec, "test", 4096, drop_last_batch=False) as test_rows:
        expected_labels, expected_logits = predict_dataset(model, test_rows, torch.device("cpu")).arrays()
    local = fetch_model(f"{root / 'published'}/criteo_dlrm", root / "fetched")
    raw_test_day = root / "criteo" / "raw" / "day_2"
    scores = {}
    for engine in ("eager", "torchscript"):
        result = predict_file(local, raw_test_day, root / f"scores_{engine}.tsv", engine=engine,
                              limit_rows=metrics["rows"], with_metrics=True)
        assert result.scored == metrics["rows"] and result.bad == 0
        scores[engine] = np.loadtxt(root / f"scores_{engine}.tsv")
    np.testing.assert_array_equal(scores["eager"][:, 1], expected_labels)
    np.testing.assert_allclose(scores["eager"][:, 2], 1 / (1 + np.exp(-expected_logits.astype(np.float64))),
                               atol=2e-6)
    np.testing.assert_allclose(scores["torchscript"][:, 2], scores["eager"][:, 2], atol=2e-6)
    assert result.metrics["auc"] == pytest.approx(metrics["auc"], abs=1e-6)

    # Progress and rank lines reached the task log as they were printed.
    assert "[rank 0]" in run["log"] and "samples/s" in run["log"]
    assert "gate PASSED" in run["log"]


def test_a_worse_model_is_gated_out_by_scoring_production_on_the_same_rows(ingested):
    """This run preprocesses with the nvtabular engine (NVIDIA's NVTabular workflow, in .venv-nvtabular): its
    dataset is the published Spark-preprocessed run's, byte for byte, and what it would publish carries the fitted
    workflow."""
    root = Path(ingested["RECFLOW_DATA_ROOT"])
    latest = json.loads((root / "published" / "criteo_dlrm" / "latest.json").read_text())
    # Barely trained: clearly worse than production. min_auc=0 so only the same-rows comparison can gate it out (a
    # 2-step model's AUC sits near 0.5 either side, and a threshold failure is decided before any baseline).
    production = json.loads((root / "published" / "criteo_dlrm" / "versions" / latest["version"]
                             / "lineage.json").read_text())["run_id"]
    production_dataset = layout.run_dir(root, "criteo_dlrm", production) / "dataset"
    production_bytes = {p.relative_to(production_dataset): p.read_bytes() for p in production_dataset.rglob("*.bin")}
    # Retention keeps one finished run's dataset here: this run's prune deletes the production run's once Airflow
    # says that run is `success`.
    run = run_dag({**ingested, "RECFLOW_KEEP_RUN_DATASETS": "1"}, "criteo_dlrm",
                  {"train_days": "0-1", "test_day": 2, **TINY_MODEL, "epochs": 1, "limit_train_batches": 2,
                   "min_auc": 0.0, "engine": "nvtabular"})
    run_dir = layout.run_dir(root, "criteo_dlrm", run["run_id"])
    assert len(production_bytes) == 3 * 28 and "[nvtabular fit]" in run["log"]
    assert all((run_dir / "dataset" / f).read_bytes() == data for f, data in production_bytes.items())
    from tasks.criteo.dlrm import publishable_files, run_paths

    settings = Settings(data_root=root)
    # What a writer killed on another worker leaves (kept a day there): not part of the version.
    paths = run_paths(settings, run["run_id"])
    (paths.export / ".tmp-preprocessing.json~other-worker~12~ab").write_text("{")
    (paths.dictionary / "nvt_workflow" / ".tmp-workflow.pkl~other-worker~12~cd").write_bytes(b"")
    files = publishable_files(settings, run["run_id"], {})
    assert "dictionary/nvt_workflow/workflow.pkl" in files and not any(".tmp-" in name for name in files)
    assert run["tasks"]["gate"]["state"] == "success"  # a failed gate is a decision, not a task failure
    assert run["state"] == "success", run["log"][-4000:]
    assert run["tasks"]["publish"]["state"] == "skipped"
    # A run held back by its gate ended well: it is marked finished, and the production run's dataset is gone (its
    # model, metrics and curves stay).
    assert run["tasks"]["prune"]["state"] == "success" and (run_dir / "_FINISHED.json").is_file()
    assert not production_dataset.exists(), [line[:400] for line in run["log"].splitlines() if "prune" in line]
    assert (production_dataset.parent / "train" / "model.pt").is_file()
    assert f"deleted {production_dataset}" in run["log"] and f"of finished run {production}" in run["log"]
    assert "keeps its outputs" not in run["log"] and "is unknown" not in run["log"]
    gate = json.loads((layout.run_dir(root, "criteo_dlrm", run["run_id"]) / "gate" / "gate.json").read_text())
    assert not gate["passed"] and gate["baseline_version"] == latest["version"]
    assert gate["baseline_basis"].startswith(f"production {latest['version']} scored on the same {ROWS // 2} test rows")
    # Scored on the same rows as its own evaluation, the production model's AUC is exactly the one it published.
    assert gate["baseline_auc"] == pytest.approx(latest["metrics"]["auc"], abs=1e-6)
    assert gate["auc"] < gate["baseline_auc"] - 0.005
    # The gate fetched what eager scoring reads, not the TorchScript export (as large as the weights at full size).
    from tasks.criteo.layout import models_cache

    fetched = models_cache(root) / "criteo_dlrm" / latest["version"]
    assert (fetched / "model.pt").is_file() and not (fetched / "triton").exists()
    assert "gate FAILED: auc" in run["log"]


def test_a_run_that_fails_after_the_gate_ends_failed_in_the_registry(ingested):
    """publish_uri outside RECFLOW_PUBLISH_ALLOWED: publish fails on its first try (bad input), and its failure
    callback turns the run the gate registered into `failed` (before, nothing ever set that status)."""
    from tasks.release.registry import Registry

    root = Path(ingested["RECFLOW_DATA_ROOT"])
    run = run_dlrm(ingested, epochs=1, limit_train_batches=3, min_auc=0.0, max_regression=1.0,
                   publish_uri="/srv/elsewhere/models")
    assert run["state"] == "failed", run["log"][-4000:]
    assert run["tasks"]["gate"]["state"] == "success"
    assert run["tasks"]["publish"]["state"] == "failed" and run["tasks"]["publish"]["try_number"] == 1
    # A failed run is not finished: it keeps its dataset for the retry, and prunes nothing.
    assert run["tasks"]["prune"]["state"] == "upstream_failed"
    assert not (layout.run_dir(root, "criteo_dlrm", run["run_id"]) / "_FINISHED.json").exists()
    assert (f"PublishNotAllowed: publish store /srv/elsewhere/models is not under an allowed store "
            f"['{root / 'published'}'] (set RECFLOW_PUBLISH_ALLOWED to allow more)") in run["log"]
    with Registry("sqlite:///" + str(root / "registry.db")) as registry:
        assert registry.get_run("criteo_dlrm", run["run_id"]).status == "failed"
    assert not Path("/srv/elsewhere/models").exists()
