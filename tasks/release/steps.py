"""The release half of every training pipeline, shared: open the deployment's registry, gate a candidate against
the production model, publish a self-contained version and move `latest`, and mark a run failed when a task after
the gate fails for good.

A pipeline supplies what differs (its name, its metric, the files a version holds, how to score the production
model on the candidate's own test rows); the bookkeeping around them (registry records, gate.json, aliases, the
allow-lists a trigger form is checked against) is the same for all and lives here once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.storage import write_text_atomic

log = logging.getLogger(__name__)


def open_registry(settings: Settings, conn_id: str | None = None):
    """The deployment's model registry (RECFLOW_REGISTRY_CONN_ID, else <data root>/registry.db); `conn_id` overrides
    the setting (tests pass "" for the SQLite file)."""
    from tasks.release.registry import open_registry as open_migrated

    return open_migrated(settings.data_root, settings.registry_conn_id if conn_id is None else conn_id or None)


def s3_client_for(store_uri: str, aws_conn_id: str | None, allowed_conn_ids: tuple[str, ...]):
    """A boto3 client from the Airflow connection when the store is s3://, else None (the connection id is checked
    against the deployment's allow-list before it is looked up)."""
    if not store_uri.startswith("s3://"):
        return None
    from tasks.core.download import s3_client_from_connection

    return s3_client_from_connection(aws_conn_id, allowed_conn_ids)


def trusted_manifest_sha256(settings: Settings, model: str, version: str | None,
                            registry_conn_id: str | None = None) -> str:
    """The manifest digest the registry recorded when `model` `version` was published: the only form in which a
    published version is ever loaded (its files may hold pickles: nvt workflows, TorchScript). UnverifiedVersion (a
    FileNotFoundError) when the registry has none: never published through it, or published before digests were."""
    return trusted_version(settings, model, version, registry_conn_id)[2]


def trusted_version(settings: Settings, model: str, version: str | None,
                    registry_conn_id: str | None = None) -> tuple[str, str, str]:
    """(version, artifact URI, manifest digest) as the registry recorded them at publish; `version` None: the one
    its `latest` alias names. UnverifiedVersion when it has no digest for it, or names no latest version."""
    from tasks.release.publish import UnverifiedVersion

    with open_registry(settings, registry_conn_id) as registry:
        if version is None:
            alias = registry.alias(model)
            if alias is None:
                raise UnverifiedVersion(f"{model}: the registry names no latest version (nothing published through "
                                        "it): nothing is loaded")
            version = alias["version"]
        record = registry.version(model, version)
    digest = record.get("manifest_sha256") if record else None
    if not digest:
        raise UnverifiedVersion(f"{model} {version}: the registry recorded no manifest digest for it (published "
                                "before digests were recorded, or not through recflow): it is not loaded")
    return version, record["artifact_uri"], digest


def fetch_production(settings: Settings, version_uri: str, cache_dir: Path, *, aws_conn_id: str | None,
                     required: Callable[[list[str]], list[str]], registry_conn_id: str | None = None,
                     wanted: Callable[[str], bool] | None = None) -> Path:
    """A local copy of a published version (what the gate scores), verified before any of it is loaded: its
    manifest against the digest the registry recorded at publish time (TamperedVersion, one line, otherwise), each
    file against the manifest. `required(file names)` lists what the version lacks to be scored; a version that lacks
    something raises FileNotFoundError naming it. `wanted(file name)`: the files the scorer reads (default all)."""
    from tasks.release.publish import fetch_published_version, parse_model_uri, published_manifest

    store, model, version = parse_model_uri(version_uri)
    trusted = trusted_manifest_sha256(settings, model, version, registry_conn_id)
    s3_client = s3_client_for(store, aws_conn_id, settings.allowed_conn_ids)
    missing = required(list(published_manifest(store, model, version, s3_client, trusted)["files"]))
    if missing:
        raise FileNotFoundError(f"{model} {version} has no {', '.join(missing)}")
    return fetch_published_version(store, model, version, cache_dir / model / version, s3_client, trusted, wanted)


