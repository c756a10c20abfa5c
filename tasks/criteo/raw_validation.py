"""validate_raw for one Criteo day file: every row checked, bad rows quarantined, GX report kept, budget enforced.

Output directory (criteo/validated/day=N):
  quarantine.jsonl   one JSON object per bad row: line, field, column_name, byte column, reason, text
  report.json        counts, the bad-row reasons by kind, the first bad rows, and the GX validation result
  _MANIFEST.json     only when the day passed: marks the validation complete for these inputs

A day over budget still gets report.json and quarantine.jsonl (so a person can see what went wrong) but no
manifest, and the task fails with one line naming the count, the budget and the first bad row's file/line/column.

With a stats target (the arrow day-stats engine), the same pass also writes the day's criteo_day_stats output from
the rows it has just parsed and found good (tasks/criteo/day_stats_arrow.py): published before the validation's
manifest, so a completed validation implies complete stats, and not at all for a day over budget.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.criteo.schema import RAW_COLUMNS
from tasks.criteo.raw_rows import RULE_TEXT, BadRow, checked_blocks
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest, write_text_atomic
from tasks.core.validation import DataQualityError, gx_section, start_gx_worker

if TYPE_CHECKING:
    from tasks.criteo.day_stats_arrow import StatsTarget

log = logging.getLogger(__name__)

# First rows of the day handed to GX: its pandas engine has a fixed cost of ~0.35 s and ~0.13 ms a row (5,000 rows:
# 1.0 s a day). Every row is checked by raw_rows with the same rules; GX's report is the second opinion on a sample.
EVIDENCE_ROWS = 1_000
EVIDENCE_BAD_ROWS = 1_000     # quarantined rows handed to GX (so its report shows real failures)
QUARANTINE_LIMIT = 1_000_000  # rows written to quarantine.jsonl; beyond that only counted
PROGRESS_EVERY_S = 10.0


@dataclass
class ValidationSummary:
    rows: dict[str, int]
    bad_fraction: float
    first_bad: str | None
    reasons: dict[str, int]


def column_name(bad: BadRow) -> str | None:
    return RAW_COLUMNS[bad.field - 1] if bad.field else None


def _reason_kind(bad: BadRow) -> str:
    """The reason without the row's own value ('cat_3: not 8 lowercase hex characters'), so the report's reason
    counts stay a handful of kinds whatever a hostile file holds (a value may hold spaces and quotes)."""
    if bad.field == 0:
        return "field count" if "fields" in bad.reason else "line too long"
    rule = next((text for text in RULE_TEXT.values() if bad.reason.endswith(text)), None)
    if rule is None:  # not a value rule (a carriage return): the reason after its first word, as before
        rule = bad.reason.split(" ", 1)[1] if " " in bad.reason else bad.reason
    return f"{column_name(bad)}: {rule}"


def validate_raw_file(raw: Path, out: Path, *, inputs: dict[str, Any], budget: float,
                      block_bytes: int = 64 << 20, stats: StatsTarget | None = None) -> ValidationSummary:
    """Validate `raw` into `out` (replaced atomically). Raises DataQualityError when over budget.

    stats: also write the day's typed columnar copy and value counts there, from the good rows of this pass.
    """
    start = time.monotonic()
    start_gx_worker()  # the report's GX run needs it at the end: imported in another process while the rows are checked
    progress = ProgressLog(f"validating {raw.name}", total=raw.stat().st_size, unit="bytes", every_s=PROGRESS_EVERY_S, logger=log)
    total = bad_count = bytes_done = 0
    reasons: Counter[str] = Counter()
    first_bad: BadRow | None = None
    evidence: list[bytes] = []
    evidence_bad: list[bytes] = []
    with atomic_directory(out) as tmp:
        with open(tmp / "quarantine.jsonl", "w") as quarantine, _stats_writer(stats) as stats_writer:
            for block, skipped, result in checked_blocks(raw, block_bytes, keep_good=stats_writer is not None,
                                                         prepare=_stats_typing(stats_writer)):
                if stats_writer is not None and result is not None and result.good_rows is not None:
                    stats_writer.add(result.good_rows, result.prepared)
                bad_rows = skipped + (result.bad_rows if result else [])
                total += len(skipped) + (result.lines if result else 0)
                bytes_done += len(block) + sum(len(b.text) for b in skipped)
                if len(evidence) < EVIDENCE_ROWS and block:
                    evidence += block.split(b"\n", EVIDENCE_ROWS - len(evidence))[: EVIDENCE_ROWS - len(evidence)]
                for bad in bad_rows:
                    first_bad = first_bad or bad
                    reasons[_reason_kind(bad)] += 1
                    if bad_count < QUARANTINE_LIMIT:
                        quarantine.write(json.dumps(asdict(bad) | {"file": raw.name, "column_name": column_name(bad)})
                                         + "\n")
                    if len(evidence_bad) < EVIDENCE_BAD_ROWS:
                        evidence_bad.append(bad.text.encode("utf-8", errors="replace"))
                    bad_count += 1
                progress.report(bytes_done, note=f"{total} rows, {bad_count} bad")
            quarantine.flush()
            summary = _summarize(raw, total, bad_count, budget, first_bad, reasons)
            passed = total > 0 and summary.bad_fraction <= budget
            if passed and stats_writer is not None:
                stats_writer.finish(stats)  # published as this block ends: before the validation's manifest
        report = _report(raw, summary, budget, evidence + evidence_bad, time.monotonic() - start)
        write_text_atomic(tmp / "report.json", json.dumps(report, indent=2, default=str))
        if passed:
            write_manifest(tmp, Manifest(kind="criteo_validated_day", inputs=inputs, rows=summary.rows,
                                         extra={"reasons": summary.reasons, "first_bad": summary.first_bad}))
    seconds = time.monotonic() - start
    log.info("%s: %d rows, %d bad (%.4f%%), %.1f s, %.0f rows/s", raw.name, total, bad_count,
             100 * summary.bad_fraction, seconds, total / max(seconds, 1e-9))
    if not passed:
        raise DataQualityError(_failure_line(raw, out, summary, budget))
    return summary


def _stats_typing(stats_writer: Any):
    """The day stats' typing of a block (run in checked_blocks' helper thread), when the stats are written."""
    if stats_writer is None:
        return None
    from tasks.criteo.day_stats_arrow import type_rows

    return type_rows


def _stats_writer(stats: StatsTarget | None):
    """The arrow day-stats writer for `stats` (a context: publishes only if finished), or none."""
    if stats is None:
        return contextlib.nullcontext(None)
    from tasks.criteo.day_stats_arrow import day_stats_output

    return day_stats_output(stats)


def _summarize(raw: Path, total: int, bad: int, budget: float, first_bad: BadRow | None,
               reasons: Counter[str]) -> ValidationSummary:
    first = f"{raw.name} {first_bad.describe()}" if first_bad else None
    return ValidationSummary(rows={"total": total, "good": total - bad, "bad": bad},
                             bad_fraction=bad / total if total else 1.0, first_bad=first,
                             reasons=dict(reasons.most_common()))


def _failure_line(raw: Path, out: Path, summary: ValidationSummary, budget: float) -> str:
    if summary.rows["total"] == 0:
        return f"{raw}: empty day file (0 rows); nothing to validate"
    return (f"{raw.name}: {summary.rows['bad']} bad rows of {summary.rows['total']} "
            f"({100 * summary.bad_fraction:.3f}% > budget {100 * budget:.3f}%); first: {summary.first_bad}; "
            f"quarantine and GX report in {out}")


def _report(raw: Path, summary: ValidationSummary, budget: float, evidence: list[bytes],
            seconds: float) -> dict[str, Any]:
    from tasks.core.validation import summarize_gx
    from tasks.criteo.gx_suite import run_raw_suite

    gx_result: dict[str, Any] | None = None
    if evidence:
        gx_result = run_raw_suite([line for line in evidence if line], mostly=max(0.0, 1.0 - budget))
        for line in summarize_gx(gx_result):
            log.info("GX: %s", line)
    return {
        "file": str(raw), "rows": summary.rows, "bad_fraction": summary.bad_fraction, "budget": budget,
        "reasons": summary.reasons, "first_bad": summary.first_bad, "seconds": round(seconds, 3),
        "gx": gx_section(gx_result, f"first {EVIDENCE_ROWS} rows + up to {EVIDENCE_BAD_ROWS} quarantined rows"),
    }
