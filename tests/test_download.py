"""tasks.core.download against real servers on 127.0.0.1: the range-capable HTTP server and moto's S3 API server."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.core.download import (
    ChecksumMismatch, DownloadError, SourceNotFound, download, s3_client_from_connection, vouched_sha256,
)
from tests.conftest import REPO
from tests.http_range_server import etag_of
from tests.servers import free_port

CHUNK = 64 << 10  # small chunks, so a 300 KB source streams as several reads


def _payload(size: int = 300_000) -> bytes:
    """Deterministic incompressible-ish bytes (a hash chain), so offsets and checksums mean something."""
    blocks, block = [], b"seed"
    for _ in range(0, size, 32):
        block = hashlib.sha256(block).digest()
        blocks.append(block)
    return b"".join(blocks)[:size]


def _tsv(rows: int = 5000) -> bytes:
    return "".join(f"{i % 2}\t{i}\t\t{i * 7:08x}\n" for i in range(rows)).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _leave_part(out: Path, url: str, data: bytes, validator: str) -> None:
    """A .part an earlier attempt left, with the record of the URL and source version its bytes came from."""
    (out / "day_0.part").write_bytes(data)
    (out / "day_0.part.json").write_text(json.dumps({"source": url, "validator": validator}))


@pytest.fixture(autouse=True)
def allow_this_tests_servers(request, monkeypatch: pytest.MonkeyPatch) -> None:
    """download() refuses an http(s)/s3 source outside RECFLOW_SOURCE_ALLOWED_PREFIXES (none by default without a
    dataset's configured source): allow the servers this test talks to, and nothing else."""
    prefixes = []
    if "http_server" in request.fixturenames:
        prefixes.append(request.getfixturevalue("http_server").base_url)
    if "s3_bucket" in request.fixturenames:
        prefixes.append(f"s3://{request.getfixturevalue('s3_bucket')}")
    monkeypatch.setenv("RECFLOW_SOURCE_ALLOWED_PREFIXES", " ".join(prefixes) or "https://nothing.invalid")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


@pytest.fixture
def source(http_server) -> bytes:
    data = _payload()
    (http_server.root / "day_0").write_bytes(data)
    return data


# --- file sources and URL validation ----------------------------------------------------------------------------------


def test_file_url_and_plain_path_are_copied_with_sidecar(tmp_path: Path, out: Path) -> None:
    data = _payload()
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    by_url = download(src.as_uri(), out / "a", chunk_bytes=CHUNK, allowed_file_roots=[tmp_path])
    by_path = download(str(src), out / "b", chunk_bytes=CHUNK, expected_sha256=_sha(data), allowed_file_roots=[tmp_path])
    assert (out / "a").read_bytes() == data and (out / "b").read_bytes() == data
    assert (by_url.bytes, by_url.source_bytes, by_url.sha256) == (len(data), len(data), _sha(data))
    assert not by_url.cached
    sidecar = json.loads((out / "a.download.json").read_text())
    assert sidecar["source"] == src.as_uri() and sidecar["sha256"] == _sha(data) and sidecar["bytes"] == len(data)
    assert by_path.sha256 == _sha(data)
    assert _leftovers(out) == ["a", "a.download.json", "b", "b.download.json"]


def test_local_source_is_hard_linked_when_allowed_and_hashed_once(tmp_path: Path, out: Path) -> None:
    data = _payload()
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    result = download(src.as_uri(), out / "a", link_local=True, expected_sha256=_sha(data),
                      allowed_file_roots=[tmp_path])
    assert os.stat(out / "a").st_ino == os.stat(src).st_ino  # no bytes copied
    assert (result.bytes, result.sha256, result.cached) == (len(data), _sha(data), False)
    sidecar = json.loads((out / "a.download.json").read_text())
    assert sidecar["sha256"] == _sha(data) and sidecar["linked_ctime_ns"] == os.stat(out / "a").st_ctime_ns
    assert vouched_sha256(out / "a") == _sha(data)
    again = download(src.as_uri(), out / "a", link_local=True, allowed_file_roots=[tmp_path])
    assert again.cached and _leftovers(out) == ["a", "a.download.json"]
    copied = download(src.as_uri(), out / "b", allowed_file_roots=[tmp_path])  # without link_local: a copy
    assert os.stat(out / "b").st_ino != os.stat(src).st_ino and copied.sha256 == _sha(data)


def test_a_linked_source_written_in_place_no_longer_vouches_for_its_checksum(tmp_path: Path, out: Path) -> None:
    """A write into the source changes the linked bytes: the recorded sha256 is then no longer trusted (the caller
    hashes again) and the next download fetches again instead of returning the stale record."""
    data = _payload()
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    download(src.as_uri(), out / "a", link_local=True, allowed_file_roots=[tmp_path])
    time.sleep(0.01)  # a distinct ctime even on a coarse clock
    with open(src, "r+b") as f:  # same size, same inode: only the ctime tells
        f.write(b"X")
    assert (out / "a").read_bytes()[:1] == b"X"
    assert vouched_sha256(out / "a") is None
    changed = b"X" + data[1:]
    result = download(src.as_uri(), out / "a", link_local=True, allowed_file_roots=[tmp_path])
    assert not result.cached and result.sha256 == _sha(changed) and vouched_sha256(out / "a") == _sha(changed)


def test_a_file_no_download_vouches_for_is_hashed_once_while_it_is_unchanged(tmp_path: Path, out: Path,
                                                                            monkeypatch) -> None:
    """recorded_sha256: a raw day put in place by hand (or linked again since its download) is hashed once and the
    result recorded beside it; a write in place, even of the same size, makes the next call hash again."""
    from tasks.core import storage
    from tasks.core.download import recorded_sha256

    data = _payload()
    day = out / "day_0"
    day.write_bytes(data)
    hashed = []
    real = storage.file_sha256
    monkeypatch.setattr(storage, "file_sha256", lambda path: hashed.append(path) or real(path))
    assert recorded_sha256(day) == recorded_sha256(day) == _sha(data)
    assert hashed == [day] and (out / "day_0.sha256.json").is_file()
    time.sleep(0.01)  # a distinct ctime even on a coarse clock
    with open(day, "r+b") as f:
        f.write(b"X")
    assert recorded_sha256(day) == _sha(b"X" + data[1:]) and len(hashed) == 2
    assert recorded_sha256(day) == _sha(b"X" + data[1:]) and len(hashed) == 2

    src = tmp_path / "src.bin"  # a download's sidecar vouches: nothing hashed, no record written
    src.write_bytes(data)
    download(src.as_uri(), out / "day_0", allowed_file_roots=[tmp_path])
    assert not (out / "day_0.sha256.json").exists()  # the replaced file's record went with it
    assert recorded_sha256(out / "day_0") == _sha(data) and len(hashed) == 2
    assert not (out / "day_0.sha256.json").exists()


def test_a_linked_source_with_the_wrong_checksum_leaves_nothing(tmp_path: Path, out: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(_payload())
    with pytest.raises(ChecksumMismatch):
        download(src.as_uri(), out / "a", link_local=True, expected_sha256="0" * 64,
                 allowed_file_roots=[tmp_path])
    assert _leftovers(out) == [] and src.read_bytes() == _payload()


def test_a_source_that_cannot_be_linked_is_copied(tmp_path: Path, out: Path, monkeypatch) -> None:
    data = _payload()
    src = tmp_path / "src.bin"
    src.write_bytes(data)

    def cross_device(*args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("tasks.core.download.os.link", cross_device)
    result = download(src.as_uri(), out / "a", link_local=True, allowed_file_roots=[tmp_path])
    assert os.stat(out / "a").st_ino != os.stat(src).st_ino and result.sha256 == _sha(data)
    assert "linked_ctime_ns" not in json.loads((out / "a.download.json").read_text())
    assert vouched_sha256(out / "a") == _sha(data)


@pytest.mark.parametrize("link_local", [False, True])
def test_missing_file_is_source_not_found(tmp_path: Path, out: Path, link_local: bool) -> None:
    with pytest.raises(SourceNotFound, match="src.bin"):
        download((tmp_path / "src.bin").as_uri(), out / "day_0", allowed_file_roots=[tmp_path], link_local=link_local)
    assert _leftovers(out) == []


def test_file_source_outside_the_allowed_roots_is_refused_by_download_itself(tmp_path: Path, out: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "elsewhere" / "src.bin"
    src.parent.mkdir()
    src.write_bytes(_payload(1000))
    with pytest.raises(DownloadError, match=r"outside the allowed roots .*RECFLOW_FILE_SOURCE_ROOTS"):
        download(src.as_uri(), out / "a", allowed_file_roots=[tmp_path / "data"])
    # With no roots given, download() falls back to the deployment's (the data root): no caller can skip the check.
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path / "data"))
    with pytest.raises(DownloadError, match="outside the allowed roots"):
        download(str(src), out / "a")
    assert _leftovers(out) == []


@pytest.mark.parametrize(
    "url",
    ["s3://bucket/raw/../secret", "s3://bucket/raw//day_0", "s3://bucket/", "s3:///key"],
)
def test_unsafe_s3_uri_is_rejected_before_any_request(url: str, out: Path) -> None:
    with pytest.raises(DownloadError, match="invalid S3 URI"):
        download(url, out / "day_0", s3_client=object())  # a client that would fail if it were used
    assert _leftovers(out) == []


def test_credentials_in_url_are_rejected_without_echoing_them(out: Path) -> None:
    with pytest.raises(DownloadError, match="credentials") as excinfo:
        download("https://alice:s3cret@example.com/day_0", out / "day_0")
    assert "s3cret" not in str(excinfo.value)


def test_unsupported_scheme_is_named(out: Path) -> None:
    with pytest.raises(DownloadError, match="'ftp'"):
        download("ftp://example.com/day_0", out / "day_0")


# --- http -------------------------------------------------------------------------------------------------------------


def test_http_full_download_with_checksum(http_server, source: bytes, out: Path) -> None:
    result = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source).upper(), chunk_bytes=CHUNK)
    assert (out / "day_0").read_bytes() == source
    assert (result.sha256, result.source_bytes, result.resumed_from) == (_sha(source), len(source), 0)
    assert not result.cached
    assert http_server.server.requests == [("/day_0", None)]
    assert _leftovers(out) == ["day_0", "day_0.download.json"]


