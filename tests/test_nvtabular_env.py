"""How tasks reach NVTabular's own environment (tasks/core/nvtabular.py): settings, the child's environment, and
the interpreter check. The jobs themselves are tested against the other engines in tests/test_preprocess_arrow.py."""

from __future__ import annotations

import os

import pytest

from tasks.core import nvtabular, settings_registry
from tasks.core.config import REPO_ROOT, choose_engine


def test_settings_are_checked_with_one_line(monkeypatch):
    monkeypatch.setenv(nvtabular.DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="RECFLOW_NVT_DEVICE 'tpu': expected one of cpu, gpu, auto"):
        nvtabular.nvt_device()
    monkeypatch.setenv(nvtabular.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="RECFLOW_NVT_WORKERS 'two'"):
        nvtabular.nvt_workers()
    monkeypatch.setenv(nvtabular.WORKERS_ENV, "-1")
    with pytest.raises(ValueError, match="cannot be negative"):
        nvtabular.nvt_workers()
    monkeypatch.setenv(nvtabular.WORKERS_ENV, "0")
    assert nvtabular.nvt_workers() == 0
    monkeypatch.delenv(nvtabular.WORKERS_ENV)
    assert nvtabular.nvt_workers() == min(os.cpu_count() or 1, 2)


def test_the_child_imports_the_repository_and_hears_no_merlin_noise(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    env = nvtabular.child_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/elsewhere"]
    filters = env["PYTHONWARNINGS"].split(",")
    assert filters[0] == "error::DeprecationWarning" and "ignore:Tensorflow dtype mappings" in filters


def test_a_missing_interpreter_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv(nvtabular.PYTHON_ENV, str(tmp_path / "python"))
    with pytest.raises(nvtabular.NvtEnvironmentMissing, match=r"RECFLOW_NVT_PYTHON=.*run `make nvt-env`"):
        nvtabular.nvt_python()
    monkeypatch.delenv(nvtabular.PYTHON_ENV)
    assert nvtabular.nvt_python() == REPO_ROOT / ".venv-nvtabular" / "bin" / "python"  # make test builds it first


def test_engine_choice_names_where_a_bad_one_came_from(monkeypatch):
    # Settings are read through their declaration: declare this made-up one for the test's duration.
    monkeypatch.setitem(settings_registry._DECLARED, "RECFLOW_X_ENGINE",
                        settings_registry.Setting("RECFLOW_X_ENGINE", "choice", "", "a test's engine setting"))
    monkeypatch.setenv("RECFLOW_X_ENGINE", "dask")
    assert choose_engine("nvtabular", "RECFLOW_X_ENGINE", ("spark", "nvtabular")) == "nvtabular"
    with pytest.raises(ValueError, match="RECFLOW_X_ENGINE 'dask': expected one of spark, nvtabular"):
        choose_engine(None, "RECFLOW_X_ENGINE", ("spark", "nvtabular"))
    with pytest.raises(ValueError, match="engine 'pandas'"):
        choose_engine("pandas", "RECFLOW_X_ENGINE", ("spark", "nvtabular"))
    monkeypatch.delenv("RECFLOW_X_ENGINE")
    assert choose_engine(None, "RECFLOW_X_ENGINE", ("spark", "nvtabular")) == "spark"
