"""The model registry (tasks/release/registry.py + sql/registry/) against a SQLite file and the PostgreSQL server here.

Every behavioural test runs on both backends. The PostgreSQL variant gets a fresh schema per test (dropped after),
is marked `integration`, and is skipped with the reason only when 127.0.0.1:5432 does not answer. That includes
migration 002 (runs keyed by pipeline, the data window as JSON): a database built at schema 001 with rows written the
way 001's code wrote them is migrated and read back through today's API.
"""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import queue
import random
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, make_url, text
from sqlalchemy.exc import IntegrityError, OperationalError

import tasks.release.registry as registry_module
from tasks.release.registry import (RUN_STATUSES, SQL_DIR, ModelOwnedElsewhere, NamedQuery, Registry, RegistryConflict,
                                    RegistryError, registry_url_from_connection)
from tests.servers import free_port

PG_URL = os.environ.get("RECFLOW_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
ALL_MIGRATIONS = [1, 2, 3]
PIPELINE = "criteo_dlrm"  # the pipeline 002 assigns to the runs and versions written before it
WINDOW = {"train_days": [0, 1, 2], "test_day": 3}


@functools.lru_cache(maxsize=1)
def _postgres_unreachable() -> str | None:
    """Why PostgreSQL cannot be used, or None if it answers."""
    engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        return str(exc.orig).strip().splitlines()[0]
    finally:
        engine.dispose()
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a fresh, uniquely named schema in database `test`; the schema is dropped after."""
    reason = _postgres_unreachable()
    if reason:
        pytest.skip(f"PostgreSQL at {make_url(PG_URL).render_as_string()} is unreachable: {reason}")
    schema = f"recflow_registry_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))  # identifier made here, not user input
    try:
        url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def registry_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry' / 'registry.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    with Registry(registry_url) as reg:
        reg.migrate()
        yield reg


def _register(reg: Registry, run_id: str, model_name: str = "dlrm", pipeline: str = PIPELINE) -> None:
    reg.register_run(pipeline, model_name, run_id, dataset="criteo", window=WINDOW, config_hash="cfg1")


def _record(reg: Registry, version: str, model_name: str = "dlrm", auc: float = 0.8) -> None:
    reg.record_version(model_name, version, None, f"file:///published/{version}", {"auc": auc})


def test_migrate_twice_is_idempotent_also_when_concurrent(registry_url: str):
    results: list[list[int]] = []
    registries = [Registry(registry_url) for _ in range(4)]
    threads = [threading.Thread(target=lambda r=r: results.append(r.migrate())) for r in registries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [[], [], [], ALL_MIGRATIONS]  # exactly one applied the migrations

    reg = registries[0]
    _register(reg, "run-1")
    assert reg.migrate() == [] and Registry(registry_url).migrate() == []
    assert reg.get_run(PIPELINE, "run-1").status == "registered"  # data survives a second migrate
    for r in registries:
        r.close()


def test_register_statuses_and_production_metrics(registry: Registry):
    run_id, window = "scheduled__2026-01-05", {"train_days": [0, 1], "test_day": 2}
    run = registry.register_run(PIPELINE, "dlrm", run_id, dataset="criteo", window=window, config_hash="abc123",
                                artifact_uri="file:///runs/1")
    assert (run.pipeline, run.status, run.window, run.metrics) == (PIPELINE, "registered", window, None)
    again = registry.register_run(PIPELINE, "dlrm", run_id, dataset="criteo",
                                  window={"test_day": 2, "train_days": (0, 1)}, config_hash="abc123")
    assert again.id == run.id  # a retried registration is a no-op (the window compares as JSON)
    with pytest.raises(RegistryConflict, match=r"config_hash \('abc123', not 'other'\)"):
        registry.register_run(PIPELINE, "dlrm", run_id, dataset="criteo", window=window, config_hash="other")
    with pytest.raises(RegistryConflict, match=r"of pipeline 'criteo_dlrm' .* different window"):
        registry.register_run(PIPELINE, "dlrm", run_id, dataset="criteo", window={"train_days": [0], "test_day": 2},
                              config_hash="abc123")
    with pytest.raises(ValueError, match="must be a mapping"):
        registry.register_run(PIPELINE, "dlrm", "other-run", dataset="criteo", window=[0, 1], config_hash="abc123")

    assert registry.production_metrics("dlrm") is None  # nothing published: the gate compares with nothing
    trained = registry.set_run_status(PIPELINE, run_id, "trained", {"auc": 0.81, "logloss": 0.45})
    assert trained.status == "trained" and trained.metrics == {"auc": 0.81, "logloss": 0.45}
    assert registry.set_run_status(PIPELINE, run_id, "published").metrics == {"auc": 0.81, "logloss": 0.45}

    assert registry.record_version("dlrm", "v1", run_id, "file:///pub/v1", trained.metrics, pipeline=PIPELINE)
    assert not registry.record_version("dlrm", "v1", run_id, "file:///pub/v1", trained.metrics, pipeline=PIPELINE)
    with pytest.raises(RegistryConflict, match="immutable"):
        registry.record_version("dlrm", "v1", run_id, "file:///pub/v1", {"auc": 0.9}, pipeline=PIPELINE)
    with pytest.raises(ModelOwnedElsewhere, match="'dlrm' belongs to pipeline 'criteo_dlrm'"):
        registry.record_version("dlrm", "v1", run_id, "file:///pub/v1", trained.metrics, pipeline="other_pipeline")
    with pytest.raises(ValueError, match="give both or neither"):
        registry.record_version("dlrm", "v2", run_id, "file:///pub/v2", trained.metrics)  # run id without pipeline
    assert registry.production_metrics("dlrm") is None  # recorded is not yet promoted
    assert registry.promote("dlrm", "v1")
    assert registry.production_metrics("dlrm") == {"auc": 0.81, "logloss": 0.45}
    assert registry.production_metrics("dlrm", alias="canary") is None

    _register(registry, "manual__2", model_name="dlrm")
    registry.set_run_status(PIPELINE, "manual__2", "gated_out", {"auc": 0.70})
    [entry] = registry.history("dlrm")
    assert (entry["version"], entry["run_status"], entry["aliases"]) == ("v1", "published", ["latest"])
    assert (entry["pipeline"], entry["run_id"], entry["dataset"], entry["config_hash"]) == (
        PIPELINE, run_id, "criteo", "abc123")
    assert entry["window"] == window and entry["metrics"]["auc"] == 0.81

    with pytest.raises(RegistryError, match="'nope' of pipeline 'criteo_dlrm' is not registered"):
        registry.set_run_status(PIPELINE, "nope", "trained")
    assert registry.get_run(PIPELINE, "nope") is None and registry.get_run("other_pipeline", run_id) is None


def test_same_run_id_under_two_pipelines_is_two_runs(registry: Registry):
    run_id = "scheduled__2026-01-05T06:00:00+00:00"  # every weekly DAG has a run with this id
    ctr = registry.register_run(PIPELINE, "dlrm", run_id, dataset="criteo", window=WINDOW, config_hash="c1")
    other_window = {"start": "2016-06-14", "end": "2016-06-20", "holdout": "2016-06-21"}
    other = registry.register_run("outbrain_dlrm", "dlrm", run_id, dataset="outbrain", window=other_window,
                                  config_hash="o1")
    assert ctr.id != other.id and (other.pipeline, other.window) == ("outbrain_dlrm", other_window)
    registry.set_run_status("outbrain_dlrm", run_id, "gated_out", {"auc": 0.6})
    assert registry.get_run(PIPELINE, run_id).status == "registered"  # the other pipeline's run is untouched
    registry.set_run_status(PIPELINE, run_id, "published", {"auc": 0.8})

    registry.record_version("dlrm", "v1", run_id, "file:///pub/v1", {"auc": 0.8}, pipeline=PIPELINE)
    with pytest.raises(ModelOwnedElsewhere):  # the name belongs to its first publisher's pipeline
        registry.record_version("dlrm", "v2", run_id, "file:///pub/v2", {"auc": 0.6}, pipeline="outbrain_dlrm")
    registry.record_version("dlrm_outbrain", "v2", run_id, "file:///pub/v2", {"auc": 0.6}, pipeline="outbrain_dlrm")
    registry.record_version("dlrm", "v3", None, "file:///pub/v3", {"auc": 0.7})  # imported: no run
    history = {e["version"]: e for e in registry.history("dlrm")}
    assert [(e["pipeline"], e["dataset"], e["window"], e["run_status"]) for e in history.values()] == [
        (PIPELINE, "criteo", WINDOW, "published"), (None, None, None, None)]
    [theirs] = registry.history("dlrm_outbrain")
    assert (theirs["pipeline"], theirs["dataset"], theirs["window"]) == ("outbrain_dlrm", "outbrain", other_window)


def test_promote_older_version_does_not_move_latest(registry: Registry):
    for version in ("20260105T000000Z-b", "20260104T000000Z-a", "20260106T000000Z-c"):
        _record(registry, version)
    assert registry.promote("dlrm", "20260105T000000Z-b")
    assert not registry.promote("dlrm", "20260104T000000Z-a")
    assert not registry.promote("dlrm", "20260105T000000Z-b")  # already there: not a move
    assert registry.alias("dlrm")["version"] == "20260105T000000Z-b" and registry.alias("dlrm")["revision"] == 1
    assert registry.promote("dlrm", "20260106T000000Z-c")
    assert registry.alias("dlrm")["revision"] == 2

    # Code-point order, as in tasks/release/publish.py: '-' sorts before '_' (a locale collation may say otherwise).
    _record(registry, "x-b", model_name="m2")
    _record(registry, "x_a", model_name="m2")
    assert registry.promote("m2", "x-b") and registry.promote("m2", "x_a")
    assert registry.alias("m2")["version"] == "x_a"
    with pytest.raises(RegistryError, match="not recorded"):
        registry.promote("dlrm", "20990101T000000Z-never-recorded")


@pytest.mark.parametrize("ours, theirs, ours_wins", [("v3", "v2", True), ("v2", "v3", False)])
def test_stale_read_is_caught_by_compare_and_set(registry: Registry, registry_url: str, caplog, ours, theirs,
                                                 ours_wins):
    """Another publisher moves the alias between our read and our write: our write must not land blindly."""
    caplog.set_level(logging.INFO, logger="tasks.release.registry")
    for version in ("v1", "v2", "v3"):
        _record(registry, version)
    registry.promote("dlrm", "v1")
    other = Registry(registry_url)
    original, interfered = registry._begin, []

    def begin_with_interference(what: str):
        # Between our read and our write transaction (on SQLite a transaction holds the write lock from its BEGIN,
        # so nobody can commit inside it; between the two, anybody can).
        if what.startswith("moving") and not interfered:
            interfered.append(other.promote("dlrm", theirs))  # commits on its own connection
        return original(what)

    registry._begin = begin_with_interference
    assert registry.promote("dlrm", ours) is ours_wins
    other.close()
    assert interfered == [True]
    assert "another publisher moved" in caplog.text
    alias = registry.alias("dlrm")
    assert alias["version"] == "v3"  # a blind write of v2 over v3 would be the lost update
    assert alias["revision"] == (3 if ours_wins else 2)


def _promote_all(url: str, versions: list[str], barrier, results) -> None:
    reg = Registry(url)
    barrier.wait()
    results.put([(version, reg.promote("dlrm", version)) for version in versions])
    reg.close()


def _check_no_lost_update(registry: Registry, outcomes: list[tuple[str, bool]], versions: list[str]) -> None:
    assert sorted(v for v, _ in outcomes) == sorted(versions)
    alias = registry.alias("dlrm")
    assert alias["version"] == max(versions)
    assert alias["revision"] == sum(moved for _, moved in outcomes)  # one revision per successful move
    assert dict(outcomes)[max(versions)] is True


def test_concurrent_promotes_from_8_threads(registry: Registry, registry_url: str):
    versions = [f"2026010{d}T000000Z-run{i}" for d in range(1, 3) for i in range(8)]
    for version in versions:
        _record(registry, version)
    random.Random(7).shuffle(versions)
    barrier, results = threading.Barrier(8), queue.Queue()
    threads = [threading.Thread(target=_promote_all, args=(registry_url, versions[i::8], barrier, results))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    outcomes = [pair for _ in threads for pair in results.get_nowait()]
    _check_no_lost_update(registry, outcomes, versions)


def test_concurrent_promotes_from_2_processes(registry: Registry, registry_url: str):
    versions = [f"v{i:03d}" for i in range(30)]
    for version in versions:
        _record(registry, version)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    mine = [versions[0::2], versions[1::2]]
    procs = [ctx.Process(target=_promote_all, args=(registry_url, part, barrier, results)) for part in mine]
    for proc in procs:
        proc.start()
    outcomes = [pair for _ in procs for pair in results.get(timeout=60)]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    _check_no_lost_update(registry, outcomes, versions)


def test_sql_injection_in_names_is_stored_literally(registry: Registry):
    evil = "dlrm'); DROP TABLE training_runs; -- :model_name \" OR 1=1"
    evil_run = "run'; DELETE FROM model_versions; --"
    evil_window = {"days'); --": ["0'); --"], ":test_day": None}
    registry.register_run(evil, evil, evil_run, dataset="criteo' OR '1'='1", window=evil_window, config_hash="x")
    _register(registry, "innocent")
    registry.record_version(evil, "v1", evil_run, "file:///published/v1", {"auc": 0.8}, pipeline=evil)
    assert registry.promote(evil, "v1")
    run = registry.get_run(evil, evil_run)
    assert (run.pipeline, run.model_name, run.dataset, run.window) == (evil, evil, "criteo' OR '1'='1", evil_window)
    assert registry.production_metrics(evil) == {"auc": 0.8}
    assert registry.production_metrics("dlrm") is None  # nothing leaked to other names
    assert [(e["version"], e["pipeline"], e["window"]) for e in registry.history(evil)] == [("v1", evil, evil_window)]
    assert registry.get_run(PIPELINE, "innocent").status == "registered"  # tables are intact


def test_bad_status_is_rejected_by_the_check_constraint(registry: Registry):
    _register(registry, "run-1")
    with pytest.raises(RegistryError) as failure:
        registry.set_run_status(PIPELINE, "run-1", "done; DROP TABLE training_runs", {"auc": 0.9})
    message = str(failure.value)
    assert "\n" not in message
    assert "rejected by the CHECK constraint training_runs_status_check" in message
    assert "allowed are registered, trained, gated_out, published, failed" in message
    assert isinstance(failure.value.__cause__, IntegrityError)  # the database refused it, not Python
    run = registry.get_run(PIPELINE, "run-1")
    assert run.status == "registered" and run.metrics is None  # the failed update changed nothing


def _check_list(sql: str, constraint: str) -> tuple[str, ...]:
    matches = re.findall(constraint + r"\s+CHECK \(status IN \(([^)]*)\)\)", sql)
    assert matches, f"no CHECK constraint {constraint} in the migrations"
    return tuple(re.findall(r"'(\w+)'", matches[-1]))  # the migration that defined it last


def test_every_status_is_reachable(registry: Registry):
    """RUN_STATUSES is exactly the CHECK's list, and set_run_status reaches each one, from any other."""
    migrations = "\n".join(p.read_text() for p in sorted(SQL_DIR.glob("[0-9][0-9][0-9]_*.sql")))
    assert _check_list(migrations, "training_runs_status_check") == RUN_STATUSES
    for status in RUN_STATUSES:
        _register(registry, f"to-{status}")
        assert registry.set_run_status(PIPELINE, f"to-{status}", status).status == status
    _register(registry, "walk")
    for status in [*RUN_STATUSES[1:], *RUN_STATUSES]:  # e.g. failed -> registered: a cleared-and-rerun task
        assert registry.set_run_status(PIPELINE, "walk", status).status == status


def test_errors_are_one_line(tmp_path: Path):
    unreachable = Registry(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/test?connect_timeout=3")
    with pytest.raises(RegistryError, match=r"migrating the schema failed in registry postgresql.*refused") as err:
        unreachable.migrate()
    assert "\n" not in str(err.value)
    with pytest.raises(RegistryError, match="only sqlite and postgresql"):
        Registry("mysql://u@h/db")
    with pytest.raises(RegistryError, match="not a SQLAlchemy URL"):
        Registry("not a url")


def test_registry_url_from_airflow_connection(monkeypatch, tmp_path: Path):
    default = tmp_path / "registry.db"
    assert registry_url_from_connection(None, default) == f"sqlite:///{default}"
    # A configured connection that does not exist fails with one line, never falls back to a local file.
    with pytest.raises(RegistryError, match=r"^registry connection 'recflow_registry_missing' "
                                            r"\(RECFLOW_REGISTRY_CONN_ID\) is not defined: add it") as missing:
        registry_url_from_connection("recflow_registry_missing", default)
    assert "\n" not in str(missing.value) and not default.exists()
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_PG", json.dumps({
        "conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "recflow", "password": "p@ss/w:rd",
        "schema": "registry", "extra": {"sqlalchemy_query": {"sslmode": "require"}, "cursor": "dictcursor"}}))
    url = make_url(registry_url_from_connection("recflow_registry_pg", default))  # the postgres provider's URL
    assert (url.get_backend_name(), url.username, url.password, url.host, url.port, url.database, dict(url.query)) == (
        "postgresql", "recflow", "p@ss/w:rd", "db.internal", 5432, "registry", {"sslmode": "require"})
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_LITE",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "lite.db")}))
    assert registry_url_from_connection("recflow_registry_lite", default) == f"sqlite:///{tmp_path / 'lite.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_MY", "mysql://u@h/db")
    with pytest.raises(RegistryError, match="has type 'mysql'"):
        registry_url_from_connection("recflow_registry_my", default)