@pytest.mark.reliability
def test_http_interrupted_transfer_resumes_in_same_call(http_server, source: bytes, out: Path) -> None:
    http_server.server.drop_after_bytes = 100_000
    result = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source), chunk_bytes=CHUNK)
    assert (out / "day_0").read_bytes() == source
    requests = http_server.server.requests
    assert len(requests) == 2 and requests[0][1] is None
    assert requests[1][1] == f"bytes={result.resumed_from}-" and 0 < result.resumed_from <= 100_000
    assert result.sha256 == _sha(source)


@pytest.mark.reliability
def test_http_interruption_beyond_attempts_keeps_part_for_next_retry(http_server, source: bytes, out: Path) -> None:
    http_server.server.drop_after_bytes = 100_000
    with pytest.raises(DownloadError, match=r"interrupted at byte \d+ after 0 resume attempts"):
        download(http_server.url("day_0"), out / "day_0", chunk_bytes=CHUNK, max_resume_attempts=0)
    part = out / "day_0.part"
    kept = part.read_bytes()
    assert _leftovers(out) == ["day_0.part", "day_0.part.json"] and 0 < len(kept) <= 100_000
    assert source.startswith(kept)
    retried = download(http_server.url("day_0"), out / "day_0", chunk_bytes=CHUNK, expected_sha256=_sha(source))
    assert retried.resumed_from == len(kept)
    assert (out / "day_0").read_bytes() == source and not part.exists()


