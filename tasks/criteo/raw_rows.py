"""Streaming, vectorised row checks of raw Criteo TSV: every row, bounded memory, exact line and column.

A day file is read in byte blocks cut at line ends. Per block, pyarrow parses the lines as 40 binary columns and
numpy checks each field against the schema's rules (tasks/criteo/raw_fields.py); only a block that pyarrow cannot
parse line for line (a line of another field count, a carriage return) has its tabs counted per line by numpy, to
find and drop those lines first. Bad rows come back with their line number, the first offending field and the byte
column where it starts, so the task log can say exactly where a day went wrong. Memory is one block (16 MiB by
default; checked_blocks holds a few), whatever the day's size.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core.validation import LongLine, keep_lines, line_bounds, quoted_value, read_csv_block
from tasks.core.validation import counted_line_blocks as core_counted_line_blocks
from tasks.criteo.schema import CAT_PATTERN, INT_PATTERN, LABEL_PATTERN, NUM_FIELDS, RAW_COLUMNS

_TAB, _CARRIAGE_RETURN = 9, 13


@dataclass(frozen=True)
class BadRow:
    line: int          # 1-based line number in the file
    field: int         # 1-based field number (0 when the row as a whole is wrong, e.g. field count)
    column: int        # 1-based byte column where the field starts (1 for whole-row problems)
    reason: str
    text: str          # the line, decoded for humans and truncated

    def describe(self) -> str:
        where = f"line {self.line}" + (f", field {self.field} ({RAW_COLUMNS[self.field - 1]}), column {self.column}"
                                       if self.field else "")
        return f"{where}: {self.reason}"


@dataclass
class BlockResult:
    first_line: int
    lines: int
    good_rows: object  # pyarrow.Table of the good rows (binary columns), or None when not requested
    bad_rows: list[BadRow]
    prepared: object = None  # checked_blocks' prepare(good_rows), when asked


def _field_rules() -> list[tuple[str, str, bool]]:
    """(column, regex, empty allowed) for each of the 40 fields, from the schema module."""
    rules = [(RAW_COLUMNS[0], LABEL_PATTERN, False)]
    rules += [(name, INT_PATTERN, True) for name in RAW_COLUMNS[1:14]]
    rules += [(name, CAT_PATTERN, True) for name in RAW_COLUMNS[14:]]
    return rules


RULE_TEXT = {
    LABEL_PATTERN: "label must be 0 or 1",
    INT_PATTERN: "not an integer",
    CAT_PATTERN: "not 8 lowercase hex characters",
}


def _display(raw: bytes, limit: int = 2000) -> str:
    text = raw[:limit].decode("utf-8", errors="backslashreplace")
    return text + ("…" if len(raw) > limit else "")


def iter_line_blocks(path: Path, block_bytes: int, max_line_bytes: int | None = None
                     ) -> Iterator[tuple[int, bytes, list[BadRow]]]:
    """Yield (first line number, block of whole lines, over-long lines skipped before it). max_line_bytes: None =
    the deployment's RECFLOW_MAX_LINE_BYTES (the cap Spark's day_stats reader skips lines at, too)."""
    for first_line, block, skipped, _ in counted_line_blocks(path, block_bytes, max_line_bytes):
        yield first_line, block, skipped


def counted_line_blocks(path: Path, block_bytes: int, max_line_bytes: int | None = None
                        ) -> Iterator[tuple[int, bytes, list[BadRow], int]]:
    """iter_line_blocks' blocks with the newlines each holds, counted once by the reader
    (tasks.core.validation.counted_line_blocks) for the line numbers and handed on to check_block."""
    if max_line_bytes is None:
        from tasks.core.config import load_settings

        max_line_bytes = load_settings().max_line_bytes
    for first_line, block, skipped, lines in core_counted_line_blocks(path, block_bytes, max_line_bytes):
        yield first_line, block, [_long_line(long, max_line_bytes) for long in skipped], lines


CHECK_THREADS = 2  # blocks of one day checked at once: a day alone keeps two cores busy, memory stays a few blocks
_check_pool = None
_check_pool_lock = threading.Lock()


def _shared_check_pool():
    """The process's threads that check blocks, one per core, shared by the days validated at once (the ingest
    command's --jobs): two days share the cores, and the last day alone gets them all."""
    global _check_pool
    with _check_pool_lock:
        if _check_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _check_pool = ThreadPoolExecutor(max(2, os.cpu_count() or 1), thread_name_prefix="check-block")
        return _check_pool


