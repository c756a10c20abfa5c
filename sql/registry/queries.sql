-- Model registry queries, loaded by tasks/release/registry.py by name (against the schema after the last migration).
--
-- Format: a block starts at `-- name: <name>` and runs to the next one; an optional `-- dialect: <name>` line
-- restricts it to one database (sqlite | postgresql). Parameters are bound (:name), never formatted into the text.
-- Full-line comments inside a block are dropped before the statement is sent.
-- Timestamps (:now) are ISO-8601 UTC text from the application; JSON values are text.

-- Migrations ----------------------------------------------------------------------------------------------------

-- Serialise concurrent migrate() calls: the first statement of the migration transaction, held until commit, so a
-- second migrator waits and then sees the first one's schema_version rows (and CREATE TABLE IF NOT EXISTS is not
-- safe against a concurrent CREATE on PostgreSQL).
-- name: lock_migrations
-- dialect: postgresql
SELECT pg_advisory_xact_lock(7401155201);

-- SQLite needs no statement here: every registry transaction on SQLite starts with BEGIN IMMEDIATE
-- (tasks/release/registry.py), which takes the write lock before the first statement and waits for it.

-- name: applied_migrations
SELECT version FROM schema_version ORDER BY version;

-- name: record_migration
INSERT INTO schema_version (version, name, applied_at) VALUES (:version, :name, :now)
ON CONFLICT (version) DO NOTHING;

-- Runs ----------------------------------------------------------------------------------------------------------

-- Runs are keyed by (pipeline, run_id): run ids repeat across pipelines (each its own DAG). A retried registration
-- inserts nothing; the caller compares the stored row with its own.
-- name: register_run
INSERT INTO training_runs (pipeline, model_name, run_id, dataset, data_window, config_hash, artifact_uri, status,
                           created_at, updated_at)
VALUES (:pipeline, :model_name, :run_id, :dataset, :data_window, :config_hash, :artifact_uri, 'registered',
        :now, :now)
ON CONFLICT (pipeline, run_id) DO NOTHING;

-- name: get_run
SELECT id, pipeline, model_name, run_id, dataset, data_window, config_hash, metrics, artifact_uri, status,
       created_at, updated_at
FROM training_runs
WHERE pipeline = :pipeline AND run_id = :run_id;

-- name: runs_of_pipeline
SELECT run_id, model_name, data_window, status, created_at
FROM training_runs
WHERE pipeline = :pipeline
ORDER BY id;

-- metrics and artifact_uri keep their stored value when the caller passes NULL.
-- name: set_run_status
UPDATE training_runs
SET status = :status,
    metrics = COALESCE(:metrics, metrics),
    artifact_uri = COALESCE(:artifact_uri, artifact_uri),
    updated_at = :now
WHERE pipeline = :pipeline AND run_id = :run_id;

-- Versions ------------------------------------------------------------------------------------------------------

-- Versions are immutable: a second record of the same (model_name, version) inserts nothing, and the caller
-- checks that the stored row says the same thing.
-- name: record_version
INSERT INTO model_versions (model_name, version, pipeline, run_id, artifact_uri, metrics, manifest_sha256,
                            published_at)
VALUES (:model_name, :version, :pipeline, :run_id, :artifact_uri, :metrics, :manifest_sha256, :now)
ON CONFLICT (model_name, version) DO NOTHING;

-- name: get_version
SELECT model_name, version, pipeline, run_id, artifact_uri, metrics, manifest_sha256, published_at
FROM model_versions
WHERE model_name = :model_name AND version = :version;

-- Owners: the first publish of a model name claims it for its pipeline; two racing claimers insert one row, and
-- each then reads the owner back.
-- name: claim_model
INSERT INTO model_owners (model_name, pipeline, claimed_at)
VALUES (:model_name, :pipeline, :now)
ON CONFLICT (model_name) DO NOTHING;

-- name: get_owner
SELECT pipeline, claimed_at
FROM model_owners
WHERE model_name = :model_name;

-- Aliases (compare-and-set) -------------------------------------------------------------------------------------

-- name: get_alias
SELECT version, revision, updated_at
FROM model_aliases
WHERE model_name = :model_name AND alias = :alias;

-- The first promote of a model creates the alias at revision 1; of two racing creators one inserts a row.
-- name: create_alias
INSERT INTO model_aliases (model_name, alias, version, revision, updated_at)
VALUES (:model_name, :alias, :version, 1, :now)
ON CONFLICT (model_name, alias) DO NOTHING;

-- The compare-and-set: updates one row only if nobody moved the alias since :expected_revision was read.
-- name: move_alias
UPDATE model_aliases
SET version = :version, revision = revision + 1, updated_at = :now
WHERE model_name = :model_name AND alias = :alias AND revision = :expected_revision;

-- name: aliases_of_model
SELECT alias, version, revision, updated_at
FROM model_aliases
WHERE model_name = :model_name;

-- Reads for the gate and for people -----------------------------------------------------------------------------

-- The metrics the gate compares a candidate with: those of the version the alias names.
-- name: production_metrics
SELECT v.version, v.metrics
FROM model_aliases a
JOIN model_versions v ON v.model_name = a.model_name AND v.version = a.version
WHERE a.model_name = :model_name AND a.alias = :alias;

-- Every published version with the run that produced it (if registered: same pipeline and run id); sorted by
-- version in Python.
-- name: history
SELECT v.version, v.pipeline, v.run_id, v.artifact_uri, v.metrics, v.published_at,
       r.dataset, r.data_window, r.config_hash, r.status
FROM model_versions v
LEFT JOIN training_runs r ON r.pipeline = v.pipeline AND r.run_id = v.run_id
WHERE v.model_name = :model_name;
