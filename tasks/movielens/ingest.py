"""The MovieLens ingest steps for one snapshot: download_snapshot, validate_snapshot. Plain functions; the DAG only
wires them. Each returns a small JSON-able dict for XCom and is a no-op when its output already carries a manifest
for the same inputs. Both run under the snapshot's lock (tasks.core.storage.partition_lock), so two runs of one
snapshot never write the same files.

download_snapshot: `<name>.zip` and its published checksum `<name>.zip.md5` through tasks.core.download (file,
http(s), s3; the deployment's allow-lists), the zip's md5 checked against the published one, then unzipped
atomically (tasks.core.archive: no member may escape the folder) into raw/<name>/ with a manifest naming the
verified zip.

validate_snapshot: every rating row of the ratings file checked (tasks.movielens.raw_ratings), the typed good rows
written as parquet in file order, bad lines quarantined with their line numbers, a GX suite run on evidence
(tasks.movielens.gx_suite), the bad-row budget enforced. Output (validated/<name>/):
  ratings/part-00000.parquet  line, user_id, item_id, rating, timestamp (tasks.movielens.schema)
  quarantine.jsonl            one JSON object per bad line: file, line, column (field number, 0 = the whole line),
                              column_name, byte, reason, rule (the reason without the value), text
  report.json                 counts, reasons by kind, first bad line, duplicates, users, items, the GX result
  _MANIFEST.json              only when the snapshot passed
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tasks.core.config import Settings
from tasks.core.download_sources import ChecksumMismatch
from tasks.core.storage import (
    Manifest, atomic_directory, completed_manifest, partition_lock, read_manifest, write_manifest,
)
from tasks.movielens import layout
from tasks.movielens.ratings_validation import DataQualityError, validate_ratings_file
from tasks.movielens.schema import RatingsFormat, ratings_format
from tasks.movielens.settings import MovieLensSettings, load_movielens_settings

log = logging.getLogger(__name__)

RULES_VERSION = 1  # bump when tasks.movielens.schema's rules change: cached validations are then redone

_BSD_MD5 = re.compile(r"^MD5 \((?P<file>.+)\) = (?P<md5>[0-9a-fA-F]{32})$")
_GNU_MD5 = re.compile(r"^(?P<md5>[0-9a-fA-F]{32}) [ *](?P<file>.+)$")


class StepInputMissing(RuntimeError):
    """An upstream output this step needs is absent or incomplete."""


def snapshot_lock(settings: Settings, name: str):
    """The snapshot's exclusive lock: a second run of the same snapshot waits, then finds the first one's output."""
    return partition_lock(settings.data_root, layout.DATASET, f"snapshot={name}", label=f"MovieLens {name}",
                          timeout_s=settings.partition_lock_timeout_s)


def checksum_url(url: str) -> str:
    """Where the published md5 of an archive lives: the archive's URL + '.md5' (before any query string)."""
    parts = urlsplit(url)
    if parts.scheme.lower() in ("http", "https", "s3") and parts.query:
        return urlunsplit(parts._replace(path=parts.path + ".md5"))
    return url + ".md5"


def parse_md5_file(text: str, file_name: str, *, shown: str = "") -> str:
    """The md5 of `file_name` in a checksum file: BSD/GroupLens `MD5 (ml-20m.zip) = <hex>` or GNU `<hex>  ml-20m.zip`
    (`*` for binary mode); a bare `<hex>` line is taken as the file's. Lowercase hex; one-line ValueError if absent."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        match = _BSD_MD5.match(line) or _GNU_MD5.match(line)
        if match and Path(match.group("file").strip()).name == file_name:
            found.append(match.group("md5").lower())
        elif re.fullmatch(r"[0-9a-fA-F]{32}", line):
            found.append(line.lower())
    if len(set(found)) != 1:
        problem = "no md5" if not found else "conflicting md5s"
        raise ValueError(f"{problem} for {file_name} in {shown or 'the checksum file'}: expected a line "
                         f"'MD5 ({file_name}) = <32 hex digits>' or '<32 hex digits>  {file_name}'")
    return found[0]


def file_md5(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def download_snapshot(settings: Settings, name: str, *, source: str | None = None, aws_conn_id: str | None = None,
                      movielens: MovieLensSettings | None = None) -> dict[str, Any]:
    """Fetch `<name>.zip` and its published `.md5` (file, http(s), s3), verify the md5, unzip atomically into
    raw/<name>/; cached when a verified extraction of the same zip exists. `source` overrides the configured URL
    template (RECFLOW_MOVIELENS_SOURCE) for this snapshot: the archive's URL, its checksum at URL + '.md5'."""
    from tasks.core.download import check_source_allowed, s3_client_from_connection

    fmt = ratings_format(name)
    movielens = movielens or load_movielens_settings()
    url = source or movielens.source_url(settings.data_root, name)
    md5_url = checksum_url(url)
    allowed = movielens.allow_lists(settings)
    for checked in (url, md5_url):  # a refused input leaves nothing under the data root, not even a lock
        check_source_allowed(checked, **allowed)
    s3_client = s3_client_from_connection(aws_conn_id, settings.allowed_conn_ids) if url.startswith("s3://") else None
    with snapshot_lock(settings, name):
        return _download_snapshot(settings, fmt, url, md5_url, allowed, s3_client)


