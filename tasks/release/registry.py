"""Model registry in SQL: training runs, published versions and the alias ("latest") the gate compares against.

It spans pipelines: a training run is keyed by (pipeline, run id), since each pipeline is its own Airflow DAG and run
ids repeat across DAGs, and its data window is a JSON object the pipeline shapes itself (days, date ranges, a
snapshot id, ...); the registry stores and returns it without interpreting it. A published version names the run
that produced it by the same (pipeline, run id) pair.

The SQL lives in sql/registry/: numbered migrations (001_create_registry.sql, ...) and queries.sql, both as
`-- name: <name>` blocks (optionally `-- dialect: sqlite|postgresql`). This module only binds parameters and runs
them through SQLAlchemy Core, so the same code serves the embedded default (a SQLite file) and a deployment's
PostgreSQL, picked by an Airflow connection (`registry_url_from_connection`).

Concurrency: the `model_aliases` row is the single source of truth for "latest". `promote` reads it, decides in
Python (a version is newer when it sorts after the current one as a plain string, tasks/release/publish.py's rule), and
writes with a compare-and-set on `revision`; a writer whose read went stale updates no row, re-reads and decides
again. So concurrent publishes never lose an update, and exactly one of them ends up as `latest`. On SQLite every
transaction begins with BEGIN IMMEDIATE (the write lock up front, waited for up to the busy timeout and retried while
"database is locked" until a deadline), so concurrent migrations and writers queue instead of failing, and no
transaction can deadlock by upgrading a read lock.

Ownership and trust (issue #24): a model name belongs to the pipeline that published it first (`claim_model`); a
version records the sha256 of its manifest, which `tasks.release.steps.fetch_production` checks before any file of
the version is fetched or loaded.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, CursorResult, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, SQLAlchemyError

from tasks.core.config import NotAllowed

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql" / "registry"
QUERIES_FILE = SQL_DIR / "queries.sql"
# Every status a run can have; set_run_status accepts each of them (the table's CHECK enforces the list, and
# tests/test_registry.py keeps this tuple equal to it).
RUN_STATUSES = ("registered", "trained", "gated_out", "published", "failed")
TRAINED_STATUSES = ("trained", "gated_out", "published")  # a model was trained for the window, whatever the gate said
_STATUS_CHECK = "training_runs_status_check"
_DIALECTS = {"sqlite", "postgresql"}
_NAME_LINE = re.compile(r"--\s*name:\s*(\S+)\s*$")
_DIALECT_LINE = re.compile(r"--\s*dialect:\s*(\S+)\s*$")
_MIGRATION_FILE = re.compile(r"(\d{3})_\w+\.sql")
_PROMOTE_ATTEMPTS = 50
_SQLITE_BUSY_SECONDS = 30.0
_SQLITE_LOCKED_DEADLINE_S = 120.0  # BEGIN IMMEDIATE retried this long past the busy timeout's own waits
_CONNECTION_TYPES = ("postgres", "sqlite")


class RegistryError(RuntimeError):
    """A registry operation failed; the message is one line naming the operation and the database."""


class RegistryConflict(RegistryError):
    """A retried write found a different row already there (runs and versions are write-once)."""


class ModelOwnedElsewhere(RegistryError, NotAllowed):
    """A pipeline tried to gate or publish under a model name another pipeline owns (bad input: not retried)."""


@dataclass(frozen=True)
class NamedQuery:
    name: str
    sql: str
    dialect: str | None  # None: runs on every database


@dataclass(frozen=True)
class RunRecord:
    id: int
    pipeline: str
    model_name: str
    run_id: str
    dataset: str
    window: dict  # the data window as the pipeline registered it (decoded JSON object)
    config_hash: str
    metrics: dict | None
    artifact_uri: str | None
    status: str
    created_at: str
    updated_at: str


def _parse_block_lines(path: Path) -> Iterator[tuple[int, str, str | None, list[str]]]:
    """(line, name, dialect, statement lines) per `-- name:` block; full-line comments are dropped."""
    current: list[Any] | None = None
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if match := _NAME_LINE.fullmatch(stripped):
            if current:
                yield tuple(current)
            current = [lineno, match.group(1), None, []]
        elif (match := _DIALECT_LINE.fullmatch(stripped)) and current is not None:
            if current[3] or match.group(1) not in _DIALECTS:
                raise ValueError(f"{path}:{lineno}: '-- dialect:' must directly follow '-- name:' and be one of "
                                 f"{', '.join(sorted(_DIALECTS))}")
            current[2] = match.group(1)
        elif current is not None and stripped and not stripped.startswith("--"):
            current[3].append(line)
    if current:
        yield tuple(current)


@lru_cache(maxsize=None)
def load_queries(path: Path) -> tuple[NamedQuery, ...]:
    """The `-- name:` blocks of a SQL file, in file order (cached: the files ship with the code)."""
    queries, seen = [], set()
    for lineno, name, dialect, lines in _parse_block_lines(path):
        sql = "\n".join(lines).strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"{path}:{lineno}: query {name!r} has no SQL")
        if (name, dialect) in seen:
            raise ValueError(f"{path}:{lineno}: query {name!r} is defined twice")
        seen.add((name, dialect))
        queries.append(NamedQuery(name, sql, dialect))
    return tuple(queries)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def _require_text(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} must be a non-empty string, got {value!r}")
    return value


def _window_text(window: object) -> str:
    if not isinstance(window, Mapping):
        raise ValueError(f"the data window must be a mapping (stored as a JSON object), got {window!r}")
    return _json_text(dict(window))


def _retry_while_locked(statement: Callable[[], object], what: str) -> None:
    """Run `statement`, again while SQLite answers "database is locked"/"busy" (its busy handler is not called in
    every case: a journal-mode switch, a lock held across the timeout), with jittered waits until a deadline."""
    deadline = time.monotonic() + _SQLITE_LOCKED_DEADLINE_S
    attempt = 0
    while True:
        try:
            statement()
            return
        except (sqlite3.OperationalError, OperationalError) as exc:
            locked = "locked" in str(exc) or "busy" in str(exc)
            if not locked or time.monotonic() > deadline:
                raise
            attempt += 1
            log.info("registry busy on %s (attempt %d): waiting", what, attempt)
            time.sleep(random.uniform(0.01, min(0.5, 0.02 * attempt)))


def _sqlite_connect(dbapi_connection, _record) -> None:
    # WAL lets readers run beside the one writer; busy_timeout makes a second writer wait instead of failing with
    # "database is locked"; SQLite enforces foreign keys only when asked, per connection. isolation_level=None:
    # the driver starts no transaction of its own, _sqlite_begin does (SQLAlchemy's documented pysqlite recipe).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(_SQLITE_BUSY_SECONDS * 1000)}")
    _retry_while_locked(lambda: cursor.execute("PRAGMA journal_mode=WAL"), "switching to WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # The write lock up front: a transaction that read first and wrote later could fail at once with "database is
    # locked" when another writer committed in between (SQLite does not wait there, to avoid a deadlock).
    _retry_while_locked(lambda: conn.exec_driver_sql("BEGIN IMMEDIATE"), "BEGIN IMMEDIATE")


class Registry:
    """The model registry behind one SQLAlchemy URL (sqlite:///path or postgresql+psycopg2://...)."""

    def __init__(self, url: str) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise RegistryError(f"registry URL {url!r} is not a SQLAlchemy URL: {_first_line(exc)}") from None
        self.dialect = parsed.get_backend_name()
        if self.dialect not in _DIALECTS:
            raise RegistryError(f"registry URL {parsed.render_as_string()} uses {self.dialect}: only sqlite and "
                                "postgresql are supported")
        self.where = parsed.render_as_string(hide_password=True)
        connect_args: dict[str, Any] = {}
        if self.dialect == "sqlite":
            connect_args = {"timeout": _SQLITE_BUSY_SECONDS, "check_same_thread": False}
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self._engine = create_engine(parsed, connect_args=connect_args, pool_pre_ping=True)
        if self.dialect == "sqlite":
            event.listen(self._engine, "connect", _sqlite_connect)
            event.listen(self._engine, "begin", _sqlite_begin)
        self._queries = {q.name: q for q in load_queries(QUERIES_FILE) if q.dialect in (None, self.dialect)}

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _begin(self, what: str) -> Iterator[Connection]:
        """One transaction; database errors leave as RegistryError naming `what` and the database."""
        try:
            with self._engine.begin() as conn:
                yield conn
        except RegistryError:
            raise
        except SQLAlchemyError as exc:
            raise RegistryError(f"{what} failed in registry {self.where}: {_first_line(exc)}") from exc

    def _run(self, conn: Connection, query_name: str, /, **params: Any) -> CursorResult:
        return conn.execute(text(self._queries[query_name].sql), params)

    # -- schema ------------------------------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations not yet recorded in schema_version; returns the numbers applied (none: [])."""
        files = sorted((int(m.group(1)), p) for p in SQL_DIR.glob("*.sql")
                       if (m := _MIGRATION_FILE.fullmatch(p.name)))
        applied_now = []
        with self._begin("migrating the schema") as conn:
            if "lock_migrations" in self._queries:
                self._run(conn, "lock_migrations")
            applied = set()
            if inspect(conn).has_table("schema_version"):
                applied = {row[0] for row in self._run(conn, "applied_migrations")}
            for number, path in files:
                if number in applied:
                    continue
                for query in load_queries(path):
                    if query.dialect in (None, self.dialect):
                        conn.execute(text(query.sql))
                self._run(conn, "record_migration", version=number, name=path.stem, now=_now())
                applied_now.append(number)
        for number in applied_now:
            log.info("registry %s: applied migration %03d", self.where, number)
        return applied_now

    # -- runs --------------------------------------------------------------------------------------------------

    def register_run(self, pipeline: str, model_name: str, run_id: str, *, dataset: str, window: Mapping[str, Any],
                     config_hash: str, artifact_uri: str | None = None) -> RunRecord:
        """Record a training run of `pipeline` as 'registered'; a retry with the same identity returns the stored run.

        `window` is the data the run trained and evaluated on, in the pipeline's own shape (any JSON object). A run
        of the same (pipeline, run_id) already stored with a different model, dataset, window or config hash is a
        RegistryConflict; the same run_id under another pipeline is another run.
        """
        params = {"pipeline": _require_text("pipeline", pipeline),
                  "model_name": _require_text("model name", model_name), "run_id": _require_text("run id", run_id),
                  "dataset": _require_text("dataset", dataset),
                  "data_window": _window_text(window), "config_hash": _require_text("config hash", config_hash),
                  "artifact_uri": artifact_uri, "now": _now()}
        what = f"run {run_id!r} of pipeline {pipeline!r}"
        with self._begin(f"registering {what}") as conn:
            created = self._run(conn, "register_run", **params).rowcount == 1
            record = _run_record(self._run(conn, "get_run", pipeline=pipeline, run_id=run_id).mappings().one())
        expected = {"model_name": model_name, "dataset": dataset, "window": json.loads(params["data_window"]),
                    "config_hash": config_hash}
        differs = [key for key, value in expected.items() if getattr(record, key) != value]
        if differs:
            raise RegistryConflict(f"{what} is already registered with different "
                                   + ", ".join(f"{k} ({getattr(record, k)!r}, not {expected[k]!r})" for k in differs))
        log.info("%s %s of %s (dataset %s, window %s, config %s)", "registered" if created else "already registered:",
                 what, model_name, dataset, params["data_window"], config_hash)
        return record

    def get_run(self, pipeline: str, run_id: str) -> RunRecord | None:
        with self._begin(f"reading run {run_id!r} of pipeline {pipeline!r}") as conn:
            row = self._run(conn, "get_run", pipeline=pipeline, run_id=run_id).mappings().first()
        return _run_record(row) if row is not None else None

    def set_run_status(self, pipeline: str, run_id: str, status: str, metrics: dict | None = None,
                       artifact_uri: str | None = None) -> RunRecord:
        """Set a run's status, any of RUN_STATUSES (metrics / artifact_uri too when given; None keeps the stored
        value)."""
        params = {"pipeline": pipeline, "run_id": run_id, "status": status, "now": _now(),
                  "metrics": None if metrics is None else _json_text(metrics), "artifact_uri": artifact_uri}
        what = f"run {run_id!r} of pipeline {pipeline!r}"
        try:
            with self._begin(f"setting {what} to {status!r}") as conn:
                updated = self._run(conn, "set_run_status", **params).rowcount
                row = self._run(conn, "get_run", pipeline=pipeline, run_id=run_id).mappings().first()
        except RegistryError as exc:
            if isinstance(exc.__cause__, IntegrityError) and _STATUS_CHECK in str(exc.__cause__):
                raise RegistryError(f"status {status!r} for {what} rejected by the CHECK constraint "
                                    f"{_STATUS_CHECK} in registry {self.where}: allowed are "
                                    f"{', '.join(RUN_STATUSES)}") from exc.__cause__
            raise
        if not updated or row is None:
            raise RegistryError(f"{what} is not registered in registry {self.where}: call register_run first")
        log.info("%s is now %s%s", what, status, f" with metrics {_json_text(metrics)}" if metrics else "")
        return _run_record(row)

    # -- versions and aliases -------------------------------------------------------------------------------------

    def record_version(self, model_name: str, version: str, run_id: str | None, artifact_uri: str,
                       metrics: dict, *, pipeline: str | None = None, manifest_sha256: str | None = None) -> bool:
        """Record a published version (write-once); True if recorded now, False if already there unchanged.

        The run that produced it is (pipeline, run_id): both given, or both None for a version without a registered
        run (imported, published by hand). A run id without its pipeline could never be matched to its run. With a
        pipeline, the model name is claimed for it (the first publish claims; another pipeline's name is
        ModelOwnedElsewhere). manifest_sha256: the digest of the version's manifest, the only form in which the
        version is ever loaded again (None: never loaded).
        """
        if (run_id is None) != (pipeline is None):
            raise ValueError(f"{model_name!r} version {version!r}: pipeline and run_id name the run together, give "
                             f"both or neither (got pipeline {pipeline!r}, run_id {run_id!r})")
        if run_id is not None:
            _require_text("pipeline", pipeline)
            _require_text("run id", run_id)
        params = {"model_name": _require_text("model name", model_name), "version": _require_text("version", version),
                  "pipeline": pipeline, "run_id": run_id, "artifact_uri": _require_text("artifact URI", artifact_uri),
                  "metrics": _json_text(metrics), "manifest_sha256": manifest_sha256, "now": _now()}
        with self._begin(f"recording {model_name!r} version {version!r}") as conn:
            if pipeline is not None:
                self._claim(conn, model_name, pipeline)
            created = self._run(conn, "record_version", **params).rowcount == 1
            row = self._run(conn, "get_version", model_name=model_name, version=version).mappings().one()
        differs = [key for key in ("pipeline", "run_id", "artifact_uri", "metrics", "manifest_sha256")
                   if row[key] != params[key]]
        if differs:
            raise RegistryConflict(f"{model_name!r} version {version!r} is already recorded with different "
                                   f"{', '.join(differs)}: versions are immutable, publish a new version")
        log.info("%s %s version %s (%s)", "recorded" if created else "already recorded:", model_name, version,
                 artifact_uri)
        return created

    def _claim(self, conn: Connection, model_name: str, pipeline: str) -> None:
        self._run(conn, "claim_model", model_name=model_name, pipeline=pipeline, now=_now())
        owner = self._run(conn, "get_owner", model_name=model_name).mappings().one()["pipeline"]
        if owner != pipeline:
            raise ModelOwnedElsewhere(_owned_elsewhere(model_name, owner, pipeline))

    def claim_model(self, model_name: str, pipeline: str) -> None:
        """Bind `model_name` to `pipeline` if no pipeline owns it yet; ModelOwnedElsewhere (one line) if another
        pipeline does."""
        with self._begin(f"claiming {model_name!r} for pipeline {pipeline!r}") as conn:
            self._claim(conn, _require_text("model name", model_name), _require_text("pipeline", pipeline))

    def check_owner(self, model_name: str, pipeline: str) -> None:
        """ModelOwnedElsewhere (one line) if a pipeline other than `pipeline` owns `model_name`; claims nothing."""
        with self._begin(f"reading the owner of {model_name!r}") as conn:
            row = self._run(conn, "get_owner", model_name=model_name).mappings().first()
        if row is not None and row["pipeline"] != pipeline:
            raise ModelOwnedElsewhere(_owned_elsewhere(model_name, row["pipeline"], pipeline))

    def model_owner(self, model_name: str) -> str | None:
        """The pipeline that owns `model_name`, or None if no version of it was published by a pipeline."""
        with self._begin(f"reading the owner of {model_name!r}") as conn:
            row = self._run(conn, "get_owner", model_name=model_name).mappings().first()
        return row["pipeline"] if row is not None else None

    def promote(self, model_name: str, version: str, alias: str = "latest") -> bool:
        """Move `alias` to `version` if it sorts after the version the alias names now; True if this call moved it.

        Compare-and-set on the alias row's revision, re-read and re-decided on every lost race.
        """
        for kind, value in (("model name", model_name), ("version", version), ("alias", alias)):
            _require_text(kind, value)
        key = {"model_name": model_name, "alias": alias}
        where = f"alias {alias!r} of {model_name!r}"
        for attempt in range(1, _PROMOTE_ATTEMPTS + 1):
            with self._begin(f"reading {where}") as conn:
                if self._run(conn, "get_version", model_name=model_name, version=version).first() is None:
                    raise RegistryError(f"cannot promote {model_name!r} version {version!r} in registry "
                                        f"{self.where}: it is not recorded (call record_version first)")
                current = self._run(conn, "get_alias", **key).mappings().first()
            if current is not None and current["version"] >= version:
                if current["version"] != version:
                    log.info("%s stays at %s: it sorts after %s", where, current["version"], version)
                return False
            with self._begin(f"moving {where} to {version!r}") as conn:
                if current is None:
                    moved = self._run(conn, "create_alias", **key, version=version, now=_now()).rowcount == 1
                else:
                    moved = self._run(conn, "move_alias", **key, version=version, now=_now(),
                                      expected_revision=current["revision"]).rowcount == 1
            if moved:
                log.info("%s now names %s (was %s, revision %d)", where, version,
                         current and current["version"], 1 if current is None else current["revision"] + 1)
                return True
            log.info("another publisher moved %s first (attempt %d/%d): re-reading", where, attempt,
                     _PROMOTE_ATTEMPTS)
            time.sleep(random.uniform(0.0, 0.005 * attempt))  # jitter, so racing writers do not collide again
        raise RegistryError(f"could not move {where} to {version!r} after {_PROMOTE_ATTEMPTS} attempts: "
                            "too many concurrent publishers")

    def windows(self, pipeline: str, statuses: Sequence[str], model_name: str | None = None) -> list[dict]:
        """The data windows of a pipeline's runs in the given statuses (oldest first), e.g. what was trained; only
        the runs of `model_name` when given."""
        with self._begin(f"reading the runs of pipeline {pipeline!r}") as conn:
            rows = self._run(conn, "runs_of_pipeline", pipeline=pipeline).mappings().all()
        return [json.loads(row["data_window"]) for row in rows
                if row["status"] in statuses and model_name in (None, row["model_name"])]

    def version(self, model_name: str, version: str) -> dict | None:
        """{'model_name', 'version', 'pipeline', 'run_id', 'artifact_uri', 'metrics', 'manifest_sha256',
        'published_at'} of a recorded version."""
        with self._begin(f"reading {model_name!r} version {version!r}") as conn:
            row = self._run(conn, "get_version", model_name=model_name, version=version).mappings().first()
        return dict(row) | {"metrics": json.loads(row["metrics"])} if row is not None else None

    def alias(self, model_name: str, alias: str = "latest") -> dict | None:
        """{'version', 'revision', 'updated_at'} of an alias, or None if it was never set."""
        with self._begin(f"reading alias {alias!r} of {model_name!r}") as conn:
            row = self._run(conn, "get_alias", model_name=model_name, alias=alias).mappings().first()
        return dict(row) if row is not None else None

    # -- reads ---------------------------------------------------------------------------------------------------

    def production_metrics(self, model_name: str, alias: str = "latest") -> dict | None:
        """Metrics of the version `alias` names (the gate's baseline), or None if nothing is published."""
        with self._begin(f"reading the metrics of {model_name!r} {alias}") as conn:
            row = self._run(conn, "production_metrics", model_name=model_name, alias=alias).mappings().first()
        return json.loads(row["metrics"]) if row is not None else None

    def history(self, model_name: str) -> list[dict]:
        """Published versions, oldest first (version-string order), with their run and the aliases naming them.

        Each entry: version, pipeline, run_id, artifact_uri, metrics, published_at, and from the run (None when the
        version has no registered run) dataset, window, config_hash, run_status; then aliases.
        """
        with self._begin(f"reading the history of {model_name!r}") as conn:
            rows = self._run(conn, "history", model_name=model_name).mappings().all()
            aliases = self._run(conn, "aliases_of_model", model_name=model_name).mappings().all()
        named: dict[str, list[str]] = {}
        for row in aliases:
            named.setdefault(row["version"], []).append(row["alias"])
        history = []
        for row in sorted(rows, key=lambda r: r["version"]):
            entry = dict(row)
            entry["metrics"] = json.loads(entry["metrics"])
            window = entry.pop("data_window")
            entry["window"] = json.loads(window) if window is not None else None
            entry["run_status"] = entry.pop("status")
            entry["aliases"] = sorted(named.get(row["version"], []))
            history.append(entry)
        return history


def _owned_elsewhere(model_name: str, owner: str, pipeline: str) -> str:
    return (f"model name {model_name!r} belongs to pipeline {owner!r} (its first publisher): pipeline {pipeline!r} "
            f"may not gate or publish under it; choose another model_name")


def _run_record(row: Any) -> RunRecord:
    values = dict(row)
    values["window"] = json.loads(values.pop("data_window"))
    values["metrics"] = json.loads(values["metrics"]) if values["metrics"] is not None else None
    return RunRecord(**values)


def registry_url_from_connection(conn_id: str | None, default_sqlite_path: Path) -> str:
    """SQLAlchemy URL of the registry: the Airflow connection `conn_id` (postgres or sqlite), built by the
    connection's own provider hook; with no conn_id, a SQLite file at default_sqlite_path (the embedded default).

    A named connection that does not exist is an error, not a fallback: a deployment that configured a registry
    must never publish into a local file that nobody else reads. libpq options (sslmode, options=-csearch_path=...)
    go into the connection's extra as {"sqlalchemy_query": {...}}, as the postgres provider documents.
    """
    default = "sqlite:///" + str(Path(default_sqlite_path).expanduser().resolve())
    if not conn_id:
        return default
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise RegistryError(f"registry connection {conn_id!r} (RECFLOW_REGISTRY_CONN_ID) is not defined: add it "
                            f"(Admin > Connections, or AIRFLOW_CONN_{conn_id.upper()}) or unset "
                            "RECFLOW_REGISTRY_CONN_ID to use the local SQLite registry") from None
    if conn.conn_type not in _CONNECTION_TYPES:
        raise RegistryError(f"registry connection {conn_id!r} has type {conn.conn_type!r}: the registry supports "
                            f"{' and '.join(_CONNECTION_TYPES)} connections")
    return conn.get_hook().get_uri()


def open_registry(data_root: Path, conn_id: str | None) -> Registry:
    """The migrated registry of a deployment: connection `conn_id`, or <data_root>/registry.db when None."""
    registry = Registry(registry_url_from_connection(conn_id, data_root / "registry.db"))
    registry.migrate()
    return registry
