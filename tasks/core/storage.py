"""Atomic outputs and manifests under the data root.

Every task that writes follows one rule: write into a temporary sibling, then publish with a rename. A finished
output directory carries `_MANIFEST.json` (written last, atomically) naming its inputs' fingerprint, row counts and
the size + sha256 of every file it holds. A retry that finds a valid manifest for the same inputs does no work.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
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
    """Size (and sha256) of every file below a directory, keyed by relative path; the manifest itself and writers'
    temporaries and locks excluded (never part of an output: a killed writer's leftover is removed by the next
    atomic write beside it, the manifest's own included, which would leave the manifest naming a missing file)."""
    described: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST_NAME or is_temporary(rel):
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


_HOST = socket.gethostname().replace("~", "_") or "localhost"
STALE_FOREIGN_TEMPORARY_S = 24 * 3600  # another host's writer cannot be checked: its leftovers expire after a day


def _temporary_sibling(final: Path) -> Path:
    """`.tmp-<name>~<host>~<pid>~<random>`: the writer's host and pid let a later writer tell a leftover of a killed
    writer (pid gone) from a live one's work in progress."""
    return final.parent / f".tmp-{final.name}~{_HOST}~{os.getpid()}~{uuid.uuid4().hex[:8]}"


# A writer's temporary sibling and a lock file start with these: never part of what a reader copies or publishes.
TEMPORARY_PREFIXES = (".tmp-", ".lock-")


def is_temporary(relative: Path | str) -> bool:
    """Whether a path (relative to an output) is, or lies under, a writer's temporary or a lock file: never part of
    what a reader copies or publishes (a killed writer on another host leaves one for a day)."""
    return any(part.startswith(TEMPORARY_PREFIXES) for part in Path(relative).parts)


def _writer_gone(path: Path, now: float) -> bool:
    parts = path.name.rsplit("~", 3)
    if len(parts) != 4 or not parts[2].isdigit() or parts[1] != _HOST:
        try:  # another host's (or an unrecognised) temporary: stale once old enough
            return now - path.lstat().st_mtime > STALE_FOREIGN_TEMPORARY_S
        except FileNotFoundError:
            return False
    pid = int(parts[2])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False  # alive (or its pid reused: then kept, the safe side)


def remove_stale_temporaries(directory: Path, name: str | None = None) -> int:
    """Delete `.tmp-*` leftovers of killed writers in `directory` (only those of output `name`, if given): their
    writer's pid is gone on this host, or, for another host's, they are older than a day. A live writer's
    temporary is never touched. Returns how many were removed."""
    if not directory.is_dir():
        return 0
    now, removed = time.time(), []
    pattern = f".tmp-{glob.escape(name)}~*" if name is not None else ".tmp-*"
    for path in directory.glob(pattern):
        if not _writer_gone(path, now):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    if removed:
        log.info("removed %d leftover temporaries of killed writers in %s: %s", len(removed), directory,
                 ", ".join(sorted(removed)))
    return len(removed)


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `final` only if the block finishes without error.

    Readers see either the old complete directory or the new complete one, never a half-written one: the old
    directory is first renamed aside (its manifest goes with it), then the new one renamed into place.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent, final.name)  # a killed earlier attempt's half-written copy
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
    remove_stale_temporaries(final.parent, final.name)
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


class PartitionLockTimeout(TimeoutError):
    """Another run held a partition's lock for longer than the wait allowed (a retry waits again)."""


_LOCK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}")
_LOCK_POLL_S = 0.2
_LOCK_REPORT_EVERY_S = 60.0


def partition_lock_path(root: Path, dataset: str, key: str) -> Path:
    """`<root>/<dataset>/.lock-<key>`: one lock file per partition, kept (removing a lock file races its waiters)."""
    for kind, value in (("dataset", dataset), ("partition key", key)):
        if not _LOCK_NAME.fullmatch(value):
            raise ValueError(f"{kind} {value!r} cannot name a lock: use 1-128 of A-Z a-z 0-9 _ . = -")
    return Path(root) / dataset / f".lock-{key}"


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
    except OSError:
        text = []
    if len(text) >= 2 and text[0].isdigit():
        return f"pid {text[0]} on host {text[1]}" + (f" since {text[2]}" if len(text) > 2 else "")
    return "another process"


@contextlib.contextmanager
def partition_lock(root: Path, dataset: str, key: str, *, timeout_s: float = 3600.0,
                   label: str | None = None) -> Iterator[None]:
    """Hold the exclusive lock of one partition (dataset + key, e.g. a day) for the block, so that two runs of the
    same partition never write the same files at once: the second waits, then finds the first one's finished output.

    An fcntl.flock on `<root>/<dataset>/.lock-<key>` (a shared data root: the lock works across hosts where the file
    system supports flock, e.g. NFSv4, where Linux maps it to byte-range locks). The kernel drops it when the holder
    exits, however it dies. The holder writes its pid, host and start time into the file, so a waiter logs who it
    waits for. Waits at most timeout_s, then raises PartitionLockTimeout (retryable: the holder may still finish).
    """
    import fcntl

    path = partition_lock_path(root, dataset, key)
    label = label or f"{dataset} {key}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        started = time.monotonic()
        reported = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= timeout_s:
                    raise PartitionLockTimeout(
                        f"{label}'s lock {path} is still held by {_lock_holder(fd)} after {waited:.0f} s: giving up "
                        "(a retry waits again; RECFLOW_PARTITION_LOCK_TIMEOUT_S sets the wait)") from None
                if reported is None or waited - reported >= _LOCK_REPORT_EVERY_S:
                    log.info("waiting for %s's lock held by %s (%.0f s so far, at most %.0f s)", label,
                             _lock_holder(fd), waited, timeout_s)
                    reported = waited
                time.sleep(min(_LOCK_POLL_S, max(timeout_s - waited, 0.0)))
        if reported is not None:
            log.info("got %s's lock after waiting %.1f s", label, time.monotonic() - started)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_HOST} {stamp}\n".encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # nobody holds it now (the next holder writes its own line)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
