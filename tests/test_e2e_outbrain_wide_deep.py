"""outbrain_ingest and outbrain_wide_deep end to end through Airflow (dag.test()): synthetic Kaggle files ->
validated snapshot -> Spark SQL features -> prebatched TFRecords -> Wide & Deep on 2 tf.distribute workers ->
MAP@12 above a random ranking of the same displays by a margin -> published version -> a ranking of Kaggle's test
displays from it; then a second run gated against the first on the same validation displays.

Each DAG run is a child process (scripts/run_dag.py) with its own AIRFLOW_HOME, data root and publish store. The
public dataset cannot be downloaded here; the synthetic files have Kaggle's format and a planted signal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.outbrain import layout
from tasks.outbrain.synthetic import write_snapshot
from tests.conftest import airflow_init, airflow_test_env, run_dag
from tests.e2e_checks import check_gated_against_production, check_trained_on_two_workers, latest_published

pytestmark = pytest.mark.e2e

DISPLAYS = 4000
# The demo profile, smaller still: a test run trains in seconds.
TINY = {"profile": "demo", "epochs": 3, "tfrecord_shards": 2, "checkpoint_every_steps": 50, "min_map": 0.0}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home, data = tmp_path_factory.mktemp("airflow"), tmp_path_factory.mktemp("data")
    write_snapshot(layout.source_dir(data), displays=DISPLAYS, seed=5, compress="gz")
    return airflow_init(airflow_test_env(home, data))


@pytest.fixture(scope="module")
def ingested(env) -> dict:
    return run_dag(env, "outbrain_ingest", {})


@pytest.fixture(scope="module")
def first_run(env, ingested) -> dict:
    assert ingested["state"] == "success", ingested["log"][-4000:]
    return run_dag(env, "outbrain_wide_deep", {**TINY, "workers": 2})


def test_ingest_validates_every_file_and_announces_a_new_snapshot_once(env, ingested):
    assert ingested["state"] == "success", ingested["log"][-4000:]
    assert {t: s["state"] for t, s in ingested["tasks"].items()} == {
        "download": "success", "validate": "success", "announce": "success", "train_gate": "success"}
    root = Path(env["RECFLOW_DATA_ROOT"])
    report = json.loads((layout.validated_dir(root, "kaggle") / "report.json").read_text())
    assert report["bad_rows"] == 0 and report["good_rows"] == report["rows"] > DISPLAYS * 2
    # The weekly check of an unchanged source: nothing new, so no asset event and no retraining.
    again = run_dag(env, "outbrain_ingest", {})
    assert again["state"] == "success", again["log"][-4000:]
    assert again["tasks"]["announce"]["state"] == again["tasks"]["train_gate"]["state"] == "skipped"


def test_wide_deep_trains_on_two_workers_beats_random_ranking_and_publishes(env, first_run):
    _, metrics = check_trained_on_two_workers(env, first_run, "outbrain_wide_deep")
    assert metrics["displays"] > DISPLAYS * 0.15  # the validation split: ~20% of days 0-10 plus days 11-12
    assert metrics["map@12"] >= metrics["random_map@12"] + 0.08, metrics
    assert metrics["auc"] > 0.6, metrics

    version, files, lineage = latest_published(env, "outbrain_wide_deep")
    assert files >= {"model.weights.h5", "model_config.json", "feature_spec.yaml", "tfrecords/feature_spec.yaml",
                     "stats/numeric.json", "metrics.json", "lineage.json", "gate.json", "training_curves.png"}
    assert any(name.startswith("stats/ctr_counts/") for name in files)
    assert lineage["dataset"] == "kaggle" and lineage["profile"] == "demo" and lineage["workers"] == 2

    # Kaggle's test displays ranked by the published version alone (its own feature statistics).
    root = Path(env["RECFLOW_DATA_ROOT"])
    out = root / "submission.csv"
    proc = subprocess.run([sys.executable, "-m", "tasks.outbrain.predict", "rank", "--model-dir", str(version),
                           "--tables", str(layout.validated_dir(root, "kaggle")), "--out", str(out), "--limit", "2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(shown) == 2 and all(s["scores"] == sorted(s["scores"], reverse=True) for s in shown)
    import pyarrow.dataset as ds

    test = ds.dataset(str(layout.validated_table(root, "kaggle", "clicks_test"))).to_table().to_pandas()
    lines = out.read_text().splitlines()
    assert lines[0] == "display_id,ad_id" and len(lines) - 1 == test.display_id.nunique()
    first_id, first_ads = lines[1].split(",")
    assert sorted(map(int, first_ads.split())) == sorted(test.ad_id[test.display_id == int(first_id)])


def test_a_second_run_is_gated_against_production_on_the_same_displays_and_reuses_features(env, first_run):
    # Only model knobs changed: the same features dataset, found complete.
    production, first_metrics = check_gated_against_production(
        env, first_run, "outbrain_wide_deep", Path(env["RECFLOW_DATA_ROOT"]) / "outbrain" / "features",
        {**TINY, "epochs": 1, "workers": 1, "max_regression": 1.0})
    # The production model scored on this run's validation displays through its own statistics is the first
    # run's model on the same snapshot and split: the same MAP@12 it measured itself.
    assert production["displays"] == first_metrics["displays"]
    assert production["map@12"] == pytest.approx(first_metrics["map@12"], abs=1e-4)
