"""Validation of one Outbrain snapshot's raw files into a directory: every row of every file checked
(tasks.outbrain.raw_tables), typed good rows kept as parquet, bad rows quarantined with file/line/column/reason,
cross-file keys checked, a GX suite per file run on evidence, the bad-row budget enforced per file.
tasks.outbrain.ingest.validate_snapshot calls this under the snapshot's lock.

Cross-file checks (each a bad row of clicks_train, counted in its budget; a broken display is dropped whole from
the validated clicks_train, so every kept display has exactly one click and joins):
  - exactly one clicked=1 per display_id of clicks_train;
  - every display_id of clicks_train is in the validated events: a display whose events row was quarantined (for
    any column) is broken too, since it would join to no event (no day, platform or geo: the day decides the
    train / valid split); one events row is one display, a few clicks rows;
  - every ad_id of clicks_train is in promoted_content: an ad whose own row was quarantined there for another
    column still counts as present (its ad features are then null), since a popular ad is named by thousands of
    displays, and one bad row must not break them all;
and key uniqueness, a hard failure (a duplicate key would multiply rows in every join): display_id in events, ad_id
in promoted_content.

Memory is bounded by the block, not the file (page_views is 2 billion rows in Kaggle's full set): one block of
lines at a time (Settings.validation_block_bytes), parquet written row group by row group, and the keys of the
cross-file checks spilled to hash-bucket files on disk (tasks.core.validation.BucketSpill: clicks_train's
(display_id, clicked, line) and (ad_id, display_id, line), events' (display_id, line), promoted_content's (ad_id,
line)) and compared one bucket at a time, with as many buckets as the largest of those files has blocks, so a
bucket holds about one block's worth of keys. What stays in memory across the whole run is the set of broken
display ids (within budget: a small fraction of the displays).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest, write_text_atomic
from tasks.core.validation import (
    EVIDENCE_BAD_ROWS, BadField, BucketSpill, DataQualityError, Quarantine, bad_fraction, budget_failure,
    first_lines, gx_section, iter_line_blocks, start_gx_worker, summarize_gx, write_good_rows,
)
from tasks.outbrain.raw_tables import MAX_LINE_BYTES, check_block, check_header, long_line
from tasks.outbrain.schema import TABLES, Table, arrow_schema

log = logging.getLogger(__name__)

EVIDENCE_ROWS = 2_000  # first lines of each file handed to GX
PROGRESS_EVERY_S = 10.0
PART_FILE = "part-00000.parquet"
_SPILL_DIR = ".keys"  # inside the temporary output: a killed run's spill goes with its temporary
_KEYED = ("clicks_train", "events", "promoted_content")


def validate_tables(raw_dir: Path, out: Path, *, inputs: dict[str, Any], budget: float,
                    block_bytes: int = 64 << 20) -> dict[str, Any]:
    """Validate every file of `raw_dir` (<file>.csv each) into `out` (replaced atomically); returns the manifest
    written, as a dict. Raises DataQualityError (one line: the first failing file, line and column) when a file
    is over budget, has a wrong header, has no rows or breaks key uniqueness; `out` then holds report.json and
    quarantine.jsonl but no manifest."""
    missing = [t.file_name for t in TABLES.values() if not (raw_dir / t.file_name).is_file()]
    if missing:
        raise DataQualityError(f"{raw_dir} has no {', '.join(missing)}: the snapshot is incomplete")
    started = time.monotonic()
    start_gx_worker()  # the report's GX run needs it at the end: imported in another process while the rows are checked
    with atomic_directory(out) as tmp:
        quarantine = Quarantine(tmp / "quarantine.jsonl", evidence_rows=EVIDENCE_BAD_ROWS)
        buckets = max(1, math.ceil(max((raw_dir / f"{n}.csv").stat().st_size for n in _KEYED) / max(block_bytes, 1)))
        keys = {name: BucketSpill(tmp / _SPILL_DIR, name, buckets, width) for name, width in (
            ("clicks", 3), ("click_ads", 3), ("events", 2), ("promoted", 2))}
        scans: dict[str, TableScan] = {}
        try:
            for table in TABLES.values():
                scans[table.name] = scan = TableScan(raw_dir / table.file_name, tmp, table, quarantine, block_bytes)
                scan.run(keys)
            failures = [s.failure for s in scans.values() if s.failure]
            cross = cross_file_checks(keys, quarantine) if not failures else {}
            failures += cross.get("failures", [])
            if cross.get("broken_displays") is not None and len(cross["broken_displays"]):
                scans["clicks_train"].drop_displays(cross["broken_displays"], cross["dropped_rows"])
        finally:
            quarantine.close()
            shutil.rmtree(tmp / _SPILL_DIR, ignore_errors=True)
        report = _report(raw_dir, scans, quarantine, cross, budget, time.monotonic() - started)
        # clicks_train last: its bad rows may follow from another file's (a display whose event was quarantined),
        # and the first line of the error is the cause
        ordered = sorted(scans.values(), key=lambda scan: scan.table.name == "clicks_train")
        failures += [f for s in ordered if not s.failure
                     and (f := budget_failure(s.first_bad_text(quarantine), quarantine.bad_in(s.table.file_name),
                                              s.total, budget, out)) is not None]
        report["failures"] = failures
        write_text_atomic(tmp / "report.json", json.dumps(report, indent=2, default=str))
        if not failures:
            manifest = write_manifest(tmp, Manifest(
                kind="outbrain_validated", inputs=inputs, rows={"total": report["rows"], "good": report["good_rows"],
                                                                "bad": report["bad_rows"]},
                extra={"tables": {n: t["rows"] for n, t in report["tables"].items()},
                       "displays": cross.get("displays"), "reasons": {n: t["reasons"]
                                                                      for n, t in report["tables"].items()}}))
    log.info("Outbrain snapshot %s: %d rows in %d files, %d bad, %.1f s, %.0f rows/s", raw_dir.name, report["rows"],
             len(scans), report["bad_rows"], report["seconds"], report["rows"] / max(report["seconds"], 1e-9))
    if failures:
        more = f" (and {len(failures) - 1} more failures: see {out / 'report.json'})" if len(failures) > 1 else ""
        raise DataQualityError(failures[0] + more)
    return json.loads(manifest.to_json())


class TableScan:
    """One pass over one file: typed good rows to <table>/part-00000.parquet, bad rows to the quarantine, keys to
    the cross-file spills, the first lines kept as GX evidence."""

    def __init__(self, path: Path, tmp: Path, table: Table, quarantine: Quarantine, block_bytes: int) -> None:
        self.path, self.tmp, self.table, self.quarantine, self.block_bytes = path, tmp, table, quarantine, block_bytes
        self.total = self.good = 0
        self.failure: str | None = None
        self.evidence: list[tuple[int, bytes]] = []
        self.part = tmp / table.name / PART_FILE

    def run(self, keys: dict[str, BucketSpill]) -> None:
        import pyarrow.parquet as pq

        size = self.path.stat().st_size
        progress = ProgressLog(f"validating {self.table.file_name}", total=size, unit="bytes",
                               every_s=PROGRESS_EVERY_S, logger=log)
        self.part.parent.mkdir()
        done = 0
        with pq.ParquetWriter(self.part, arrow_schema(self.table)) as writer:
            for first_line, block, skipped in iter_line_blocks(self.path, self.block_bytes, MAX_LINE_BYTES):
                done += len(block) + sum(s.length + 1 for s in skipped)
                for long in skipped:
                    self.quarantine.record(self.table.file_name, long_line(self.table, long.line, long.length,
                                                                           long.head))
                self.total += len(skipped)
                if first_line == 1 and block:
                    block, self.failure = check_header(block, self.table)
                    if self.failure:
                        return
                    first_line = 2
                if block:
                    self._take_block(block, first_line, writer, keys)
                progress.report(done, note=f"{self.total} rows, {self.quarantine.bad_in(self.table.file_name)} bad")
        if self.total == 0:
            self.failure = f"{self.table.file_name}: no rows after the header in {self.path}"

    def _take_block(self, block: bytes, first_line: int, writer, keys: dict[str, BucketSpill]) -> None:
        checked = check_block(block, first_line, self.table)
        self.total += checked.lines
        for bad in checked.bad:
            self.quarantine.record(self.table.file_name, bad)
        self._spill_quarantined_keys(checked.bad, keys)
        self.evidence += first_lines(block, first_line, EVIDENCE_ROWS - len(self.evidence))
        good = checked.good
        if not (written := write_good_rows(writer, good)):
            return
        self.good += written
        self._spill_keys(good, checked.good_lines, keys)

    def _spill_keys(self, good, lines: np.ndarray, keys: dict[str, BucketSpill]) -> None:
        def column(name: str) -> np.ndarray:
            return good.column(name).to_numpy().astype(np.int64)

        if self.table.name == "clicks_train":
            display, ad = column("display_id"), column("ad_id")
            keys["clicks"].add(np.stack([display, column("clicked"), lines], axis=1))
            keys["click_ads"].add(np.stack([ad, display, lines], axis=1))
        elif self.table.name == "events":
            keys["events"].add(np.stack([column("display_id"), lines], axis=1))
        elif self.table.name == "promoted_content":
            keys["promoted"].add(np.stack([column("ad_id"), lines], axis=1))

    def _spill_quarantined_keys(self, bad_rows: list[BadField], keys: dict[str, BucketSpill]) -> None:
        """The key of a quarantined events / promoted_content row whose key itself is fine, spilled with its line
        negated: counted in the key checks (a duplicate of it is still a duplicate), and told apart by
        cross_file_checks (the module docstring: an event's display breaks, an ad stays present)."""
        spill = {"events": keys["events"], "promoted_content": keys["promoted"]}.get(self.table.name)
        if spill is None:
            return
        found = [(int(key), -bad.line) for bad in bad_rows
                 if (key := bad.text.split(",", 1)[0]).isascii() and key.isdigit() and len(key) <= 18]
        if found:
            spill.add(np.array(found, dtype=np.int64))

    def first_bad_text(self, quarantine: Quarantine) -> str | None:
        first = quarantine.first.get(self.table.file_name)
        return first.describe(self.table.file_name) if first else None

    def drop_displays(self, displays: np.ndarray, rows: int) -> None:
        """Rewrite the parquet without the rows of `displays` (broken by a cross-file check, already
        quarantined), row group by row group."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        kept = self.part.with_name(f".kept-{PART_FILE}")
        drop = pa.array(displays, pa.int64())
        source = pq.ParquetFile(self.part)
        with pq.ParquetWriter(kept, arrow_schema(self.table)) as writer:
            for group in range(source.num_row_groups):
                rows_of_group = source.read_row_group(group)
                writer.write_table(rows_of_group.filter(pc.invert(pc.is_in(rows_of_group.column("display_id"),
                                                                           value_set=drop))))
        kept.replace(self.part)
        self.good -= rows


def cross_file_checks(keys: dict[str, BucketSpill], quarantine: Quarantine) -> dict[str, Any]:
    """The cross-file checks of the module docstring, bucket by bucket. Quarantines every clicks_train row of a
    broken display; returns {"broken_displays", "dropped_rows", "displays", "failures"}."""
    clicks_file, failures = TABLES["clicks_train"].file_name, []
    ads_missing: list[np.ndarray] = []  # (display, ad, line) of clicks rows whose ad has no promoted_content row
    for b in range(keys["click_ads"].buckets):
        promoted = keys["promoted"].bucket(b)
        failures += _duplicates(promoted, "promoted_content", "ad_id")
        clicked_ads = keys["click_ads"].bucket(b)
        missing = ~np.isin(clicked_ads[:, 0], promoted[:, 0])
        ads_missing.append(clicked_ads[missing])
    missing_ads = np.concatenate(ads_missing)
    displays, broken, dropped = 0, [], 0
    for b in range(keys["clicks"].buckets):
        events = keys["events"].bucket(b)
        failures += _duplicates(events, "events", "display_id")
        clicks = keys["clicks"].bucket(b)
        ids, inverse = np.unique(clicks[:, 0], return_inverse=True)
        displays += len(ids)
        clicks_per_display = np.bincount(inverse, weights=clicks[:, 1], minlength=len(ids)).astype(np.int64)
        reasons = np.full(len(ids), "", dtype=object)
        no_event = ~np.isin(ids, events[:, 0])
        reasons[no_event] = "is not in events.csv"
        reasons[np.isin(ids, events[events[:, 1] < 0, 0]) & ~no_event] = "has its events.csv row quarantined"
        wrong_clicks = clicks_per_display != 1
        reasons[wrong_clicks] = [f"has {n} clicks (clicked=1), expected exactly 1" for n in clicks_per_display[
            wrong_clicks]]
        ad_broken = np.isin(ids, missing_ads[:, 1]) & (reasons == "")
        reasons[ad_broken] = "shows an ad_id that is not in promoted_content.csv"
        bad_ids = reasons != ""
        if not bad_ids.any():
            continue
        broken.append(ids[bad_ids])
        rows = np.flatnonzero(bad_ids[inverse])
        dropped += len(rows)
        for row in rows[np.argsort(clicks[rows, 2])]:
            display, line = int(clicks[row, 0]), int(clicks[row, 2])
            missing_ad = missing_ads[(missing_ads[:, 1] == display) & (missing_ads[:, 2] == line)]
            column, value, reason = ("ad_id", int(missing_ad[0, 0]), "is not in promoted_content.csv") \
                if len(missing_ad) else ("display_id", display, reasons[inverse[row]])
            quarantine.record(clicks_file, BadField(
                line, 1 if column == "display_id" else 2, column, 1, f"{column} {value} {reason}", reason,
                f"display_id={display}"))
    broken_ids = np.sort(np.concatenate(broken)) if broken else np.empty(0, np.int64)
    return {"broken_displays": broken_ids, "dropped_rows": dropped, "displays": displays, "failures": failures}


def _duplicates(rows: np.ndarray, table: str, column: str) -> list[str]:
    """One failure line for a key that appears twice (the first such pair of this bucket), or none."""
    if len(rows) < 2:
        return []
    order = np.lexsort((np.abs(rows[:, 1]), rows[:, 0]))
    keys, lines = rows[order, 0], np.abs(rows[order, 1])  # a quarantined row's line is spilled negated
    again = np.flatnonzero(keys[1:] == keys[:-1])
    if not len(again):
        return []
    i = again[np.argmin(lines[again + 1])]
    return [f"{table}.csv line {lines[i + 1]} column {column}: {column} {keys[i]} appears again (first at line "
            f"{lines[i]}); {len(again)} repeated keys"]


def _report(raw_dir: Path, scans: dict[str, TableScan], quarantine: Quarantine, cross: dict[str, Any],
            budget: float, seconds: float) -> dict[str, Any]:
    """Counts per file, reasons by kind, the first bad row, the cross-file results and each file's GX result."""
    from tasks.outbrain.gx_suite import run_table_suites

    evidence = {}
    for name, scan in scans.items():
        seen = {line for line, _ in scan.evidence}
        bad = quarantine.evidence.get(scan.table.file_name, [])
        evidence[name] = sorted(scan.evidence + [(n, text) for n, text in bad if n not in seen])
    gx_results = run_table_suites(evidence, mostly=max(0.0, 1.0 - budget))
    for name, result in gx_results.items():
        for line in summarize_gx(result):
            log.info("GX %s: %s", name, line)
    tables = {}
    for name, scan in scans.items():
        bad = quarantine.bad_in(scan.table.file_name)
        tables[name] = {
            "file": str(scan.path), "rows": {"total": scan.total, "good": scan.good, "bad": bad},
            "bad_fraction": bad_fraction(bad, scan.total), "failure": scan.failure,
            "reasons": quarantine.reasons_in(scan.table.file_name), "first_bad": scan.first_bad_text(quarantine),
            "gx": gx_section(gx_results.get(name), f"first {EVIDENCE_ROWS} lines + up to {EVIDENCE_BAD_ROWS} "
                                                   "quarantined lines"),
        }
    return {
        "snapshot": raw_dir.name, "budget": budget, "tables": tables,
        "rows": sum(t["rows"]["total"] for t in tables.values()),
        "good_rows": sum(t["rows"]["good"] for t in tables.values()),
        "bad_rows": sum(t["rows"]["bad"] for t in tables.values()),
        "cross_file": {"displays": cross.get("displays"), "broken_displays": len(cross.get("broken_displays", [])),
                       "dropped_clicks_rows": cross.get("dropped_rows", 0)},
        "gx_success": all(r.get("success") for r in gx_results.values()),
        "seconds": round(seconds, 3),
    }