@pytest.mark.integration
def test_registry_through_a_postgres_airflow_connection(monkeypatch, pg_url: str, tmp_path: Path):
    schema = make_url(pg_url).query["options"].split("=", 1)[1]
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": "test",
        "extra": {"sqlalchemy_query": {"options": f"-csearch_path={schema}"}}}))
    with Registry(registry_url_from_connection("recflow_registry", tmp_path / "unused.db")) as reg:
        assert reg.dialect == "postgresql" and reg.migrate() == ALL_MIGRATIONS
        _register(reg, "via-connection")
    with Registry(pg_url) as direct:  # it landed in the test's schema, not in a fallback SQLite file
        assert direct.get_run(PIPELINE, "via-connection").config_hash == "cfg1"
    assert not (tmp_path / "unused.db").exists()


# -- migration 002: runs per pipeline ----------------------------------------------------------------------------

# How 001's code wrote runs and versions (its queries.sql), so the rows are the ones a deployment has.
_OLD_REGISTER_RUN = """
INSERT INTO model_runs (model_name, run_id, dataset, train_days, test_day, config_hash, artifact_uri, status,
                        created_at, updated_at)
VALUES (:model_name, :run_id, :dataset, :train_days, :test_day, :config_hash, :artifact_uri, 'registered', :now, :now)
"""
_OLD_SET_STATUS = "UPDATE model_runs SET status = :status, metrics = :metrics, updated_at = :now WHERE run_id = :run_id"
_OLD_RECORD_VERSION = """
INSERT INTO model_versions (model_name, version, run_id, artifact_uri, metrics, published_at)
VALUES (:model_name, :version, :run_id, :artifact_uri, :metrics, :now)
"""