def _download_snapshot(settings: Settings, fmt: RatingsFormat, url: str, md5_url: str, allowed: dict[str, Any],
                       s3_client: Any) -> dict[str, Any]:
    from tasks.core.archive import ArchiveError, ExpansionLimitExceeded, extract_zip
    from tasks.core.validation import ArchiveUnusable
    from tasks.core.download import download

    root, name = settings.data_root, fmt.name
    archive_path, checksum_path = layout.raw_archive(root, name), layout.raw_checksum(root, name)
    # The published checksum is read afresh on every run (a few bytes): it is how a new snapshot published at the
    # same URL is noticed. An archive whose md5 is not the published one is forgotten before the download, which
    # would otherwise find it cached by its sidecar.
    _forget(checksum_path)
    download(md5_url, checksum_path, decompress=False, s3_client=s3_client, **allowed)
    try:
        published = parse_md5_file(checksum_path.read_text(errors="replace"), archive_path.name, shown=md5_url)
    except ValueError as exc:
        _forget(checksum_path)  # a retry fetches the checksum afresh
        raise DataQualityError(str(exc)) from None
    previous = read_manifest(layout.extracted_dir(root, name))
    if archive_path.exists() and (previous or {}).get("inputs", {}).get("md5") != published:
        _forget(archive_path)
    archive = download(url, archive_path, decompress=False, s3_client=s3_client, **allowed)
    extracted = layout.extracted_dir(root, name)
    inputs = {"archive": archive_path.name, "sha256": archive.sha256, "md5": published, "member": fmt.member}
    cached = completed_manifest(extracted, inputs) is not None
    if not cached:
        actual = file_md5(archive_path)
        if actual != published:
            for path in (archive_path, checksum_path):
                _forget(path)  # nothing stays marked complete: a retry downloads both again
            shutil.rmtree(extracted, ignore_errors=True)
            raise ChecksumMismatch(f"md5 mismatch for {url}: published {published} (in {md5_url}), got {actual}; "
                                   "the archive was deleted, a retry downloads it again")
        start = time.monotonic()
        try:
            with atomic_directory(extracted) as tmp:
                members = extract_zip(archive_path, tmp, required=[fmt.member])
                write_manifest(tmp, Manifest(kind="movielens_extracted", inputs=inputs,
                                             extra={"source": url, "members": members}), checksum=False)
        except ExpansionLimitExceeded:
            raise  # a refusal naming its setting (NotAllowed: not retried), as it is
        except ArchiveError as exc:
            raise ArchiveUnusable(f"{exc} (from {url})") from None
        log.info("%s: md5 %s verified, %d members unzipped into %s in %.1f s", archive_path.name, actual,
                 len(members), extracted, time.monotonic() - start)
    else:
        log.info("%s already downloaded, verified (md5 %s) and unzipped in %s: nothing to do", archive_path.name,
                 published, extracted)
    return {"name": name, "archive": str(archive_path), "md5": published, "sha256": archive.sha256,
            "bytes": archive.bytes, "source": url, "extracted": str(extracted),
            "ratings_file": str(layout.ratings_file(root, name)),
            "cached": cached and archive.cached}


def _forget(path: Path) -> None:
    """Delete a downloaded file and its download sidecar, so that nothing vouches for it any more."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".download.json").unlink(missing_ok=True)


def validate_snapshot(settings: Settings, name: str, *, bad_row_budget: float | None = None,
                      movielens: MovieLensSettings | None = None) -> dict[str, Any]:
    """Validate every rating row of the downloaded snapshot into validated/<name>/; fail over the bad-row budget
    (None: MovieLens settings' budget, else the deployment's RECFLOW_BAD_ROW_BUDGET)."""
    fmt = ratings_format(name)
    movielens = movielens or load_movielens_settings()
    budget = movielens.budget(settings) if bad_row_budget is None else bad_row_budget
    root = settings.data_root
    out = layout.validated_dir(root, name)
    with snapshot_lock(settings, name):
        extracted = layout.extracted_dir(root, name)
        unzipped = read_manifest(extracted)
        if unzipped is None or completed_manifest(extracted, unzipped.get("inputs", {})) is None:
            raise StepInputMissing(f"MovieLens {name} has no complete download in {extracted}: run download first")
        ratings = layout.ratings_file(root, name)
        if not ratings.is_file():
            raise StepInputMissing(f"ratings file {ratings} is missing: run download first")
        inputs = {"extracted": unzipped["inputs_fingerprint"], "name": name, "budget": budget,
                  "rules": RULES_VERSION}
        cached = completed_manifest(out, inputs)
        if cached:
            log.info("MovieLens %s already validated for these inputs (%s): nothing to do", name, out)
            return _result(name, out, cached, cached=True)
        manifest = validate_ratings_file(ratings, out, fmt=fmt, inputs=inputs, budget=budget,
                                         block_bytes=settings.validation_block_bytes)
    return _result(name, out, manifest, cached=False)


def _result(name: str, out: Path, manifest: dict[str, Any], *, cached: bool) -> dict[str, Any]:
    rows, extra = manifest["rows"], manifest["extra"]
    return {"name": name, "rows": rows["total"], "good_rows": rows["good"], "bad_rows": rows["bad"],
            "duplicates": rows["duplicates"], "users": extra["users"], "items": extra["items"],
            "min_timestamp": extra["min_timestamp"], "max_timestamp": extra["max_timestamp"], "path": str(out),
            "fingerprint": manifest["inputs_fingerprint"], "cached": cached}


__all__ = ["ChecksumMismatch", "DataQualityError", "StepInputMissing", "checksum_url", "download_snapshot", "file_md5",
           "parse_md5_file", "snapshot_lock", "validate_snapshot"]
