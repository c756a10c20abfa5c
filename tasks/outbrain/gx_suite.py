"""Great Expectations (1.x) suites of the Outbrain files, one per file, run with GX's own engine on bounded evidence.

GX's pandas engine is far too slow for whole files (page_views is 2 billion rows in Kaggle's full set), so, as for
every dataset here, the contract is enforced twice with the same rules (tasks.outbrain.schema): every row by the
vectorised checker in tasks.outbrain.raw_tables (exact line and column, quarantine, budget), and by GX on an
evidence frame per file, its first rows plus its quarantined rows (up to a bound), parsed here on its own (Python
split and pandas.to_numeric, not pyarrow). Each suite checks:
  - the columns of the file, in order (plus field_count);
  - the file's field count per line;
  - every column that may not be null is present (numeric columns: parse as numbers);
  - text rules of the string columns (uuid, entity_id, geo_location, publish_time) by their regexes;
  - key ranges: ids >= their minimum, clicked 0/1, platform / traffic_source 1..3, confidence 0..1, timestamps
    within the 15 days.
Each value expectation has mostly = 1 - budget, so its result reads as "would this sample pass the budget".
"""

from __future__ import annotations

import functools
from typing import Any

from tasks.outbrain.schema import TABLES, Table

FIELD_COUNT = "field_count"


def table_suite(table: Table, mostly: float):
    """The suite of one file's evidence frame (see the module docstring)."""
    import great_expectations as gx

    expect = gx.expectations
    suite = gx.ExpectationSuite(name=f"outbrain_{table.name}")
    suite.add_expectation(expect.ExpectTableColumnsToMatchOrderedList(
        column_list=[*table.column_names, FIELD_COUNT]))
    suite.add_expectation(expect.ExpectColumnValuesToBeBetween(
        column=FIELD_COUNT, min_value=len(table.columns), max_value=len(table.columns), mostly=mostly))
    for column in table.columns:
        if not column.nullable:
            suite.add_expectation(expect.ExpectColumnValuesToNotBeNull(column=column.name, mostly=mostly))
        if column.numeric and (column.min_value is not None or column.max_value is not None):
            suite.add_expectation(expect.ExpectColumnValuesToBeBetween(
                column=column.name, min_value=column.min_value, max_value=column.max_value, mostly=mostly))
        elif not column.numeric:
            suite.add_expectation(expect.ExpectColumnValuesToMatchRegex(column=column.name, regex=column.pattern,
                                                                        mostly=mostly))
    return suite


def evidence_frame(lines: list[tuple[int, bytes]], table: Table):
    """A pandas frame of raw lines split on commas: numeric columns coerced to numbers (text that does not parse
    becomes null, so the not-null expectations count it), a nullable column's null text as null."""
    import pandas as pd

    width = len(table.columns)
    rows, counts = [], []
    for _, raw in lines:
        parts = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n").split(",")
        counts.append(len(parts))
        rows.append((parts + [""] * width)[:width])
    frame = pd.DataFrame(rows, columns=list(table.column_names), dtype=object)
    for column in table.columns:
        if column.nullable:
            frame.loc[frame[column.name] == column.null_text, column.name] = None
        if column.numeric:
            frame[column.name] = pd.to_numeric(frame[column.name], errors="coerce")
    frame[FIELD_COUNT] = counts
    return frame


def run_table_suites(evidence: dict[str, list[tuple[int, bytes]]], mostly: float) -> dict[str, dict[str, Any]]:
    """Validate each file's evidence lines ({file stem: [(line number, raw bytes)]}) with its suite, in one GX
    context; returns the JSON-able result per file stem."""
    from tasks.core.validation import run_gx_suites

    frames = {name: (functools.partial(table_suite, TABLES[name], mostly), evidence_frame(lines, TABLES[name]))
              for name, lines in evidence.items() if lines}
    return run_gx_suites(frames, "outbrain_raw")