def test_leftover_part_resumes_with_range(http_server, source: bytes, out: Path) -> None:
    _leave_part(out, http_server.url("day_0"), source[:123_456], etag_of(http_server.root / "day_0"))
    result = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source), chunk_bytes=CHUNK)
    assert result.resumed_from == 123_456
    assert http_server.server.requests == [("/day_0", "bytes=123456-")]
    assert (out / "day_0").read_bytes() == source and result.sha256 == _sha(source)


def test_complete_leftover_part_needs_no_body(http_server, source: bytes, out: Path) -> None:
    _leave_part(out, http_server.url("day_0"), source, etag_of(http_server.root / "day_0"))
    result = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source))
    assert http_server.server.requests == [("/day_0", f"bytes={len(source)}-")]  # answered 416, nothing resent
    assert (out / "day_0").read_bytes() == source and result.resumed_from == len(source)


def test_server_ignoring_range_restarts_from_zero(http_server, source: bytes, out: Path) -> None:
    http_server.server.honour_range = False
    stale = b"stale bytes that are not the source prefix"
    _leave_part(out, http_server.url("day_0"), stale, etag_of(http_server.root / "day_0"))
    result = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source), chunk_bytes=CHUNK)
    assert http_server.server.requests == [("/day_0", f"bytes={len(stale)}-")]  # one request: the 200 is used
    assert result.resumed_from == 0 and (out / "day_0").read_bytes() == source
    assert _leftovers(out) == ["day_0", "day_0.download.json"]


