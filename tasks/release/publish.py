"""Publish a gated model version to the artifact store (the Pusher end of evaluate → gate → publish).

Layout under the store root:

    <model>/versions/<version>/<name>            every file the caller hands over (checkpoint, feature_spec.yaml, ...)
    <model>/versions/<version>/metrics.json
    <model>/versions/<version>/lineage.json
    <model>/versions/<version>/_MANIFEST.json    names, sizes and sha256 of all of the above; written LAST
    <model>/latest.json                          {"version", "uri", "metrics", "published_at"}; moved by CAS

A version is committed when its `_MANIFEST.json` exists; consumers ignore versions without one, so a publisher that
dies half-way leaves nothing visible and its retry simply uploads again. Versions are immutable: publishing the same
version again with the same files and metrics is a no-op (cached), with different content it raises.

Which version is latest: versions are compared as plain strings, and the pointer only moves to a version that sorts
after the one it names. Callers therefore pass versions that sort in publish order; `make_version` builds one from a
UTC timestamp and the Airflow run id ("20260105T000000Z-scheduled__2026-01-05T00_00_00_00_00").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tasks.core.config import NotAllowed
from tasks.release.artifact_store import ArtifactStore, open_store, validate_key
from tasks.core.storage import MANIFEST_NAME, Manifest, file_sha256

log = logging.getLogger(__name__)

METRICS_NAME = "metrics.json"
LINEAGE_NAME = "lineage.json"
POINTER_NAME = "latest.json"
_RESERVED_NAMES = {METRICS_NAME, LINEAGE_NAME, MANIFEST_NAME}
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_POINTER_ATTEMPTS = 20


class VersionConflict(RuntimeError):
    """A version already published with different content: versions are immutable."""


class PublishNotAllowed(NotAllowed):
    """The store URI lies outside RECFLOW_PUBLISH_ALLOWED (bad input: not retried)."""


class TamperedVersion(NotAllowed):
    """A published version's manifest is not the one the registry recorded when it was published: something changed
    it in the store afterwards. Nothing of it is fetched or loaded (not retried: it will not get better)."""


class UnverifiedVersion(FileNotFoundError):
    """A version the registry recorded no manifest digest for (published before digests were recorded, or by hand):
    it is never loaded. A FileNotFoundError, so the gate compares by the version's recorded metric instead."""


def _store_location(uri: str) -> tuple[str, str | Path, list[str]] | None:
    """('s3', bucket, prefix segments) or ('local', resolved path, []); None when it cannot name a store."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        segments = prefix.strip("/").split("/") if prefix.strip("/") else []
        if not bucket or any(segment in ("", ".", "..") for segment in segments):
            return None
        return "s3", bucket, segments
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return "local", Path(unquote(parts.path)).expanduser().resolve(), []
    if not parts.scheme or len(parts.scheme) == 1:
        return "local", Path(uri).expanduser().resolve(), []
    return None


def check_store_allowed(store_uri: str, allowed: Sequence[str] | None = None) -> None:
    """A store URI (a trigger form may name one) must lie under an allowed directory (symlinks resolved) or
    s3://bucket[/prefix] (whole key segments); None = the deployment's list (RECFLOW_PUBLISH_ALLOWED, else the
    configured publish store)."""
    if allowed is None:
        from tasks.core.config import load_settings

        allowed = load_settings().allowed_publish_stores
    store = _store_location(store_uri)
    for entry in allowed:
        root = _store_location(entry)
        if store is None or root is None or store[0] != root[0]:
            continue
        if store[0] == "local" and Path(store[1]).is_relative_to(root[1]):
            return
        if store[0] == "s3" and store[1] == root[1] and store[2][: len(root[2])] == root[2]:
            return
    raise PublishNotAllowed(f"publish store {store_uri} is not under an allowed store {list(allowed)} "
                            "(set RECFLOW_PUBLISH_ALLOWED to allow more)")


@dataclass
class PublishResult:
    model_name: str
    version: str
    uri: str  # the version's folder
    files: dict[str, int]  # every object of the version (manifest excluded) → bytes
    became_latest: bool  # latest.json names this version after the call
    cached: bool  # the version was already published with the same content; nothing was uploaded
    manifest_sha256: str = ""  # of the committed _MANIFEST.json: what the registry records, checked before loading


def validate_name(kind: str, value: str) -> str:
    """A model name or version: 1-128 of [A-Za-z0-9_.-], starting with a letter or digit."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
        raise ValueError(f"{kind} {value!r} is not safe: use 1-128 of A-Z a-z 0-9 _ . - starting with a letter/digit")
    return value