def checked_blocks(path: Path, block_bytes: int, keep_good: bool = False, max_line_bytes: int | None = None,
                   prepare: Callable[[Any], Any] | None = None, threads: int = CHECK_THREADS
                   ) -> Iterator[tuple[bytes, list[BadRow], BlockResult | None]]:
    """(block, over-long lines skipped before it, check_block's result or None for an empty block) for each block of
    iter_line_blocks (max_line_bytes as there), in file order. The next `threads` blocks are checked by the
    process's check threads (_shared_check_pool) while the caller handles this one (pyarrow's parse, numpy's
    checks and pandas' hash tables release the GIL): a day's validation keeps the cores busy, e.g. the last day of
    a backfill that runs alone. Memory: up to threads + 2 blocks (those being checked, one read, one handled).
    prepare: a function of a block's good rows (keep_good) also run in the check threads, its result in
    BlockResult.prepared: work of the caller's that is a pure function of the block (e.g. typing the columns)
    moves off the thread that handles the blocks."""
    from collections import deque

    def check(first_line: int, block: bytes, skipped: list[BadRow], lines: int):
        result = check_block(block, first_line, keep_good, lines) if block else None
        if prepare is not None and result is not None and result.good_rows is not None:
            result.prepared = prepare(result.good_rows)
        return block, skipped, result

    pool = _shared_check_pool()
    pending: deque = deque()
    try:
        for first_line, block, skipped, lines in counted_line_blocks(path, block_bytes, max_line_bytes):
            pending.append(pool.submit(check, first_line, block, skipped, lines))
            if len(pending) > max(1, threads):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # the caller stopped early (an error): blocks not yet started are dropped
            future.cancel()


def _long_line(long: LongLine, max_line_bytes: int) -> BadRow:
    return BadRow(long.line, 0, 1, f"line is {long.length} bytes, longer than {max_line_bytes} (not a Criteo row)",
                  _display(long.head, 200))


def _parse(block: bytes):
    """The block's lines as 40 binary columns (pyarrow's CSV reader, one thread; tasks.core.validation's
    read_csv_block). Raises pyarrow.ArrowInvalid when a line does not have 40 fields."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    return read_csv_block(
        block, list(RAW_COLUMNS),
        pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False),
        pacsv.ConvertOptions(column_types={c: pa.binary() for c in RAW_COLUMNS}),
    )


def _labels_are_one_byte(table) -> bool:
    from tasks.criteo.raw_fields import binary_parts

    offsets, _ = binary_parts(table.column(RAW_COLUMNS[0]))
    return bool(np.all(np.diff(offsets) == 1))


def check_block(block: bytes, first_line: int, keep_good: bool = False, lines: int | None = None) -> BlockResult:
    """Check every line of a block of whole lines; return bad rows (and the good rows as a table if asked).

    The common case, a block whose every line has 40 fields and no carriage return, is parsed once and only its
    values checked: pyarrow refuses a line of another field count, and a block it parses into as many rows as it
    has lines, none with an empty label, has 40 fields on every line, so the per-line tab count (the costliest
    numpy pass, ~1 s per 1M rows) is skipped. Any other block goes the way that finds each bad line's field count and
    position. lines: the block's newlines, when the caller has counted them already (iter_line_blocks)."""
    import pyarrow as pa

    if block and b"\r" not in block:
        if lines is None:
            lines = block.count(b"\n")
        lines += not block.endswith(b"\n")
        try:
            table = _parse(block)
        except pa.ArrowInvalid:
            table = None  # some line has another field count: found below, line by line
        # pyarrow reads an empty line as a row of empty values, not as a line of 1 field: its label is empty, and
        # such a block goes the long way too (checked on the labels: ~50x cheaper than finding "\n\n" in the block).
        if table is not None and table.num_rows == lines and _labels_are_one_byte(table):
            arr = np.frombuffer(block, dtype=np.uint8)
            return _check_values(table, arr, None, None, lines, np.arange(lines), first_line, [], keep_good)
    return _check_block_lines(block, first_line, keep_good)


