"""tasks.core.config and tasks.criteo.settings: environment overrides and the Criteo day index of a logical date."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from tasks.core.config import REPO_ROOT, Settings, load_settings
from tasks.criteo.settings import CriteoSettings, criteo_day_index, load_criteo_settings


def test_defaults_with_empty_environment() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.data_root == REPO_ROOT / "data"
    assert settings.bad_row_budget == 0.001
    assert settings.spark_profile == "local"
    assert (settings.profile, settings.train_device, settings.train_nproc) == ("full", "auto", 1)
    criteo = load_criteo_settings({})
    assert criteo == CriteoSettings() and criteo.epoch == date(2026, 1, 1)
    assert criteo.source_template(settings.data_root) == (
        (REPO_ROOT / "data" / "criteo" / "source").as_uri() + "/day_{day}")


def test_environment_overrides(tmp_path: Path) -> None:
    env = {
        "RECFLOW_DATA_ROOT": str(tmp_path / "root"),
        "RECFLOW_CRITEO_EPOCH": "2025-03-01",
        "RECFLOW_CRITEO_SOURCE": "s3://bucket/criteo/day_{day}.gz",
        "RECFLOW_BAD_ROW_BUDGET": "0.05",
        "RECFLOW_SPARK_PROFILE": "gpu",
        "RECFLOW_PROFILE": "demo",
        "RECFLOW_TRAIN_DEVICE": "cuda",
        "RECFLOW_TRAIN_NPROC": "8",
    }
    settings = load_settings(env)
    assert settings.data_root == (tmp_path / "root").resolve()
    assert settings.bad_row_budget == 0.05
    assert settings.spark_profile == "gpu"
    assert (settings.profile, settings.train_device, settings.train_nproc) == ("demo", "cuda", 8)
    criteo = load_criteo_settings(env)
    assert criteo.epoch == date(2025, 3, 1)
    assert criteo.source_template(settings.data_root) == "s3://bucket/criteo/day_{day}.gz"
    # An s3 source adds no local folder to the roots a file:// source may read.
    assert criteo.allowed_file_roots(settings) == (settings.data_root,)


def test_data_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings({"RECFLOW_DATA_ROOT": "rel/data"})
    assert settings.data_root == tmp_path.resolve() / "rel" / "data"
    assert CriteoSettings().source_template(settings.data_root) == (
        (tmp_path.resolve() / "rel" / "data" / "criteo" / "source").as_uri() + "/day_{day}")


def test_empty_values_fall_back_to_defaults() -> None:
    assert load_settings({"RECFLOW_DATA_ROOT": "", "RECFLOW_BAD_ROW_BUDGET": ""}) == Settings()


def test_reads_os_environ_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("RECFLOW_BAD_ROW_BUDGET", "0.25")
    settings = load_settings()
    assert settings.data_root == tmp_path.resolve()
    assert settings.bad_row_budget == 0.25


def test_invalid_values_raise() -> None:
    with pytest.raises(ValueError):
        load_criteo_settings({"RECFLOW_CRITEO_EPOCH": "not-a-date"})
    with pytest.raises(ValueError, match="RECFLOW_TRAIN_DEVICE"):
        load_settings({"RECFLOW_TRAIN_DEVICE": "tpu"})
    with pytest.raises(ValueError):
        load_settings({"RECFLOW_BAD_ROW_BUDGET": "lots"})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().bad_row_budget = 1.0  # type: ignore[misc]


def test_criteo_day_index() -> None:
    epoch = date(2026, 1, 1)
    assert criteo_day_index(epoch, epoch) == 0
    assert criteo_day_index(date(2026, 1, 2), epoch) == 1
    assert criteo_day_index(date(2026, 1, 24), epoch) == 23
    assert criteo_day_index(date(2026, 3, 1), epoch) == 59


def test_criteo_day_index_before_epoch_raises() -> None:
    with pytest.raises(ValueError, match=r"before the Criteo epoch 2026-01-01"):
        criteo_day_index(date(2025, 12, 31), date(2026, 1, 1))


def test_allow_lists_default_to_the_configured_source_store_and_connection(tmp_path: Path) -> None:
    settings = load_settings({"RECFLOW_DATA_ROOT": str(tmp_path)})
    assert settings.allowed_conn_ids == ("aws_default",)
    assert settings.allowed_publish_stores == (str(tmp_path.resolve() / "published"),)
    assert settings.partition_lock_timeout_s == 3600.0
    # A file:// source adds no URL prefix (file roots apply); an http(s)/s3 template allows its own folder only.
    assert CriteoSettings().allowed_source_prefixes(settings) == ()
    mirror = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": "https://mirror.example:8443/criteo/day_{day}.gz?sig=1"})
    assert mirror.allowed_source_prefixes(settings) == ("https://mirror.example:8443/criteo/",)
    bucket = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": "s3://raw-bucket/{day}/day.gz"})
    assert bucket.allowed_source_prefixes(settings) == ("s3://raw-bucket/",)
    s3_store = load_settings({"RECFLOW_PUBLISH_URI": "s3://models/published"})
    assert s3_store.allowed_publish_stores == ("s3://models/published",)


def test_allow_lists_from_the_environment_replace_the_defaults(tmp_path: Path) -> None:
    settings = load_settings({
        "RECFLOW_SOURCE_ALLOWED_PREFIXES": "https://a.example/criteo/, s3://raw-bucket/criteo",
        "RECFLOW_PUBLISH_ALLOWED": f"{tmp_path}/models s3://models",
        "RECFLOW_ALLOWED_CONN_IDS": "aws_default,aws_readonly",
        "RECFLOW_PARTITION_LOCK_TIMEOUT_S": "90",
        "RECFLOW_CRITEO_SOURCE": "https://mirror.example/criteo/day_{day}",
    })
    assert settings.source_allowed_prefixes == ("https://a.example/criteo/", "s3://raw-bucket/criteo")
    mirror = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": "https://mirror.example/criteo/day_{day}"})
    assert mirror.allowed_source_prefixes(settings) == settings.source_allowed_prefixes  # explicit wins
    assert settings.allowed_publish_stores == (f"{tmp_path}/models", "s3://models")
    assert settings.allowed_conn_ids == ("aws_default", "aws_readonly")
    assert settings.partition_lock_timeout_s == 90.0
    with pytest.raises(ValueError, match="RECFLOW_SOURCE_ALLOWED_PREFIXES: 'file:///data'"):
        load_settings({"RECFLOW_SOURCE_ALLOWED_PREFIXES": "file:///data"})


def test_code_version_prefers_the_baked_in_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.core.config import code_version

    monkeypatch.setenv("RECFLOW_CODE_VERSION", "0123abc")
    assert code_version() == "0123abc"
    monkeypatch.delenv("RECFLOW_CODE_VERSION")
    assert code_version()  # the checkout's commit, or 'unknown' without git: never empty
