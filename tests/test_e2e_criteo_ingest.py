"""criteo_ingest end to end through Airflow itself (dag.test(): real task instances, XCom, retries, SQLite DB).

Each run goes through scripts/run_dag.py in a child process with its own AIRFLOW_HOME and data root.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tasks.criteo import layout as criteo_layout
from tasks.core.storage import read_manifest
from tasks.criteo.synthetic import ensure_days
from tests.conftest import CRITEO_SAMPLE, airflow_init, airflow_test_env, run_dag

pytestmark = pytest.mark.e2e

ROWS = 3000


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow")
    data = tmp_path_factory.mktemp("data")
    source = data / "source"
    ensure_days(source, (0, 1), ROWS, seed=7)
    shutil.copy(CRITEO_SAMPLE, source / "day_2")  # 100 real Criteo rows, no trailing newline
    lines = (source / "day_0").read_bytes().split(b"\n")
    lines[10] = b"2\t" + lines[10].split(b"\t", 1)[1]      # label outside {0,1}
    lines[20] = b"1\t2\t3"                                  # too few fields
    (source / "day_3").write_bytes(b"\n".join(lines))     # 2 bad of 3000 = 0.07% ...
    shutil.copy(source / "day_0", source / "day_5")         # fetched against a wrong checksum
    return airflow_init(airflow_test_env(home, data, RECFLOW_CRITEO_SOURCE=source.as_uri() + "/day_{day}"))


def run_ingest(env: dict[str, str], day: int, **conf) -> dict:
    return run_dag(env, "criteo_ingest", conf, timeout=600, logical_date=f"2026-01-{day + 1:02d}")


def data_root(env) -> Path:
    return Path(env["RECFLOW_DATA_ROOT"])


def test_two_synthetic_days_ingest_with_manifests(airflow_env):
    for day in (0, 1):
        run = run_ingest(airflow_env, day)
        assert run["state"] == "success", run["log"][-3000:]
        assert [run["tasks"][t]["state"] for t in ("download", "validate_raw", "day_stats")] == ["success"] * 3
        assert run["tasks"]["retrain_gate"]["state"] in ("success", "skipped")
        validated = read_manifest(criteo_layout.validated_day(data_root(airflow_env), day))
        stats = read_manifest(criteo_layout.stats_day(data_root(airflow_env), day))
        assert validated["rows"] == {"total": ROWS, "good": ROWS, "bad": 0}
        assert stats["rows"]["good"] == ROWS
        assert any(name.startswith("columnar/") and name.endswith(".parquet") for name in stats["files"])
        assert any(name.startswith("counts/") for name in stats["files"])
        assert all(set(entry) == {"bytes"} for entry in stats["files"].values())  # sizes only: no reader hashes
        assert all(entry.get("sha256") for entry in validated["files"].values())  # the small report keeps its hash
        # parsed once: validate_raw wrote the stats (arrow engine), day_stats found them
        assert stats["extra"]["engine"] == "arrow" and "spark-submit" not in run["log"]


def test_rerun_is_cached_and_deleting_one_output_redoes_only_that(airflow_env):
    root = data_root(airflow_env)
    run = run_ingest(airflow_env, 0)
    assert run["state"] == "success"
    assert run["log"].count("nothing to do") >= 2  # validation and stats both cached
    assert "cached" in run["log"]
    assert "spark-submit" not in run["log"]
    before = read_manifest(criteo_layout.validated_day(root, 0))["created_at"]

    # Stats gone, validation kept: day_stats recomputes them, here with the spark engine (the setting reaches the
    # task from the environment); the default arrow engine's recovery is tests/test_day_stats_arrow.py's.
    shutil.rmtree(criteo_layout.stats_day(root, 0))
    run = run_ingest({**airflow_env, "RECFLOW_CRITEO_DAY_STATS_ENGINE": "spark"}, 0)
    assert run["state"] == "success"
    assert "spark-submit" in run["log"]
    assert read_manifest(criteo_layout.validated_day(root, 0))["created_at"] == before
    stats = read_manifest(criteo_layout.stats_day(root, 0))
    assert stats["rows"]["good"] == ROWS and stats["extra"]["engine"] == "spark"


def test_real_criteo_sample_ingests_cleanly(airflow_env):
    run = run_ingest(airflow_env, 2)
    assert run["state"] == "success", run["log"][-3000:]
    root = data_root(airflow_env)
    assert read_manifest(criteo_layout.validated_day(root, 2))["rows"] == {"total": 100, "good": 100, "bad": 0}
    assert read_manifest(criteo_layout.stats_day(root, 2))["rows"]["good"] == 100


def test_bad_rows_within_budget_are_quarantined(airflow_env):
    run = run_ingest(airflow_env, 3, bad_row_budget=0.001)
    assert run["state"] == "success", run["log"][-3000:]
    out = criteo_layout.validated_day(data_root(airflow_env), 3)
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["field"]) for q in quarantined] == [(11, 1), (21, 0)]
    assert read_manifest(criteo_layout.stats_day(data_root(airflow_env), 3))["rows"]["good"] == ROWS - 2


def test_bad_rows_over_budget_fail_validation_without_retry_or_downstream(airflow_env):
    root = data_root(airflow_env)
    shutil.rmtree(criteo_layout.validated_day(root, 3), ignore_errors=True)
    shutil.rmtree(criteo_layout.stats_day(root, 3), ignore_errors=True)
    # No budget in the conf: the form's empty field takes the deployment's RECFLOW_BAD_ROW_BUDGET (0.01%).
    run = run_dag({**airflow_env, "RECFLOW_BAD_ROW_BUDGET": "0.0001"}, "criteo_ingest", {"day": 3}, timeout=600)
    assert run["state"] == "failed"
    assert run["tasks"]["download"]["state"] == "success"
    assert run["tasks"]["validate_raw"]["state"] == "failed"
    assert run["tasks"]["validate_raw"]["try_number"] == 1  # bad data is not retried
    assert run["tasks"]["day_stats"]["state"] == "upstream_failed"
    assert "DataQualityError: day_3: 2 bad rows of 3000 (0.067% > budget 0.010%)" in run["log"]
    assert "line 11, field 1 (label), column 1" in run["log"]
    out = criteo_layout.validated_day(root, 3)
    assert (out / "report.json").exists() and (out / "quarantine.jsonl").exists()
    assert read_manifest(out) is None
    assert not criteo_layout.stats_day(root, 3).exists()


def test_source_url_outside_the_allow_list_fails_download_without_retry(airflow_env):
    """A trigger form may name a source URL; one outside RECFLOW_SOURCE_ALLOWED_PREFIXES (default: the configured
    source's folder, none for this file:// source) is bad input: download fails on its first try, nothing is fetched."""
    root = data_root(airflow_env)
    run = run_ingest(airflow_env, 4, source_url="https://evil.example/day_4")
    assert run["state"] == "failed"
    assert run["tasks"]["download"]["state"] == "failed"
    assert run["tasks"]["download"]["try_number"] == 1  # bad input is not retried
    assert run["tasks"]["validate_raw"]["state"] == "upstream_failed"
    assert ("SourceNotAllowed: source https://evil.example/day_4 is not under an allowed prefix [] "
            "(set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)") in run["log"]
    assert not criteo_layout.raw_day(root, 4).exists() and not criteo_layout.validated_day(root, 4).exists()


def test_a_wrong_expected_checksum_fails_download_without_retry(airflow_env):
    """A retry would fetch the whole day again (the mismatch deletes it) to the same end; so would a re-download."""
    root = data_root(airflow_env)
    run = run_ingest(airflow_env, 5, expected_sha256="0" * 64)
    assert run["state"] == "failed"
    assert (run["tasks"]["download"]["state"], run["tasks"]["download"]["try_number"]) == ("failed", 1)
    assert run["tasks"]["validate_raw"]["state"] == "upstream_failed"
    assert "ChecksumMismatch: sha256 mismatch for " in run["log"] and f"expected {'0' * 64}, got " in run["log"]
    assert not criteo_layout.raw_day(root, 5).exists()
