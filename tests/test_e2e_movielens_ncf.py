"""movielens_ingest and movielens_ncf end to end through Airflow (dag.test()): a synthetic GroupLens archive ->
validated snapshot -> Spark leave-one-out -> NeuMF on 2 tf.distribute workers -> HR@10 well above random ->
published version -> a recommendation from it; then a second run gated against the first on the same test rows.

Each DAG run is a child process (scripts/run_dag.py) with its own AIRFLOW_HOME, data root and publish store. The
public archive cannot be downloaded here; the synthetic one has GroupLens's format and a planted structure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.movielens import layout
from tasks.movielens.synthetic import write_archive
from tests.conftest import airflow_init, airflow_test_env, run_dag
from tests.e2e_checks import check_gated_against_production, check_trained_on_two_workers, latest_published

pytestmark = pytest.mark.e2e

USERS, ITEMS = 800, 400
# The demo profile, smaller still: a test run trains in seconds.
TINY = {"profile": "demo", "epochs": 4, "batch_size": 2048, "checkpoint_every_steps": 20, "min_hr": 0.25}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home, data = tmp_path_factory.mktemp("airflow"), tmp_path_factory.mktemp("data")
    write_archive(layout.source_dir(data), "ml-20m", users=USERS, items=ITEMS, ratings_per_user=30, seed=5)
    return airflow_init(airflow_test_env(home, data))


@pytest.fixture(scope="module")
def ingested(env) -> dict:
    return run_dag(env, "movielens_ingest", {"dataset": "ml-20m"})


@pytest.fixture(scope="module")
def first_run(env, ingested) -> dict:
    assert ingested["state"] == "success", ingested["log"][-4000:]
    return run_dag(env, "movielens_ncf", {**TINY, "workers": 2})


def test_ingest_validates_and_announces_a_new_snapshot_once(env, ingested):
    assert ingested["state"] == "success", ingested["log"][-4000:]
    assert {t: s["state"] for t, s in ingested["tasks"].items()} == {
        "download": "success", "validate": "success", "announce": "success", "train_gate": "success"}
    # The gate's run of movielens_ncf waits in the queue (dag.test runs no scheduler): what `make demo` removes
    # before it runs movielens_ncf itself, so that a scheduler started on the demo's DB later does not train again.
    [triggered] = ingested["triggered"]
    assert triggered.startswith("snapshot__ml-20m__"), ingested["triggered"]
    summary = json.dumps({"triggered": [triggered]})
    drop = [sys.executable, "-c", "import json, sys; from tasks.dagkit.local_run import drop_triggered_runs as d; "
                                  "runs = [json.loads(sys.argv[1])]; print(d('movielens_ncf', runs)); "
                                  "print(d('movielens_ncf', runs))", summary]
    dropped = subprocess.run(drop, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert dropped.splitlines()[-2:] == [str([triggered]), "[]"], dropped
    root = Path(env["RECFLOW_DATA_ROOT"])
    report = json.loads((layout.validated_dir(root, "ml-20m") / "report.json").read_text())
    assert report["rows"]["good"] >= USERS * 20 and report["rows"]["bad"] == 0
    # The weekly check of an unchanged source: nothing new, so no asset event and no retraining.
    again = run_dag(env, "movielens_ingest", {"dataset": "ml-20m"})
    assert again["state"] == "success", again["log"][-4000:]
    assert again["tasks"]["announce"]["state"] == again["tasks"]["train_gate"]["state"] == "skipped"


def test_ncf_trains_on_two_workers_beats_random_and_publishes(env, first_run):
    _, metrics = check_trained_on_two_workers(env, first_run, "movielens_ncf")
    assert metrics["users"] == USERS
    assert metrics["hr@10"] >= 3 * metrics["random_hr@10"], metrics
    assert metrics["ndcg@10"] >= 3 * metrics["random_ndcg@10"], metrics

    version, files, lineage = latest_published(env, "movielens_ncf")
    assert files >= {
        "model.weights.h5", "model_config.json", "mappings/users.parquet", "mappings/items.parquet", "seen.parquet",
        "feature_spec.yaml", "metrics.json", "lineage.json", "gate.json", "training_curves.png"}
    assert lineage["dataset"] == "ml-20m" and lineage["profile"] == "demo" and lineage["workers"] == 2

    # A recommendation from the published version: raw movie ids, none the user rated in training.
    proc = subprocess.run([sys.executable, "-m", "tasks.movielens.predict", "recommend", "--model-dir", str(version),
                           "--user", "1", "--k", "5"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["user"] == 1 and len(answer["items"]) == 5
    assert answer["scores"] == sorted(answer["scores"], reverse=True)
    import pyarrow.parquet as pq

    users = pq.read_table(version / "mappings" / "users.parquet").to_pandas().set_index("user_id")["user"]
    items = pq.read_table(version / "mappings" / "items.parquet").to_pandas().set_index("item")["item_id"]
    seen = pq.read_table(version / "seen.parquet").to_pandas()
    rated_in_training = set(items[seen.loc[seen.user == users[1], "item"]])
    assert len(rated_in_training) >= 19
    assert not set(answer["items"]) & rated_in_training, "recommended a movie the user rated in training"
    unknown = subprocess.run([sys.executable, "-m", "tasks.movielens.predict", "recommend", "--model-dir",
                              str(version), "--user", str(10 ** 9)], env=env, capture_output=True, text=True,
                             timeout=300)
    assert unknown.returncode == 1 and "not in the model's training snapshot" in unknown.stderr


def test_a_second_run_is_gated_against_production_on_the_same_rows_and_reuses_preprocessing(env, first_run):
    # Only model knobs changed: the same preprocessed dataset, found complete.
    production, first_metrics = check_gated_against_production(
        env, first_run, "movielens_ncf", Path(env["RECFLOW_DATA_ROOT"]) / "movielens" / "preprocessed",
        {**TINY, "epochs": 1, "workers": 1, "max_regression": 1.0})
    # The production model scored on this run's test rows is the first run's model on the same snapshot and
    # negatives: the same HR@10 it measured itself.
    assert production["hr@10"] == pytest.approx(first_metrics["hr@10"], abs=2 / USERS)
    assert production["unknown_users"] == 0 and production["unknown_candidates"] == 0
