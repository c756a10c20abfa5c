"""Streaming, vectorised checks of one block of a raw Outbrain CSV: every row, exact line and column.

Per block of whole lines (tasks.core.validation.iter_line_blocks): numpy finds whole-line problems (empty lines,
control characters, a field count other than the table's), pyarrow parses the other lines as binary columns, RE2
regexes check each field's text against tasks.outbrain.schema's rules (a nullable column's null text passes as
null), and the values are cast and range-checked. Good rows come back typed (schema.arrow_schema) with their line
numbers; bad rows with their line, the first offending column and a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.core.validation import (BadField, display_text, keep_lines, line_bounds, mark_failures, quoted_value,
                                   read_csv_block, split_header, whole_line_problems)
from tasks.outbrain.schema import PUBLISH_TIME_FORMAT, Column, Table, arrow_schema

MAX_LINE_BYTES = 4 << 10  # the longest Outbrain row is ~100 bytes; a longer "line" is not a row
_COMMA = 44


@dataclass
class CheckedBlock:
    lines: int              # lines in the block
    good: object            # pyarrow.Table of typed good rows, or None when there are none
    good_lines: np.ndarray  # int64 line number of each good row
    bad: list[BadField]


def long_line(table: Table, line: int, length: int, head: bytes) -> BadField:
    return BadField(line, 0, None, 1, f"line is {length} bytes, longer than {MAX_LINE_BYTES} (not a {table.name} "
                    "row)", "line too long", display_text(head, 200))


def check_header(block: bytes, table: Table) -> tuple[bytes, str | None]:
    """Strip the header line from the file's first block; returns (the rest, a one-line problem or None)."""
    return split_header(block, table.file_name, table.header)


def check_block(block: bytes, first_line: int, table: Table) -> CheckedBlock:
    """Check every line of a block of whole lines against the table's rules; typed good rows and the bad ones."""
    if b"\r\n" in block:
        block = block.replace(b"\r\n", b"\n")  # CRLF line ends are tolerated; a lone CR is a control character
    arr = np.frombuffer(block, dtype=np.uint8)
    starts, ends = line_bounds(arr)
    bad = whole_line_problems(block, arr, starts, ends, first_line)
    commas = np.flatnonzero(arr == _COMMA)
    fields = np.searchsorted(commas, ends) - np.searchsorted(commas, starts) + 1
    keep = np.ones(len(ends), dtype=bool)
    keep[[b.line - first_line for b in bad]] = False
    for i in np.flatnonzero(keep & (fields != len(table.columns))):
        keep[i] = False
        bad.append(BadField(first_line + int(i), 0, None, 1, f"has {int(fields[i])} fields, expected "
                            f"{len(table.columns)} ({table.header})", "wrong number of fields",
                            display_text(block[starts[i]:ends[i]])))
    lines = np.arange(first_line, first_line + len(ends), dtype=np.int64)[keep]
    good, good_lines = None, lines[:0]
    if len(lines):
        work = block if keep.all() else keep_lines(arr, starts, ends, keep)
        good, good_lines, value_bad = _check_values(work, lines, table)
        bad += value_bad
    bad.sort(key=lambda b: b.line)
    return CheckedBlock(len(ends), good, good_lines, bad)


