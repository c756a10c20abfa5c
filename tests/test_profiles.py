"""criteo_dlrm's configuration: one home for its knobs (tasks/criteo/profiles.py), named profiles, the form's
params, how a run resolves them, and a learning-rate schedule that never stops learning early at full scale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from models.dlrm.config import DlrmConfig
from tasks.core.config import Settings
from tasks.byo import profiles as byo
from tasks.core.profiles import Knob, ProfileError, check_profiles, layer_sizes, resolve_knobs
from tasks.core.storage import Manifest, write_manifest
from tasks.criteo import layout
from tasks.criteo.dlrm import model_config, resolve_run
from tasks.criteo.profiles import KNOBS, MODEL_KNOBS, PROFILES

# Criteo 1TB: 4,373,472,329 rows over 24 days (NVIDIA's README), i.e. ~182M rows a day.
CRITEO_ROWS_PER_DAY = 4_373_472_329 // 24


def full_run_steps(days: int) -> int:
    knobs = PROFILES["full"]
    return days * CRITEO_ROWS_PER_DAY // knobs["batch_size"] * knobs["epochs"]


@pytest.mark.parametrize("days", [2, 24, 60])
def test_full_profile_schedule_learns_until_the_last_step_on_any_window(days):
    config = DlrmConfig(**model_config(PROFILES["full"], device="cpu"))
    total = full_run_steps(days)
    schedule = config.schedule(total)
    factors = [schedule.factor(step) for step in range(total)]
    assert min(factors[:-1]) > 0, f"lr reaches 0 before the last of {total} steps"
    # NVIDIA's shape, scaled: warmup to the full rate, a plateau, then decay that ends on the run's last step.
    assert schedule.warmup_steps >= 1 and max(factors) == 1.0
    assert schedule.decay_start_step + schedule.decay_steps == total
    assert schedule.warmup_steps / total == pytest.approx(8000 / 72000, rel=0.01)
    assert factors[-1] == 0.0 and factors[total // 2] == 1.0


def test_fixed_schedule_that_would_stop_learning_is_refused_before_training():
    config = DlrmConfig(**{**model_config(PROFILES["full"], device="cpu"), "schedule_scaling": "fixed"})
    total = full_run_steps(60)  # 166k steps: NVIDIA's 72k-step schedule would leave lr at 0 for 94k of them
    with pytest.raises(ValueError, match=r"reaches 0 at step 71999 of a \d+-step run"):
        config.schedule(total)
    assert config.schedule(72_000).first_zero_step() == 71_999  # a run of exactly NVIDIA's length is fine


def test_every_profile_sets_every_knob_and_no_other():
    check_profiles(KNOBS, PROFILES)
    assert set(PROFILES) == {"demo", "full"}
    with pytest.raises(ProfileError, match=r"profile 'bad': missing knobs \['lr'\]"):
        check_profiles({"lr": Knob({"type": "number"}, "rate")}, {"bad": {}})


def test_full_profile_is_nvidias_recipe_and_the_trainers_defaults():
    full = PROFILES["full"]
    assert (full["batch_size"], full["lr"], full["warmup_steps"], full["decay_start_step"], full["decay_steps"]) == (
        65536, 24.0, 8000, 48000, 24000)
    assert (full["window_days"], full["frequency_threshold"]) == (23, 15)
    # The trainer's CLI defaults are the same recipe, so a trainer run by hand matches a scheduled retrain.
    defaults = DlrmConfig()
    for name in MODEL_KNOBS:
        assert getattr(defaults, name) == full[name], name
    fields = {f.name for f in dataclasses.fields(DlrmConfig)}
    assert set(MODEL_KNOBS) <= fields
    assert (layer_sizes(full["bottom_mlp"]), layer_sizes(full["top_mlp"])) == (
        list(defaults.bottom_mlp_sizes), list(defaults.top_mlp_sizes))
    # byo_dlrm shows the same DLRM knobs (less TorchRec's sharding) with the same full-size values: one home.
    assert byo.KNOBS == {name: knob for name, knob in KNOBS.items() if name in byo.KNOBS}
    assert set(KNOBS) - set(byo.KNOBS) == {"window_days", "frequency_threshold", "threshold_overrides",
                                           "dictionary_days", "sharding"}
    assert byo.MODEL_KNOBS == tuple(name for name in MODEL_KNOBS if name != "sharding")
    assert all(byo.PROFILES["full"][name] == full[name] for name in (*byo.MODEL_KNOBS, "bottom_mlp", "top_mlp"))


def test_params_override_single_knobs_and_empty_means_the_profile():
    params = {name: None for name in KNOBS} | {"lr": 0.5, "epochs": 3}
    values = resolve_knobs(KNOBS, PROFILES, "demo", params)
    assert values == {**PROFILES["demo"], "lr": 0.5, "epochs": 3}
    with pytest.raises(ProfileError, match="unknown profile 'huge'"):
        resolve_knobs(KNOBS, PROFILES, "huge", params)


def test_form_shows_every_knob_as_nullable_with_each_profiles_value():
    from tasks.dagkit import knob_params

    params = knob_params(KNOBS, PROFILES)
    assert set(params) == set(KNOBS)
    lr = params["lr"]
    assert lr.value is None and lr.schema["type"] == ["null", "number"]
    assert "demo: 1.0" in lr.description and "full: 24.0" in lr.description
    assert params["dictionary_days"].schema["enum"] == [None, "train", "all"]


def _ingest_marker(root: Path, days: range) -> None:
    for day in days:
        out = layout.stats_day(root, day)
        out.mkdir(parents=True)
        write_manifest(out, Manifest(kind="criteo_day_stats", inputs={"day": day}))


def test_a_run_without_conf_uses_the_deployments_profile_device_and_processes(tmp_path):
    _ingest_marker(tmp_path, range(30))
    deployment = Settings(data_root=tmp_path, profile="full", train_device="cuda", train_nproc=8)
    run = resolve_run(deployment, {})  # what a scheduled / asset-triggered run passes
    assert run["profile"] == "full" and run["knobs"] == PROFILES["full"]
    assert (run["device"], run["nproc"]) == ("cuda", 8)
    assert run["test_day"] == 29 and run["train_days"] == list(range(6, 29))  # NVIDIA's 23 train days
    demo = resolve_run(Settings(data_root=tmp_path, profile="demo"), {"nproc": 2, "batch_size": 512})
    assert demo["train_days"] == [27, 28] and demo["nproc"] == 2 and demo["knobs"]["batch_size"] == 512
    assert demo["device"] == "auto"


def test_bad_mlp_sizes_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="must end in 1"):
        resolve_run(Settings(data_root=tmp_path, profile="demo"), {"top_mlp": "64,32"})
