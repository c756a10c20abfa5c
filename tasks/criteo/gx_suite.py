"""Great Expectations (1.x) suites: the data contract of raw Criteo rows, run with GX's own engine.

GX's pandas engine checks about 12k Criteo rows/s on this machine (measured: 8 s for 100k rows × 40 regex
expectations with result_format BOOLEAN_ONLY), far too slow for a 180M-row day. So the contract is enforced twice
with the same rules (tasks.criteo.schema patterns): every row by the vectorised checker in tasks.criteo.raw_rows (exact line
and column, quarantine, budget), and by GX on a bounded evidence frame — the day's first rows plus every quarantined
row — whose result (counts, unexpected examples) is kept as the day's GX report.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tasks.criteo.schema import CAT_COLUMNS, CAT_PATTERN, INT_COLUMNS, INT_PATTERN, LABEL, NUM_FIELDS, RAW_COLUMNS

log = logging.getLogger(__name__)

FIELD_COUNT = "field_count"
SUITE_NAME = "criteo_raw_rows"


def criteo_raw_suite(mostly: float):
    """The raw-row suite: 40 fields, label in {0,1}, integers parse, categoricals are 8-hex or empty."""
    import great_expectations as gx

    expectations = gx.expectations
    suite = gx.ExpectationSuite(name=SUITE_NAME)
    suite.add_expectation(expectations.ExpectTableColumnsToMatchOrderedList(column_list=[*RAW_COLUMNS, FIELD_COUNT]))
    suite.add_expectation(expectations.ExpectColumnValuesToBeBetween(
        column=FIELD_COUNT, min_value=NUM_FIELDS, max_value=NUM_FIELDS, mostly=mostly))
    suite.add_expectation(expectations.ExpectColumnValuesToBeInSet(column=LABEL, value_set=["0", "1"], mostly=mostly))
    suite.add_expectation(expectations.ExpectColumnValuesToNotBeNull(column=LABEL, mostly=mostly))
    for name in INT_COLUMNS:
        suite.add_expectation(expectations.ExpectColumnValuesToMatchRegex(column=name, regex=INT_PATTERN,
                                                                          mostly=mostly))
    for name in CAT_COLUMNS:
        suite.add_expectation(expectations.ExpectColumnValuesToMatchRegex(column=name, regex=CAT_PATTERN,
                                                                          mostly=mostly))
    return suite


def evidence_frame(lines: list[bytes]):
    """A pandas frame of raw lines split into the 40 named fields (missing fields and empty strings -> None)."""
    import pandas as pd

    rows = []
    counts = []
    for raw in lines:
        parts = raw.decode("utf-8", errors="backslashreplace").rstrip("\n").split("\t")
        counts.append(len(parts))
        padded = (parts + [""] * NUM_FIELDS)[:NUM_FIELDS]
        rows.append([p if p != "" else None for p in padded])
    frame = pd.DataFrame(rows, columns=list(RAW_COLUMNS), dtype=object)
    frame[FIELD_COUNT] = counts
    return frame


def run_raw_suite(lines: list[bytes], mostly: float) -> dict[str, Any]:
    """Validate the evidence lines with GX; return the JSON-able validation result."""
    from tasks.core.validation import run_gx_suites

    suite = functools.partial(criteo_raw_suite, mostly)  # built inside GX's context (in its worker process)
    return run_gx_suites({"evidence": (suite, evidence_frame(lines))}, "criteo_raw")["evidence"]