def _check_block_lines(block: bytes, first_line: int, keep_good: bool) -> BlockResult:
    """check_block for a block with lines of the wrong field count or carriage returns: those lines are found and
    dropped first, then the rest is parsed and its values checked."""
    arr = np.frombuffer(block, dtype=np.uint8)
    starts, ends = line_bounds(arr)
    is_tab = arr == _TAB
    # Tabs per line by one segmented sum (each line's segment runs to the next line's start); a block holds ~39
    # tabs a row, whose positions are found only for the rare rows with a carriage return.
    # (Summed as uint8 into int32: ~20x faster than summing the booleans into int64.)
    fields = (np.add.reduceat(is_tab.view(np.uint8), starts, dtype=np.int32).astype(np.int64) + 1 if len(starts)
              else np.zeros(0, np.int64))
    wrong_count = np.flatnonzero(fields != NUM_FIELDS)
    bad: list[BadRow] = [
        BadRow(first_line + int(i), 0, 1, f"has {int(fields[i]) if ends[i] > starts[i] else 0} fields, expected "
               f"{NUM_FIELDS}", _display(block[starts[i]:ends[i]]))
        for i in wrong_count
    ]
    # pyarrow's CSV reader ends a row at '\r' too; Spark (lineSep '\n') keeps it in the field. Rows holding one
    # are bad here, before pyarrow sees them, so both engines agree.
    carriage = _carriage_return_rows(arr, starts, ends, is_tab, fields, first_line, block)
    bad += carriage
    dropped = np.union1d(wrong_count, [b.line - first_line for b in carriage]).astype(np.int64)
    kept = np.ones(len(ends), dtype=bool)
    kept[dropped] = False
    good_lines = np.flatnonzero(kept)
    if len(dropped):
        block = keep_lines(arr, starts, ends, kept)
    if len(good_lines) == 0:
        return BlockResult(first_line, len(ends), None, bad)

    return _check_values(_parse(block), arr, starts, ends, len(ends), good_lines, first_line, bad, keep_good)


def _check_values(table, arr: np.ndarray, starts: np.ndarray | None, ends: np.ndarray | None, lines: int,
                  good_lines: np.ndarray, first_line: int, bad: list[BadRow], keep_good: bool) -> BlockResult:
    """Check the parsed lines' values against the field rules; `good_lines` = each table row's line index in the
    block (`arr`, `lines` lines bounded by starts/ends; None: found here, only if a value is bad)."""
    import pyarrow as pa

    from tasks.criteo.raw_fields import first_failing_field

    rules = _field_rules()
    first_bad_field = first_failing_field(table, rules)  # 0 = row is good; the rules' regexes, checked by numpy
    bad_idx = np.flatnonzero(first_bad_field)
    if len(bad_idx) and starts is None:
        starts, ends = line_bounds(arr)
    for i in bad_idx:
        line_index = good_lines[i]
        raw = block_line(arr, starts, ends, line_index)
        field = int(first_bad_field[i])
        parts = raw.split(b"\t")
        column = sum(len(p) + 1 for p in parts[: field - 1]) + 1
        value = parts[field - 1]
        reason = f"{quoted_value(value)} {RULE_TEXT[rules[field - 1][1]]}"
        bad.append(BadRow(first_line + int(line_index), field, column, reason, _display(raw)))
    bad.sort(key=lambda b: b.line)
    good = None
    if keep_good:
        good = table.filter(pa.array(first_bad_field == 0)) if len(bad_idx) else table
    return BlockResult(first_line, lines, good, bad)


def _carriage_return_rows(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, is_tab: np.ndarray,
                          fields: np.ndarray, first_line: int, block: bytes) -> list[BadRow]:
    """Rows with 40 fields that hold a carriage return: bad at the field holding the first '\r' (the byte column
    is where that field starts, as for every other field error)."""
    positions = np.flatnonzero(arr == _CARRIAGE_RETURN)
    if len(positions) == 0:
        return []
    tabs = np.flatnonzero(is_tab)
    lines, first = np.unique(np.searchsorted(ends, positions), return_index=True)
    rows = []
    for line, pos in zip(lines, positions[first]):
        if fields[line] != NUM_FIELDS:
            continue  # already bad for its field count
        first_tab = int(np.searchsorted(tabs, starts[line]))
        field = int(np.searchsorted(tabs, pos)) - first_tab + 1
        field_start = starts[line] if field == 1 else tabs[first_tab + field - 2] + 1
        rows.append(BadRow(first_line + int(line), field, int(field_start - starts[line]) + 1,
                           "carriage return (\\r) inside the row", _display(block[starts[line]:ends[line]])))
    return rows


def block_line(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, index: int) -> bytes:
    return arr[starts[index]:ends[index]].tobytes()