def _database_at_001(url: str, tmp_path: Path, monkeypatch) -> dict[str, int]:
    """Migrate `url` to schema 001 only, fill it as 001's code would have; {run_id: id} of its runs."""
    only_001 = tmp_path / "sql-001"
    only_001.mkdir()
    shutil.copy(SQL_DIR / "001_create_registry.sql", only_001)
    with monkeypatch.context() as patch:
        patch.setattr(registry_module, "SQL_DIR", only_001)
        with Registry(url) as reg:
            assert reg.migrate() == [1]
    engine = create_engine(url)
    now = "2026-01-05T06:00:00.000000+00:00"
    with engine.begin() as conn:
        for run_id, days, test_day in (("scheduled__1", "[0, 1, 2]", 3), ("scheduled__2", "[1, 2, 3]", 4),
                                       ("manual__3", "[\"0'); --\"]", None)):
            conn.execute(text(_OLD_REGISTER_RUN), {
                "model_name": "dlrm", "run_id": run_id, "dataset": "criteo", "train_days": days, "test_day": test_day,
                "config_hash": "cfg-" + run_id, "artifact_uri": None, "now": now})
        conn.execute(text(_OLD_SET_STATUS), {"status": "published", "metrics": '{"auc": 0.8}', "run_id": "scheduled__1",
                                             "now": now})
        conn.execute(text(_OLD_SET_STATUS), {"status": "gated_out", "metrics": '{"auc": 0.7}', "run_id": "scheduled__2",
                                             "now": now})
        for version, run_id in (("v1", "scheduled__1"), ("v0", None), ("v2", "unregistered__run")):
            conn.execute(text(_OLD_RECORD_VERSION), {"model_name": "dlrm", "version": version, "run_id": run_id,
                                                     "artifact_uri": f"file:///pub/{version}", "metrics": "{}",
                                                     "now": now})
        conn.execute(text("INSERT INTO model_aliases (model_name, alias, version, revision, updated_at) "
                          "VALUES ('dlrm', 'latest', 'v1', 1, :now)"), {"now": now})
        ids = dict(conn.execute(text("SELECT run_id, id FROM model_runs")).all())
    engine.dispose()
    return ids