def test_checksum_mismatch_leaves_nothing(http_server, source: bytes, out: Path) -> None:
    wrong = "0" * 64
    with pytest.raises(ChecksumMismatch, match=f"expected {wrong}, got {_sha(source)}") as excinfo:
        download(http_server.url("day_0"), out / "day_0", expected_sha256=wrong, chunk_bytes=CHUNK)
    assert http_server.url("day_0") in str(excinfo.value)
    assert _leftovers(out) == []


def test_http_404_is_source_not_found(http_server, out: Path) -> None:
    url = http_server.url("day_9")
    with pytest.raises(SourceNotFound, match=f"^HTTP 404 for {url}$"):
        download(url, out / "day_9")
    assert _leftovers(out) == []


def test_closed_port_cannot_reach(out: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/day_0"
    with pytest.raises(DownloadError, match=f"cannot reach {url}: .*[Cc]onnection refused"):
        download(url, out / "day_0", timeout_s=2, allowed_prefixes=[url])
    assert _leftovers(out) == []


def test_cached_second_call_makes_no_request(http_server, source: bytes, out: Path) -> None:
    first = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source))
    seen = list(http_server.server.requests)
    second = download(http_server.url("day_0"), out / "day_0", expected_sha256=_sha(source))
    assert http_server.server.requests == seen
    assert second.cached and not first.cached
    assert (second.sha256, second.bytes, second.source_bytes) == (first.sha256, first.bytes, first.source_bytes)


def test_changed_destination_is_downloaded_again(http_server, source: bytes, out: Path) -> None:
    download(http_server.url("day_0"), out / "day_0")
    (out / "day_0").write_bytes(b"truncated")  # no longer the size the sidecar vouches for
    result = download(http_server.url("day_0"), out / "day_0")
    assert not result.cached and len(http_server.server.requests) == 2
    assert (out / "day_0").read_bytes() == source


# --- gzip -------------------------------------------------------------------------------------------------------------


def test_gz_source_is_decompressed_to_plain_file_as_it_arrives(http_server, out: Path, monkeypatch) -> None:
    from tasks.core import download as module

    plain = _tsv()
    packed = gzip.compress(plain)
    (http_server.root / "day_0.gz").write_bytes(packed)
    reads = []

    def spying_open(file, mode="r", *args, **kwargs):
        if "r" in mode:
            reads.append(Path(file).name)
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(module, "open", spying_open, raising=False)
    result = download(http_server.url("day_0.gz"), out / "day_0", expected_sha256=_sha(packed), chunk_bytes=CHUNK)
    assert reads == []  # decompressed while fetched: the .part is written, never read back
    assert (out / "day_0").read_bytes() == plain
    assert (result.bytes, result.source_bytes, result.sha256) == (len(plain), len(packed), _sha(packed))
    assert _leftovers(out) == ["day_0", "day_0.download.json"]


def test_truncated_gzip_fails_without_destination(http_server, out: Path) -> None:
    packed = gzip.compress(_tsv())
    (http_server.root / "day_0.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DownloadError, match=r"corrupt or truncated gzip .*day_0\.part.* near compressed byte \d+"):
        download(http_server.url("day_0.gz"), out / "day_0", chunk_bytes=CHUNK)
    assert _leftovers(out) == []


def test_corrupt_gzip_fails_without_destination(http_server, out: Path) -> None:
    packed = bytearray(gzip.compress(_tsv()))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)
    (http_server.root / "day_0.gz").write_bytes(bytes(packed))
    with pytest.raises(DownloadError, match="corrupt or truncated gzip"):
        download(http_server.url("day_0.gz"), out / "day_0", chunk_bytes=CHUNK)
    assert _leftovers(out) == []


