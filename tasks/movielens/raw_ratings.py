"""Streaming, vectorised checks of a raw MovieLens ratings file: every row, bounded memory, exact line and column.

The file is read in byte blocks cut at line ends. Per block, numpy finds whole-line problems (empty lines, control
characters, a field count other than 4), pyarrow parses the other lines as 4 binary columns, RE2 regexes check the
text against tasks.movielens.schema's rules, and the values are cast and range-checked column by column. Good rows
come back typed (line, user_id, item_id, rating, timestamp); bad rows with their line, the first offending column
and a reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.core.validation import iter_line_blocks as read_line_blocks
from tasks.core.validation import (BadField, display_text, keep_lines, line_bounds, mark_failures, quoted_value,
                                   read_csv_block, whole_line_problems)
from tasks.movielens.schema import (
    ID_PATTERN, ITEM_ID, MIN_TIMESTAMP, RATING, TIMESTAMP, TIMESTAMP_PATTERN, USER_ID, RatingsFormat,
    validated_arrow_schema,
)

MAX_LINE_BYTES = 4 << 10  # a rating row is ~30 bytes; a longer "line" is not a row (and must not grow memory)
_DELIMITER = 9  # ml-1m's "::" becomes a tab once lines holding a real tab are out


@dataclass
class CheckedBlock:
    lines: int
    good: object  # pyarrow.Table of typed good rows (schema.validated_arrow_schema()), or None when there are none
    bad: list[BadField]


def iter_line_blocks(path: Path, block_bytes: int) -> Iterator[tuple[int, bytes, list[BadField]]]:
    """Yield (first line number, block of whole lines, over-long lines skipped before it); memory ~ block_bytes."""
    for first_line, block, skipped in read_line_blocks(path, block_bytes, MAX_LINE_BYTES):
        yield first_line, block, [
            BadField(long.line, 0, None, 1, f"line is {long.length} bytes, longer than {MAX_LINE_BYTES} (not a rating "
                      "row)", "line too long", display_text(long.head, 200)) for long in skipped]


def check_block(block: bytes, first_line: int, fmt: RatingsFormat, max_timestamp: int) -> CheckedBlock:
    """Check every line of a block of whole lines against the format; typed good rows and the bad ones."""
    if b"\r\n" in block:
        block = block.replace(b"\r\n", b"\n")  # CRLF line ends are tolerated; a lone CR is a control character
    arr = np.frombuffer(block, dtype=np.uint8)
    starts, ends = line_bounds(arr)
    bad = whole_line_problems(block, arr, starts, ends, first_line)
    keep = np.ones(len(ends), dtype=bool)
    keep[[b.line - first_line for b in bad]] = False
    lines = np.arange(first_line, first_line + len(ends), dtype=np.int64)[keep]
    work = keep_lines(arr, starts, ends, keep) if len(bad) else block
    if len(fmt.separator) > 1:
        work = work.replace(fmt.separator.encode(), bytes([_DELIMITER]))
    delimiter = fmt.separator.encode() if len(fmt.separator) == 1 else bytes([_DELIMITER])
    warr = np.frombuffer(work, dtype=np.uint8)
    wstarts, wends = line_bounds(warr)
    seps = np.flatnonzero(warr == delimiter[0])
    fields = np.searchsorted(seps, wends) - np.searchsorted(seps, wstarts) + 1
    wrong = fields != len(fmt.raw_columns)
    for i in np.flatnonzero(wrong):
        raw = warr[wstarts[i]:wends[i]].tobytes().replace(delimiter, fmt.separator.encode())
        bad.append(BadField(int(lines[i]), 0, None, 1, f"has {int(fields[i])} fields, expected "
                             f"{len(fmt.raw_columns)} (separated by '{fmt.separator}')", "wrong number of fields",
                             display_text(raw)))
    if wrong.any():
        work = keep_lines(warr, wstarts, wends, ~wrong)
        lines = lines[~wrong]
    good = None
    if len(lines):
        good, value_bad = _check_values(work, lines, fmt, max_timestamp, delimiter)
        bad += value_bad
    bad.sort(key=lambda b: b.line)
    return CheckedBlock(len(ends), good, bad)


def _value_rules(fmt: RatingsFormat, max_timestamp: int) -> list[tuple[str, str, str, list, object]]:
    """Per column, in file order: (typed name, text regex, its failure, [(range check, its failure)], arrow type)."""
    import pyarrow as pa

    positive = [(lambda v: v >= 1, "is not a positive id")]
    rating_range = [(lambda v: (v >= fmt.rating_min) & (v <= fmt.rating_max), f"is not in {fmt.rating_range_text()}"),
                    # exactly on the grid (its multiples are exact in binary): 3.500001 is not 3.5
                    (lambda v: np.isclose(np.round(v / fmt.rating_step) * fmt.rating_step, v, rtol=0, atol=1e-9),
                     f"is not a multiple of {fmt.rating_step:g}")]
    plausible = [(lambda v: (v >= MIN_TIMESTAMP) & (v <= max_timestamp),
                  f"is not a plausible time (unix seconds from 1995-01-01 to {_date_text(max_timestamp)})")]
    return [
        (USER_ID, ID_PATTERN, "is not an integer", positive, pa.int64()),
        (ITEM_ID, ID_PATTERN, "is not an integer", positive, pa.int64()),
        (RATING, fmt.rating_pattern, "is not a number" if fmt.rating_step < 1 else "is not an integer",
         rating_range, pa.float64()),
        (TIMESTAMP, TIMESTAMP_PATTERN, "is not an integer (unix seconds)", plausible, pa.int64()),
    ]


def _check_values(work: bytes, lines: np.ndarray, fmt: RatingsFormat, max_timestamp: int,
                  delimiter: bytes) -> tuple[object, list[BadField]]:
    """Parse lines that have 4 fields; check each value's text, type and range. Returns (typed good rows, bad)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    table = read_csv_block(
        work, list(fmt.raw_columns),
        pacsv.ParseOptions(delimiter=delimiter.decode(), quote_char=False, escape_char=False,
                           ignore_empty_lines=False),
        pacsv.ConvertOptions(column_types={c: pa.binary() for c in fmt.raw_columns}),
    )
    failed_column = np.zeros(table.num_rows, dtype=np.int64)  # 1-based column of the first failure; 0 = good
    failed_rule = np.zeros(table.num_rows, dtype=np.int64)    # 1-based index into `rules`
    rules: list[str] = []
    values: dict[str, np.ndarray] = {}
    specs = _value_rules(fmt, max_timestamp)
    for index in reversed(range(len(specs))):  # reversed: the lowest failing column wins
        name, pattern, format_rule, range_rules, arrow_type = specs[index]
        column = table.column(index)
        matches = pc.match_substring_regex(column, pattern).to_numpy(zero_copy_only=False)
        cleaned = pc.if_else(pa.array(matches), column, pa.scalar(b"0", pa.binary()))  # casts only parse digits
        value = cleaned.cast(pa.string()).cast(arrow_type).to_numpy(zero_copy_only=False)
        values[name] = value
        checks = [(~matches, format_rule)] + [(matches & ~check(value), rule) for check, rule in range_rules]
        mark_failures(checks, index + 1, rules, failed_column, failed_rule)
    bad = [_bad_value(table, int(i), int(lines[i]), int(failed_column[i]), rules[failed_rule[i] - 1], fmt)
           for i in np.flatnonzero(failed_column)]
    good_mask = failed_column == 0
    if not good_mask.any():
        return None, bad
    good = pa.Table.from_arrays(
        [pa.array(lines[good_mask]), pa.array(values[USER_ID][good_mask]), pa.array(values[ITEM_ID][good_mask]),
         pa.array(values[RATING][good_mask].astype(np.float32)), pa.array(values[TIMESTAMP][good_mask])],
        schema=validated_arrow_schema(),
    )
    return good, bad


def _bad_value(table, row: int, line: int, field: int, rule: str, fmt: RatingsFormat) -> BadField:
    raw = [table.column(c)[row].as_py() for c in range(table.num_columns)]
    byte = sum(len(value) + len(fmt.separator) for value in raw[: field - 1]) + 1
    return BadField(line, field, fmt.raw_columns[field - 1], byte, f"{quoted_value(raw[field - 1])} {rule}", rule,
                     display_text(fmt.separator.encode().join(raw)))


def _date_text(timestamp: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(timestamp, tz=timezone.utc).date().isoformat()