def fetch_model(model_uri: str, cache_dir: Path, s3_client: Any = None) -> Path:
    """A published version (its URI, or a model's URI for the latest version) as a verified local directory under
    cache_dir/<model>/<version>: what the predict CLIs and the demos load.

    In a store of this deployment's (RECFLOW_PUBLISH_ALLOWED) the registry is the authority: it names the latest
    version (not the store's latest.json, which anyone who can write to the bucket can move) and the digest the
    version's manifest must have, checked before anything is fetched; a version it recorded no digest for is not
    loaded (UnverifiedVersion: a version's files may hold pickles or TorchScript). A store outside the deployment's
    is the person's own call: its latest.json names the version, and each file is checked against the version's
    manifest only, with a warning."""
    from tasks.core.config import load_settings
    from tasks.release.publish import PublishNotAllowed, check_store_allowed, fetch_published_version, latest_version
    from tasks.release.publish import parse_model_uri

    store, model, version = parse_model_uri(model_uri)
    settings = load_settings()
    try:
        check_store_allowed(store, settings.allowed_publish_stores)
    except PublishNotAllowed as exc:
        if version is None:
            latest = latest_version(store, model, s3_client)
            if latest is None:
                raise FileNotFoundError(f"no version of {model} is published in {store}") from None
            version = latest["version"]
        log.warning("%s %s is not verified against the registry (%s): checked against its own manifest only",
                    model, version, str(exc).splitlines()[0])
        return fetch_published_version(store, model, version, Path(cache_dir) / model / version, s3_client)
    asked, (version, recorded_uri, trusted) = version, trusted_version(settings, model, version)
    try:
        return fetch_published_version(store, model, version, Path(cache_dir) / model / version, s3_client, trusted)
    except FileNotFoundError as exc:
        if asked is not None:
            raise
        raise FileNotFoundError(f"the registry's latest {model} is {version}, published to {recorded_uri}, which "
                                f"{store} does not hold ({str(exc).splitlines()[0]})") from exc


def gate_run(settings: Settings, *, pipeline: str, dataset: str, run_id: str, model_name: str,
             metrics: Mapping[str, Any], metric: str, min_value: float, max_regression: float,
             window: Mapping[str, Any], config_hash: str, gate_dir: Path,
             score_production: Callable[[str], Mapping[str, Any]] | None,
             registry_conn_id: str | None = None) -> dict[str, Any]:
    """Decide whether a candidate may be published: `metric` >= min_value, and not worse than the production model
    (the registry's `latest`) by more than max_regression *on the same rows*: `score_production(version_uri)`
    scores the production version on this run's test rows (TFX Evaluator's baseline comparison). A version that
    cannot be scored that way (FileNotFoundError: published before versions were self-contained) is compared by its
    recorded metric and the reason says so. Registers the run, writes gate_dir/gate.json, sets the run's status."""
    from tasks.release.gate import decide

    with open_registry(settings, registry_conn_id) as registry:
        registry.check_owner(model_name, pipeline)  # another pipeline's model: refused before anything is recorded
        registry.register_run(pipeline, model_name, run_id, dataset=dataset, window=dict(window),
                              config_hash=config_hash)
        production = registry.alias(model_name)
        recorded = registry.production_metrics(model_name)
        version_uri = registry.version(model_name, production["version"])["artifact_uri"] if production else None
    baseline, basis = None, "no production model yet"
    if production:
        try:
            if score_production is None:
                raise FileNotFoundError("no same-rows scorer")
            baseline = dict(score_production(version_uri))
            rows = f" {metrics['rows']}" if "rows" in metrics else ""
            basis = f"production {production['version']} scored on the same{rows} test rows"
        except FileNotFoundError as exc:
            baseline, basis = recorded, f"production {production['version']}'s recorded {metric} ({exc})"
    decision = decide(dict(metrics), metric=metric, min_value=min_value, baseline_metrics=baseline,
                      max_regression=max_regression)
    record = {"passed": decision.passed, "reason": decision.reason, "metric": metric, metric: decision.value,
              f"baseline_{metric}": decision.baseline, "baseline_version": production["version"] if production else None,
              "baseline_basis": basis, "baseline_metrics": baseline}
    write_text_atomic(gate_dir / "gate.json", json.dumps(record, indent=2, sort_keys=True))
    with open_registry(settings, registry_conn_id) as registry:
        earlier = registry.get_run(pipeline, run_id)
        if earlier is not None and earlier.status == "published":  # cleared after it published: it stays so
            log.info("run %s published %s before it was cleared: its registry status stays published",
                     run_id, earlier.artifact_uri)
        else:
            registry.set_run_status(pipeline, run_id, "trained" if decision.passed else "gated_out",
                                    metrics={**metrics, "baseline": {k: record[k] for k in (
                                        f"baseline_{metric}", "baseline_version", "baseline_basis")}})
    log.info("gate %s: %s (%s)", "PASSED" if decision.passed else "FAILED", decision.reason, basis)
    return record