def _parse(text, column: Column, usable):
    """The typed values of a binary column (rows not `usable` parsed as a stand-in) and a mask of rows whose value
    is out of range or not a real date."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.arrow_type == "string":  # only matched (ASCII) values cast: invalid UTF-8 elsewhere would fail it
        return pc.if_else(usable, text, pa.scalar(b"")).cast(pa.string()), None
    if column.arrow_type == "timestamp":
        given = pc.if_else(usable, text, pa.scalar(b"2016-01-01 00:00:00")).cast(pa.string())
        parsed = pc.strptime(given, format=PUBLISH_TIME_FORMAT, unit="s", error_is_null=True)
        # strptime rolls a day or second past its range over (2016-02-30 -> 03-01, 23:59:60 -> the next day):
        # a real date formats back to the text it was read from, in years 1-9999 (Spark's and Python's range)
        unreal = pc.or_kleene(pc.not_equal(pc.strftime(parsed, format=PUBLISH_TIME_FORMAT), given),
                              pc.less(pc.year(parsed), 1))
        return parsed, pc.or_kleene(pc.is_null(parsed), unreal).fill_null(True).to_numpy(zero_copy_only=False)
    wide = pa.float64() if column.arrow_type == "float32" else pa.int64()
    value = pc.if_else(usable, text, pa.scalar(b"0")).cast(pa.string()).cast(wide)
    numbers = value.to_numpy(zero_copy_only=False)
    out = np.zeros(len(numbers), dtype=bool)
    if column.min_value is not None:
        out |= numbers < column.min_value
    if column.max_value is not None:
        out |= numbers > column.max_value
    return value, out


def _range_rule(column: Column) -> str:
    if column.arrow_type == "timestamp":
        return "is not a real date and time"
    if column.max_value is None:
        return f"is less than {_number(column.min_value)}"
    return f"is not in {_number(column.min_value)}..{_number(column.max_value)}"


def _number(value: float | None) -> str:
    """A bound as the error line shows it: 1295999999, not 1.296e+09."""
    return str(int(value)) if value is not None and float(value).is_integer() else f"{value:g}"


def _check_values(work: bytes, lines: np.ndarray, table: Table):
    """Parse lines with the right field count; check each value's text, type and range. Returns (typed good rows,
    their line numbers, bad rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    names = list(table.column_names)
    parsed = read_csv_block(
        work, names,
        pacsv.ParseOptions(delimiter=",", quote_char=False, escape_char=False, ignore_empty_lines=False),
        pacsv.ConvertOptions(column_types={c: pa.binary() for c in names}, strings_can_be_null=False,
                             quoted_strings_can_be_null=False),
    )
    failed_column = np.zeros(parsed.num_rows, dtype=np.int64)  # 1-based column of the first failure; 0 = good
    failed_rule = np.zeros(parsed.num_rows, dtype=np.int64)    # 1-based index into `rules`
    rules: list[str] = []
    values = {}
    for index in reversed(range(len(table.columns))):  # reversed: the lowest failing column wins
        column = table.columns[index]
        text = parsed.column(index)
        is_null = (pc.equal(text, pa.scalar(column.null_text.encode())) if column.nullable
                   else pa.array(np.zeros(len(text), dtype=bool)))
        matches = pc.and_(pc.match_substring_regex(text, column.pattern), pc.invert(is_null))
        value, out_of_range = _parse(text, column, matches)
        values[column.name] = pc.if_else(is_null, pa.scalar(None, value.type), value)
        matched, null = matches.to_numpy(zero_copy_only=False), is_null.to_numpy(zero_copy_only=False)
        checks = [(~matched & ~null, column.rule)]
        if out_of_range is not None:
            checks.append((matched & out_of_range, _range_rule(column)))
        mark_failures(checks, index + 1, rules, failed_column, failed_rule)
    bad = [_bad_value(parsed, int(i), int(lines[i]), int(failed_column[i]), rules[failed_rule[i] - 1], table)
           for i in np.flatnonzero(failed_column)]
    good_mask = failed_column == 0
    if not good_mask.any():
        return None, lines[:0], bad
    keep = pa.array(good_mask)
    schema = arrow_schema(table)
    good = pa.Table.from_arrays([values[f.name].filter(keep).cast(f.type) for f in schema], schema=schema)
    return good, lines[good_mask], bad


def _bad_value(parsed, row: int, line: int, field: int, rule: str, table: Table) -> BadField:
    raw = [parsed.column(c)[row].as_py() for c in range(parsed.num_columns)]
    byte = sum(len(value) + 1 for value in raw[: field - 1]) + 1
    return BadField(line, field, table.columns[field - 1].name, byte, f"{quoted_value(raw[field - 1])} {rule}", rule,
                    display_text(b",".join(raw)))
