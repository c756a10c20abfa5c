"""Download one source object (file / http(s) / s3) to a local file: streamed, resumable, checksummed, gunzipped.

Bytes go to `<destination>.part`; an interrupted transfer resumes from it with a Range request, within the call (up to
`max_resume_attempts`) and across Airflow retries, since the .part stays. Beside it, `<destination>.part.json` records
the URL and the source's version (ETag / Last-Modified) the bytes came from: a resume names that version (If-Range),
so a source that changed meanwhile is fetched whole, and a .part from another URL or of unknown version is discarded,
never glued to another file's tail. The sha256 covers the SOURCE bytes (what a published checksum refers to). A `.gz`
source is decompressed into the destination, because Spark cannot split gzip: while it is fetched, by a thread fed the
bytes as they are appended to the .part (a resumed .part is fed as it is re-read for its hash), so no second pass
reads the .part after the transfer; a local (file://) `.gz` is read once into the thread with no .part at all (a
file read needs no resume, and the .part would be a second copy of every source byte). The destination appears only complete and verified (rename); a sidecar
`<destination>.download.json`, written after it, lets a retry with the same source return at once without touching
the network.

A local (file://) source that is not decompressed is hard-linked when the caller allows it (`link_local`) and the
destination is on the same filesystem: one read to hash it instead of a read, a write and an fsync of every byte
(~0.4 s of CPU per 230 MB day, issue #27). A link shares the source's inode, so a later write into the source in
place would change the downloaded bytes under the checksum recorded for them: the sidecar records the inode's
change time (ctime, which only the kernel sets, on any write, truncate, chmod or new link), and `vouched_sha256` /
the cached check trust the recorded checksum only while it is unchanged (else the file is hashed again, or fetched
again). A source replaced by rename (a new inode) leaves the link alone. Our code never writes a downloaded file in
place (it is replaced by rename), so a link cannot change the source either. Without a link (another filesystem, a
filesystem without links, no permission) the bytes are copied as for any source.

Limits (tasks.core.config.Settings): at most `download_max_bytes` source bytes, `expanded_max_bytes` decompressed
bytes (a gzip bomb is refused at the cap, nothing left behind), and `download_deadline_s` for the whole download,
resumes included: a server that trickles a byte a minute fails by the deadline.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from tasks.core.archive import ExpansionLimitExceeded
from tasks.core.config import NotAllowed
from tasks.core.download_sources import (  # noqa: F401 - errors and the S3 client factory are this module's API too
    ChecksumMismatch, ConnectionNotAllowed, Deadline, DeadlineExceeded, DownloadError, DownloadTooLarge, Opener,
    SourceNotAllowed, SourceNotFound, _Body, _Interrupted, _opener, _parse_source, _RangeNotSatisfiable, _Source,
    check_source_prefix, s3_client_from_connection,
)
from tasks.core.progress import ProgressLog
from tasks.core.storage import atomic_file, write_text_atomic

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 5.0
_GUNZIP_QUEUE_BYTES = 64 << 20  # fetched bytes waiting for the decompressing thread, at most
_GUNZIP_HANDOVER_BYTES = 1 << 20  # what the fetch hands the thread at a time (small reads gathered, large cut)
_GUNZIP_PIECE_BYTES = 256 << 10  # what the thread hands zlib at a time (and checks for a stop between)
_HASHED_SUFFIX = ".sha256.json"  # recorded_sha256's record beside a file no download vouches for


@dataclass
class DownloadResult:
    path: str  # final local file
    source: str  # the URL
    bytes: int  # size of the final file
    source_bytes: int  # bytes of the source object (compressed size for .gz)
    sha256: str  # sha256 of the SOURCE bytes
    resumed_from: int  # byte offset a resume started at (0 if none)
    cached: bool  # a verified copy already existed and nothing was transferred
    seconds: float


@dataclass
class _Part:
    path: Path
    digest: Any  # hashlib sha256 over the bytes in the .part
    offset: int
    validator: str | None = None  # the source version the bytes came from (recorded in <part>.json)


@dataclass(frozen=True)
class _Limits:
    max_bytes: int  # source bytes
    max_expanded: int  # decompressed bytes
    deadline: Deadline


def download(
    source_url: str, destination: Path, *, expected_sha256: str | None = None, decompress: bool | None = None,
    s3_client: Any = None, chunk_bytes: int = 8 << 20, timeout_s: float = 60.0, max_resume_attempts: int = 3,
    allowed_file_roots: Sequence[Path] | None = None, allowed_prefixes: Sequence[str] | None = None,
    max_bytes: int | None = None, max_expanded_bytes: int | None = None, deadline_s: float | None = None,
    link_local: bool = False,
) -> DownloadResult:
    """Fetch `source_url` into `destination` (see the module docstring); safe to retry.

    decompress: None = gunzip when the URL path ends with `.gz`. s3_client: a boto3 S3 client (default: boto3's
    default chain, see s3_client_from_connection). allowed_file_roots: directories a file:// source must lie under
    (symlinks resolved); None = the deployment's roots (tasks.core.config.Settings.allowed_file_roots()), so no
    caller can forget the check. allowed_prefixes: URL prefixes an http(s)/s3 source must lie under (whole path
    segments, same scheme/host/port or bucket); None = the deployment's RECFLOW_SOURCE_ALLOWED_PREFIXES (none when
    unset: a dataset passes its configured source's folder). Either refusal is a SourceNotAllowed, before any I/O;
    every HTTP redirect hop is checked against the same prefixes. max_bytes / max_expanded_bytes / deadline_s: the
    limits (None: the deployment's RECFLOW_DOWNLOAD_MAX_BYTES / _EXPANDED_MAX_BYTES / _DOWNLOAD_DEADLINE_S).
    link_local: hard-link a local source instead of copying it (module docstring), for a caller whose readers ask
    vouched_sha256 (not the sidecar directly) what the file holds.
    """
    from tasks.core.config import load_settings

    started = time.monotonic()
    destination = Path(destination)
    settings = load_settings()
    if allowed_prefixes is None:
        allowed_prefixes = settings.allowed_source_prefixes()
    source = check_source_allowed(source_url, allowed_file_roots=allowed_file_roots,
                                  allowed_prefixes=allowed_prefixes)
    limits = _Limits(max_bytes=settings.download_max_bytes if max_bytes is None else max_bytes,
                     max_expanded=settings.expanded_max_bytes if max_expanded_bytes is None else max_expanded_bytes,
                     deadline=Deadline.after(settings.download_deadline_s if deadline_s is None else deadline_s))
    if decompress is None:
        decompress = urlsplit(source_url).path.endswith(".gz")
    expected = expected_sha256.strip().lower() if expected_sha256 else None
    sidecar = _sidecar_path(destination)
    cached = _cached(source_url, destination, expected, decompress)
    if cached is not None:
        log.info("%s already downloaded from %s (sha256 %s): nothing to do", destination, source.shown, cached.sha256)
        cached.seconds = time.monotonic() - started
        return cached
    sidecar.unlink(missing_ok=True)  # a stale sidecar must never vouch for the file being replaced
    destination.with_name(destination.name + _HASHED_SUFFIX).unlink(missing_ok=True)  # nor recorded_sha256's record
    destination.parent.mkdir(parents=True, exist_ok=True)
    if link_local and source.path is not None and not decompress:
        linked = _link_local(source.path, destination, source.shown, expected, limits.max_bytes)
        if linked is not None:
            result = DownloadResult(path=str(destination), source=source_url, bytes=linked.st_size,
                                    source_bytes=linked.st_size, sha256=linked.sha256, resumed_from=0, cached=False,
                                    seconds=time.monotonic() - started)
            record = _sidecar_record(result, decompress) | {"linked_ctime_ns": linked.ctime_ns}
            write_text_atomic(sidecar, json.dumps(record, indent=2, sort_keys=True))
            log.info("downloaded %s -> %s as a hard link: %d bytes, sha256 %s, %.1f s", source.shown, destination,
                     result.bytes, result.sha256, result.seconds)
            return result
    part_path = destination.with_name(destination.name + ".part")
    open_at = _opener(source, s3_client, chunk_bytes, timeout_s, limits.deadline, allowed_prefixes)
    fetch = functools.partial(_fetch_to_part, open_at, source_url, source.shown, part_path, max_resume_attempts,
                              limits)
    if decompress:
        local = source.path is not None
        with atomic_file(destination) as out, _StreamingGunzip(out, None if local else part_path, source.shown,
                                                               limits.max_expanded) as gunzip:
            if local:
                part, resumed_from = _read_local(open_at, source.shown, part_path, limits, gunzip), 0
            else:
                part, resumed_from = fetch(gunzip)
            actual = _verified(part, expected, source.shown)
            gunzip.finish()
        _discard_part(part_path)
    else:
        part, resumed_from = fetch(None)
        actual = _verified(part, expected, source.shown)
        os.replace(part_path, destination)
        _part_record_path(part_path).unlink(missing_ok=True)
    result = DownloadResult(
        path=str(destination), source=source_url, bytes=destination.stat().st_size, source_bytes=part.offset,
        sha256=actual, resumed_from=resumed_from, cached=False, seconds=time.monotonic() - started,
    )
    write_text_atomic(sidecar, json.dumps(_sidecar_record(result, decompress), indent=2, sort_keys=True))
    log.info("downloaded %s -> %s: %d source bytes, %d bytes on disk, sha256 %s, %.1f s",
             source.shown, destination, result.source_bytes, result.bytes, actual, result.seconds)
    return result


def check_source_allowed(source_url: str, *, allowed_file_roots: Sequence[Path] | None = None,
                         allowed_prefixes: Sequence[str] | None = None) -> _Source:
    """Parse the URL and refuse it unless it lies under an allowed file root (file://) or URL prefix (http(s),
    s3); None = the deployment's (see download()). Touches nothing: callers may check before taking locks."""
    source = _parse_source(source_url)
    if source.path is not None:
        if allowed_file_roots is None:
            from tasks.core.config import load_settings

            allowed_file_roots = load_settings().allowed_file_roots()
        check_file_root(source.path, allowed_file_roots)
    else:
        if allowed_prefixes is None:
            from tasks.core.config import load_settings

            allowed_prefixes = load_settings().allowed_source_prefixes()
        check_source_prefix(source_url, allowed_prefixes)
    return source


def check_file_root(path: Path, roots: Sequence[Path]) -> None:
    """A local source must lie under one of the allowed roots, symlinks resolved (a trigger form names the URL)."""
    resolved = Path(path).resolve()
    roots = [Path(root).resolve() for root in roots]
    if not any(resolved.is_relative_to(root) for root in roots):
        raise SourceNotAllowed(f"file source {resolved} is outside the allowed roots {[str(r) for r in roots]} "
                               f"(set RECFLOW_FILE_SOURCE_ROOTS to allow more)")


def _part_record_path(part_path: Path) -> Path:
    return part_path.with_name(part_path.name + ".json")


def _discard_part(part_path: Path) -> None:
    part_path.unlink(missing_ok=True)
    _part_record_path(part_path).unlink(missing_ok=True)


def _verified(part: _Part, expected: str | None, shown: str) -> str:
    """The fetched bytes' sha256, refused (and the .part discarded) when it is not the expected one."""
    actual = part.digest.hexdigest()
    if expected and actual != expected:
        _discard_part(part.path)  # wrong bytes: a retry must start over, not resume them
        raise ChecksumMismatch(f"sha256 mismatch for {shown}: expected {expected}, got {actual}")
    return actual


def _existing_part(path: Path, source_url: str, shown: str, gunzip: _StreamingGunzip | None) -> _Part:
    """The .part left by an earlier attempt of this very source and version, re-hashed (and fed to `gunzip`) so
    that the final sha256 covers every source byte; an empty part when there is none, or when its record names another
    URL or no version (its bytes could be another file's: resuming would glue two files together)."""
    digest = hashlib.sha256()
    if not path.is_file():
        _part_record_path(path).unlink(missing_ok=True)
        return _Part(path, digest, 0)
    record: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(_part_record_path(path).read_text())
    if not isinstance(record, dict) or record.get("source") != source_url or not record.get("validator"):
        log.warning("%s: the leftover %s %s: starting over", shown, path.name,
                    "came from another source" if isinstance(record, dict) and record.get("source") not in
                    (None, source_url) else "has no recorded source version")
        _discard_part(path)
        return _Part(path, digest, 0)
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
            offset += len(chunk)
            if gunzip is not None:
                gunzip.feed(chunk)
    return _Part(path, digest, offset, record["validator"])


def _open_from(open_at: Opener, part: _Part, shown: str) -> _Body:
    if part.offset and not part.validator:
        log.warning("%s sent no version (ETag / Last-Modified) to resume against: starting over", shown)
        return open_at(0, None)
    try:
        return open_at(part.offset, part.validator)
    except _RangeNotSatisfiable as exc:
        if exc.total == part.offset:  # an earlier attempt already fetched everything
            return _Body(part.offset, part.offset, iter(()), lambda: None, part.validator)
        log.warning("%s: the .part holds %d bytes but the source has %s: starting over", shown, part.offset, exc.total)
        return open_at(0, None)


def _restart(part: _Part, body: _Body, source_url: str, gunzip: _StreamingGunzip | None) -> _Part:
    """An empty .part for a body sent from byte 0, its record naming the URL and the version it comes from."""
    if gunzip is not None:
        gunzip.restart()
    _discard_part(part.path)
    write_text_atomic(_part_record_path(part.path), json.dumps({"source": source_url, "validator": body.validator}))
    return _Part(part.path, hashlib.sha256(), 0, body.validator)


def _fetch_to_part(open_at: Opener, source_url: str, shown: str, path: Path, max_resume_attempts: int,
                   limits: _Limits, gunzip: _StreamingGunzip | None) -> tuple[_Part, int]:
    """Fill the .part with the whole source, resuming after drops, feeding `gunzip` (if any) every byte in order;
    returns the part and the first resume offset."""
    part = _existing_part(path, source_url, shown, gunzip)
    resumed_from, failures = 0, 0
    progress = ProgressLog(f"downloading {shown}", unit="bytes", every_s=_PROGRESS_EVERY_S, logger=log,
                           done=part.offset)  # the rate counts this call's bytes, not a resumed .part's
    while True:
        limits.deadline.check(shown, part.offset)
        body = _open_from(open_at, part, shown)
        try:
            if body.start not in (part.offset, 0):
                raise DownloadError(f"{shown} answered from byte {body.start} when asked for byte {part.offset}")
            if body.start == 0:
                if part.offset:
                    log.warning("%s answered from byte 0, not %d (Range ignored, or the source changed since the "
                                ".part was started): restarting from 0", shown, part.offset)
                part = _restart(part, body, source_url, gunzip)
            elif not resumed_from:
                resumed_from = part.offset
                log.info("resuming %s from byte %d", shown, part.offset)
            _append(body, part, progress, shown, limits, gunzip)
            return part, resumed_from
        except _Interrupted as exc:
            failures += 1
            if failures > max_resume_attempts:
                raise DownloadError(
                    f"transfer of {shown} interrupted at byte {part.offset} after {max_resume_attempts} "
                    f"resume attempts ({exc}); {path} kept for the next retry") from None
            log.warning("transfer of %s interrupted at byte %d (%s): resuming, attempt %d of %d",
                        shown, part.offset, exc, failures, max_resume_attempts)
            time.sleep(min(failures - 1, 10))  # first resume at once, then back off a little
        finally:
            body.close()


def _read_local(open_at: Opener, shown: str, part_path: Path, limits: _Limits, gunzip: _StreamingGunzip) -> _Part:
    """A local source read once, hashed as it is handed to `gunzip`, with no .part: the .part exists to resume an
    interrupted transfer, and for a file it would be a second full copy of the compressed source, written and
    fsynced. A read that fails is a DownloadError (the task's retry reads the file again, from its start); a gzip
    the thread finds bad (or cannot write out) stops the read there, since no .part is being kept."""
    _discard_part(part_path)  # one an earlier attempt left (the source was remote then) is of no use now
    part = _Part(part_path, hashlib.sha256(), 0)
    progress = ProgressLog(f"reading {shown}", unit="bytes", every_s=_PROGRESS_EVERY_S, logger=log)
    limits.deadline.check(shown, 0)
    body = open_at(0, None)
    try:
        _append(body, part, progress, shown, limits, gunzip, keep=False)
        if gunzip.failed:
            gunzip.finish()  # raises what the thread found
    except _Interrupted as exc:
        raise DownloadError(f"reading {shown} failed at byte {part.offset}: {exc}") from None
    finally:
        body.close()
    return part


def _append(body: _Body, part: _Part, progress: ProgressLog, shown: str, limits: _Limits,
            gunzip: _StreamingGunzip | None, *, keep: bool = True) -> None:
    """Append the body to the .part, hashing as it goes and handing it to `gunzip` (if any); with `keep` False no
    .part is written, and the read stops once `gunzip` has failed. A body shorter than announced is an interruption. Refuses a source larger than the byte cap (announced or not) and stops at the
    deadline between any two reads."""
    if body.total is not None and body.total > limits.max_bytes:
        _discard_part(part.path)
        raise DownloadTooLarge(f"{shown} holds {body.total} bytes, more than the {limits.max_bytes} one download "
                               "may fetch (set RECFLOW_DOWNLOAD_MAX_BYTES to allow more)")
    with open(part.path, "ab") if keep else contextlib.nullcontext() as f:
        try:
            for chunk in body.chunks:
                limits.deadline.check(shown, part.offset)
                if part.offset + len(chunk) > limits.max_bytes:
                    if f is not None:
                        f.close()
                    _discard_part(part.path)
                    raise DownloadTooLarge(f"{shown} sent more than the {limits.max_bytes} bytes one download may "
                                           "fetch (set RECFLOW_DOWNLOAD_MAX_BYTES to allow more)")
                if f is not None:
                    f.write(chunk)
                elif gunzip is not None and gunzip.failed:
                    return  # nothing is kept: the rest of the source need not be read
                part.digest.update(chunk)
                part.offset += len(chunk)
                if gunzip is not None:
                    gunzip.feed(chunk)
                progress.report(part.offset, total=body.total)
        finally:
            if f is not None and not f.closed:
                f.flush()
                os.fsync(f.fileno())  # what the .part claims to hold must be on disk before a resume trusts it
    if body.total is not None and part.offset != body.total:
        if part.offset > body.total:
            raise DownloadError(f"{shown} sent {part.offset} bytes, more than its announced {body.total}")
        raise _Interrupted(f"stream ended at byte {part.offset} of {body.total}")


class _Aborted(Exception):
    """The decompressing thread was told to stop (a restart from byte 0, or the download failed)."""


class _GzipStream:
    """gzip's decompression of a byte stream handed over in chunks, as GzipFile reads it: one or more members, each
    with its CRC and length checked (zlib, wbits 31), zero padding allowed between and after members (zlib is
    stricter on a header than GzipFile: reserved flag bits and a header CRC are checked, as RFC 1952 asks); the output
    written to `out`, refused past `max_expanded` bytes. Pieces of up to _GUNZIP_PIECE_BYTES go to zlib (which
    releases the GIL), not GzipFile's 8 KiB reads: the Python overhead per byte is what kept a decompressing thread
    from overlapping; small enough that a member's end copies little (`unused_data`) and an error is placed within
    a piece."""

    OUT_BYTES = 16 << 20  # the most one zlib call returns

    def __init__(self, out: BinaryIO, max_expanded: int, what: str) -> None:
        self.out, self.max_expanded, self.what = out, max_expanded, what
        self.inflater: Any = None  # the member being decompressed; None between members
        self.members = self.consumed = self.expanded = 0

    def write(self, data: bytes | memoryview) -> None:
        while data:
            if self.inflater is None:
                if self.members:
                    padded = len(data)
                    data = bytes(data).lstrip(b"\0")  # padding after a member
                    self.consumed += padded - len(data)
                    if not data:
                        return
                self.inflater = zlib.decompressobj(wbits=31)  # a gzip member: a bad header is a zlib.error
            before = len(data)
            while True:
                expanded = self.inflater.decompress(data, self.OUT_BYTES)
                self._emit(expanded)
                data = self.inflater.unconsumed_tail
                if self.inflater.eof or (not data and len(expanded) < self.OUT_BYTES):
                    break
            if self.inflater.eof:
                data = self.inflater.unused_data
                self.inflater = None
                self.members += 1
            self.consumed += before - len(data)

    def close(self) -> None:
        if self.inflater is not None:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        if not self.members:
            raise EOFError("the file is empty (no gzip member)")

    def _emit(self, expanded: bytes) -> None:
        self.expanded += len(expanded)
        if self.expanded > self.max_expanded:
            raise ExpansionLimitExceeded(f"{self.what} expands to more than {self.max_expanded} bytes; refusing to "
                                         "unpack it (a decompression bomb? set RECFLOW_EXPANDED_MAX_BYTES to allow "
                                         "more)")
        self.out.write(expanded)


class _StreamingGunzip:
    """Decompresses the source into `out` while it is fetched: the fetch hands every byte, in order, to a thread
    (_GzipStream; zlib and file writes release the GIL, so the transfer and the decompression overlap instead of
    following each other; at most _GUNZIP_QUEUE_BYTES wait, then the fetch waits). A corrupt or truncated gzip, or one
    expanding past `max_expanded`, is reported by `finish`, after the transfer and its sha256 check, as when the .part
    was decompressed afterwards; a failed thread drops the rest of the bytes meanwhile. `restart` (the source is
    fetched from byte 0 again) starts over with an empty `out`. `part`: the .part the bytes come from (None: a local
    source, read without one)."""

    def __init__(self, out: BinaryIO, part: Path | None, shown: str, max_expanded: int) -> None:
        self.out, self.part, self.shown, self.max_expanded = out, part, shown, max_expanded
        self.fed = 0
        self.gathered = bytearray()  # small reads (an HTTPS read1 returns one TLS record, <= 16 KiB) not handed over
        self._start()

    def _start(self) -> None:
        self.out.seek(0)
        self.out.truncate()
        self.chunks: queue.Queue = queue.Queue(maxsize=_GUNZIP_QUEUE_BYTES // _GUNZIP_HANDOVER_BYTES)
        self.gathered.clear()
        self.aborted = threading.Event()
        self.stream = _GzipStream(self.out, self.max_expanded, f"gzip {self.shown}")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"gunzip {self.shown}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while (chunk := self._next()) is not None:
                view = memoryview(chunk)
                for at in range(0, len(view), _GUNZIP_PIECE_BYTES):
                    if self.aborted.is_set():
                        raise _Aborted
                    self.stream.write(view[at:at + _GUNZIP_PIECE_BYTES])
            self.stream.close()
        except _Aborted:
            pass
        except BaseException as exc:  # reported by finish(), in the caller's thread
            self.error = exc

    def _next(self) -> memoryview | None:
        while True:
            try:
                chunk = self.chunks.get(timeout=0.5)
            except queue.Empty:
                continue
            if self.aborted.is_set():
                raise _Aborted
            return chunk

    def _hand_over(self, item: memoryview | None) -> None:
        while self.thread.is_alive():
            try:
                self.chunks.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def feed(self, chunk: bytes) -> None:
        """Hands `chunk` over in pieces of _GUNZIP_HANDOVER_BYTES (so that the queue's bound is one in bytes and the
        thread's work per piece is worth its overhead), the last few bytes kept until more come or `finish`."""
        self.fed += len(chunk)
        view = memoryview(chunk)
        if self.gathered:
            taken = _GUNZIP_HANDOVER_BYTES - len(self.gathered)
            self.gathered += view[:taken]
            view = view[taken:]
            if len(self.gathered) < _GUNZIP_HANDOVER_BYTES:
                return
            self._hand_over(memoryview(bytes(self.gathered)))
            self.gathered.clear()
        whole = len(view) - len(view) % _GUNZIP_HANDOVER_BYTES
        for at in range(0, whole, _GUNZIP_HANDOVER_BYTES):
            self._hand_over(view[at:at + _GUNZIP_HANDOVER_BYTES])
        self.gathered += view[whole:]

    @property
    def failed(self) -> bool:
        """The thread stopped on an error (reported by `finish`)."""
        return self.error is not None

    def restart(self) -> None:
        if self.fed:
            self._stop()
            self.fed = 0
            self._start()

    def finish(self) -> None:
        """Ends the stream and waits for the thread; raises what it found. A corrupt gzip or a refusal discards the
        .part (the next retry fetches afresh rather than resuming bad bytes); an OSError (a full disk) keeps it."""
        if self.gathered:
            self._hand_over(memoryview(bytes(self.gathered)))
            self.gathered.clear()
        self._hand_over(None)
        self.thread.join()
        if self.error is None:
            return
        if self.part is not None and isinstance(self.error, (EOFError, zlib.error, NotAllowed)):
            _discard_part(self.part)  # bad bytes, or a refusal: a retry fetches afresh (an OSError keeps the .part)
        if isinstance(self.error, (EOFError, zlib.error)):
            where = f"{self.part} (from {self.shown})" if self.part is not None else self.shown
            raise DownloadError(f"corrupt or truncated gzip {where} near compressed byte {self.stream.consumed}: "
                                f"{self.error}") from None
        raise self.error

    def _stop(self) -> None:
        self.aborted.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.chunks.get_nowait()  # unblocks a fetch waiting to hand over
        with contextlib.suppress(queue.Full):
            self.chunks.put_nowait(None)  # wakes the thread at once: it sees the stop before the item
        self.thread.join()

    def __enter__(self) -> _StreamingGunzip:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self._stop()


@dataclass(frozen=True)
class _Linked:
    st_size: int
    sha256: str
    ctime_ns: int  # the shared inode's change time once the link is in place (see vouched_sha256)


def _link_local(source: Path, destination: Path, shown: str, expected: str | None, max_bytes: int) -> _Linked | None:
    """Hard-link `source` to `destination` through a temporary name, hashing it once; None when it cannot be linked
    (the caller copies instead). The inode must not change while it is hashed (a source still being written is
    copied instead, as the copy path would hash what it copies)."""
    try:
        size = source.stat().st_size
    except FileNotFoundError:
        raise SourceNotFound(f"source file not found: {source}") from None
    except OSError:
        return None  # the copy opens it and says why it cannot
    if size > max_bytes:
        raise DownloadTooLarge(f"{shown} holds {size} bytes, more than the {max_bytes} one download may fetch "
                               "(set RECFLOW_DOWNLOAD_MAX_BYTES to allow more)")
    tmp = destination.with_name(destination.name + ".link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError as exc:
        log.info("%s cannot be hard-linked to %s (%s): copying it", shown, destination, exc.strerror or exc)
        return None
    try:
        before = os.stat(tmp)
        with open(tmp, "rb") as f:
            actual = hashlib.file_digest(f, "sha256").hexdigest()
        after = os.stat(tmp)
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (before.st_size, before.st_mtime_ns,
                                                                       before.st_ctime_ns):
            log.warning("%s changed while it was hashed: copying it instead of linking", shown)
            tmp.unlink()
            return None
        if expected and actual != expected:
            raise ChecksumMismatch(f"sha256 mismatch for {shown}: expected {expected}, got {actual}")
        os.replace(tmp, destination)
    finally:
        tmp.unlink(missing_ok=True)
    return _Linked(after.st_size, actual, os.stat(destination).st_ctime_ns)


def vouched_sha256(path: Path) -> str | None:
    """The sha256 the download recorded for `path` while it still vouches for the file's bytes, else None (no
    sidecar, an unreadable one, a size that differs, or a hard-linked file whose inode changed since: the source was
    written in place, chmod-ed or linked again; the caller hashes the file itself)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        record = json.loads(_sidecar_path(path).read_text())
        status = path.stat()
        if record.get("bytes") != status.st_size:
            return None
        if "linked_ctime_ns" in record and record["linked_ctime_ns"] != status.st_ctime_ns:
            return None
        return record.get("sha256")
    return None


def recorded_sha256(path: Path) -> str:
    """The file's sha256 without reading it where a record vouches for it: the download's (vouched_sha256), else
    one an earlier call hashed while the inode is the same and unchanged since (inode, size, mtime and ctime: the
    kernel moves ctime on any write, truncate, chmod or new link); else the file is hashed and the result recorded
    beside it (`<file>.sha256.json`) for the next caller. A raw day no download vouches for (put in place by hand, or
    linked again since) was hashed on every run and retry before (~33 s per 46 GB file); once now. A file that
    changed while it was hashed is not recorded; a folder that cannot be written only costs the record."""
    from tasks.core.storage import file_sha256

    vouched = vouched_sha256(path)
    if vouched is not None:
        return vouched
    record_path = path.with_name(path.name + _HASHED_SUFFIX)
    identity = _inode_identity(path)
    with contextlib.suppress(OSError, ValueError, AttributeError, KeyError, TypeError):
        record = json.loads(record_path.read_text())
        if record["identity"] == identity:
            return str(record["sha256"])
    digest = file_sha256(path)
    if _inode_identity(path) == identity:
        with contextlib.suppress(OSError):
            write_text_atomic(record_path, json.dumps({"sha256": digest, "identity": identity}))
    return digest


def _inode_identity(path: Path) -> list[int]:
    """What changes when a file's bytes may have: its inode, size, mtime and ctime (recorded as JSON, so a list)."""
    status = os.stat(path)
    return [status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]


def _sidecar_path(destination: Path) -> Path:
    return destination.with_name(destination.name + ".download.json")


def _sidecar_record(result: DownloadResult, decompressed: bool) -> dict[str, Any]:
    record = asdict(result)
    for transient in ("path", "resumed_from", "cached", "seconds"):
        record.pop(transient)
    return record | {"decompressed": decompressed}


def _cached(source_url: str, destination: Path, expected: str | None, decompress: bool) -> DownloadResult | None:
    """The earlier result when destination + sidecar match this request (no network access), else None."""
    sidecar = _sidecar_path(destination)
    if not destination.is_file() or not sidecar.is_file():
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError, KeyError):  # unreadable sidecar: redo
        record = json.loads(sidecar.read_text())
        matches = (
            record.get("source") == source_url
            and record.get("bytes") == destination.stat().st_size
            and record.get("decompressed") == decompress
            and (expected is None or record.get("sha256") == expected)
            and record.get("linked_ctime_ns", destination.stat().st_ctime_ns) == destination.stat().st_ctime_ns
        )
        if matches:
            return DownloadResult(
                path=str(destination), source=source_url, bytes=record["bytes"],
                source_bytes=record["source_bytes"], sha256=record["sha256"], resumed_from=0, cached=True, seconds=0.0,
            )
        log.info("%s exists but its sidecar does not match this request: downloading again", destination)
    return None