def test_migration_002_carries_runs_and_versions_over(registry_url: str, tmp_path: Path, monkeypatch):
    old_ids = _database_at_001(registry_url, tmp_path, monkeypatch)
    assert len(set(old_ids.values())) == 3
    with Registry(registry_url) as reg:
        assert reg.migrate() == [2, 3]
        assert reg.migrate() == []  # applied once

        first = reg.get_run(PIPELINE, "scheduled__1")  # the runs before 002 belong to criteo_dlrm
        assert (first.id, first.window, first.status, first.metrics, first.config_hash) == (
            old_ids["scheduled__1"], {"train_days": [0, 1, 2], "test_day": 3}, "published", {"auc": 0.8},
            "cfg-scheduled__1")
        assert reg.get_run(PIPELINE, "scheduled__2").window == {"train_days": [1, 2, 3], "test_day": 4}
        third = reg.get_run(PIPELINE, "manual__3")
        assert (third.id, third.window) == (old_ids["manual__3"], {"train_days": ["0'); --"], "test_day": None})

        # A retry of an old run with the same window written by today's code is recognised as the same run.
        retried = reg.register_run(PIPELINE, "dlrm", "scheduled__2", dataset="criteo",
                                   window={"train_days": [1, 2, 3], "test_day": 4}, config_hash="cfg-scheduled__2")
        assert retried.id == old_ids["scheduled__2"] and retried.status == "gated_out"
        fresh = reg.register_run(PIPELINE, "dlrm", "scheduled__4", dataset="criteo", window=WINDOW, config_hash="c")
        assert fresh.id > max(old_ids.values())  # PostgreSQL: the new sequence was moved past the copied ids
        reg.set_run_status(PIPELINE, "scheduled__4", "failed")
        assert reg.register_run("outbrain_dlrm", "dlrm", "scheduled__1", dataset="outbrain", window={},
                                config_hash="o").id not in (*old_ids.values(), fresh.id)

        history = {e["version"]: e for e in reg.history("dlrm")}
        assert (history["v1"]["pipeline"], history["v1"]["run_status"], history["v1"]["window"]) == (
            PIPELINE, "published", {"train_days": [0, 1, 2], "test_day": 3})
        assert history["v1"]["aliases"] == ["latest"]
        assert (history["v2"]["pipeline"], history["v2"]["run_status"]) == (PIPELINE, None)  # run never registered
        assert (history["v0"]["pipeline"], history["v0"]["run_id"], history["v0"]["window"]) == (None, None, None)
        assert not reg.record_version("dlrm", "v1", "scheduled__1", "file:///pub/v1", {}, pipeline=PIPELINE)
        assert reg.production_metrics("dlrm") == {}

    engine = create_engine(registry_url)
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        assert "model_runs" not in tables and "training_runs" in tables
        assert {i["name"] for i in inspect(conn).get_indexes("training_runs")} >= {
            "training_runs_model_created_idx", "training_runs_status_idx"}
        assert "model_versions_pipeline_run_idx" in {i["name"] for i in inspect(conn).get_indexes("model_versions")}
        if engine.dialect.name == "postgresql":  # the old sequence went with its table; the new one is owned by id
            assert conn.execute(text("SELECT to_regclass('model_runs_id_seq')")).scalar() is None
            owner = conn.execute(text("SELECT pg_get_serial_sequence('training_runs', 'id')")).scalar()
            assert owner is not None and owner.endswith(".training_runs_id_seq")
    engine.dispose()