def publish_run(settings: Settings, *, pipeline: str, run_id: str, when: datetime, metrics: dict[str, Any],
                lineage_doc: dict[str, Any], files: Callable[[], dict[str, Path]], model_name: str,
                store_uri: str | None = None, aws_conn_id: str | None = None,
                registry_conn_id: str | None = None) -> dict[str, Any]:
    """Upload a self-contained version (`files()`: name in the version -> local path; raises FileNotFoundError
    naming what is missing), its metrics and lineage; record it in the registry and move its `latest` alias; then the
    store's latest.json (each by compare-and-set). The store and connection a form names are checked first. The
    pointer moves last, so that a publish the registry refuses (another pipeline claimed the name first) or cannot
    record never leaves latest.json naming a version the registry does not know; a retry finishes the move.

    A run cleared after it published (from its gate, or from evaluate or earlier) publishes nothing new: the version
    the registry records for it stays what it published (versions are immutable) and only the steps after the
    upload are redone, each of which moves forward only. Its files are not compared again: a re-evaluation's
    metrics or a re-gate's record may differ in their last digits, which failed every retry of such a publish."""
    from tasks.release.publish import (advance_latest, check_store_allowed, make_version, open_store, publish_model,
                                       version_uri)

    store = store_uri or settings.publish_store
    check_store_allowed(store, settings.allowed_publish_stores)  # a form's publish_uri: refused before any work
    s3_client = s3_client_for(store, aws_conn_id, settings.allowed_conn_ids)  # and a form's aws_conn_id
    version = make_version(when, run_id)
    with open_registry(settings, registry_conn_id) as registry:
        registry.check_owner(model_name, pipeline)  # another pipeline's model name: refused before any upload
        recorded = registry.version(model_name, version)
    if (recorded is not None and (recorded["pipeline"], recorded["run_id"]) == (pipeline, run_id)
            and recorded["artifact_uri"] == version_uri(open_store(store, s3_client), model_name, version)):
        log.info("run %s published %s version %s before it was cleared: the recorded version stands, nothing is "
                 "uploaded again", run_id, model_name, version)
        uri, metrics, cached = recorded["artifact_uri"], recorded["metrics"], True
    else:
        result = publish_model(store, model_name, version, files(), metrics, lineage_doc, s3_client=s3_client,
                               allowed_stores=settings.allowed_publish_stores, move_latest=False)
        uri, cached = result.uri, result.cached
        with open_registry(settings, registry_conn_id) as registry:
            # Claims the name for this pipeline (the first publish does; a racing other pipeline is refused here)
            # and records the manifest's digest, the only form in which the version is ever loaded again.
            registry.record_version(model_name, version, run_id, uri, metrics, pipeline=pipeline,
                                    manifest_sha256=result.manifest_sha256)
    with open_registry(settings, registry_conn_id) as registry:
        registry.promote(model_name, version)
        production = registry.alias(model_name)
        registry.set_run_status(pipeline, run_id, "published", metrics=metrics, artifact_uri=uri)
    advance_latest(store, model_name, version, metrics, s3_client)
    became_latest = bool(production and production["version"] == version)
    log.info("published %s version %s to %s%s", model_name, version, uri,
             " (now latest)" if became_latest else f" (latest stays {production and production['version']})")
    return {"model_name": model_name, "version": version, "uri": uri, "became_latest": became_latest,
            "cached": cached}


def record_failure(settings: Settings, pipeline: str, run_id: str, *, reason: str = "",
                   registry_conn_id: str | None = None) -> bool:
    """Mark a registered run `failed` in the registry: a task after the gate (which registers the run) failed for
    good. Returns True when the status changed; a run never registered (it failed before the gate) or already
    `published` / `gated_out` is left as it is. Called by a DAG's on_failure_callback, so it never raises: a
    registry that cannot be reached is logged, and the task's own failure stays what the log shows."""
    try:
        with open_registry(settings, registry_conn_id) as registry:
            record = registry.get_run(pipeline, run_id)
            if record is None or record.status in ("published", "gated_out", "failed"):
                log.info("run %s of %s: %s, registry status left as it is", run_id, pipeline,
                         "not registered" if record is None else f"status {record.status}")
                return False
            registry.set_run_status(pipeline, run_id, "failed")
    except Exception as exc:  # noqa: BLE001 - a failure callback must not hide the task's own error
        log.warning("could not mark run %s of %s failed in the registry: %s: %s", run_id, pipeline,
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return False
    log.info("run %s of %s marked failed in the registry%s", run_id, pipeline, f" ({reason})" if reason else "")
    return True


def failure_callback(pipeline: str) -> Callable[[dict], None]:
    """An on_failure_callback for the tasks after a pipeline's gate: the registry then says `failed`."""

    def callback(context: dict) -> None:
        from tasks.core.config import load_settings

        record_failure(load_settings(), pipeline, context["run_id"],
                       reason=f"{context['ti'].task_id}: {context.get('exception')}")

    return callback
