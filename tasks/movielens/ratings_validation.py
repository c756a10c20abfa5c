"""Validation of one MovieLens ratings file into a directory: every row checked, typed good rows kept as parquet in
file order, bad lines quarantined, duplicates and distinct users/items counted, a GX suite run on evidence, the
bad-row budget enforced. tasks.movielens.ingest.validate_snapshot calls this under the snapshot's lock.

Memory stays bounded whatever the file's size: one block of lines (Settings.validation_block_bytes) at a time, the
parquet written row group by row group, (user, item) pairs spilled to hash buckets (raw_ratings.DistinctPairs),
distinct user and item ids kept as sorted arrays (bounded by the id space, not by the rows).
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
    EVIDENCE_BAD_ROWS, BadField, DataQualityError, DistinctPairs, Quarantine, bad_fraction, budget_failure,
    first_lines, gx_section, split_header, start_gx_worker, summarize_gx, write_good_rows,
)
from tasks.movielens.raw_ratings import check_block, iter_line_blocks
from tasks.movielens.schema import FUTURE_SLACK_S, ITEM_ID, RATING, TIMESTAMP, USER_ID, RatingsFormat

log = logging.getLogger(__name__)

EVIDENCE_ROWS = 5_000         # first lines of the file handed to GX
PROGRESS_EVERY_S = 10.0
RATINGS_DIR = "ratings"
PART_FILE = "part-00000.parquet"
_SPILL_DIR = ".pairs"  # inside the temporary output: a killed run's spill goes with its temporary


def validate_ratings_file(ratings: Path, out: Path, *, fmt: RatingsFormat, inputs: dict[str, Any], budget: float,
                          block_bytes: int = 64 << 20, now: float | None = None) -> dict[str, Any]:
    """Validate one ratings file into `out` (replaced atomically); returns the manifest written, as a dict.

    Raises DataQualityError (one line) over budget, for a wrong header, for a missing file or one without rating
    rows; `out` then holds report.json and quarantine.jsonl but no manifest. `now`: the clock timestamps are
    checked against (default: the current time)."""
    if not ratings.is_file():
        raise DataQualityError(f"{ratings.name}: ratings file {ratings} is missing")
    max_timestamp = int(time.time() if now is None else now) + FUTURE_SLACK_S
    start_gx_worker()  # the report's GX run needs it at the end: imported in another process while the rows are checked
    failure: str | None = None
    with atomic_directory(out) as tmp:
        scan = RatingsScan(ratings, tmp, fmt, max_timestamp=max_timestamp, block_bytes=block_bytes)
        try:
            scan.run()
        except DataQualityError as exc:
            failure = str(exc)
        report = scan.report(budget, failure)
        write_text_atomic(tmp / "report.json", json.dumps(report, indent=2, default=str))
        failure = failure or _budget_failure(ratings, out, scan, report, budget)
        if failure is None:
            manifest = write_manifest(tmp, Manifest(
                kind="movielens_validated", inputs=inputs, rows=report["rows"],
                extra={key: report[key] for key in ("users", "items", "min_timestamp", "max_timestamp", "reasons",
                                                    "first_bad")}))
    rows = report["rows"]
    log.info("%s: %d rows, %d bad (%.4f%%), %d duplicate (user, item) rows, %d users, %d items, %.1f s, %.0f rows/s",
             ratings.name, rows["total"], rows["bad"], 100 * report["bad_fraction"], rows["duplicates"],
             report["users"], report["items"], report["seconds"], rows["total"] / max(report["seconds"], 1e-9))
    if failure is not None:
        raise DataQualityError(failure)
    return json.loads(manifest.to_json())


def _budget_failure(ratings: Path, out: Path, scan: RatingsScan, report: dict[str, Any], budget: float) -> str | None:
    rows = report["rows"]
    if rows["total"] == 0:
        return f"{ratings.name}: no rating rows in {ratings}"
    first = scan.first_bad.describe(ratings.name) if scan.first_bad else None
    return budget_failure(first, rows["bad"], rows["total"], budget, out)


class RatingsScan:
    """One pass over a ratings file, writing ratings/ and quarantine.jsonl into `tmp` and counting as it goes."""

    def __init__(self, ratings: Path, tmp: Path, fmt: RatingsFormat, *, max_timestamp: int, block_bytes: int):
        self.ratings, self.tmp, self.fmt = ratings, tmp, fmt
        self.max_timestamp, self.block_bytes = max_timestamp, block_bytes
        self.total = self.good = 0
        self.quarantine: Quarantine | None = None
        self.users = np.empty(0, np.int64)
        self.items = np.empty(0, np.int64)
        self.min_timestamp: int | None = None
        self.max_timestamp_seen: int | None = None
        self.duplicates = 0
        self.evidence: list[tuple[int, bytes]] = []
        self._started = time.monotonic()

    def run(self) -> None:
        import pyarrow.parquet as pq

        from tasks.movielens.schema import validated_arrow_schema

        size = self.ratings.stat().st_size
        buckets = max(1, math.ceil(size / max(self.block_bytes, 1)))
        pairs = DistinctPairs(self.tmp / _SPILL_DIR, buckets)
        progress = ProgressLog(f"validating {self.ratings.name}", total=size, unit="bytes", every_s=PROGRESS_EVERY_S,
                               logger=log)
        (self.tmp / RATINGS_DIR).mkdir()
        done = 0
        self.quarantine = Quarantine(self.tmp / "quarantine.jsonl", evidence_rows=EVIDENCE_BAD_ROWS)
        try:
            with pq.ParquetWriter(self.tmp / RATINGS_DIR / PART_FILE, validated_arrow_schema()) as writer:
                for first_line, block, skipped in iter_line_blocks(self.ratings, self.block_bytes):
                    done += len(block) + sum(len(b.text) + 1 for b in skipped)
                    block, first_line = self._header(block, first_line)
                    self._record_bad(skipped)
                    self.total += len(skipped)
                    if block:
                        self._take_block(block, first_line, writer, pairs)
                    progress.report(done, note=f"{self.total} rows, {self.bad} bad")
            self.duplicates = self.good - pairs.distinct()
        finally:
            self.quarantine.close()
            shutil.rmtree(self.tmp / _SPILL_DIR, ignore_errors=True)

    @property
    def bad(self) -> int:
        return self.quarantine.count if self.quarantine else 0

    @property
    def first_bad(self) -> BadField | None:
        return self.quarantine.first.get(self.ratings.name) if self.quarantine else None

    def _header(self, block: bytes, first_line: int) -> tuple[bytes, int]:
        """Check and strip the header (ml-20m) from the first block."""
        if first_line != 1 or not self.fmt.header:
            return block, first_line
        block, problem = split_header(block, self.ratings.name, self.fmt.separator.join(self.fmt.header))
        if problem:
            raise DataQualityError(problem)
        return block, 2

    def _take_block(self, block: bytes, first_line: int, writer, pairs: DistinctPairs) -> None:
        checked = check_block(block, first_line, self.fmt, self.max_timestamp)
        self.total += checked.lines
        self._record_bad(checked.bad)
        self.evidence += first_lines(block, first_line, EVIDENCE_ROWS - len(self.evidence))
        good = checked.good
        if not (written := write_good_rows(writer, good)):
            return
        self.good += written
        users = good.column(USER_ID).to_numpy()
        items = good.column(ITEM_ID).to_numpy()
        timestamps = good.column(TIMESTAMP).to_numpy()
        pairs.add(users, items)
        self.users = np.union1d(self.users, users)
        self.items = np.union1d(self.items, items)
        low, high = int(timestamps.min()), int(timestamps.max())
        self.min_timestamp = low if self.min_timestamp is None else min(self.min_timestamp, low)
        self.max_timestamp_seen = high if self.max_timestamp_seen is None else max(self.max_timestamp_seen, high)

    def _record_bad(self, bad_rows: list[BadField]) -> None:
        assert self.quarantine is not None
        for bad in bad_rows:
            self.quarantine.record(self.ratings.name, bad)

    def report(self, budget: float, failure: str | None) -> dict[str, Any]:
        """Counts, reasons, the first bad line and the GX suite's result on the evidence."""
        evidence_bad = self.quarantine.evidence.get(self.ratings.name, []) if self.quarantine else []
        gx_result = self._run_gx(budget, evidence_bad) if (self.evidence or evidence_bad) else None
        total = self.total
        return {
            "file": str(self.ratings), "snapshot": self.fmt.name,
            "rows": {"total": total, "good": self.good, "bad": self.bad, "duplicates": self.duplicates},
            "bad_fraction": bad_fraction(self.bad, total), "budget": budget, "failure": failure,
            "reasons": self.quarantine.reasons_in(self.ratings.name) if self.quarantine else {},
            "first_bad": self.first_bad.describe(self.ratings.name) if self.first_bad else None,
            "users": int(len(self.users)), "items": int(len(self.items)),
            "min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp_seen,
            "columns": {"line": "1-based line in the raw file", USER_ID: "raw user id", ITEM_ID: "raw movie id",
                        RATING: "stars", TIMESTAMP: "unix seconds"},
            "seconds": round(time.monotonic() - self._started, 3),
            "gx": gx_section(gx_result, f"first {EVIDENCE_ROWS} lines + up to {EVIDENCE_BAD_ROWS} quarantined lines"),
        }

    def _run_gx(self, budget: float, evidence_bad: list[tuple[int, bytes]]) -> dict[str, Any]:
        from tasks.movielens.gx_suite import run_ratings_suite

        seen = {line for line, _ in self.evidence}
        lines = sorted(self.evidence + [(n, text) for n, text in evidence_bad if n not in seen])
        result = run_ratings_suite(lines, self.fmt, mostly=max(0.0, 1.0 - budget),
                                   max_timestamp=self.max_timestamp)
        for line in summarize_gx(result):
            log.info("GX: %s", line)
        return result