def test_failed_migration_002_changes_nothing(registry_url: str, tmp_path: Path, monkeypatch):
    """002 drops model_runs after copying it: a failure anywhere in it must roll all of it back, on both databases."""
    old_ids = _database_at_001(registry_url, tmp_path, monkeypatch)
    original = registry_module.load_queries

    def failing_last(path: Path):
        queries = original(path)
        if path.name.startswith("002_"):
            return (*queries, NamedQuery("boom", "SELECT no_such_column FROM training_runs", None))
        return queries

    with Registry(registry_url) as reg:
        monkeypatch.setattr(registry_module, "load_queries", failing_last)
        with pytest.raises(RegistryError, match="migrating the schema failed"):
            reg.migrate()
        engine = create_engine(registry_url)
        with engine.connect() as conn:
            assert "training_runs" not in inspect(conn).get_table_names()
            assert dict(conn.execute(text("SELECT run_id, id FROM model_runs")).all()) == old_ids
            assert conn.execute(text("SELECT version FROM schema_version")).scalars().all() == [1]
            assert "pipeline" not in {c["name"] for c in inspect(conn).get_columns("model_versions")}
        engine.dispose()
        monkeypatch.setattr(registry_module, "load_queries", original)
        assert reg.migrate() == [2, 3]
        assert reg.get_run(PIPELINE, "scheduled__1").id == old_ids["scheduled__1"]
