"""Where download bytes come from: source URLs parsed and validated, and one opener per scheme (file, http(s), s3),
each returning a body that starts at a byte offset (Range requests), with transport errors turned into one-line
DownloadErrors. tasks.core.download drives them (resume, checksum, gunzip, atomic publish).

A body carries the source's version (`validator`: the HTTP ETag or Last-Modified, the S3 ETag, a local file's size
and mtime); a resume names the version its .part came from (HTTP If-Range, S3 IfMatch, compared for files), and a
source that changed since answers from byte 0. HTTP redirects are followed here, one hop at a time, each hop checked
against the allow-list the first URL was checked against. Every open and every read is bounded by the download's
deadline (`Deadline`), not only by the time between two reads."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from tasks.core.config import NotAllowed

log = logging.getLogger(__name__)

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)$")
MAX_REDIRECTS = 5

class DownloadError(RuntimeError):
    """A download failed; the message is one line naming what failed and where (URL, byte offset, status)."""


class ChecksumMismatch(DownloadError):
    """The source's sha256 is not the expected one (the .part is deleted: a retry starts over)."""


class SourceNotFound(DownloadError):
    """No such file / object / URL (HTTP 403/404/410, S3 NoSuchKey/NoSuchBucket/AccessDenied)."""


class SourceNotAllowed(DownloadError, NotAllowed):
    """The source lies outside the deployment's allowed file roots or URL prefixes (bad input: not retried)."""


class DownloadTooLarge(DownloadError, NotAllowed):
    """The source holds more bytes than one download may fetch (RECFLOW_DOWNLOAD_MAX_BYTES; bad input: not retried)."""


class DeadlineExceeded(DownloadError):
    """The download took longer than its deadline (RECFLOW_DOWNLOAD_DEADLINE_S), however slowly bytes kept coming."""


class ConnectionNotAllowed(NotAllowed):
    """A run named an Airflow connection outside RECFLOW_ALLOWED_CONN_IDS (bad input: not retried)."""


class _Interrupted(Exception):
    """The body stream broke off; the transfer can resume from the bytes already in the .part."""


class _RangeNotSatisfiable(Exception):
    def __init__(self, total: int | None) -> None:
        super().__init__(total)
        self.total = total  # size of the source, when the server said


@dataclass
class _Body:
    start: int  # source offset the body begins at: 0 when a Range was ignored
    total: int | None  # size of the whole source object, when known
    chunks: Iterator[bytes]
    close: Callable[[], None]
    validator: str | None = None  # the source's version (ETag / Last-Modified / size+mtime); None: unknown


@dataclass(frozen=True)
class Deadline:
    """When a whole download must be done (time.monotonic), with the seconds it was given, for the message."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, shown: str, offset: int) -> None:
        if self.remaining() <= 0:
            raise DeadlineExceeded(f"download of {shown} passed its deadline of {self.seconds:g} s at byte {offset} "
                                   "(a stalled or trickling source; set RECFLOW_DOWNLOAD_DEADLINE_S to allow more)")



@dataclass(frozen=True)
class _Source:
    scheme: str  # file | http | s3
    url: str
    shown: str  # the URL as logs may show it (query string hidden: presigned URLs carry signatures)
    path: Path | None = None
    bucket: str = ""
    key: str = ""


def redacted_url(url: str) -> str:
    """The URL as logs, XCom, lineage and the registry may keep it: an http(s) query string (a presigned URL's
    signature) is replaced by '<hidden>'."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.query:
        return url
    return urlunsplit(parts._replace(query="<hidden>", fragment=""))


_shown = redacted_url


