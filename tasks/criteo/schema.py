"""The one schema of Criteo click logs: column names, groups and raw-format rules.

Preprocessing, validation, loaders, models and tests import these names; nothing else spells them.
"""

from __future__ import annotations

NUM_INT_FEATURES = 13
NUM_CAT_FEATURES = 26
NUM_FIELDS = 1 + NUM_INT_FEATURES + NUM_CAT_FEATURES  # 40

LABEL = "label"
INT_COLUMNS: tuple[str, ...] = tuple(f"int_{i}" for i in range(NUM_INT_FEATURES))
CAT_COLUMNS: tuple[str, ...] = tuple(f"cat_{i}" for i in range(NUM_CAT_FEATURES))
RAW_COLUMNS: tuple[str, ...] = (LABEL, *INT_COLUMNS, *CAT_COLUMNS)

# Raw-format rules, as regular expressions over the field text (empty = missing, allowed except for the label).
LABEL_PATTERN = r"^[01]$"
INT_PATTERN = r"^-?[0-9]{1,18}$"  # fits in int64 with room; real Criteo values are far smaller
CAT_PATTERN = r"^[0-9a-f]{8}$"

# Criteo raw column numbers as NVIDIA's Spark scripts name them: _c0 label, _c1.._c13 ints, _c14.._c39 cats.
NVIDIA_COLUMN = {name: f"_c{i}" for i, name in enumerate(RAW_COLUMNS)}


def column_of_field(field_index: int) -> str:
    """Name of the 0-based field position in a raw row."""
    return RAW_COLUMNS[field_index]
