"""Validate a user's CSV files against their FeatureSpec: every row of every chunk file checked, bad rows
quarantined, the bad-row budget enforced, a Great Expectations report kept (tasks/core/validation.py machinery).

Row rules (tasks/byo/spec.py, the same the Spark transcode applies): the line has one field per feature of its
chunk; a categorical is a non-negative integer id; a numerical is a number whose magnitude fits float16; the label
is 0 or 1. A bad row is quarantined (the transcode drops that row from every file of the mapping) and counts
against the budget, which holds for each mapping (train, test) on its own. Whole-dataset rules fail at once,
whatever the budget: the files of a mapping must have the same number of lines (row k is line k of each), a file
must not be empty, an id at or above a declared cardinality fails naming its file, line and column (NVIDIA's
transcode asserts the same), and so does an id past what an 'auto' cardinality can hold (int32 ids); a mapping whose
good rows hold one label value fails after the pass (training and AUC need both).

Output directory: quarantine.jsonl, report.json, and _MANIFEST.json only when the files passed.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.byo.contract import COMPRESSED_SUFFIXES, MAX_LINE_BYTES, BlockLines, open_csv
from tasks.byo.contract import column_bad as _column_bad
from tasks.byo.contract import parse_block as _parse_block
from tasks.byo.spec import (CATEGORICAL_CHANNEL, FLOAT16_MAX, LABEL_CHANNEL, MAPPINGS, MAX_CARDINALITY,
                            NUMERICAL_CHANNEL, PATTERNS, RULE_TEXT, CsvChunk, csv_chunks, declared_cardinalities)
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest, write_text_atomic
from tasks.core.validation import (DataQualityError, Quarantine, budget_failure, display_text, gx_section,
                                   iter_line_blocks, quoted_value, start_gx_worker, summarize_gx)
from tasks.formats.feature_spec import FeatureSpec

log = logging.getLogger(__name__)

EVIDENCE_ROWS = 2_000   # first rows of each file handed to GX
PROGRESS_EVERY_S = 10.0
FIELD_COUNT = "field_count"


@dataclass
class BadRow:
    line: int
    column: int | None        # 1-based field, None for the whole line (field count, line length)
    column_name: str | None
    reason: str               # what is wrong, with the value: "value 'x7' is not a non-negative integer id"
    rule: str                 # the same without the value or a count, what the report counts
    text: str

    @property
    def kind(self) -> str:
        """What the report counts bad rows by: one key per rule (and column), whatever the values were."""
        return self.rule if self.column_name is None else f"{self.column_name}: {self.rule}"

    def describe(self, file_name: str) -> str:
        where = f" column {self.column} ({self.column_name})" if self.column else ""
        return f"{file_name} line {self.line}{where}: {self.reason}"


@dataclass
class FileResult:
    lines: int
    bad: int
    max_ids: dict[str, int]   # categorical -> largest id in the file's good rows (-1: none)


class _FileChecker:
    """Checks one chunk file block by block; bad rows go to the quarantine, fatal problems raise at once."""

    def __init__(self, chunk: CsvChunk, path: Path, cards: dict[str, int | None], quarantine: Quarantine) -> None:
        self.chunk, self.path, self.cards, self.quarantine = chunk, path, cards, quarantine
        self.name = chunk.file
        self.max_ids = {f: -1 for f, c in zip(chunk.features, chunk.channels) if c == CATEGORICAL_CHANNEL}
        self.evidence: list[list[str]] = []
        self.lines = 0
        self.bad_lines: set[int] = set()
        self.labels: set[float] = set()  # label values of the file's good rows

    def run(self, block_bytes: int, progress: ProgressLog) -> FileResult:
        opener = functools.partial(open_csv, name=self.name)
        for first_line, block, skipped in iter_line_blocks(self.path, block_bytes, MAX_LINE_BYTES, opener):
            for long in skipped:
                self._bad(BadRow(long.line, None, None, _long_line_reason(long.length), LONG_LINE_RULE,
                                 display_text(long.head)))
            self.lines += len(skipped)
            if block:
                self._check_block(first_line + len(skipped), block)
            progress.advance(len(block) + sum(s.length for s in skipped))
        if self.lines == 0:
            raise DataQualityError(f"{self.name}: empty file (0 rows)")
        return FileResult(self.lines, self.quarantine.bad_in(self.name), dict(self.max_ids))

    def _bad(self, bad: BadRow) -> None:
        self.bad_lines.add(bad.line)
        self.quarantine.record(self.name, bad, {"mapping": self.chunk.mapping})

    def _check_block(self, first_line: int, block: bytes) -> None:
        lines = BlockLines.of(block, len(self.chunk.features))
        starts, ends, expected = lines.starts, lines.ends, len(self.chunk.features)
        lengths = ends - starts
        good = lines.parseable & (lengths <= MAX_LINE_BYTES)  # lines up to the block's size
        for i in np.flatnonzero(~good):
            raw = block[starts[i]:ends[i]]
            column = name = None
            index = lines.return_field(i) if lines.returns[i] >= 0 else expected  # the CR's field
            if lengths[i] > MAX_LINE_BYTES:
                reason, rule = _long_line_reason(int(lengths[i])), LONG_LINE_RULE
            elif index < expected:
                column, name = index + 1, self.chunk.features[index]
                value = raw.removesuffix(b"\r").split(b",")[index]  # without the line end's own '\r'
                rule = "holds a carriage return (\\r) that does not end the line"
                reason = f"value {quoted_value(value)} {rule}"
            else:
                rule = f"fields, expected {expected}"
                reason = f"{int(lines.fields[i])} {rule} ({', '.join(self.chunk.features)})"
            self._bad(BadRow(first_line + int(i), column, name, reason, rule, display_text(raw)))
        self.lines += len(starts)
        rows = np.flatnonzero(good)
        if not len(rows):
            return
        table = _parse_block(lines.keep(block, good), self.chunk.features)
        bad_columns = np.zeros((len(rows), expected), dtype=bool)
        labels = []
        for index, (name, channel) in enumerate(zip(self.chunk.features, self.chunk.channels)):
            column = table.column(index)
            bad, values = _column_bad(column.combine_chunks(), channel)
            bad_columns[:, index] = bad
            if channel == CATEGORICAL_CHANNEL and (~bad).any():
                self._check_ids(first_line, rows, index, name, values, bad, column)
            elif channel == LABEL_CHANNEL:
                labels.append(values)
        for values in labels:
            self.labels.update(np.unique(values[~bad_columns.any(axis=1)]).tolist())
        if len(self.evidence) < EVIDENCE_ROWS:
            take = min(EVIDENCE_ROWS - len(self.evidence), table.num_rows)
            self.evidence += [list(r) for r in zip(*(table.column(i).slice(0, take).to_pylist()
                                                     for i in range(expected)))]
        for row in np.flatnonzero(bad_columns.any(axis=1)):
            index = int(np.argmax(bad_columns[row]))
            name, channel = self.chunk.features[index], self.chunk.channels[index]
            raw = block[starts[rows[row]]:ends[rows[row]]]
            value = raw.removesuffix(b"\r").split(b",")[index]  # the line's own bytes (parse_block's are ASCII)
            reason = RULE_TEXT[channel] if channel != NUMERICAL_CHANNEL or not _is_number(value) else \
                f"is beyond float16's range (+-{FLOAT16_MAX:g})"
            self._bad(BadRow(first_line + int(rows[row]), index + 1, name,
                             f"value {quoted_value(value)} {reason}", reason, display_text(raw)))

    def _check_ids(self, first_line: int, rows: np.ndarray, index: int, name: str, values: np.ndarray,
                   bad: np.ndarray, column) -> None:
        ids = np.where(bad, -1, values)
        self.max_ids[name] = max(self.max_ids[name], int(ids.max()))
        card = self.cards[name]
        over = np.flatnonzero(ids >= (card if card is not None else MAX_CARDINALITY))
        if len(over):
            row = int(over[0])
            where = f"{self.name} line {first_line + int(rows[row])} column {index + 1} ({name})"
            if card is None:  # 'auto' would be max id + 1: past what an int32 id holds, found after a whole pass
                raise DataQualityError(f"{where}: id {column[row].as_py()} is too big for an 'auto' cardinality "
                                       f"(ids up to {MAX_CARDINALITY - 1}, int32): map the ids to 0 .. n-1 first")
            raise DataQualityError(f"{where}: id {column[row].as_py()} >= declared cardinality {card} (declare a "
                                   "larger cardinality or 'auto')")


LONG_LINE_RULE = f"line longer than {MAX_LINE_BYTES} bytes"


def _long_line_reason(length: int) -> str:
    return f"line of {length} bytes is longer than {MAX_LINE_BYTES}"


def _is_number(value: bytes) -> bool:
    import re

    return value.isascii() and re.match(PATTERNS[NUMERICAL_CHANNEL], value.decode("ascii")) is not None


def validate_csvs(spec: FeatureSpec, source_dir: Path, out: Path, *, inputs: dict[str, Any], budget: float,
                  block_bytes: int = 64 << 20) -> dict[str, Any]:
    """Validate every chunk file of `spec` (found under source_dir) into `out` (replaced atomically). Raises
    DataQualityError with one line (file, line, column) over budget or on a whole-dataset rule."""
    started = time.monotonic()
    start_gx_worker()  # the report's GX run needs it at the end: imported in another process while the rows are checked
    source_dir = Path(source_dir)
    cards = declared_cardinalities(spec)
    names = [c.file for m in MAPPINGS for c in csv_chunks(spec, m)]
    total_bytes = None if any(n.endswith(COMPRESSED_SUFFIXES) for n in names) else \
        sum((source_dir / n).stat().st_size for n in names if (source_dir / n).is_file())  # compressed: no ETA
    progress = ProgressLog("validating CSV files", total=total_bytes, unit="bytes", every_s=PROGRESS_EVERY_S,
                           logger=log)
    files: dict[str, dict[str, Any]] = {}
    evidence: dict[str, tuple[CsvChunk, list[list[str]], list[tuple[int, bytes]]]] = {}
    with atomic_directory(out) as tmp:
        quarantine = Quarantine(tmp / "quarantine.jsonl")
        try:
            rows, bad_rows, first_bad, max_ids, labels = _check_mappings(spec, source_dir, cards, quarantine,
                                                                         block_bytes, progress, files, evidence)
        finally:
            quarantine.close()
        total, bad = sum(rows.values()), sum(bad_rows.values())
        # The budget holds per mapping: a small test set is not let through on the train set's good rows.
        failure = next((f for m in MAPPINGS if (f := budget_failure(first_bad.get(m), bad_rows[m], rows[m], budget,
                                                                    out)) is not None), None)
        failure = failure or _one_class(labels, rows, bad_rows)
        first = next((first_bad[m] for m in MAPPINGS if m in first_bad), None)
        report = _report(files, rows, bad, total, budget, first, evidence, time.monotonic() - started)
        write_text_atomic(tmp / "report.json", json.dumps(report, indent=2, default=str))
        if failure is None:
            write_manifest(tmp, Manifest(kind="byo_validated_csv", inputs=inputs, rows=rows,
                                         extra={"max_ids": max_ids, "bad_rows": bad_rows}))
    log.info("validated %d rows in %d files: %d bad, %.1f s", total, len(files), bad, time.monotonic() - started)
    if failure is not None:
        raise DataQualityError(failure)
    return {"path": str(out), "rows": rows, "bad_rows": bad_rows, "max_ids": max_ids}


def _check_mappings(spec: FeatureSpec, source_dir: Path, cards: dict[str, int | None], quarantine: Quarantine,
                    block_bytes: int, progress: ProgressLog, files: dict[str, dict[str, Any]], evidence: dict):
    """(lines per mapping, distinct bad rows per mapping, the first bad row's line per mapping, largest id per
    categorical, the label values of each mapping's good rows)."""
    rows: dict[str, int] = {}
    bad_rows: dict[str, int] = {}
    max_ids = {name: -1 for name in cards}
    first_bad: dict[str, str] = {}
    labels: dict[str, set[float]] = {}
    for mapping in MAPPINGS:
        counts: dict[str, int] = {}
        bad_lines: set[int] = set()  # a row bad in any file of the mapping is dropped from all of them
        for chunk in csv_chunks(spec, mapping):
            path = source_dir / chunk.file
            if not path.is_file():
                raise DataQualityError(f"{chunk.file}: file is missing ({path}); source_spec.{mapping} names it")
            checker = _FileChecker(chunk, path, cards, quarantine)
            result = checker.run(block_bytes, progress)
            counts[chunk.file] = result.lines
            bad_lines |= checker.bad_lines
            files[chunk.file] = {"mapping": mapping, "lines": result.lines, "bad": result.bad,
                                 "reasons": quarantine.reasons_in(chunk.file)}
            if mapping not in first_bad and chunk.file in quarantine.first:
                first_bad[mapping] = quarantine.first[chunk.file].describe(chunk.file)
            if LABEL_CHANNEL in chunk.channels:
                labels.setdefault(mapping, set()).update(checker.labels)
            for name, value in result.max_ids.items():
                max_ids[name] = max(max_ids[name], value)
            evidence[chunk.file] = (chunk, checker.evidence, quarantine.evidence.get(chunk.file, []))
        if len(set(counts.values())) != 1:
            (short, n), (long, m) = min(counts.items(), key=lambda kv: kv[1]), max(counts.items(), key=lambda kv: kv[1])
            raise DataQualityError(f"{long} line {n + 1}: no partner row in {short}, which has {n} lines to {long}'s "
                                   f"{m} (source_spec.{mapping}: line k of every file is row k)")
        rows[mapping] = next(iter(counts.values()))
        bad_rows[mapping] = len(bad_lines)
    return rows, bad_rows, first_bad, max_ids, labels


def _one_class(labels: dict[str, set[float]], rows: dict[str, int], bad_rows: dict[str, int]) -> str | None:
    """The one-line error of a mapping whose good rows hold one label value (or none), else None: a model learns
    nothing from one class, and AUC (evaluate, the gate) is undefined on one; found here, not after training."""
    for mapping, seen in labels.items():
        if len(seen) < 2:
            held = f"every good row's label is {int(next(iter(seen)))}" if seen else "no good row"
            return (f"source_spec.{mapping}: {held} ({rows[mapping]} lines, {bad_rows[mapping]} bad): training and "
                    "its AUC need rows of both labels, 0 and 1")
    return None


def _evidence_frame(chunk: CsvChunk, good: list[list[str]], bad: list[tuple[int, bytes]]):
    """First rows plus quarantined rows of one file as strings, one column per feature, plus the field count."""
    import pandas as pd

    records, counts = [], []
    for row in good:
        records.append(row)
        counts.append(len(row))
    for _, text in bad:
        parts = text.decode("utf-8", errors="replace").split(",")
        counts.append(len(parts))
        records.append((parts + [None] * len(chunk.features))[:len(chunk.features)])
    frame = pd.DataFrame(records, columns=list(chunk.features), dtype=object)
    frame[FIELD_COUNT] = counts
    return frame


def _suite(chunk: CsvChunk, mostly: float):
    import great_expectations as gx

    expectations = gx.expectations
    suite = gx.ExpectationSuite(name=f"byo_{chunk.mapping}_{chunk.index}")
    suite.add_expectation(expectations.ExpectTableColumnsToMatchOrderedList(
        column_list=[*chunk.features, FIELD_COUNT]))
    width = len(chunk.features)
    suite.add_expectation(expectations.ExpectColumnValuesToBeBetween(column=FIELD_COUNT, min_value=width,
                                                                     max_value=width, mostly=mostly))
    for name, channel in zip(chunk.features, chunk.channels):
        suite.add_expectation(expectations.ExpectColumnValuesToMatchRegex(column=name, regex=PATTERNS[channel],
                                                                          mostly=mostly))
        suite.add_expectation(expectations.ExpectColumnValuesToNotBeNull(column=name, mostly=mostly))
    return suite


def _report(files, rows, bad, total, budget, first_bad, evidence, seconds) -> dict[str, Any]:
    from tasks.core.validation import run_gx_suites

    mostly = max(0.0, 1.0 - budget)
    frames = {}
    for name, (chunk, good, bad_sample) in evidence.items():
        if good or bad_sample:
            frames[name.replace("/", "__")] = (functools.partial(_suite, chunk, mostly),
                                               _evidence_frame(chunk, good, bad_sample))
    results = run_gx_suites(frames, "byo_csv") if frames else {}
    for name, result in results.items():
        for line in summarize_gx(result):
            log.info("GX %s: %s", name, line)
    return {"files": files, "rows": rows, "bad": bad, "total": total, "budget": budget, "first_bad": first_bad,
            "seconds": round(seconds, 3),
            "gx": {name: gx_section(result, f"first {EVIDENCE_ROWS} rows + up to 1000 quarantined rows")
                   for name, result in results.items()}}