def make_version(when: datetime, run_id: str) -> str:
    """A version string that sorts in publish order: UTC timestamp, then the run id made path-safe."""
    stamp = when.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return validate_name("version", f"{stamp}-{_UNSAFE_CHARS.sub('_', run_id)}"[:128])


def _version_prefix(model_name: str, version: str) -> str:
    return f"{model_name}/versions/{version}/"


def version_uri(store: ArtifactStore, model_name: str, version: str) -> str:
    """The URI of a version's folder in `store` (what the registry records as its artifact URI)."""
    return store.url_for(_version_prefix(model_name, version) + MANIFEST_NAME).rsplit("/", 1)[0]


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode()


def _describe_bytes(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _read_manifest(store: ArtifactStore, model_name: str, version: str) -> dict[str, Any] | None:
    found = _read_manifest_bytes(store, model_name, version)
    return None if found is None else found[0]


def _read_manifest_bytes(store: ArtifactStore, model_name: str, version: str,
                         trusted_sha256: str | None = None) -> tuple[dict[str, Any], str] | None:
    """(parsed manifest, sha256 of its bytes) of a version, or None when it has none. trusted_sha256: the digest the
    registry recorded at publish time; other bytes are TamperedVersion, refused before they are parsed."""
    key = _version_prefix(model_name, version) + MANIFEST_NAME
    raw = store.get_bytes(key)
    if raw is None:
        return None
    digest = hashlib.sha256(raw).hexdigest()
    if trusted_sha256 is not None and digest != trusted_sha256:
        raise TamperedVersion(f"refusing {model_name} version {version}: {store.url_for(key)} has sha256 "
                              f"{digest[:16]}, not the {trusted_sha256[:16]} the registry recorded when it was "
                              "published (changed in the store since); nothing of it was fetched or loaded")
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"manifest of {model_name} version {version} is not valid JSON: "
                         f"{str(exc).splitlines()[0][:200]}") from None
    return manifest, digest


def _check_same_content(existing: dict[str, Any], planned: dict[str, dict[str, Any]], where: str) -> None:
    """Raise VersionConflict unless the published files and metrics equal the planned ones.

    lineage.json is left out of the comparison: it describes the run (try number, hosts) and may differ on a retry.
    """
    def content(files: dict[str, Any]) -> dict[str, Any]:
        return {name: (entry.get("bytes"), entry.get("sha256"))
                for name, entry in files.items() if name != LINEAGE_NAME}

    old, new = content(existing.get("files", {})), content(planned)
    if old != new:
        changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
        raise VersionConflict(f"{where} is already published with different content ({', '.join(changed)}): "
                              "versions are immutable, publish a new version")


