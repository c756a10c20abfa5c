"""outbrain_wide_deep's decisions without a scheduler: which snapshot a run is about, when an ingest run
announces, when an asset-triggered run has nothing new to train, that the `full` profile is NVIDIA's recipe as the
trainer's own defaults state it, and that bad knobs fail before any work."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.core.config import Settings
from tasks.core.storage import Manifest, write_manifest
from tasks.outbrain import layout
from tasks.outbrain.dagkit import OUTBRAIN_CLICKS, announcement, snapshot_of_run
from tasks.outbrain.profiles import FEATURE_KNOBS, PROFILES
from tasks.outbrain.wide_deep import PIPELINE, features_dir, resolve_run, trainer_config
from tasks.release.runs import SnapshotMissing
from tests.snapshot_runs import check_a_trained_snapshot_is_not_retrained


def test_a_run_names_its_snapshot_by_param_else_by_the_announcing_event():
    event = SimpleNamespace(extra={"dataset": "mirror-2", "snapshot": "abc"})
    events = {OUTBRAIN_CLICKS: [event]}
    assert snapshot_of_run({"params": {"snapshot": "kaggle"}, "triggering_asset_events": events}) == "kaggle"
    assert snapshot_of_run({"params": {"snapshot": None}, "triggering_asset_events": events}) == "mirror-2"
    assert snapshot_of_run({"params": {}}) is None


def test_ingest_announces_only_what_is_new():
    downloaded = {"snapshot": "kaggle", "cached": True}
    validated = {"fingerprint": "f1", "good_rows": 10, "displays": 3, "cached": False}
    assert announcement(downloaded, validated) == {"dataset": "kaggle", "snapshot": "f1", "rows": 10, "displays": 3}
    from airflow.sdk.exceptions import AirflowSkipException

    with pytest.raises(AirflowSkipException, match="nothing new"):
        announcement(downloaded, {**validated, "cached": True})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_root=tmp_path, registry_conn_id="")


def test_training_needs_an_ingested_snapshot(settings: Settings):
    with pytest.raises(SnapshotMissing, match="Outbrain snapshot kaggle is not ingested.*run outbrain_ingest with "
                                              "snapshot=kaggle first"):
        resolve_run(settings, {"profile": "demo", "snapshot": "kaggle"})


def test_an_asset_triggered_run_of_a_snapshot_already_trained_does_nothing(settings: Settings):
    # a new snapshot is new files (another checksum); a run gated out was trained all the same
    run = check_a_trained_snapshot_is_not_retrained(
        settings, resolve_run, PIPELINE, "outbrain", layout.validated_dir(settings.data_root, "kaggle"),
        {"profile": "demo", "snapshot": "kaggle"}, source_key="sha", status="gated_out")
    assert run["window"]["dataset"] == "kaggle" and run["profile"] == "demo" and run["knobs"]["map_k"] == 12


def test_bad_layer_sizes_are_refused_before_any_spark_work(settings: Settings):
    write_manifest(layout.validated_dir(settings.data_root, "kaggle"), Manifest(kind="test", inputs={"sha": "a"}))
    with pytest.raises(ValueError, match="deep hidden units '64,x'"):
        resolve_run(settings, {"profile": "demo", "snapshot": "kaggle", "deep_hidden_units": "64,x"})


def test_runs_that_change_only_model_knobs_share_the_features(settings: Settings):
    write_manifest(layout.validated_dir(settings.data_root, "kaggle"), Manifest(kind="test", inputs={"sha": "a"}))
    base = resolve_run(settings, {"profile": "demo", "snapshot": "kaggle"})
    other_model = resolve_run(settings, {"profile": "demo", "snapshot": "kaggle", "epochs": 9, "deep_lr": 0.1})
    other_split = resolve_run(settings, {"profile": "demo", "snapshot": "kaggle", "split_seed": 5})
    assert features_dir(settings, base) == features_dir(settings, other_model)
    assert features_dir(settings, base) != features_dir(settings, other_split)
    assert "split_seed" in FEATURE_KNOBS and "epochs" not in FEATURE_KNOBS


def test_full_profile_is_the_trainers_own_nvidia_defaults():
    # The trainer's defaults state NVIDIA's TF2 recipe; a scheduled run with no conf must train with the same.
    from models.wide_deep.config import WideDeepConfig

    defaults = WideDeepConfig()
    flags = trainer_config(PROFILES["full"])
    recipe = ("epochs", "global_batch_size", "eval_batch_size", "linear_learning_rate", "deep_learning_rate",
              "deep_warmup_epochs", "deep_hidden_units", "deep_dropout", "embedding_dim", "precision", "xla", "map_k")
    assert set(recipe) <= set(flags)  # the rest (seed, checkpoint interval) are operational, not the recipe
    for name in recipe:
        value = tuple(flags[name]) if isinstance(flags[name], list) else flags[name]
        assert value == getattr(defaults, name), name
    assert flags["embedding_dim"] == 0  # NVIDIA's per-feature dims
    assert PROFILES["full"]["prebatch_size"] == 4096
