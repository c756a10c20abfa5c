#!/usr/bin/env bash
# Run once by the postgres image on an empty data directory (/docker-entrypoint-initdb.d): the model registry gets
# its own login role and database, owned by that role and nothing more (no superuser, no CREATEDB/CREATEROLE), so a
# task holding the registry connection cannot read or change Airflow's metadata. The password comes from the
# registry_db_password secret and is passed as a psql variable (:'pw' quotes it as a literal: any character works).
set -euo pipefail
pw="$(cat /run/secrets/registry_db_password)"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -v pw="$pw" <<'SQL'
CREATE ROLE recflow_registry LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
CREATE DATABASE recflow_registry OWNER recflow_registry;
REVOKE ALL ON DATABASE recflow_registry FROM PUBLIC;
REVOKE CONNECT ON DATABASE airflow FROM PUBLIC;
SQL