def test_local_gz_is_read_once_into_the_decompression_without_a_part(tmp_path: Path, out: Path,
                                                                       monkeypatch) -> None:
    """A file:// .gz needs no .part (it only serves a resumed transfer): no second copy of the source is written,
    a leftover .part of an earlier attempt is dropped, and a bad gzip names the source file."""
    from tasks.core import download as module

    plain = _payload()  # incompressible: the .gz spans several reads
    packed = gzip.compress(plain)
    src = tmp_path / "day_0.gz"
    src.write_bytes(packed)
    (out / "day_0.part").write_bytes(b"left by an earlier attempt")
    fed = []
    feed = module._StreamingGunzip.feed
    monkeypatch.setattr(module._StreamingGunzip, "feed",
                        lambda self, chunk: (fed.append(os.path.exists(out / "day_0.part")), feed(self, chunk)))
    result = download(src.as_uri(), out / "day_0", expected_sha256=_sha(packed), chunk_bytes=CHUNK,
                      allowed_file_roots=[tmp_path])
    assert len(fed) > 1 and not any(fed)  # several reads, none with a .part on disk
    assert (out / "day_0").read_bytes() == plain
    assert (result.bytes, result.source_bytes, result.sha256) == (len(plain), len(packed), _sha(packed))
    assert _leftovers(out) == ["day_0", "day_0.download.json"]

    for bad in (packed[: len(packed) // 2], b"not a gzip header" + _payload(4 << 20)):  # found at the end / start
        src.write_bytes(bad)
        with pytest.raises(DownloadError,
                           match=rf"corrupt or truncated gzip {re.escape(src.as_uri())} near compressed"):
            download(src.as_uri(), out / "day_1", chunk_bytes=CHUNK, allowed_file_roots=[tmp_path])
        assert _leftovers(out) == ["day_0", "day_0.download.json"]


@pytest.mark.reliability
def test_gz_interrupted_in_the_call_and_across_retries_decompresses_every_byte_once(http_server, out: Path) -> None:
    """The decompression runs while the bytes arrive: a resume in the call continues the stream, and a retry that
    finds a .part feeds its bytes to the decompressor as it re-hashes them."""
    plain = _payload()
    packed = gzip.compress(plain, compresslevel=1)  # incompressible: ~300 KB, so the drops fall mid-stream
    (http_server.root / "day_0.gz").write_bytes(packed)
    url = http_server.url("day_0.gz")
    http_server.server.drop_after_bytes = 100_000
    in_call = download(url, out / "a", expected_sha256=_sha(packed), chunk_bytes=CHUNK)
    assert 0 < in_call.resumed_from <= 100_000 and (out / "a").read_bytes() == plain

    http_server.server.drop_after_bytes = 150_000
    with pytest.raises(DownloadError, match="after 0 resume attempts"):
        download(url, out / "b", chunk_bytes=CHUNK, max_resume_attempts=0)
    assert not (out / "b").exists() and 0 < (out / "b.part").stat().st_size <= 150_000
    retried = download(url, out / "b", expected_sha256=_sha(packed), chunk_bytes=CHUNK)
    assert retried.resumed_from > 0 and (out / "b").read_bytes() == plain
    assert _leftovers(out) == ["a", "a.download.json", "b", "b.download.json"]


def _gunzip_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("gunzip")]


def test_gz_restarted_from_byte_zero_decompresses_only_the_new_bytes(http_server, out: Path) -> None:
    """A leftover .part whose bytes are not the source's start (a server that ignores Range answers from 0): the
    decompression, fed that .part mid-member as it was re-hashed, starts over with the new body."""
    plain = _tsv()
    packed = gzip.compress(plain)
    (http_server.root / "day_0.gz").write_bytes(packed)
    http_server.server.honour_range = False
    url = http_server.url("day_0.gz")
    other = gzip.compress(_payload(), compresslevel=1)  # another valid gzip, cut mid-member
    _leave_part(out, url, other[: len(other) // 2], etag_of(http_server.root / "day_0.gz"))
    result = download(url, out / "day_0", expected_sha256=_sha(packed), chunk_bytes=CHUNK)
    assert result.resumed_from == 0 and (out / "day_0").read_bytes() == plain
    assert _leftovers(out) == ["day_0", "day_0.download.json"] and _gunzip_threads() == []


def test_gz_of_several_members_with_zero_padding_is_decompressed_whole(http_server, out: Path) -> None:
    members = [_tsv(3000), b"", _payload(200_000)]
    packed = gzip.compress(members[0]) + gzip.compress(members[1]) + bytes(10) + gzip.compress(members[2]) + bytes(7)
    (http_server.root / "day_0.gz").write_bytes(packed)
    download(http_server.url("day_0.gz"), out / "day_0", chunk_bytes=CHUNK)
    assert (out / "day_0").read_bytes() == b"".join(members)


def test_gz_with_the_wrong_checksum_leaves_nothing_running_or_written(http_server, out: Path) -> None:
    (http_server.root / "day_0.gz").write_bytes(gzip.compress(_payload(), compresslevel=1))
    with pytest.raises(ChecksumMismatch):
        download(http_server.url("day_0.gz"), out / "day_0", expected_sha256="0" * 64, chunk_bytes=CHUNK)
    assert _leftovers(out) == [] and _gunzip_threads() == []


def test_gz_whose_decompressed_write_fails_keeps_the_verified_part(http_server, out: Path, monkeypatch) -> None:
    """A full disk while writing the decompressed bytes is not the source's fault: the verified .part stays, and the
    retry decompresses it without fetching the body again."""
    import errno

    from tasks.core import download as module

    plain = _payload()
    packed = gzip.compress(plain, compresslevel=1)
    (http_server.root / "day_0.gz").write_bytes(packed)

    def full_disk(self, expanded):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(module._GzipStream, "_emit", full_disk)
        with pytest.raises(OSError, match="No space left"):
            download(http_server.url("day_0.gz"), out / "day_0", chunk_bytes=CHUNK)
    assert _leftovers(out) == ["day_0.part", "day_0.part.json"] and _gunzip_threads() == []
    result = download(http_server.url("day_0.gz"), out / "day_0", expected_sha256=_sha(packed), chunk_bytes=CHUNK)
    assert result.resumed_from == len(packed) and (out / "day_0").read_bytes() == plain
    assert http_server.server.requests[-1] == ("/day_0.gz", f"bytes={len(packed)}-")  # answered 416: no body


def test_gz_stream_fed_in_any_piece_sizes_decompresses_whole_and_places_an_error(tmp_path: Path) -> None:
    """Reads of any size (an HTTPS read returns one TLS record; a leftover .part is re-read in 8 MiB) are gathered
    or cut into the thread's pieces without losing or reordering a byte; a bad member after padding is placed at its
    compressed offset."""
    import io
    import random

    from tasks.core.download import _StreamingGunzip

    plain = _payload(3_000_000) + _tsv(20_000)
    packed = gzip.compress(plain, compresslevel=1)
    rng, at, out = random.Random(3), 0, io.BytesIO()
    with _StreamingGunzip(out, tmp_path / "x.part", "test", max_expanded=1 << 30) as gunzip:
        while at < len(packed):
            size = rng.choice([1, 13, 16 << 10, 1 << 20, 3 << 20])
            gunzip.feed(packed[at:at + size])
            at += size
        gunzip.finish()
    assert out.getvalue() == plain

    bad = gzip.compress(b"first member") + bytes(1000) + b"\x1f\x8bnot a header"
    with _StreamingGunzip(io.BytesIO(), tmp_path / "x.part", "test", max_expanded=1 << 30) as gunzip:
        gunzip.feed(bad)
        with pytest.raises(DownloadError, match=rf"near compressed byte {len(bad) - 14}"):
            gunzip.finish()


def test_gz_kept_compressed_when_decompress_false(http_server, out: Path) -> None:
    packed = gzip.compress(_tsv())
    (http_server.root / "day_0.gz").write_bytes(packed)
    result = download(http_server.url("day_0.gz"), out / "day_0.gz", decompress=False)
    assert (out / "day_0.gz").read_bytes() == packed and result.bytes == result.source_bytes == len(packed)


# --- s3 (moto) --------------------------------------------------------------------------------------------------------


def test_s3_download(s3_server, s3_bucket: str, out: Path) -> None:
    data = _payload()
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="criteo/day_0", Body=data)
    url = f"s3://{s3_bucket}/criteo/day_0"
    result = download(url, out / "day_0", s3_client=client, expected_sha256=_sha(data), chunk_bytes=CHUNK)
    assert (out / "day_0").read_bytes() == data
    assert (result.source, result.source_bytes, result.resumed_from) == (url, len(data), 0)


def test_s3_leftover_part_resumes(s3_server, s3_bucket: str, out: Path) -> None:
    data = _payload()
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="criteo/day_0", Body=data)
    url = f"s3://{s3_bucket}/criteo/day_0"
    _leave_part(out, url, data[:200_000], client.head_object(Bucket=s3_bucket, Key="criteo/day_0")["ETag"])
    result = download(url, out / "day_0", s3_client=client, expected_sha256=_sha(data))
    assert result.resumed_from == 200_000 and result.sha256 == _sha(data)
    assert (out / "day_0").read_bytes() == data


def test_s3_gz_with_default_client_from_environment(s3_server, s3_bucket: str, out: Path, monkeypatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    plain = _tsv()
    s3_server.client().put_object(Bucket=s3_bucket, Key="day_0.gz", Body=gzip.compress(plain))
    download(f"s3://{s3_bucket}/day_0.gz", out / "day_0", s3_client=s3_client_from_connection(None))
    assert (out / "day_0").read_bytes() == plain


def test_s3_missing_key_is_source_not_found(s3_server, s3_bucket: str, out: Path) -> None:
    with pytest.raises(SourceNotFound, match="NoSuchKey"):
        download(f"s3://{s3_bucket}/criteo/day_9", out / "day_9", s3_client=s3_server.client())
    assert _leftovers(out) == []


def test_s3_client_from_airflow_connection(s3_server, s3_bucket: str, tmp_path: Path, out: Path) -> None:
    """The Airflow `aws` connection path, run in a child process so that Airflow's logging setup and AIRFLOW_HOME
    stay out of this test session."""
    data = _payload(1000)
    s3_server.client().put_object(Bucket=s3_bucket, Key="day_0", Body=data)
    connection = {"conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
                  "extra": {"endpoint_url": s3_server.endpoint_url, "region_name": s3_server.region}}
    script = (
        "import sys; from pathlib import Path; from tasks.core.download import download, s3_client_from_connection; "
        f"download('s3://{s3_bucket}/day_0', Path(sys.argv[1]), s3_client=s3_client_from_connection('recflow_s3'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW"))}
    env |= {"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW_CONN_RECFLOW_S3": json.dumps(connection),
            "RECFLOW_ALLOWED_CONN_IDS": "aws_default,recflow_s3"}
    done = subprocess.run([sys.executable, "-c", script, str(out / "day_0")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "day_0").read_bytes() == data


def test_progress_line_reports_rate_and_eta(http_server, source: bytes, out: Path, monkeypatch, caplog) -> None:
    monkeypatch.setattr("tasks.core.download._PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="tasks.core.download"):
        download(http_server.url("day_0"), out / "day_0", chunk_bytes=CHUNK)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("downloading ")]
    assert lines and all(re.search(r"of 0\.3 MB \(\d+%\), [\d.]+ MB/s, ETA \d+:\d\d:\d\d", line) for line in lines)
    assert "(100%)" in lines[-1]


# --- allow-lists and the same day from two runs ---------------------------------------------------------------------


@pytest.mark.parametrize("url, prefix, allowed", [
    ("https://m.example/raw/day_0.gz?sig=x", "https://m.example/raw/", True),
    ("https://M.EXAMPLE:443/raw/day_0", "https://m.example/raw", True),
    ("https://m.example/raw/sub/day_0", "https://m.example/", True),
    ("https://m.example/raw-private/day_0", "https://m.example/raw", False),
    ("https://m.example.evil.io/raw/day_0", "https://m.example/raw/", False),
    ("http://m.example/raw/day_0", "https://m.example/raw/", False),
    ("https://m.example:8443/raw/day_0", "https://m.example/raw/", False),
    ("https://m.example/raw/../secret", "https://m.example/raw/", False),
    ("https://m.example/raw/%2e%2e/secret", "https://m.example/raw/", False),
    ("https://m.example/raw/a%2Fb", "https://m.example/raw/", False),
    ("s3://bucket/raw/day_0", "s3://bucket/raw/", True),
    ("s3://bucket/raw/day_0", "s3://bucket", True),
    ("s3://bucket-2/raw/day_0", "s3://bucket", False),
    ("s3://bucket/rawer/day_0", "s3://bucket/raw", False),
])
def test_source_prefixes_compare_scheme_host_port_and_whole_segments(url, prefix, allowed) -> None:
    from tasks.core.download_sources import source_under_prefix

    assert source_under_prefix(url, prefix) is allowed


def test_source_outside_the_allowed_prefixes_is_refused_before_any_request(http_server, source: bytes,
                                                                          out: Path) -> None:
    from tasks.core.download import SourceNotAllowed

    with pytest.raises(SourceNotAllowed, match=r"^source http://127\.0\.0\.1:\d+/day_0 is not under an allowed prefix "
                                                r"\['https://mirror\.example/raw/'\] \(set "
                                                r"RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more\)$"):
        download(http_server.url("day_0"), out / "day_0", allowed_prefixes=["https://mirror.example/raw/"])
    assert http_server.server.requests == [] and _leftovers(out) == []


def test_connection_outside_the_allowed_ids_is_refused_before_it_is_looked_up(monkeypatch) -> None:
    from tasks.core.download import ConnectionNotAllowed

    with pytest.raises(ConnectionNotAllowed, match=r"^connection 'prod_admin' is not an allowed connection "
                                                   r"\['aws_default'\] \(set RECFLOW_ALLOWED_CONN_IDS to allow more\)$"):
        s3_client_from_connection("prod_admin")
    monkeypatch.setenv("RECFLOW_ALLOWED_CONN_IDS", "aws_readonly")
    with pytest.raises(ConnectionNotAllowed, match="'aws_default' is not an allowed connection"):
        s3_client_from_connection("aws_default")


_DOWNLOAD_DAY = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
from tasks.core.config import load_settings
from tasks.criteo.ingest import download_day
print(json.dumps(download_day(load_settings(), 0)))
"""


def test_two_runs_of_one_day_never_write_the_same_file(http_server, source: bytes, tmp_path: Path) -> None:
    """Two criteo_ingest runs of day 0 at once (the `day` param, max_active_runs=3) from a slow source: the second
    waits for the day's lock, then finds the first one's verified copy; the file is the source, byte for byte."""
    from tasks.criteo.layout import raw_day

    http_server.server.write_delay_s = 1.0  # ~5 s for the 300 KB source: the second run arrives mid-transfer
    data = tmp_path / "data"
    env = {**os.environ, "RECFLOW_DATA_ROOT": str(data), "RECFLOW_CRITEO_SOURCE": http_server.url("day_{day}"),
           "PYTHONPATH": str(REPO)}
    env.pop("RECFLOW_SOURCE_ALLOWED_PREFIXES")  # the configured source's own folder is allowed by default

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _DOWNLOAD_DAY], env=env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = start()
    deadline = time.monotonic() + 60
    while not http_server.server.requests and time.monotonic() < deadline:
        time.sleep(0.05)  # the first run holds the lock and is transferring
    second = start()
    (out1, err1), (out2, err2) = first.communicate(timeout=120), second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err1[-2000:] + err2[-2000:]
    results = [json.loads(out1.strip().splitlines()[-1]), json.loads(out2.strip().splitlines()[-1])]
    assert [r["cached"] for r in results] == [False, True]
    assert raw_day(data, 0).read_bytes() == source and all(r["sha256"] == _sha(source) for r in results)
    assert http_server.server.requests == [("/day_0", None)]  # one transfer, never a resume into a shared .part
    assert f"waiting for day 0's lock held by pid {first.pid} on host" in err2