def _parse_source(url: str) -> _Source:
    """Validate the URL before anything is opened; errors name the URL with any credentials stripped."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.username is not None or parts.password is not None:
        bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query=""))
        raise DownloadError(f"credentials in source URL {bare} are not allowed: use an Airflow connection or env")
    if scheme in ("", "file"):
        if parts.netloc not in ("", "localhost"):
            raise DownloadError(f"file URL {url} names host {parts.netloc!r}: only local files are supported")
        path = Path(unquote(parts.path)) if scheme else Path(url)
        return _Source("file", url, url, path=path)
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise DownloadError(f"URL {_shown(url)} has no host")
        return _Source("http", url, _shown(url))
    if scheme == "s3":
        # The key is taken verbatim (S3 keys may hold '?' and '#'), not through urlsplit.
        bucket, _, key = url.split("://", 1)[1].partition("/")
        if not bucket or not key or any(segment in ("", ".", "..") for segment in key.split("/")):
            raise DownloadError(f"invalid S3 URI {url}: needs s3://bucket/key without empty, '.' or '..' segments")
        return _Source("s3", url, url, bucket=bucket, key=key)
    raise DownloadError(f"unsupported URL scheme {scheme!r} in {_shown(url)}: use file://, http(s):// or s3://")


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _url_key(url: str) -> tuple[str, str, int | None, list[str]] | None:
    """(scheme, host or bucket, port, decoded path segments) of an http(s)/s3 URL; None when its path has a '.',
    '..' or empty segment or an encoded '/' or '\\' (it could leave the folder it seems to be under)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        host, _, path = url.split("://", 1)[1].partition("/")
        port = None
    else:
        host, path = (parts.hostname or "").lower(), parts.path.lstrip("/")
        try:
            port = parts.port or _DEFAULT_PORTS.get(scheme)
        except ValueError:  # a port that is not a number
            return None
    # An s3:// key is used verbatim by the fetch (_parse_source), so it is compared verbatim: unquoting it here let
    # 's3://b/allow%65d/x' pass a check for 's3://b/allowed' and then fetch another key (issue #24 item 14).
    segments = [segment if scheme == "s3" else unquote(segment) for segment in path.split("/")] if path else []
    if segments[-1:] == [""]:
        segments.pop()  # a trailing '/': the folder itself
    if any(segment in ("", ".", "..") or "/" in segment or "\\" in segment for segment in segments):
        return None
    return scheme, host, port, segments


def source_under_prefix(url: str, prefix: str) -> bool:
    """True when an http(s)/s3 URL lies under an allowed prefix: same scheme, host (or bucket) and port, and the
    prefix's path segments lead the URL's (whole segments: 'https://h/raw' allows 'https://h/raw/day_0' but not
    'https://h/raw-private/x'). The query string is not compared."""
    source, allowed = _url_key(url), _url_key(prefix)
    if source is None or allowed is None or source[:3] != allowed[:3]:
        return False
    return source[3][: len(allowed[3])] == allowed[3]


def check_source_prefix(url: str, prefixes: Sequence[str]) -> None:
    """An http(s)/s3 source must lie under one of the allowed prefixes (a trigger form names the URL)."""
    if _url_key(url) is None:
        raise SourceNotAllowed(f"source {_shown(url)} has a '.', '..', empty or encoded-slash path segment: "
                               "not allowed in a source URL")
    if not any(source_under_prefix(url, prefix) for prefix in prefixes):
        raise SourceNotAllowed(f"source {_shown(url)} is not under an allowed prefix {list(prefixes)} "
                               "(set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)")


def check_connection_allowed(conn_id: str, allowed: Sequence[str] | None = None) -> None:
    """A connection a run names must be one the deployment allows (its credentials are the deployment's)."""
    if allowed is None:
        from tasks.core.config import load_settings

        allowed = load_settings().allowed_conn_ids
    if conn_id not in allowed:
        raise ConnectionNotAllowed(f"connection {conn_id!r} is not an allowed connection {list(allowed)} "
                                   "(set RECFLOW_ALLOWED_CONN_IDS to allow more)")


def s3_client_from_connection(conn_id: str | None, allowed_conn_ids: Sequence[str] | None = None) -> Any:
    """A boto3 S3 client from an Airflow `aws` connection, or from boto3's default chain when conn_id is None
    (environment, AWS_ENDPOINT_URL_S3, instance profile). A named connection must be in allowed_conn_ids (None:
    the deployment's RECFLOW_ALLOWED_CONN_IDS) before it is looked up."""
    if conn_id:
        check_connection_allowed(conn_id, allowed_conn_ids)
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        return S3Hook(aws_conn_id=conn_id).get_conn()
    import boto3

    return boto3.client("s3")


