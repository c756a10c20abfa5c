-- Model registry, migration 003: each model name belongs to one pipeline, and each version records the sha256 of
-- its manifest (tasks/release/publish.py's _MANIFEST.json), so a version is loaded only as it was published.
--
--   * model_owners: the pipeline (Airflow DAG) that may publish a model name. The first publish of a name claims it;
--     a publish or gate of another pipeline under that name is refused (issue #24: a trigger form of byo_dlrm must
--     not replace criteo_dlrm's `latest`). Existing names are claimed by the pipeline of their oldest version.
--   * model_versions.manifest_sha256: the digest of the manifest as the publisher wrote it. The manifest lists every
--     file's sha256, so checking the manifest against this digest before fetching, and each file against the
--     manifest, means no byte that changed in the bucket after publication reaches a loader (nvt Workflow.load
--     unpickles, torch.jit.load, ...). NULL for versions recorded before 003: those are never loaded.
--
-- Portable between SQLite and PostgreSQL like 001/002; applied once, in one transaction, under the migration lock.

-- name: create_model_owners
CREATE TABLE model_owners (
    model_name  TEXT PRIMARY KEY,
    pipeline    TEXT NOT NULL,
    claimed_at  TEXT NOT NULL
);

-- name: claim_existing_models
INSERT INTO model_owners (model_name, pipeline, claimed_at)
SELECT v.model_name, v.pipeline, v.published_at
FROM model_versions v
WHERE v.pipeline IS NOT NULL
  AND v.version = (SELECT MIN(o.version) FROM model_versions o
                   WHERE o.model_name = v.model_name AND o.pipeline IS NOT NULL);

-- name: add_model_versions_manifest_sha256
ALTER TABLE model_versions ADD COLUMN manifest_sha256 TEXT;
