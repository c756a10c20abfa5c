"""Where published artifacts live: a local directory or an S3 prefix, behind one small interface.

`open_store(uri)` picks the backend from the URI: `s3://bucket/prefix` is S3 (boto3), `file:///path` or a plain path
is a local directory. Keys are relative, '/'-separated paths below the store root.

Both backends give the same guarantees:
- a reader never sees a half-written object (local: temp sibling + os.replace; S3: objects appear whole);
- `compare_and_swap` is the one primitive for keys that several writers share (the `latest.json` pointer):
  local uses an fcntl lock + re-read + os.replace, S3 uses conditional writes (If-None-Match / If-Match), which
  S3 has honoured since Aug/Nov 2024 and MinIO honours too.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from tasks.core.storage import TEMPORARY_PREFIXES, atomic_file, is_temporary

log = logging.getLogger(__name__)

DEFAULT_MULTIPART_THRESHOLD = 64 << 20
# S3 rejects multipart parts below 5 MiB (except the last), so chunks never go smaller.
_MIN_PART_BYTES = 5 << 20
_MAX_PARTS = 10_000  # S3's most parts in one multipart upload
_COPY_CHUNK = 8 << 20
# Names the local backend uses for its own bookkeeping (its atomic writes' temporaries and locks): keys may not use
# them, listings hide them.
_RESERVED_PREFIXES = TEMPORARY_PREFIXES
# get_bytes reads only small objects (a version's manifest, metrics and lineage, a model's latest.json): a larger one
# is not one of ours, and is refused before it is read into memory (a manifest lists ~200 bytes a file).
SMALL_OBJECT_MAX = 16 << 20
# S3 answers a lost conditional write with 412; a concurrent conditional write in flight gives 409.
_CONDITION_FAILED = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound"}


def validate_key(key: str) -> str:
    """The key unchanged if it is a safe relative path; ValueError with one clear line otherwise."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"artifact key {key!r} is empty: keys are relative paths like 'model/versions/v1/file'")
    if key.startswith("/"):
        raise ValueError(f"artifact key {key!r} starts with '/': keys are relative to the store root")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"artifact key {key!r} holds a backslash or NUL: use '/' as the only separator")
    for segment in key.split("/"):
        if segment == "":
            raise ValueError(f"artifact key {key!r} has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise ValueError(f"artifact key {key!r} has a '{segment}' segment: keys may not leave their prefix")
        if segment.startswith(_RESERVED_PREFIXES):
            raise ValueError(f"artifact key {key!r} has a segment starting with a reserved prefix {_RESERVED_PREFIXES}")
    return key


def _validate_prefix(prefix: str) -> str:
    """A listing prefix is a key, a key followed by '/', or empty (everything)."""
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class ObjectTooLarge(ValueError):
    """An object larger than what reads it expects (a manifest's entry, a small object's cap): not read."""


class _DigestingReader:
    """A file read once, front to back, hashing what is read: the digest is of exactly the bytes handed on.

    Not seekable on purpose: boto3 then reads it in order from one thread (s3transfer's non-seekable path buffers
    each part in memory and retries from that buffer), never twice and never out of order.
    """

    def __init__(self, file) -> None:
        self._file = file
        self._sha256 = hashlib.sha256()
        self.bytes = 0

    def read(self, amount: int = -1) -> bytes:
        data = self._file.read(amount)
        self._sha256.update(data)
        self.bytes += len(data)
        return data

    def seekable(self) -> bool:
        return False

    def description(self) -> dict[str, int | str]:
        return {"bytes": self.bytes, "sha256": self._sha256.hexdigest()}


class ArtifactStore(abc.ABC):
    """A flat key → bytes store with atomic writes and compare-and-swap."""

    uri: str

    def url_for(self, key: str) -> str:
        """The URI of a key, for manifests and logs."""
        return f"{self.uri.rstrip('/')}/{validate_key(key)}"

    @abc.abstractmethod
    def put_file(self, local_path: Path, key: str) -> dict[str, int | str]:
        """Upload a file, reading it once; returns {'bytes', 'sha256'} of what was uploaded (hashed as it was read,
        so a publisher needs no second pass over a model of many GB to describe it)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def get_bytes(self, key: str, max_bytes: int = SMALL_OBJECT_MAX) -> bytes | None:
        """The object's content, or None if it does not exist; ObjectTooLarge, before reading it, over max_bytes."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with `prefix` (a plain string prefix, as in S3)."""

    @abc.abstractmethod
    def download_file(self, key: str, local_path: Path, max_bytes: int | None = None) -> Path:
        """Copy an object to a local file atomically; FileNotFoundError if the key does not exist, ObjectTooLarge
        (nothing written) if it is larger than max_bytes."""

    def _too_large(self, key: str, size: int, max_bytes: int | None) -> None:
        if max_bytes is not None and size > max_bytes:
            raise ObjectTooLarge(f"artifact {self.url_for(key)} holds {size} bytes, more than the {max_bytes} "
                                 "expected: not read")

    @abc.abstractmethod
    def compare_and_swap(self, key: str, data: bytes, expected: bytes | None) -> bool:
        """Write `data` only if the current content equals `expected` (None: the key must not exist).

        Returns False, writing nothing, when the current content differs (another writer got there first).
        """


class LocalStore(ArtifactStore):
    """A directory on a local or shared POSIX file system."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def put_file(self, local_path: Path, key: str) -> dict[str, int | str]:
        with open(local_path, "rb") as src, atomic_file(self._path(key)) as dst:
            reader = _DigestingReader(src)
            shutil.copyfileobj(reader, dst, _COPY_CHUNK)
        return reader.description()

    def put_bytes(self, key: str, data: bytes) -> None:
        with atomic_file(self._path(key)) as dst:
            dst.write(data)

    def get_bytes(self, key: str, max_bytes: int = SMALL_OBJECT_MAX) -> bytes | None:
        try:
            with open(self._path(key), "rb") as src:
                self._too_large(key, os.fstat(src.fileno()).st_size, max_bytes)
                data = src.read(max_bytes + 1)
        except (FileNotFoundError, IsADirectoryError):
            return None
        self._too_large(key, len(data), max_bytes)  # grew while it was read
        return data

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        _validate_prefix(prefix)
        # Walk only the deepest directory the prefix names, not the whole store.
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        keys = []
        for path in base.rglob("*"):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and not is_temporary(rel) and rel.startswith(prefix):
                keys.append(rel)
        return sorted(keys)

    def download_file(self, key: str, local_path: Path, max_bytes: int | None = None) -> Path:
        source = self._path(key)
        if not source.is_file():
            raise FileNotFoundError(f"artifact {self.url_for(key)} does not exist")
        local_path = Path(local_path)
        with open(source, "rb") as src:
            self._too_large(key, os.fstat(src.fileno()).st_size, max_bytes)
            with atomic_file(local_path) as dst:
                shutil.copyfileobj(src, dst, _COPY_CHUNK)
        return local_path

    def compare_and_swap(self, key: str, data: bytes, expected: bytes | None) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # The lock file lives beside the key and is never removed: removing it would let two writers hold
        # locks on two different inodes. flock works across processes and across threads (separate opens).
        lock_path = path.parent / f".lock-{path.name}"
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = self.get_bytes(key)
                if current != expected:
                    return False
                with atomic_file(path) as dst:
                    dst.write(data)
                return True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


class S3Store(ArtifactStore):
    """A prefix in an S3 bucket (AWS, MinIO, moto), through boto3."""

    def __init__(self, client, bucket: str, prefix: str, multipart_threshold: int) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.multipart_threshold = multipart_threshold

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _transfer_config(self, size: int = 0):
        from boto3.s3.transfer import TransferConfig

        # Chunk = threshold (at least S3's minimum part), so a file just above the threshold goes as 2 parts; larger
        # where `size` would need more than S3's 10,000 parts (boto3 cannot adjust it for a non-seekable reader).
        chunk = max(self.multipart_threshold, _MIN_PART_BYTES, -(-size // _MAX_PARTS))
        # "classic": s3transfer, whose reading of put_file's reader is what the digest relies on (boto3 would pick
        # its CRT client, which has its own part sizes, on some instance types where awscrt is installed).
        return TransferConfig(multipart_threshold=self.multipart_threshold, multipart_chunksize=chunk,
                              preferred_transfer_client="classic")

    def put_file(self, local_path: Path, key: str) -> dict[str, int | str]:
        # A multipart upload completes only when every part arrived, so the object appears whole. The reader is not
        # seekable: boto3 holds the parts it sends in memory, at most ~11 (10 in flight, s3transfer's
        # max_in_memory_upload_chunks, and the one read next): ~700 MiB at the default 64 MiB threshold.
        s3_key = self._key(key)
        with open(local_path, "rb") as src:
            reader = _DigestingReader(src)
            config = self._transfer_config(os.fstat(src.fileno()).st_size)
            self.client.upload_fileobj(reader, self.bucket, s3_key, Config=config)
        return reader.description()

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def _get(self, key: str, max_bytes: int = SMALL_OBJECT_MAX) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _error_code(exc) in _MISSING:
                return None
            raise
        with contextlib.closing(response["Body"]) as body:
            self._too_large(key, int(response.get("ContentLength") or 0), max_bytes)
            data = body.read(max_bytes + 1)
        self._too_large(key, len(data), max_bytes)
        return data, response["ETag"]

    def get_bytes(self, key: str, max_bytes: int = SMALL_OBJECT_MAX) -> bytes | None:
        found = self._get(key, max_bytes)
        return None if found is None else found[0]

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _error_code(exc) in _MISSING:
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[str]:
        _validate_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        keys = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            keys.extend(obj["Key"][len(root) :] for obj in page.get("Contents", []))
        return sorted(keys)

    def download_file(self, key: str, local_path: Path, max_bytes: int | None = None) -> Path:
        from botocore.exceptions import ClientError

        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.parent / f".tmp-{local_path.name}-{uuid.uuid4().hex[:8]}"
        try:
            callback = None
            if max_bytes is not None:  # the size is checked before any byte lands on disk
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
                self._too_large(key, int(head["ContentLength"]), max_bytes)
                callback = self._byte_limit(key, max_bytes)  # and the bytes counted: it may change after the HEAD
            self.client.download_file(self.bucket, self._key(key), str(tmp), Callback=callback)
            os.replace(tmp, local_path)
        except ClientError as exc:
            if _error_code(exc) in _MISSING:
                raise FileNotFoundError(f"artifact {self.url_for(key)} does not exist") from None
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return local_path

    def _byte_limit(self, key: str, max_bytes: int) -> Callable[[int], None]:
        """A download progress callback that stops the transfer once more than `max_bytes` arrived (an object
        replaced by a larger one between the size check and the transfer; s3transfer calls it from its threads)."""
        received, lock = [0], threading.Lock()

        def count(new_bytes: int) -> None:
            with lock:
                received[0] += new_bytes
                if received[0] > max_bytes:
                    raise ObjectTooLarge(f"artifact {self.url_for(key)} sent more than the {max_bytes} bytes "
                                         "expected (it changed after its size was checked): not kept")

        return count

    def compare_and_swap(self, key: str, data: bytes, expected: bytes | None) -> bool:
        from botocore.exceptions import ClientError

        full_key = self._key(key)
        condition: dict[str, str]
        if expected is None:
            condition = {"IfNoneMatch": "*"}
        else:
            current = self._get(key)
            if current is None or current[0] != expected:
                return False
            # The ETag pins the exact object we compared: if anyone replaced it since, S3 answers 412.
            condition = {"IfMatch": current[1]}
        try:
            self.client.put_object(Bucket=self.bucket, Key=full_key, Body=data, **condition)
        except ClientError as exc:
            code = _error_code(exc)
            # NoSuchKey: the object we matched on was deleted in between; that is a lost race too.
            if code in _CONDITION_FAILED or (expected is not None and code in _MISSING):
                log.info("conditional write of s3://%s/%s lost (%s)", self.bucket, full_key, code)
                return False
            raise
        return True


def open_store(
    uri: str, s3_client=None, multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
) -> ArtifactStore:
    """The store a URI names: `s3://bucket/prefix`, `file:///abs/path` or a plain local path.

    s3_client: a boto3 S3 client; default `boto3.client("s3")`, configured from the environment
        (AWS_ENDPOINT_URL_S3 points it at MinIO). multipart_threshold: S3 uploads above it go multipart.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URI {uri!r} names no bucket: expected s3://bucket/prefix")
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        return S3Store(s3_client, parsed.netloc, parsed.path, multipart_threshold)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"store URI {uri!r} names host {parsed.netloc!r}: only local file:// URIs are supported")
        return LocalStore(Path(unquote(parsed.path)))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive, i.e. a plain path
        raise ValueError(f"store URI {uri!r} has unsupported scheme {parsed.scheme!r}: use s3://, file:// or a path")
    return LocalStore(Path(uri))
