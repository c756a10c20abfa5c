"""Great Expectations (1.x) suite of MovieLens rating rows, run with GX's own engine on bounded evidence.

GX's pandas engine is far too slow for ml-20m's 20M rows, so (as for every dataset here) the contract is enforced
twice with the same rules (tasks.movielens.schema): every row by the vectorised checker in
tasks.movielens.raw_ratings (exact line and column, quarantine, budget), and by GX on an evidence frame, the file's
first rows plus every quarantined row (up to a bound), parsed here independently of the checker (Python split and
pandas.to_numeric, not pyarrow). The suite checks:
  - the columns (line, user_id, item_id, rating, timestamp, field_count) in order;
  - 4 fields per line;
  - user_id and item_id present (numeric) and >= 1;
  - rating present and one of the snapshot's values (0.5, 1.0, ..., 5.0 for ml-20m; 1..5 for ml-1m);
  - timestamp present and between 1995-01-01 and validation time + 1 day;
  - `line` strictly increasing (the evidence is in file order).
Each value expectation has mostly = 1 - budget, so its result reads as "would this sample pass the budget".
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from tasks.movielens.schema import (
    FUTURE_SLACK_S, ITEM_ID, LINE, MIN_TIMESTAMP, RATING, TIMESTAMP, USER_ID, RatingsFormat,
)

log = logging.getLogger(__name__)

FIELD_COUNT = "field_count"
EVIDENCE_COLUMNS = (LINE, USER_ID, ITEM_ID, RATING, TIMESTAMP, FIELD_COUNT)


def suite_name(fmt: RatingsFormat) -> str:
    return f"movielens_{fmt.name.replace('-', '_')}_ratings"


def ratings_suite(fmt: RatingsFormat, mostly: float, max_timestamp: int | None = None):
    """The rating-row suite of one snapshot's format (see the module docstring)."""
    import great_expectations as gx

    expect = gx.expectations
    max_timestamp = int(time.time()) + FUTURE_SLACK_S if max_timestamp is None else max_timestamp
    suite = gx.ExpectationSuite(name=suite_name(fmt))
    suite.add_expectation(expect.ExpectTableColumnsToMatchOrderedList(column_list=list(EVIDENCE_COLUMNS)))
    suite.add_expectation(expect.ExpectColumnValuesToBeBetween(
        column=FIELD_COUNT, min_value=len(fmt.raw_columns), max_value=len(fmt.raw_columns), mostly=mostly))
    for column in (USER_ID, ITEM_ID):
        suite.add_expectation(expect.ExpectColumnValuesToNotBeNull(column=column, mostly=mostly))
        suite.add_expectation(expect.ExpectColumnValuesToBeBetween(column=column, min_value=1, mostly=mostly))
    suite.add_expectation(expect.ExpectColumnValuesToNotBeNull(column=RATING, mostly=mostly))
    suite.add_expectation(expect.ExpectColumnValuesToBeInSet(column=RATING, value_set=list(fmt.rating_values),
                                                             mostly=mostly))
    suite.add_expectation(expect.ExpectColumnValuesToNotBeNull(column=TIMESTAMP, mostly=mostly))
    suite.add_expectation(expect.ExpectColumnValuesToBeBetween(column=TIMESTAMP, min_value=MIN_TIMESTAMP,
                                                               max_value=max_timestamp, mostly=mostly))
    suite.add_expectation(expect.ExpectColumnValuesToBeIncreasing(column=LINE, strictly=True))
    return suite


def evidence_frame(lines: list[tuple[int, bytes]], fmt: RatingsFormat):
    """A pandas frame of (line number, raw line) pairs split on the format's separator; values that do not parse
    as numbers become null (so the suite's not-null expectations count them)."""
    import pandas as pd

    rows, counts, numbers = [], [], []
    for number, raw in lines:
        parts = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n").split(fmt.separator)
        numbers.append(number)
        counts.append(len(parts))
        rows.append((parts + [""] * 4)[:4])
    frame = pd.DataFrame(rows, columns=[USER_ID, ITEM_ID, RATING, TIMESTAMP], dtype=object)
    for column in (USER_ID, ITEM_ID, RATING, TIMESTAMP):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame.insert(0, LINE, numbers)
    frame[FIELD_COUNT] = counts
    return frame


def run_ratings_suite(lines: list[tuple[int, bytes]], fmt: RatingsFormat, mostly: float,
                      max_timestamp: int | None = None) -> dict[str, Any]:
    """Validate the evidence lines (line number, raw bytes) with GX; return the JSON-able validation result."""
    from tasks.core.validation import run_gx_suites

    suite = functools.partial(ratings_suite, fmt, mostly, max_timestamp)  # built inside GX's context
    return run_gx_suites({"evidence": (suite, evidence_frame(lines, fmt))}, "movielens_ratings")["evidence"]
