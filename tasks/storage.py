"""Atomic outputs and manifests under the data root.

Every task that writes follows one rule: write into a temporary sibling, then publish with a rename. A finished
output directory carries `_MANIFEST.json` (written last, atomically) naming its inputs' fingerprint, row counts and
the size + sha256 of every file it holds. A retry that finds a valid manifest for the same inputs does no work.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST_NAME = "_MANIFEST.json"
_HASH_CHUNK = 8 << 20


def file_sha256(path: Path) -> str:
    """sha256 of a file, streamed in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(value: Any) -> str:
    """Stable short hash of a JSON-serialisable value (inputs, configs)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Manifest:
    """What a finished output holds. `inputs` is whatever identifies the work (upstream checksums, config)."""

    kind: str
    inputs: dict[str, Any]
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    @property
    def inputs_fingerprint(self) -> str:
        return fingerprint(self.inputs)

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"inputs_fingerprint": self.inputs_fingerprint}, indent=2, sort_keys=True)


def describe_files(directory: Path, checksum: bool = True) -> dict[str, dict[str, Any]]:
    """Size (and sha256) of every file below a directory, keyed by relative path; the manifest itself excluded."""
    described: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST_NAME:
            continue
        entry: dict[str, Any] = {"bytes": path.stat().st_size}
        if checksum:
            entry["sha256"] = file_sha256(path)
        described[rel] = entry
    return described


def write_manifest(directory: Path, manifest: Manifest, checksum: bool = True) -> Manifest:
    """Describe the directory's files into the manifest and write it last, atomically."""
    manifest.files = describe_files(directory, checksum=checksum)
    manifest.created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_text_atomic(directory / MANIFEST_NAME, manifest.to_json())
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def completed_manifest(directory: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The directory's manifest if it is complete for these inputs: same fingerprint, every file present, same size.

    Sizes (not checksums) are re-checked so that the cache check stays cheap on multi-GB outputs.
    """
    manifest = read_manifest(directory)
    if manifest is None or manifest.get("inputs_fingerprint") != fingerprint(inputs):
        return None
    for rel, entry in manifest.get("files", {}).items():
        path = directory / rel
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            log.info("cached output %s is incomplete (%s missing or changed): redoing it", directory, rel)
            return None
    return manifest


def _temporary_sibling(final: Path) -> Path:
    return final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `final` only if the block finishes without error.

    Readers see either the old complete directory or the new complete one, never a half-written one: the old
    directory is first renamed aside (its manifest goes with it), then the new one renamed into place.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(final)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_directory(tmp, final)


def replace_directory(src: Path, final: Path) -> None:
    """Move a finished directory into place, discarding what was there."""
    trash = None
    if final.exists():
        trash = _temporary_sibling(final)
        os.replace(final, trash)
    os.replace(src, final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(final: Path, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary sibling for writing; fsync and rename it over `final` when the block succeeds."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(final)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_text_atomic(final: Path, text: str) -> None:
    with atomic_file(final, "w") as f:
        f.write(text)


def remove_stale_temporaries(directory: Path) -> int:
    """Delete `.tmp-*` leftovers of killed writers in a directory; returns how many were removed."""
    removed = 0
    if not directory.is_dir():
        return 0
    for path in directory.glob(".tmp-*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed += 1
    return removed