def _upload_version(store: ArtifactStore, prefix: str, files: dict[str, Path],
                    extra: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    """Upload the caller's files, then metrics.json and lineage.json (the manifest comes after, elsewhere); returns
    the manifest's entries, each file described by the bytes that were uploaded (hashed as they were read: one pass
    over a model of many GB, not a hash pass and then an upload pass)."""
    total = len(files) + len(extra)
    uploaded: dict[str, dict[str, Any]] = {}
    for done, (name, path) in enumerate(files.items(), start=1):
        started = time.monotonic()
        uploaded[name] = store.put_file(path, prefix + name)
        seconds, mib = max(time.monotonic() - started, 1e-6), uploaded[name]["bytes"] / 2**20
        log.info("uploaded %s (%.1f MiB) in %.1f s, %.1f MiB/s (%d/%d objects)",
                 store.url_for(prefix + name), mib, seconds, mib / seconds, done, total)
    for name, data in extra.items():
        store.put_bytes(prefix + name, data)
        uploaded[name] = _describe_bytes(data)
    return uploaded


def publish_model(store_uri: str, model_name: str, version: str, files: dict[str, Path], metrics: dict,
                  lineage: dict, s3_client=None, allowed_stores: Sequence[str] | None = None,
                  move_latest: bool = True) -> PublishResult:
    """Upload a model version (files, metrics, lineage, manifest last) and move latest.json to it if it is newer
    (move_latest=False: leave that to advance_latest, once the registry has recorded the version).

    files: published name (may hold '/', e.g. 'dictionary/cat_0.parquet') → local path. allowed_stores: where
    store_uri may point (check_store_allowed; None = the deployment's list, so no caller can forget the check).
    """
    check_store_allowed(store_uri, allowed_stores)
    validate_name("model name", model_name)
    validate_name("version", version)
    store = open_store(store_uri, s3_client)
    prefix = _version_prefix(model_name, version)
    files = {name: Path(path) for name, path in files.items()}
    for name, path in files.items():
        store.url_for(prefix + name)  # validates the name as a key
        if name in _RESERVED_NAMES:
            raise ValueError(f"file name {name!r} is reserved for the publisher: rename it")
        if not path.is_file():
            raise FileNotFoundError(f"file {name!r} to publish does not exist: {path}")
    extra = {METRICS_NAME: _json_bytes(metrics), LINEAGE_NAME: _json_bytes(lineage)}
    where = f"{model_name} version {version} at {store.url_for(prefix + MANIFEST_NAME)}"

    cached = (existing := _read_manifest_bytes(store, model_name, version)) is not None
    if cached:
        # A retry after the commit: the files are hashed (not uploaded) to check they are the committed ones.
        planned = {name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for name, p in files.items()}
        planned |= {name: _describe_bytes(data) for name, data in extra.items()}
        _check_same_content(existing[0], planned, where)
        digest = existing[1]
        log.info("%s is already published with the same content: nothing uploaded", where)
    else:
        planned = _upload_version(store, prefix, files, extra)
        manifest = Manifest(kind="published_model", inputs={"model_name": model_name, "version": version},
                            files=planned, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        raw = manifest.to_json().encode()
        digest = hashlib.sha256(raw).hexdigest()
        # The manifest commits the version; CAS so that of two publishers of one version only one commits it.
        if store.compare_and_swap(prefix + MANIFEST_NAME, raw, None):
            log.info("committed %s (%d objects)", where, len(planned))
        else:
            theirs = _read_manifest_bytes(store, model_name, version) or ({}, "")
            _check_same_content(theirs[0], planned, where)
            digest = theirs[1]
            log.info("%s was committed by a concurrent publisher with the same content", where)
            cached = True

    uri = version_uri(store, model_name, version)
    became_latest = _advance_pointer(store, model_name, version, uri, metrics) if move_latest else False
    sizes = {name: entry["bytes"] for name, entry in planned.items()}
    return PublishResult(model_name, version, uri, sizes, became_latest, cached, digest)


def _parse_pointer(raw: bytes | None, where: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        pointer = json.loads(raw)
        if isinstance(pointer, dict) and isinstance(pointer.get("version"), str):
            return pointer
    except json.JSONDecodeError:
        pass
    log.warning("pointer %s is not a JSON object with a 'version': treating it as absent", where)
    return None


def advance_latest(store_uri: str, model_name: str, version: str, metrics: dict, s3_client=None) -> bool:
    """Move the model's latest.json to a committed `version` unless it names one at or after it; True if it names
    ours."""
    store = open_store(store_uri, s3_client)
    return _advance_pointer(store, model_name, version, version_uri(store, model_name, version), metrics)


def _advance_pointer(store: ArtifactStore, model_name: str, version: str, uri: str, metrics: dict) -> bool:
    """Move latest.json to `version` unless it already names a version at or after it; True if it names ours."""
    key = f"{model_name}/{POINTER_NAME}"
    new = _json_bytes({"version": version, "uri": uri, "metrics": metrics,
                       "published_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    for attempt in range(1, _POINTER_ATTEMPTS + 1):
        raw = store.get_bytes(key)
        current = _parse_pointer(raw, store.url_for(key))
        if current is not None and current["version"] >= version:
            if current["version"] != version:
                log.info("%s stays at %s: %s sorts after %s", store.url_for(key), current["version"],
                         current["version"], version)
            return current["version"] == version
        if store.compare_and_swap(key, new, raw):
            log.info("%s now names %s (was %s)", store.url_for(key), version, current and current["version"])
            return True
        log.info("another publisher moved %s first (attempt %d/%d): re-reading", store.url_for(key), attempt,
                 _POINTER_ATTEMPTS)
        time.sleep(random.uniform(0.0, 0.05 * attempt))  # jitter so that racing publishers do not collide again
    raise RuntimeError(f"could not update {store.url_for(key)} after {_POINTER_ATTEMPTS} attempts: "
                       "too many concurrent publishers")


def _committed_versions(store: ArtifactStore, model_name: str) -> list[str]:
    """Versions that carry a manifest, in publish order."""
    prefix = f"{model_name}/versions/"
    versions = []
    for key in store.list(prefix):
        parts = key[len(prefix) :].split("/")
        if len(parts) == 2 and parts[1] == MANIFEST_NAME:
            versions.append(parts[0])
    return sorted(versions)


def latest_version(store_uri: str, model_name: str, s3_client=None) -> dict | None:
    """The parsed latest.json of a model, or None if no version is published.

    If the pointer is missing or names a version without a manifest (a publisher died between the manifest and the
    pointer, or someone deleted objects by hand), the newest committed version is returned instead.
    """
    validate_name("model name", model_name)
    store = open_store(store_uri, s3_client)
    key = f"{model_name}/{POINTER_NAME}"
    pointer = _parse_pointer(store.get_bytes(key), store.url_for(key))
    if pointer is not None and _read_manifest(store, model_name, pointer["version"]) is not None:
        return pointer
    committed = _committed_versions(store, model_name)
    if not committed:
        return None
    version = committed[-1]
    log.warning("%s is %s: using the newest committed version %s", store.url_for(key),
                "missing" if pointer is None else f"naming uncommitted {pointer['version']}", version)
    manifest = _read_manifest(store, model_name, version) or {}
    return {"version": version, "uri": version_uri(store, model_name, version),
            "metrics": load_published_metrics(store_uri, model_name, version, s3_client),
            "published_at": manifest.get("created_at")}


def _committed_manifest(store: ArtifactStore, model_name: str, version: str,
                        trusted_sha256: str | None = None) -> dict[str, Any]:
    """The manifest of a committed version. trusted_sha256: the digest the registry recorded at publish time; a
    manifest with any other digest is TamperedVersion, refused before any file of the version is read."""
    validate_name("model name", model_name)
    validate_name("version", version)
    where = store.url_for(_version_prefix(model_name, version) + MANIFEST_NAME)
    found = _read_manifest_bytes(store, model_name, version, trusted_sha256)
    if found is None:
        raise FileNotFoundError(f"{model_name} version {version} is not published: no {where}")
    manifest, _ = found
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ValueError(f"{where} has no 'files' mapping")
    for name, entry in files.items():  # a name becomes a local path when fetched: all checked before any folder
        try:
            validate_key(name)
        except ValueError as exc:
            raise ValueError(f"{where} names an unsafe file: {exc}") from None
        if not (isinstance(entry, dict) and type(entry.get("bytes")) is int and entry["bytes"] >= 0
                and isinstance(entry.get("sha256"), str)):
            raise ValueError(f"{where}: the entry of {name!r} is not {{'bytes': <int>, 'sha256': <hex>}}")
    return manifest


def published_manifest(store_uri: str, model_name: str, version: str, s3_client=None,
                       trusted_sha256: str | None = None) -> dict[str, Any]:
    """The manifest of a committed version (its files with sizes and checksums); FileNotFoundError if uncommitted,
    TamperedVersion if its digest is not `trusted_sha256` (when given)."""
    return _committed_manifest(open_store(store_uri, s3_client), model_name, version, trusted_sha256)


def load_published_metrics(store_uri: str, model_name: str, version: str, s3_client=None) -> dict:
    """metrics.json of a committed version, checked against its manifest."""
    store = open_store(store_uri, s3_client)
    manifest = _committed_manifest(store, model_name, version)
    key = _version_prefix(model_name, version) + METRICS_NAME
    data = store.get_bytes(key)
    if data is None or _describe_bytes(data) != manifest["files"].get(METRICS_NAME):
        raise ValueError(f"{store.url_for(key)} is missing or does not match its manifest")
    return json.loads(data)


def fetch_published_file(store_uri: str, model_name: str, version: str, name: str, local_path: Path,
                         s3_client=None, trusted_sha256: str | None = None) -> Path:
    """Download one file of a committed version to local_path, verified against the manifest's size and sha256
    (and the manifest against the registry's digest, when given). The name is checked before any folder is made."""
    store = open_store(store_uri, s3_client)
    validate_key(name)
    manifest = _committed_manifest(store, model_name, version, trusted_sha256)
    return _fetch_file(store, model_name, version, manifest, name, Path(local_path))


def _fetch_file(store: ArtifactStore, model_name: str, version: str, manifest: dict[str, Any], name: str,
                local_path: Path) -> Path:
    entry = manifest["files"].get(name)
    key = _version_prefix(model_name, version) + name
    if entry is None:
        raise FileNotFoundError(f"{store.url_for(key)} is not in the version's manifest "
                                f"(has: {', '.join(sorted(manifest['files']))})")
    local_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = local_path.parent / f".tmp-{local_path.name}-{os.getpid()}-{random.getrandbits(32):08x}"
    try:
        store.download_file(key, tmp, max_bytes=entry["bytes"])  # a larger object never reaches the disk
        got = {"bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
        if got != {"bytes": entry["bytes"], "sha256": entry["sha256"]}:
            raise ValueError(f"{store.url_for(key)} does not match its manifest: {got['bytes']} bytes sha256 "
                             f"{got['sha256'][:12]}, expected {entry['bytes']} bytes sha256 {entry['sha256'][:12]}")
        os.replace(tmp, local_path)
    finally:
        tmp.unlink(missing_ok=True)
    return local_path


def fetch_published_version(store_uri: str, model_name: str, version: str, local_dir: Path,
                            s3_client=None, trusted_sha256: str | None = None,
                            wanted: Callable[[str], bool] | None = None) -> Path:
    """Every file of a committed version under local_dir (or those whose name `wanted` accepts: a scorer need not
    download a GB-sized serving export it never loads), each verified against the manifest (and the manifest
    against `trusted_sha256`, the digest the registry recorded at publish time, when given: TamperedVersion
    otherwise, before anything is downloaded); the directory appears only complete (atomic) with the version's
    manifest in it, listing the files it holds, and a later call that it holds every file of finds it and returns."""
    from tasks.core.storage import atomic_directory

    local_dir = Path(local_dir)
    store = open_store(store_uri, s3_client)
    manifest = _committed_manifest(store, model_name, version, trusted_sha256)
    files = {name: entry for name, entry in manifest["files"].items() if wanted is None or wanted(name)}
    local_manifest = local_dir / MANIFEST_NAME
    if local_manifest.is_file():
        held = json.loads(local_manifest.read_text()).get("files", {})
        if all(held.get(name) == entry for name, entry in files.items()):
            return local_dir
    with atomic_directory(local_dir) as tmp:
        for name in sorted(files):
            _fetch_file(store, model_name, version, manifest, name, tmp / name)
        (tmp / MANIFEST_NAME).write_text(json.dumps({**manifest, "files": files}, indent=2, sort_keys=True))
    left = len(manifest["files"]) - len(files)
    log.info("fetched %s version %s (%d files%s) into %s", model_name, version, len(files),
             f"; {left} its reader does not need left in the store" if left else "", local_dir)
    return local_dir


def parse_model_uri(uri: str) -> tuple[str, str, str | None]:
    """'<store>/<model>/versions/<version>' -> (store, model, version); '<store>/<model>' -> (store, model, None)
    (the latest version). The store is a directory or s3://bucket/prefix, as RECFLOW_PUBLISH_URI."""
    trimmed = uri.rstrip("/")
    head, _, last = trimmed.rpartition("/")
    if head.endswith("/versions"):
        store_and_model, version = head.removesuffix("/versions"), last
    else:
        store_and_model, version = trimmed, None
    store, _, model = store_and_model.rpartition("/")
    if not store or not model:
        raise ValueError(f"model URI {uri!r}: expected <store>/<model>[/versions/<version>]")
    validate_name("model name", model)
    if version is not None:
        validate_name("version", version)
    return store, model, version