Opener = Callable[[int, "str | None"], _Body]


def _opener(source: _Source, s3_client: Any, chunk_bytes: int, timeout_s: float, deadline: Deadline,
            allowed_prefixes: Sequence[str] = ()) -> Opener:
    """A function that opens the source's body from a byte offset, given the version the bytes before it came from
    (None: start from 0 only). `allowed_prefixes`: what every HTTP redirect hop must lie under."""
    if source.scheme == "file":
        return lambda start, validator: _open_file(source, start, chunk_bytes, validator)
    if source.scheme == "http":
        return lambda start, validator: _open_http(source, start, chunk_bytes, timeout_s, deadline, validator,
                                                   allowed_prefixes)
    client = s3_client if s3_client is not None else s3_client_from_connection(None)
    return lambda start, validator: _open_s3(client, source, start, chunk_bytes, validator)


def _guarded(chunks: Iterable[bytes], transport_errors: tuple[type[BaseException], ...]) -> Iterator[bytes]:
    """Chunks, with the transport's mid-stream failures turned into _Interrupted (resumable)."""
    try:
        yield from chunks
    except transport_errors as exc:
        # urllib3 repeats its reason in args[1]; the first argument alone reads as one line.
        reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else f"{type(exc).__name__}: {exc}"
        raise _Interrupted(reason) from exc


def _root_cause(exc: BaseException) -> str:
    """The innermost reason ('[Errno 111] Connection refused'), not the client library's wrapper text."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    return str(exc) or type(exc).__name__


def _parse_content_range(value: str | None, shown: str) -> tuple[int, int | None]:
    match = _CONTENT_RANGE.match(value or "")
    if not match:
        raise DownloadError(f"partial response from {shown} has an unreadable Content-Range {value!r}")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _open_file(source: _Source, start: int, chunk_bytes: int, validator: str | None) -> _Body:
    assert source.path is not None
    try:
        f = open(source.path, "rb")  # noqa: SIM115 - closed by the caller through _Body.close
    except FileNotFoundError:
        raise SourceNotFound(f"source file not found: {source.path}") from None
    except OSError as exc:
        raise DownloadError(f"cannot read source file {source.path}: {exc.strerror or exc}") from None
    status = os.fstat(f.fileno())
    total, version = status.st_size, f"{status.st_size}-{status.st_mtime_ns}"
    if start and version != validator:
        start = 0  # the file changed since the .part was started: as a server answering If-Range, send it whole
    if start > total:
        f.close()
        raise _RangeNotSatisfiable(total)
    f.seek(start)
    chunks = iter(lambda: f.read(chunk_bytes), b"")
    return _Body(start, total, _guarded(chunks, (OSError,)), f.close, version)


def _http_validator(headers: Any) -> str | None:
    """What If-Range can name: a strong ETag, else Last-Modified (a weak ETag cannot be used for ranges)."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified") or None


def _get_following_allowed_redirects(source: _Source, headers: dict[str, str], start: int, timeout_s: float,
                                     deadline: Deadline, allowed_prefixes: Sequence[str]) -> Any:
    """GET the URL, following redirects one hop at a time: each hop must be an http(s) URL under an allowed prefix
    (requests would follow them all unchecked). Connect and read timeouts never run past the deadline."""
    import requests

    url = source.url
    for _ in range(MAX_REDIRECTS + 1):
        deadline.check(source.shown, start)
        wait = max(0.001, min(timeout_s, deadline.remaining()))
        try:
            response = requests.get(url, headers=headers, stream=True, timeout=(wait, wait), allow_redirects=False)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise DownloadError(f"cannot reach {_shown(url)}: {_root_cause(exc)}") from None
        except requests.RequestException as exc:
            raise DownloadError(f"request for {_shown(url)} failed at byte {start}: {_root_cause(exc)}") from None
        if not response.is_redirect:
            return response
        status, target = response.status_code, urljoin(url, response.headers["Location"])
        response.close()
        if urlsplit(target).scheme.lower() not in ("http", "https"):
            raise SourceNotAllowed(f"source {source.shown} redirected (HTTP {status}) to {_shown(target)}: only "
                                   "http(s) redirects are followed")
        try:
            check_source_prefix(target, allowed_prefixes)
        except SourceNotAllowed as exc:
            raise SourceNotAllowed(f"source {source.shown} redirected (HTTP {status}) to a URL that is not allowed: "
                                   f"{exc}") from None
        log.info("%s redirected (HTTP %d) to %s", _shown(url), status, _shown(target))
        url = target
    raise DownloadError(f"source {source.shown} redirected more than {MAX_REDIRECTS} times")


