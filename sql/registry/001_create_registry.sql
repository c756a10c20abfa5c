-- Model registry, migration 001: runs, published versions, aliases ("latest") and the schema version.
--
-- Portable between SQLite (>= 3.24, for ON CONFLICT) and PostgreSQL (>= 9.5). tasks/registry.py runs the blocks
-- below in file order; a block marked `-- dialect: <name>` runs on that database only. Every statement is
-- idempotent (IF NOT EXISTS), so running the file twice changes nothing.
--
-- Portable types on purpose: timestamps are ISO-8601 UTC text written by the application (SQLite has no timestamp
-- type, and text compares in time order in both databases); JSON is text (SQLite has no JSON column type).
-- Versions are compared in Python, never in SQL: PostgreSQL's default collation does not sort strings in code-point
-- order, and "newer" must mean exactly what tasks/publish.py means by it.

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  TEXT NOT NULL
);

-- One row per training run (an Airflow DAG run), from registration to its final status.
-- name: create_model_runs
CREATE TABLE IF NOT EXISTS model_runs (
    id            INTEGER PRIMARY KEY,          -- SQLite: rowid alias; PostgreSQL: default from a sequence (below)
    model_name    TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    dataset       TEXT NOT NULL,
    train_days    TEXT NOT NULL,                -- JSON array, e.g. [0, 1, 2]
    test_day      INTEGER,
    config_hash   TEXT NOT NULL,
    metrics       TEXT,                         -- JSON object, set once evaluated
    artifact_uri  TEXT,
    status        TEXT NOT NULL DEFAULT 'registered',
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    CONSTRAINT model_runs_run_id_key UNIQUE (run_id),
    CONSTRAINT model_runs_status_check
        CHECK (status IN ('registered', 'trained', 'gated_out', 'published', 'failed'))
);

-- PostgreSQL has no rowid: give id a sequence default. Both statements are idempotent.
-- name: create_model_runs_id_sequence
-- dialect: postgresql
CREATE SEQUENCE IF NOT EXISTS model_runs_id_seq OWNED BY model_runs.id;

-- name: default_model_runs_id
-- dialect: postgresql
ALTER TABLE model_runs ALTER COLUMN id SET DEFAULT nextval('model_runs_id_seq');

-- name: index_model_runs_model
CREATE INDEX IF NOT EXISTS model_runs_model_created_idx ON model_runs (model_name, created_at);

-- name: index_model_runs_status
CREATE INDEX IF NOT EXISTS model_runs_status_idx ON model_runs (status);

-- Published versions are immutable: a row is written once and never updated (tasks/publish.py's rule).
-- run_id deliberately has no foreign key: a version may be imported or published by hand without a registered run.
-- name: create_model_versions
CREATE TABLE IF NOT EXISTS model_versions (
    model_name    TEXT NOT NULL,
    version       TEXT NOT NULL,
    run_id        TEXT,
    artifact_uri  TEXT NOT NULL,
    metrics       TEXT NOT NULL,                -- JSON object
    published_at  TEXT NOT NULL,
    CONSTRAINT model_versions_pkey PRIMARY KEY (model_name, version)
);

-- name: index_model_versions_run
CREATE INDEX IF NOT EXISTS model_versions_run_idx ON model_versions (run_id);

-- The single source of truth for "latest" (and any other alias). Moved only by compare-and-set on `revision`:
--   UPDATE ... SET version = :new, revision = revision + 1 WHERE ... AND revision = :revision_read
-- so of two writers that read the same revision exactly one updates a row; the other re-reads and decides again.
-- revision counts the moves: 1 when the alias is created, +1 per move.
-- name: create_model_aliases
CREATE TABLE IF NOT EXISTS model_aliases (
    model_name  TEXT NOT NULL,
    alias       TEXT NOT NULL,
    version     TEXT NOT NULL,
    revision    INTEGER NOT NULL CHECK (revision >= 1),
    updated_at  TEXT NOT NULL,
    CONSTRAINT model_aliases_pkey PRIMARY KEY (model_name, alias),
    CONSTRAINT model_aliases_version_fkey FOREIGN KEY (model_name, version)
        REFERENCES model_versions (model_name, version)
);
