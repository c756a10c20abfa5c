"""The model registry (tasks/registry.py + sql/registry/) against a SQLite file and the PostgreSQL server here.

Every behavioural test runs on both backends. The PostgreSQL variant gets a fresh schema per test (dropped after),
is marked `integration`, and is skipped with the reason only when 127.0.0.1:5432 does not answer.
"""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import queue
import random
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import IntegrityError, OperationalError

from tasks.registry import Registry, RegistryConflict, RegistryError, registry_url_from_connection
from tests.servers import free_port

PG_URL = os.environ.get("RECFLOW_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


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


def _register(reg: Registry, run_id: str, model_name: str = "dlrm") -> None:
    reg.register_run(model_name, run_id, dataset="criteo", train_days=[0, 1, 2], test_day=3, config_hash="cfg1")


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
    assert sorted(results) == [[], [], [], [1]]  # exactly one applied migration 001

    reg = registries[0]
    _register(reg, "run-1")
    assert reg.migrate() == [] and Registry(registry_url).migrate() == []
    assert reg.get_run("run-1").status == "registered"  # data survives a second migrate
    for r in registries:
        r.close()


def test_register_statuses_and_production_metrics(registry: Registry):
    run = registry.register_run("dlrm", "scheduled__2026-01-05", dataset="criteo", train_days=[0, 1],
                                test_day=2, config_hash="abc123", artifact_uri="file:///runs/1")
    assert (run.status, run.train_days, run.test_day, run.metrics) == ("registered", [0, 1], 2, None)
    again = registry.register_run("dlrm", "scheduled__2026-01-05", dataset="criteo", train_days=[0, 1],
                                  test_day=2, config_hash="abc123")
    assert again.id == run.id  # a retried registration is a no-op
    with pytest.raises(RegistryConflict, match=r"config_hash \('abc123', not 'other'\)"):
        registry.register_run("dlrm", "scheduled__2026-01-05", dataset="criteo", train_days=[0, 1], test_day=2,
                              config_hash="other")

    assert registry.production_metrics("dlrm") is None  # nothing published: the gate compares with nothing
    trained = registry.set_run_status("scheduled__2026-01-05", "trained", {"auc": 0.81, "logloss": 0.45})
    assert trained.status == "trained" and trained.metrics == {"auc": 0.81, "logloss": 0.45}
    assert registry.set_run_status("scheduled__2026-01-05", "published").metrics == {"auc": 0.81, "logloss": 0.45}

    assert registry.record_version("dlrm", "v1", "scheduled__2026-01-05", "file:///pub/v1", trained.metrics)
    assert not registry.record_version("dlrm", "v1", "scheduled__2026-01-05", "file:///pub/v1", trained.metrics)
    with pytest.raises(RegistryConflict, match="immutable"):
        registry.record_version("dlrm", "v1", "scheduled__2026-01-05", "file:///pub/v1", {"auc": 0.9})
    assert registry.production_metrics("dlrm") is None  # recorded is not yet promoted
    assert registry.promote("dlrm", "v1")
    assert registry.production_metrics("dlrm") == {"auc": 0.81, "logloss": 0.45}
    assert registry.production_metrics("dlrm", alias="canary") is None

    _register(registry, "manual__2", model_name="dlrm")
    registry.set_run_status("manual__2", "gated_out", {"auc": 0.70})
    [entry] = registry.history("dlrm")
    assert (entry["version"], entry["run_status"], entry["aliases"]) == ("v1", "published", ["latest"])
    assert entry["train_days"] == [0, 1] and entry["metrics"]["auc"] == 0.81

    with pytest.raises(RegistryError, match="'nope' is not registered"):
        registry.set_run_status("nope", "trained")


def test_promote_older_version_does_not_move_latest(registry: Registry):
    for version in ("20260105T000000Z-b", "20260104T000000Z-a", "20260106T000000Z-c"):
        _record(registry, version)
    assert registry.promote("dlrm", "20260105T000000Z-b")
    assert not registry.promote("dlrm", "20260104T000000Z-a")
    assert not registry.promote("dlrm", "20260105T000000Z-b")  # already there: not a move
    assert registry.alias("dlrm")["version"] == "20260105T000000Z-b" and registry.alias("dlrm")["revision"] == 1
    assert registry.promote("dlrm", "20260106T000000Z-c")
    assert registry.alias("dlrm")["revision"] == 2

    # Code-point order, as in tasks/publish.py: '-' sorts before '_' (a locale collation may say otherwise).
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
    caplog.set_level(logging.INFO, logger="tasks.registry")
    for version in ("v1", "v2", "v3"):
        _record(registry, version)
    registry.promote("dlrm", "v1")
    other = Registry(registry_url)
    original, interfered = registry._run, []

    def run_with_interference(conn, query_name, /, **params):
        if query_name == "move_alias" and not interfered:
            interfered.append(other.promote("dlrm", theirs))  # commits on its own connection
        return original(conn, query_name, **params)

    registry._run = run_with_interference
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
    evil = "dlrm'); DROP TABLE model_runs; -- :model_name \" OR 1=1"
    registry.register_run(evil, "run'; DELETE FROM model_versions; --", dataset="criteo' OR '1'='1",
                          train_days=["0'); --"], test_day=None, config_hash="x")
    _register(registry, "innocent")
    _record(registry, "v1", model_name=evil)
    assert registry.promote(evil, "v1")
    run = registry.get_run("run'; DELETE FROM model_versions; --")
    assert (run.model_name, run.dataset, run.train_days) == (evil, "criteo' OR '1'='1", ["0'); --"])
    assert registry.production_metrics(evil) == {"auc": 0.8}
    assert registry.production_metrics("dlrm") is None  # nothing leaked to other names
    assert [e["version"] for e in registry.history(evil)] == ["v1"]
    assert registry.get_run("innocent").status == "registered"  # tables are intact


def test_bad_status_is_rejected_by_the_check_constraint(registry: Registry):
    _register(registry, "run-1")
    with pytest.raises(RegistryError) as failure:
        registry.set_run_status("run-1", "done; DROP TABLE model_runs", {"auc": 0.9})
    message = str(failure.value)
    assert "\n" not in message
    assert "rejected by the CHECK constraint model_runs_status_check" in message
    assert "allowed are registered, trained, gated_out, published, failed" in message
    assert isinstance(failure.value.__cause__, IntegrityError)  # the database refused it, not Python
    run = registry.get_run("run-1")
    assert run.status == "registered" and run.metrics is None  # the failed update changed nothing


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
    assert registry_url_from_connection("recflow_registry_missing", default) == f"sqlite:///{default}"
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_PG", json.dumps({
        "conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "recflow", "password": "p@ss/w:rd",
        "schema": "registry", "extra": {"sslmode": "require", "cursor": "dictcursor"}}))
    url = registry_url_from_connection("recflow_registry_pg", default)
    assert url == "postgresql+psycopg2://recflow:p%40ss%2Fw%3Ard@db.internal:5432/registry?sslmode=require"
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_LITE",
                       json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "lite.db")}))
    assert registry_url_from_connection("recflow_registry_lite", default) == f"sqlite:///{tmp_path / 'lite.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY_MY", "mysql://u@h/db")
    with pytest.raises(ValueError, match="has type 'mysql'"):
        registry_url_from_connection("recflow_registry_my", default)


@pytest.mark.integration
def test_registry_through_a_postgres_airflow_connection(monkeypatch, pg_url: str, tmp_path: Path):
    schema = make_url(pg_url).query["options"].split("=", 1)[1]
    monkeypatch.setenv("AIRFLOW_CONN_RECFLOW_REGISTRY", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": 5432, "login": "postgres", "schema": "test",
        "extra": {"options": f"-csearch_path={schema}"}}))
    with Registry(registry_url_from_connection("recflow_registry", tmp_path / "unused.db")) as reg:
        assert reg.dialect == "postgresql" and reg.migrate() == [1]
        _register(reg, "via-connection")
    with Registry(pg_url) as direct:  # it landed in the test's schema, not in a fallback SQLite file
        assert direct.get_run("via-connection").config_hash == "cfg1"
    assert not (tmp_path / "unused.db").exists()
