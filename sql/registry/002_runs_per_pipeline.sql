-- Model registry, migration 002: runs keyed by (pipeline, run id), with the data window as JSON.
--
-- 001's model_runs had one pipeline's shape: a global UNIQUE (run_id) and the columns train_days / test_day. Runs of
-- different pipelines (each its own Airflow DAG, whose run ids repeat across DAGs: "scheduled__2026-01-05T06:00...")
-- and other kinds of data windows need a key that names the pipeline and a window each pipeline shapes itself. So:
--   * training_runs replaces model_runs: UNIQUE (pipeline, run_id), data_window a JSON object (text), the rest as
--     before (same statuses, same CHECK); every model_runs row is copied over with its id, then model_runs is dropped;
--   * model_versions gets a nullable pipeline column, so a version names its run by (pipeline, run_id).
--
-- Every run and every version with a run id written before 002 came from 'criteo_dlrm' (tasks/criteo/dlrm.py's
-- PIPELINE): it was the only pipeline that wrote to the registry before this migration. That is the pipeline the
-- copied rows get.
--
-- Portable between SQLite and PostgreSQL like 001 (same block format: `-- name:`, optional `-- dialect:`). Unlike
-- 001 the statements are not idempotent one by one (the copy reads model_runs, which the migration drops): the
-- registry's migrate() runs all of a migration's blocks and its schema_version row in one transaction, under the
-- migration lock (pg_advisory_xact_lock / BEGIN IMMEDIATE), so 002 is applied exactly once, entirely or not at all.
-- Both databases run DDL inside a transaction.
--
-- Create-copy-drop rather than ALTER: SQLite cannot drop a UNIQUE constraint or a constrained column in place.

-- name: create_training_runs
CREATE TABLE training_runs (
    id            INTEGER PRIMARY KEY,          -- SQLite: rowid alias; PostgreSQL: default from a sequence (below)
    pipeline      TEXT NOT NULL,                -- the pipeline (DAG) that ran it; run ids are unique per pipeline
    model_name    TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    dataset       TEXT NOT NULL,
    data_window   TEXT NOT NULL,                -- JSON object, shaped by the pipeline (WINDOW is a keyword)
    config_hash   TEXT NOT NULL,
    metrics       TEXT,                         -- JSON object, set once evaluated
    artifact_uri  TEXT,
    status        TEXT NOT NULL DEFAULT 'registered',
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    CONSTRAINT training_runs_pipeline_run_id_key UNIQUE (pipeline, run_id),
    CONSTRAINT training_runs_status_check
        CHECK (status IN ('registered', 'trained', 'gated_out', 'published', 'failed'))
);

-- PostgreSQL: the table's own sequence. model_runs_id_seq is OWNED BY model_runs.id and is dropped with model_runs
-- below, so it cannot be reused.
-- name: create_training_runs_id_sequence
-- dialect: postgresql
CREATE SEQUENCE training_runs_id_seq OWNED BY training_runs.id;

-- name: default_training_runs_id
-- dialect: postgresql
ALTER TABLE training_runs ALTER COLUMN id SET DEFAULT nextval('training_runs_id_seq');

-- Ids are kept. The window is built as text in the shape the application writes (json.dumps with sorted keys):
-- {"test_day": 3, "train_days": [0, 1, 2]}. train_days already is a JSON array; a NULL test_day becomes JSON null.
-- `||` and CAST(... AS TEXT) mean the same in both databases.
-- name: copy_model_runs
INSERT INTO training_runs (id, pipeline, model_name, run_id, dataset, data_window, config_hash, metrics,
                           artifact_uri, status, created_at, updated_at)
SELECT id, 'criteo_dlrm', model_name, run_id, dataset,
       '{"test_day": ' || COALESCE(CAST(test_day AS TEXT), 'null') || ', "train_days": ' || train_days || '}',
       config_hash, metrics, artifact_uri, status, created_at, updated_at
FROM model_runs;

-- PostgreSQL: the next id follows the copied ones (SQLite's rowid already takes max(id) + 1).
-- name: advance_training_runs_id_sequence
-- dialect: postgresql
SELECT setval('training_runs_id_seq', COALESCE((SELECT MAX(id) FROM training_runs), 0) + 1, false);

-- Drops its indexes with it, and on PostgreSQL its sequence (OWNED BY). No foreign key refers to model_runs.
-- name: drop_model_runs
DROP TABLE model_runs;

-- name: index_training_runs_model
CREATE INDEX training_runs_model_created_idx ON training_runs (model_name, created_at);

-- name: index_training_runs_status
CREATE INDEX training_runs_status_idx ON training_runs (status);

-- A version names its run by (pipeline, run_id); both NULL when it has no registered run (imported, by hand).
-- name: add_model_versions_pipeline
ALTER TABLE model_versions ADD COLUMN pipeline TEXT;

-- name: backfill_model_versions_pipeline
UPDATE model_versions SET pipeline = 'criteo_dlrm' WHERE run_id IS NOT NULL;

-- name: drop_index_model_versions_run
DROP INDEX model_versions_run_idx;

-- name: index_model_versions_run
CREATE INDEX model_versions_pipeline_run_idx ON model_versions (pipeline, run_id);
