"""The Outbrain ingest steps for one snapshot: download_snapshot, validate_snapshot. Plain functions; the DAG only
wires them. Each returns a small JSON-able dict for XCom and is a no-op when its output already carries a manifest
for the same inputs. Both run under the snapshot's lock (tasks.core.storage.partition_lock), so two runs of one
snapshot never write the same files.

download_snapshot: each of the nine files through tasks.core.download (file, http(s), s3; the deployment's
allow-lists; resumable; atomic), as the source serves it: `<file>.csv`, `<file>.csv.gz` (gunzipped while
downloading) or Kaggle's `<file>.csv.zip` (its `<file>.csv` member unzipped atomically), into
raw/<snapshot>/<file>.csv. A `SHA256SUMS` beside the files (sha256sum format), when the source has one, is read
afresh on every run and each served file checked against it (a mismatch is one line naming the file). A manifest
of raw/<snapshot>/ names the verified inputs; a rerun with the same ones transfers nothing.

validate_snapshot: tasks.outbrain.tables_validation into validated/<snapshot>/:
  <table>/part-00000.parquet  typed good rows, column names as in the CSV (tasks.outbrain.schema.arrow_schema)
  quarantine.jsonl            one JSON object per bad row: file, line, column (field number, 0 = the whole line),
                              column_name, byte, reason, rule (the reason without the value), text
  report.json                 counts and reasons per file, cross-file results, each file's GX result
  _MANIFEST.json              only when every file passed
"""

from __future__ import annotations

import logging
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tasks.core.archive import copy_capped, expanded_max_bytes, unreadable
from tasks.core.config import Settings
from tasks.core.download_sources import ChecksumMismatch, SourceNotFound
from tasks.core.storage import (
    Manifest, atomic_file, completed_manifest, partition_lock, read_manifest, write_manifest, write_text_atomic,
)
from tasks.core.validation import ArchiveUnusable, DataQualityError
from tasks.outbrain import layout
from tasks.outbrain.schema import TABLES, check_snapshot_name
from tasks.outbrain.settings import OutbrainSettings, load_outbrain_settings

log = logging.getLogger(__name__)

RULES_VERSION = 1  # bump when tasks.outbrain.schema's rules change: cached validations are then redone
CHECKSUMS_FILE = "SHA256SUMS"


class StepInputMissing(RuntimeError):
    """An upstream output this step needs is absent or incomplete."""


def snapshot_lock(settings: Settings, snapshot: str):
    """The snapshot's exclusive lock: a second run of the same snapshot waits, then finds the first one's output."""
    return partition_lock(settings.data_root, layout.DATASET, f"snapshot={snapshot}", label=f"Outbrain {snapshot}",
                          timeout_s=settings.partition_lock_timeout_s)


def checksums_url(file_url: str) -> str:
    """Where the SHA256SUMS of a snapshot lives: beside its files (the last path segment replaced; the query
    string of a presigned URL is dropped, as it signs the file, not the sums)."""
    parts = urlsplit(file_url)
    if parts.scheme.lower() in ("http", "https", "s3"):
        folder = parts.path[: parts.path.rfind("/") + 1]
        return urlunsplit(parts._replace(path=folder + CHECKSUMS_FILE, query="", fragment=""))
    return file_url[: file_url.rfind("/") + 1] + CHECKSUMS_FILE