def _read1_chunks(raw: Any, chunk_bytes: int) -> Iterator[bytes]:
    """The body as it arrives: read1 returns after one receive, so the caller can check the deadline between bytes
    that trickle in (read(n) would wait for n bytes, however long they take)."""
    while chunk := raw.read1(chunk_bytes, decode_content=False):
        yield chunk


def _open_http(source: _Source, start: int, chunk_bytes: int, timeout_s: float, deadline: Deadline,
               validator: str | None, allowed_prefixes: Sequence[str]) -> _Body:
    import requests
    import urllib3

    # identity: the stored bytes must be the source's own (a .gz served with Content-Encoding: gzip stays gzip).
    headers = {"Accept-Encoding": "identity"}
    if start:
        headers["Range"] = f"bytes={start}-"
        if validator:
            headers["If-Range"] = validator  # a changed source answers 200 with all of it, never the new tail
    response = _get_following_allowed_redirects(source, headers, start, timeout_s, deadline, allowed_prefixes)
    status = response.status_code
    if status not in (200, 206):
        response.close()
        if status in (403, 404, 410):
            raise SourceNotFound(f"HTTP {status} for {source.shown}")
        if status == 416:
            match = re.match(r"bytes \*/(\d+)$", response.headers.get("Content-Range", ""))
            raise _RangeNotSatisfiable(int(match.group(1)) if match else None)
        raise DownloadError(f"HTTP {status} for {source.shown} at byte {start}")
    if status == 206:
        first, total = _parse_content_range(response.headers.get("Content-Range"), source.shown)
    else:
        length = response.headers.get("Content-Length")
        first, total = 0, int(length) if length and length.isdigit() else None
    chunks = _read1_chunks(response.raw, chunk_bytes)
    errors = (urllib3.exceptions.HTTPError, requests.RequestException, OSError)
    return _Body(first, total, _guarded(chunks, errors), response.close, _http_validator(response.headers))


def _open_s3(client: Any, source: _Source, start: int, chunk_bytes: int, validator: str | None) -> _Body:
    import urllib3
    from botocore.exceptions import BotoCoreError, ClientError

    request = {"Bucket": source.bucket, "Key": source.key}
    if start:
        request["Range"] = f"bytes={start}-"
        if validator:
            request["IfMatch"] = validator  # a changed object fails 412: then it is fetched whole
    try:
        response = client.get_object(**request)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        if code in ("PreconditionFailed", "412") and start:
            log.warning("%s changed since the .part was started (ETag %s no longer matches): starting over",
                        source.url, validator)
            return _open_s3(client, source, 0, chunk_bytes, None)
        if code in ("NoSuchKey", "NoSuchBucket", "404", "AccessDenied", "403"):
            raise SourceNotFound(f"S3 {code} for {source.url}") from None
        if code == "InvalidRange":
            size = client.head_object(Bucket=source.bucket, Key=source.key)["ContentLength"]
            raise _RangeNotSatisfiable(int(size)) from None
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        raise DownloadError(f"S3 {code} (HTTP {status}) for {source.url} at byte {start}") from None
    except BotoCoreError as exc:
        raise DownloadError(f"cannot reach {source.url}: {exc}") from None
    if response.get("ContentRange"):
        first, total = _parse_content_range(response["ContentRange"], source.url)
    else:
        first, total = 0, response.get("ContentLength")
    body = response["Body"]
    errors = (BotoCoreError, urllib3.exceptions.HTTPError, OSError)
    return _Body(first, total, _guarded(body.iter_chunks(chunk_bytes), errors), body.close, response.get("ETag"))
