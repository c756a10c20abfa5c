"""movielens_ncf's scheduling decisions without a scheduler: which snapshot a run is about (param, else the
announcing asset event), when an ingest run announces, and when an asset-triggered run has nothing new to train."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.core.config import Settings
from tasks.core.storage import Manifest, write_manifest
from tasks.movielens import layout
from tasks.movielens.dagkit import MOVIELENS_RATINGS, announcement, snapshot_of_run
from tasks.movielens.ncf import PIPELINE, resolve_run
from tasks.release.runs import SnapshotMissing
from tests.snapshot_runs import check_a_trained_snapshot_is_not_retrained


def test_a_run_names_its_snapshot_by_param_else_by_the_announcing_event():
    event = SimpleNamespace(extra={"dataset": "ml-1m", "snapshot": "abc"})
    assert snapshot_of_run({"params": {"dataset": "ml-20m"}, "triggering_asset_events": {MOVIELENS_RATINGS: [event]}}) \
        == "ml-20m"
    assert snapshot_of_run({"params": {"dataset": None}, "triggering_asset_events": {MOVIELENS_RATINGS: [event]}}) \
        == "ml-1m"
    assert snapshot_of_run({"params": {"dataset": None}, "triggering_asset_events": {}}) is None
    assert snapshot_of_run({"params": {}}) is None


def test_ingest_announces_only_what_is_new():
    downloaded = {"name": "ml-20m", "md5": "0" * 32, "cached": True}
    validated = {"fingerprint": "f1", "good_rows": 10, "users": 2, "items": 3, "cached": False}
    assert announcement(downloaded, validated) == {"dataset": "ml-20m", "md5": "0" * 32, "snapshot": "f1",
                                                    "rows": 10, "users": 2, "items": 3}
    from airflow.sdk.exceptions import AirflowSkipException

    with pytest.raises(AirflowSkipException, match="nothing new"):
        announcement(downloaded, {**validated, "cached": True})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_root=tmp_path, registry_conn_id="")


def test_training_needs_an_ingested_snapshot(settings: Settings):
    with pytest.raises(SnapshotMissing, match="ml-20m is not ingested.*run movielens_ingest with dataset=ml-20m"):
        resolve_run(settings, {"profile": "demo", "dataset": "ml-20m"})


def test_an_asset_triggered_run_of_a_snapshot_already_trained_does_nothing(settings: Settings):
    # a new snapshot is another archive md5
    run = check_a_trained_snapshot_is_not_retrained(
        settings, resolve_run, PIPELINE, "movielens", layout.validated_dir(settings.data_root, "ml-20m"),
        {"profile": "demo", "dataset": "ml-20m"}, source_key="md5", status="trained")
    assert run["window"]["dataset"] == "ml-20m" and run["profile"] == "demo" and run["knobs"]["min_ratings"] == 20


def test_bad_mlp_sizes_are_refused_before_any_spark_work(settings: Settings):
    write_manifest(layout.validated_dir(settings.data_root, "ml-20m"), Manifest(kind="test", inputs={"md5": "a"}))
    with pytest.raises(ValueError, match="must be even"):
        resolve_run(settings, {"profile": "demo", "dataset": "ml-20m", "mlp": "63,32"})
