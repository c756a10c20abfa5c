"""byo_dlrm end to end through Airflow (dag.test()): a CSV FeatureSpec with `auto` cardinalities and generated CSVs
with a planted signal -> validated -> transcoded by spark-submit -> trained on 2 torchrun processes -> evaluated ->
gated -> published. The DAG runs in a child process via scripts/run_dag.py with its own AIRFLOW_HOME and data root.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core import layout
from tasks.formats.feature_spec import FeatureSpec
from tests.conftest import airflow_init, airflow_test_env, run_dag

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

ROWS = {"train": 16_000, "test": 4_000}
TINY_MODEL = {"profile": "demo", "bottom_mlp": "16,8", "top_mlp": "32,1", "batch_size": 512, "lr": 0.5, "epochs": 2,
              "checkpoint_every_steps": 20, "log_every_steps": 10, "min_auc": 0.65, "nproc": 2}


@pytest.fixture(scope="module")
def byo_run(tmp_path_factory) -> dict:
    from tasks.byo.demo import write_demo_source

    home, data = tmp_path_factory.mktemp("airflow"), tmp_path_factory.mktemp("data")
    spec_path = write_demo_source(data / "incoming", ROWS["train"], ROWS["test"], seed=9)
    env = airflow_init(airflow_test_env(home, data))
    conf = {"spec_uri": spec_path.as_uri(), **TINY_MODEL}
    return run_dag(env, "byo_dlrm", conf) | {"data": data}


def test_byo_dlrm_validates_transcodes_trains_and_publishes(byo_run):
    run = byo_run
    assert run["state"] == "success", run["log"][-4000:]
    assert set(run["tasks"]) == {"resolve_run", "fetch", "validate", "transcode", "validate_dataset", "train",
                                 "evaluate", "gate", "publish", "prune"}
    assert all(t["state"] == "success" for t in run["tasks"].values())
    root = Path(run["data"])
    run_dir = layout.run_dir(root, "byo_dlrm", run["run_id"])

    spec = FeatureSpec.from_yaml(run_dir / "dataset" / "feature_spec.yaml")
    spec.check_feature_spec()
    cards = spec.get_categorical_sizes()
    assert cards[0] == 10 and cards[3:] == [100, 50, 127] and all(c >= 2 for c in cards[1:3])  # two were 'auto'

    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["rows"] == ROWS["test"]
    assert metrics["auc"] > 0.7, metrics  # the planted signal was learnt, clearly above chance

    store = root / "published" / "byo_dlrm"
    latest = json.loads((store / "latest.json").read_text())
    version = store / "versions" / latest["version"]
    assert {p.name for p in version.iterdir()} >= {"model.pt", "feature_spec.yaml", "source_feature_spec.yaml",
                                                   "metrics.json", "lineage.json", "gate.json", "_MANIFEST.json"}
    lineage = json.loads((version / "lineage.json").read_text())
    assert lineage["spec_uri"].endswith("incoming/feature_spec.yaml") and len(lineage["source_files"]) == 8
    assert "[rank 1]" in run["log"] or "2 training process" in run["log"]
    assert "gate PASSED" in run["log"]