def parse_sha256sums(text: str, *, shown: str = "") -> dict[str, str]:
    """{file name: lowercase sha256} of a sha256sum listing (`<hex>  <name>` or `<hex> *<name>`); a line that is
    neither blank nor a checksum fails with one line."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.strip().partition(" ")
        name = name.lstrip(" *")
        if len(digest) != 64 or not all(c in "0123456789abcdefABCDEF" for c in digest) or not name:
            raise DataQualityError(f"{shown or CHECKSUMS_FILE} line {number}: not '<64 hex digits>  <file>'")
        sums[Path(name).name] = digest.lower()
    return sums


def download_snapshot(settings: Settings, snapshot: str, *, source: str | None = None, aws_conn_id: str | None = None,
                      outbrain: OutbrainSettings | None = None) -> dict[str, Any]:
    """Fetch the nine files of a snapshot into raw/<snapshot>/ (see the module docstring); cached when a verified
    copy of the same inputs exists. `source` overrides the configured URL template (RECFLOW_OUTBRAIN_SOURCE) for
    this run: a template with {file}."""
    from tasks.core.download import check_source_allowed, s3_client_from_connection

    check_snapshot_name(snapshot)
    outbrain = outbrain or load_outbrain_settings()
    if source is not None and "{file}" not in source:
        raise DataQualityError(f"source {source!r} has no {{file}} placeholder (e.g. https://mirror/outbrain/{{file}})")
    candidates = {name: outbrain.source_urls(settings.data_root, name, source) for name in TABLES}
    sums_url = checksums_url(candidates["clicks_train"][0])
    allowed = outbrain.allow_lists(settings)
    for url in (sums_url, *(u for urls in candidates.values() for u in urls)):
        check_source_allowed(url, **allowed)  # a refused input leaves nothing under the data root, not even a lock
    first = candidates["clicks_train"][0]
    s3_client = s3_client_from_connection(aws_conn_id, settings.allowed_conn_ids) if first.startswith("s3://") else None
    with snapshot_lock(settings, snapshot):
        return _download_snapshot(settings, snapshot, candidates, sums_url, allowed, s3_client)


def _download_snapshot(settings: Settings, snapshot: str, candidates: dict[str, tuple[str, ...]], sums_url: str,
                       allowed: dict[str, Any], s3_client: Any) -> dict[str, Any]:
    from tasks.core.download import download

    start = time.monotonic()
    raw = layout.raw_dir(settings.data_root, snapshot)
    sums_path = raw / CHECKSUMS_FILE
    sums_path.unlink(missing_ok=True)  # read afresh every run: it is how a new snapshot at the same URL is noticed
    sums_path.with_name(CHECKSUMS_FILE + ".download.json").unlink(missing_ok=True)
    try:
        download(sums_url, sums_path, decompress=False, s3_client=s3_client, **allowed)
        sums = parse_sha256sums(sums_path.read_text(errors="replace"), shown=sums_url)
    except SourceNotFound:
        sums = None
        log.info("no %s at the source (%s): files are not checked against published checksums", CHECKSUMS_FILE,
                 sums_url)
    previous = (read_manifest(raw) or {}).get("extra", {}).get("files", {})
    files = {}
    for name, urls in candidates.items():
        recorded = previous.get(name, {}).get("source")
        ordered = ([recorded] if recorded in urls else []) + [u for u in urls if u != recorded]
        files[name] = _fetch_file(raw, name, ordered, sums, allowed, s3_client, download)
    inputs = {"files": {name: {"source": f["source"], "sha256": f["sha256"]} for name, f in files.items()},
              "checksums": sums is not None}
    cached = completed_manifest(raw, inputs) is not None and all(f["cached"] for f in files.values())
    if not cached:
        write_manifest(raw, Manifest(kind="outbrain_raw", inputs=inputs, extra={"files": files}), checksum=False)
    log.info("Outbrain %s: %d files in %s (%s), %.1f s%s", snapshot, len(files), raw,
             "checked against " + sums_url if sums is not None else "no published checksums",
             time.monotonic() - start, " [cached]" if cached else "")
    return {"snapshot": snapshot, "path": str(raw), "files": files, "checksums": sums_url if sums is not None else None,
            "fingerprint": read_manifest(raw)["inputs_fingerprint"], "cached": cached}


def _fetch_file(raw: Path, name: str, urls: list[str], sums: dict[str, str] | None, allowed: dict[str, Any],
                s3_client: Any, download) -> dict[str, Any]:
    """The first of `urls` the source has, downloaded (and decompressed) into raw/<file>.csv."""
    destination = raw / f"{name}.csv"
    for url in urls:
        served = Path(urlsplit(url).path).name
        expected = None
        if sums is not None:
            expected = sums.get(served)
            if expected is None:
                continue  # the source's checksums do not list this form: try the next one
        zipped = served.endswith(".zip")
        try:
            result = download(url, raw / served if zipped else destination, expected_sha256=expected,
                              decompress=served.endswith(".gz"), s3_client=s3_client, **allowed)
        except SourceNotFound:
            continue
        except ChecksumMismatch as exc:
            raise ChecksumMismatch(f"{served}: {exc} (its line in {CHECKSUMS_FILE}); the download was deleted, a "
                                   "retry fetches it again") from None
        cached = result.cached
        if zipped:
            cached = _unzip_member(Path(result.path), destination, f"{name}.csv", result.sha256) and cached
        return {"source": url, "served": served, "sha256": result.sha256, "bytes": destination.stat().st_size,
                "source_bytes": result.source_bytes, "cached": cached}
    listed = "" if sums is None else f" listed in {CHECKSUMS_FILE}"
    raise DataQualityError(f"no {name}.csv, .csv.gz or .csv.zip{listed} at the source (tried {', '.join(urls)})")


def _unzip_member(archive: Path, destination: Path, member: str, archive_sha256: str) -> bool:
    """Unzip `member` of Kaggle's `<file>.csv.zip` atomically into destination; True when an earlier run already
    did so for this very archive (a stamp beside it records the archive's sha256)."""
    stamp = destination.with_name(destination.name + ".unzipped.json")
    wanted = f'{{"archive": "{archive.name}", "sha256": "{archive_sha256}"}}'
    if destination.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return True
    stamp.unlink(missing_ok=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            if member not in names:
                raise ArchiveUnusable(f"{archive.name} holds no {member} (members: {names[:10]})")
            if names.count(member) > 1:
                raise ArchiveUnusable(f"{archive.name}: member {member!r} appears more than once (which copy is "
                                       "the data?); refusing to unpack it")
            with zf.open(member) as source, atomic_file(destination) as sink:
                # A zip bomb stops at the deployment's cap (ExpansionLimitExceeded: NotAllowed, not retried).
                copy_capped(source, sink, limit=expanded_max_bytes(), what=f"{archive.name} (member {member})",
                            chunk_bytes=8 << 20)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        if (error := unreadable(archive, exc)) is None:
            raise  # not the archive's fault (a full disk is an OSError, retried)
        raise ArchiveUnusable(str(error)) from None
    write_text_atomic(stamp, wanted)
    return False


def validate_snapshot(settings: Settings, snapshot: str, *, bad_row_budget: float | None = None,
                      outbrain: OutbrainSettings | None = None) -> dict[str, Any]:
    """Validate every row of every file of the downloaded snapshot into validated/<snapshot>/; fail over the
    bad-row budget (None: the Outbrain settings' budget, else the deployment's RECFLOW_BAD_ROW_BUDGET).

    Memory is bounded by Settings.validation_block_bytes, not by the files (tasks.outbrain.tables_validation)."""
    from tasks.outbrain.tables_validation import validate_tables

    check_snapshot_name(snapshot)
    outbrain = outbrain or load_outbrain_settings()
    budget = outbrain.budget(settings) if bad_row_budget is None else bad_row_budget
    root = settings.data_root
    out = layout.validated_dir(root, snapshot)
    with snapshot_lock(settings, snapshot):
        raw = layout.raw_dir(root, snapshot)
        downloaded = read_manifest(raw)
        if downloaded is None or completed_manifest(raw, downloaded.get("inputs", {})) is None:
            raise StepInputMissing(f"Outbrain {snapshot} has no complete download in {raw}: run download first")
        inputs = {"raw": downloaded["inputs_fingerprint"], "snapshot": snapshot, "budget": budget,
                  "rules": RULES_VERSION}
        cached = completed_manifest(out, inputs)
        if cached:
            log.info("Outbrain %s already validated for these inputs (%s): nothing to do", snapshot, out)
            return _result(snapshot, out, cached, cached=True)
        manifest = validate_tables(raw, out, inputs=inputs, budget=budget, block_bytes=settings.validation_block_bytes)
    return _result(snapshot, out, manifest, cached=False)


def _result(snapshot: str, out: Path, manifest: dict[str, Any], *, cached: bool) -> dict[str, Any]:
    rows, extra = manifest["rows"], manifest["extra"]
    return {"snapshot": snapshot, "rows": rows["total"], "good_rows": rows["good"], "bad_rows": rows["bad"],
            "tables": extra["tables"], "displays": extra["displays"], "path": str(out),
            "fingerprint": manifest["inputs_fingerprint"], "cached": cached}


__all__ = ["ChecksumMismatch", "DataQualityError", "StepInputMissing", "checksums_url", "download_snapshot",
           "parse_sha256sums", "snapshot_lock", "validate_snapshot"]
