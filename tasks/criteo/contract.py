"""What Criteo's three preprocessing engines agree on (spark_jobs/criteo, tasks/criteo/*_arrow.py, nvt_jobs/criteo.py):
output folder and file names, the row-order column, the dataset's mappings and row-id layout, the frequency
thresholds and their parsing, the engines' shared command lines and result records.

Every engine imports these from here (none from another engine), and so do the steps, the DAG and the command line;
stdlib only beside the schema and tasks.core, so NVTabular's older environment imports it too (issue #25 item 2).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.core.storage import Manifest, write_manifest, write_text_atomic
from tasks.criteo.schema import CAT_COLUMNS, NVIDIA_COLUMN

# A day's statistics (criteo_day_stats): its typed columnar copy, its value counts, and each row's file order.
COLUMNAR = "columnar"
COUNTS = "counts"
ROW_ORDER = "row_order"

# A window's dictionary (criteo_dictionary).
DICTIONARY = "dictionary"
CARDINALITIES_FILE = "cardinalities.json"
MODEL_SIZE_FILE = "model_size.json"

# A window's split-binary dataset (criteo_transform).
MAPPINGS = ("train", "test", "validation")
# monotonically_increasing_id (the spark engine's row_order) keeps the partition index above bit 33
PARTITION_SHIFT = 33
INDEX_MASK = (1 << PARTITION_SHIFT) - 1
LOOKUPS = ("arrow", "join")


@dataclass(frozen=True)
class DictionaryResult:
    output: str
    values: int                      # kept values over all columns
    cardinalities: dict[str, int]    # cat_i -> max id + 1


@dataclass(frozen=True)
class TransformResult:
    output: str
    rows: dict[str, int]
    cardinalities: list[int]
    split_row_order: int                                    # first (dense) row_order of the test day in validation
    joins: dict[str, str] = field(default_factory=dict)     # cat_i -> broadcast | skew | empty


def parse_threshold_overrides(text: str) -> dict[str, int]:
    """"cat_3:2,cat_7:0" -> {"cat_3": 2, "cat_7": 0}; ValueError naming the bad item."""
    overrides: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or name not in CAT_COLUMNS:
            raise ValueError(f"threshold override {item!r}: expected cat_<0..25>:<count>, e.g. cat_3:2")
        try:
            threshold = int(value)
        except ValueError:
            raise ValueError(f"threshold override {item!r}: {value!r} is not an integer") from None
        if threshold < 0:
            raise ValueError(f"threshold override {item!r}: a frequency threshold cannot be negative")
        overrides[name] = threshold
    return overrides


def column_thresholds(default: int, overrides: dict[str, int]) -> list[int]:
    """The threshold of each categorical column, in column order."""
    if default < 0:
        raise ValueError(f"--frequency-threshold {default}: a frequency threshold cannot be negative")
    return [overrides.get(name, default) for name in CAT_COLUMNS]


def write_sizes(directory: Path, summary: dict[str, dict[str, float | int]]) -> dict[str, int]:
    """cardinalities.json (ours, max id + 1) and model_size.json (NVIDIA's, max id); returns the cardinalities."""
    max_ids = {name: int(summary[name]["kept"]) for name in CAT_COLUMNS}
    cardinalities = {name: max_id + 1 for name, max_id in max_ids.items()}
    write_text_atomic(directory / CARDINALITIES_FILE, json.dumps(cardinalities, indent=2) + "\n")
    # NVIDIA: json.dump(OrderedDict(("_c14", size), ...), fp, indent=4), size = rows of the column's model.
    model_size = {NVIDIA_COLUMN[name]: max_id for name, max_id in max_ids.items()}
    write_text_atomic(directory / MODEL_SIZE_FILE, json.dumps(model_size, indent=4))
    return cardinalities


def record_dictionary(directory: Path, args: argparse.Namespace, summary: dict[str, dict[str, float | int]],
                      log: logging.Logger, **extra: Any) -> tuple[dict[str, int], int]:
    """A dictionary written to `directory`: its size files (write_sizes), a log line per column and its manifest
    (`extra`: the engine's own entries). Returns (cardinalities, values kept)."""
    cardinalities = write_sizes(directory, summary)
    values = sum(int(s["kept"]) for s in summary.values())
    for name, s in summary.items():
        log.info("%s: threshold %d, kept %d values, dropped %d, %.2f%% of occurrences kept", name,
                 s["threshold"], s["kept"], s["dropped"], 100 * float(s["occurrences_kept_share"]))
    manifest = Manifest(kind="criteo_dictionary", inputs=json.loads(args.inputs_json), rows={"values": values},
                        extra={"counts": list(args.counts), "frequency_threshold": args.frequency_threshold,
                               "cardinalities": cardinalities, "summary": summary, **extra})
    write_manifest(directory, manifest)
    return cardinalities, values


def record_transform(directory: Path, args: argparse.Namespace, rows: dict[str, int], test_day_rows: int,
                     cardinalities: list[int], split: int, joins: dict[str, str], **extra: Any) -> None:
    """A dataset written to `directory`: refused when the train days gave no row or the test day's rows did not split
    in halves into test / validation; else its manifest (`extra`: the engine's own entries)."""
    from tasks.formats.split_binary import CHECKED_AT_WRITE  # here: the module stays importable without numpy

    n = test_day_rows
    if rows["train"] == 0:
        raise ValueError(f"the train days hold no rows: {', '.join(args.train_days)}")
    if (rows["test"], rows["validation"]) != (n // 2, n - n // 2):
        raise RuntimeError(f"test/validation wrote {rows['test']}/{rows['validation']} rows, expected "
                           f"{n // 2}/{n - n // 2} of the test day's {n}")
    manifest = Manifest(kind="criteo_transform", inputs=json.loads(args.inputs_json), rows=rows,
                        extra={"cardinalities": cardinalities, "seed": args.seed, "split_row_order": split,
                               "joins": joins, "train_days": list(args.train_days), "test_day": args.test_day,
                               CHECKED_AT_WRITE: list(cardinalities),  # every engine writes through write_dataset
                               **extra})
    write_manifest(directory, manifest, checksum=False)  # sizes only: docs/ARCHITECTURE.md "Manifests"


def load_cardinalities(dictionary_dir: Path) -> list[int]:
    path = dictionary_dir / CARDINALITIES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: dictionary has no {CARDINALITIES_FILE}; rebuild the dictionary")
    recorded = json.loads(path.read_text())
    missing = [name for name in CAT_COLUMNS if name not in recorded]
    if missing:
        raise ValueError(f"{path}: no cardinality for {missing}")
    return [int(recorded[name]) for name in CAT_COLUMNS]


def parse_dictionary_args(argv: Sequence[str]) -> argparse.Namespace:
    """The dictionary job's command line (each engine's dictionary step takes it)."""
    parser = argparse.ArgumentParser(description="categorical dictionary of a window of Criteo days")
    parser.add_argument("--counts", required=True, nargs="+", help="per-day counts/ directories of the window")
    parser.add_argument("--output", required=True, type=Path, help="output directory (replaced atomically)")
    parser.add_argument("--frequency-threshold", type=int, default=15,
                        help="keep values seen at least this often over the window (0 keeps all)")
    parser.add_argument("--threshold-overrides", default="", help="per-column thresholds, e.g. cat_3:2,cat_7:0")
    parser.add_argument("--inputs-json", default="{}", help="what identifies this work, recorded in the manifest")
    return parser.parse_args(argv)


def parse_transform_args(argv: Sequence[str]) -> argparse.Namespace:
    """The transform job's command line (each engine's transform step takes it)."""
    parser = argparse.ArgumentParser(description="Criteo days + dictionary -> split-binary train/test/validation")
    parser.add_argument("--train-days", required=True, nargs="+", help="columnar/ directories of the train days")
    parser.add_argument("--test-day", required=True, help="columnar/ directory of the test (+ validation) day")
    parser.add_argument("--dictionary", required=True, type=Path, help="output directory of criteo_dictionary")
    parser.add_argument("--output", required=True, type=Path, help="dataset directory (replaced atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train shuffle")
    parser.add_argument("--broadcast-max-values", type=int, default=1_000_000,
                        help="columns with more dictionary values use the skew-safe join")
    parser.add_argument("--skew-cutoff-pct", type=float, default=1.0,
                        help="NVIDIA's --skew_broadcast_pct: values above this share of occurrences are broadcast")
    parser.add_argument("--dictionary-lookup", choices=LOOKUPS, default="arrow",
                        help="broadcast-sized columns: one mapInArrow pass (arrow, CPU) or a join per column (join, "
                             "NVIDIA's plan; the GPU profile's)")
    parser.add_argument("--inputs-json", default="{}", help="what identifies this work, recorded in the manifest")
    return parser.parse_args(argv)
