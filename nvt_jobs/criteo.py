"""Criteo preprocessing with NVIDIA's NVTabular workflow for DLRM (PyTorch/Recommendation/DLRM/preproc/
preproc_NVTabular.py), run in NVTabular's own environment by tasks.criteo.preprocess (engine `nvtabular`).

  python -m nvt_jobs.criteo fit --days COLUMNAR_DIR ... --output DICTIONARY_DIR [--frequency-threshold 15]
      [--threshold-overrides cat_3:2] [--inputs-json '{...}']
  python -m nvt_jobs.criteo transform --workflow DICTIONARY_DIR/nvt_workflow --inputs COLUMNAR_DIR ...
      --output ENCODED_DIR [--inputs-json '{...}']

Input: the ingested days' columnar parquet (criteo_day_stats: label, int_* int64, cat_* string with null for
missing, row_order), i.e. the parquet NVIDIA's script converts the TSV days into first.

The workflow (one per window, fitted on the dictionary window's rows):
  categoricals  Categorify(freq_threshold = the column's threshold), then ids shifted back to NVIDIA's convention.
                NVTabular 23.08 encodes 0 = padding, 1 = null, 2 = out-of-vocabulary (unseen, or rarer than the
                threshold), 3.. = kept values by descending count. NVIDIA's script was written for NVTabular 0.x,
                where 0 meant null, rare and unseen alike and values started at 1, which is also the Spark recipe's
                convention; `LambdaOp(id - 2) >> Clip(min_value=0)` restores it, so both engines give 0 for missing,
                rare and unseen values and 1..n for the kept values by descending count. Equal counts: Spark orders
                them by value; Categorify leaves them in an unspecified order (pandas' unstable sort).
  numericals    FillMissing(-2) >> LambdaOp(x + 2) >> Clip(min_value=0) >> LogOp's log(1 + x), in float64:
                log(1 + x + 2) = log(x + 3) for x >= -2, and 0 for missing values (NVIDIA's comment: "assign 0 to
                all missing values, and calculate log(x+3) for present values"). The Clip is ours: Criteo's int_1
                holds values down to -3, where log(x + 3) is -inf in NVIDIA's NVTabular script and null -> 0 in its
                Spark one; the Clip gives 0, as Spark does.
  label, row_order  passed through (row_order orders the train shuffle and splits the test day, as in the other
                engines).

`fit` writes (replaced atomically): nvt_workflow/ (Workflow.save: the fitted workflow with its category tables,
loadable by NVTabular anywhere), and the Spark engine's files read from that workflow's category tables, so every
later step (transform's cardinalities, predict, the gate, publish) reads one dictionary format:
  dictionary/ (column, value, id, count), cardinalities.json, model_size.json, _MANIFEST.json (extra.engine).
`transform` applies the saved workflow to each input directory and writes ENCODED_DIR/<i>/part.N.parquet (label int8,
int_* float32, cat_* int64, row_order); tasks.criteo.preprocess_arrow then orders and writes the split binary, exactly
as it does for its own engine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from nvt_jobs.common import add_device_args, configure_logging, dask_cluster, dataset, log, resolve_device, run_job
from tasks.core.storage import Manifest, atomic_directory, write_manifest
from tasks.criteo.contract import (DICTIONARY, ROW_ORDER, DictionaryResult, column_thresholds,
                                   parse_threshold_overrides, write_sizes)
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL

ENGINE = "nvtabular"
WORKFLOW_DIR = "nvt_workflow"
DICTIONARY_FILE = "part-00000.parquet"
# NVTabular 23.08's Categorify: 0 padding, 1 null, 2 out-of-vocabulary, kept values from 3 (ops/categorify.py)
CATEGORIFY_FIRST_VALUE = 3
PART_SIZE = "256MB"


def build_workflow(thresholds: Sequence[int], categories_dir: str):
    """NVIDIA's DLRM workflow (see the module docstring); returns (workflow, its Categorify op)."""
    import nvtabular as nvt
    from nvtabular import ops

    categorify = ops.Categorify(freq_threshold=dict(zip(CAT_COLUMNS, thresholds)), out_path=categories_dir)
    to_nvidia_ids = ops.LambdaOp(lambda col: col - (CATEGORIFY_FIRST_VALUE - 1), label="ShiftToNvidiaIds")
    categoricals = list(CAT_COLUMNS) >> categorify >> to_nvidia_ids >> ops.Clip(min_value=0)
    numericals = (list(INT_COLUMNS) >> ops.FillMissing(fill_val=-2.0)
                  >> ops.LambdaOp(lambda col: col + 2.0, label="Add3ButMinusOneCauseLogAddsOne")
                  >> ops.Clip(min_value=0)
                  # log(x + 1) in float64, then float32, as the arrow and Spark engines compute it: NVTabular's LogOp
                  # takes the log in float32, which cuDF's CUDA log may round differently (by an ulp) from the CPU's
                  >> ops.LambdaOp(lambda col: np.log(col.astype("float64") + 1.0).astype("float32"), label="LogOp"))
    return nvt.Workflow(categoricals + numericals + [LABEL, ROW_ORDER]), categorify


def parquet_files(directories: Sequence[str]) -> list[str]:
    """The part files of each directory, in directory order then name order."""
    files = []
    for directory in directories:
        found = sorted(str(p) for p in Path(directory).glob("*.parquet") if not p.name.startswith(("_", ".")))
        if not found:
            raise FileNotFoundError(f"{directory}: no parquet files")
        files += found
    return files


def _table_parts(path: str) -> list[Path]:
    """Categorify's table of a column: one file, or a directory of part.N.parquet files (in N order)."""
    if Path(path).is_dir():
        return sorted(Path(path).glob("part.*.parquet"), key=lambda p: int(p.name.split(".")[1]))
    return [Path(path)]


def order_ties_by_value(path: str, name: str) -> int:
    """Rewrite a column's fitted Categorify table so that values of equal count are ordered by value (ascending,
    bytewise for ASCII/UTF-8), as the Spark and Arrow engines order them; returns the values kept.

    Categorify sorts by count with pandas' unstable sort, so equal counts come out in an order that may change from
    one fit to the next (a retried task could renumber them). The encoding reads its labels from the table's index,
    so the table is rewritten with the same RangeIndex (3..n+2) over the new order: ids stay dense, and only the
    order within each run of equal counts changes.
    """
    import pandas as pd

    parts = _table_parts(path)
    table = pd.concat([pd.read_parquet(p) for p in parts]) if parts else pd.DataFrame()
    if table.empty:
        return 0
    table = table.sort_values([f"{name}_size", name], ascending=[False, True], kind="mergesort")
    table.index = pd.RangeIndex(CATEGORIFY_FIRST_VALUE, CATEGORIFY_FIRST_VALUE + len(table))
    for part in parts:
        part.unlink()
    table.to_parquet(parts[0] if not Path(path).is_dir() else Path(path) / "part.0.parquet", compression=None)
    return len(table)


def category_rows(path: str, index: int):
    """One column's kept values from Categorify's table (unique.<col>.parquet: a file, or a directory of parts, each
    indexed by the encoded id), as (value, id in NVIDIA's convention, count) sorted by id."""
    import pandas as pd

    name = CAT_COLUMNS[index]
    frames = [pd.read_parquet(p) for p in _table_parts(path)]
    table = pd.concat(frames) if frames else pd.DataFrame({name: [], f"{name}_size": []})
    table = table.sort_index()
    ids = table.index.to_numpy().astype("int64") - (CATEGORIFY_FIRST_VALUE - 1)
    if len(ids) and (ids[0] != 1 or (ids[1:] - ids[:-1] != 1).any()):
        raise ValueError(f"{name}: Categorify's table {path} is not indexed {CATEGORIFY_FIRST_VALUE}..n")
    return table[name].astype("string"), ids, table[f"{name}_size"].astype("int64")


def write_dictionary(out: Path, categories: dict[str, str], thresholds: Sequence[int]) -> dict[str, dict]:
    """dictionary/ and the per-column summary from the fitted category tables (the Spark engine's format)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([pa.field("column", pa.int32()), pa.field("value", pa.string()),
                        pa.field("id", pa.int32(), nullable=False), pa.field("count", pa.int64())])
    summary: dict[str, dict] = {}
    (out / DICTIONARY).mkdir()
    with pq.ParquetWriter(out / DICTIONARY / DICTIONARY_FILE, schema, compression="snappy") as writer:
        for index, name in enumerate(CAT_COLUMNS):
            values, ids, counts = category_rows(categories[name], index)
            meta = pd.read_parquet(Path(categories[name]).parent / f"meta.{name}.parquet")
            observed = dict(zip(meta["kind"], meta["num_observed"]))
            kept_occurrences, rare_occurrences = int(observed.get("unique", 0)), int(observed.get("oov", 0))
            occurrences = kept_occurrences + rare_occurrences
            summary[name] = {"threshold": int(thresholds[index]), "kept": len(ids),
                             "dropped_occurrences": rare_occurrences,
                             "occurrences_kept_share": round(kept_occurrences / occurrences, 6) if occurrences else 1.0}
            if len(ids):
                writer.write_table(pa.Table.from_arrays(
                    [pa.array(np.full(len(ids), index, dtype=np.int32)), pa.array(values, type=pa.string()),
                     pa.array(ids.astype(np.int32)), pa.array(counts.to_numpy())], schema=schema))
    return summary


def fit_main(args: argparse.Namespace) -> DictionaryResult:
    import nvtabular as nvt

    thresholds = column_thresholds(args.frequency_threshold, parse_threshold_overrides(args.threshold_overrides))
    files = parquet_files(args.days)
    started = time.monotonic()
    with atomic_directory(args.output) as tmp, dask_cluster(args.device, args.workers):
        workflow, categorify = build_workflow(thresholds, str(tmp / "_categories"))
        log.info("fitting NVTabular %s on %d days (%d files, device %s)", nvt.__version__, len(args.days), len(files),
                 args.device)
        workflow.fit(dataset(files, args.device, part_size=args.part_size))
        fitted = time.monotonic() - started
        for name in CAT_COLUMNS:
            order_ties_by_value(categorify.categories[name], name)
        summary = write_dictionary(tmp, categorify.categories, thresholds)
        workflow.save(str(tmp / WORKFLOW_DIR))  # copies the category tables next to the workflow
        shutil.rmtree(tmp / "_categories", ignore_errors=True)
        cardinalities = write_sizes(tmp, summary)
        values = sum(int(s["kept"]) for s in summary.values())
        for name, s in summary.items():
            log.info("%s: threshold %d, kept %d values, %.2f%% of occurrences kept", name, s["threshold"], s["kept"],
                     100 * float(s["occurrences_kept_share"]))
        manifest = Manifest(kind="criteo_dictionary", inputs=json.loads(args.inputs_json), rows={"values": values},
                            extra={"days": list(args.days), "frequency_threshold": args.frequency_threshold,
                                   "cardinalities": cardinalities, "summary": summary, "engine": ENGINE,
                                   "nvtabular": nvt.__version__, "device": args.device, "workflow": WORKFLOW_DIR,
                                   "fit_seconds": round(fitted, 2)})
        write_manifest(tmp, manifest)
    log.info("dictionary (nvtabular): %d values over %d columns in %s, fit %.1f s, %.1f s in all", values,
             len(CAT_COLUMNS), args.output, fitted, time.monotonic() - started)
    return DictionaryResult(str(args.output), values, cardinalities)


def transform_main(args: argparse.Namespace) -> dict:
    import nvtabular as nvt

    started = time.monotonic()
    workflow = nvt.Workflow.load(str(args.workflow))
    rows: dict[str, int] = {}
    with atomic_directory(args.output) as tmp, dask_cluster(args.device, args.workers):
        for index, directory in enumerate(args.inputs):
            begun = time.monotonic()
            files = parquet_files([directory])
            out = tmp / str(index)
            encoded = workflow.transform(dataset(files, args.device, part_size=args.part_size)).to_ddf()
            encoded = encoded[[LABEL, *INT_COLUMNS, *CAT_COLUMNS, ROW_ORDER]]
            encoded.to_parquet(str(out), write_index=False, write_metadata_file=False, compression="snappy")
            n = sum(_rows(p) for p in out.glob("*.parquet"))
            rows[directory] = n
            seconds, elapsed = time.monotonic() - begun, time.monotonic() - started
            eta = elapsed / (index + 1) * (len(args.inputs) - index - 1)
            log.info("transformed %s: %d rows in %.1f s (%.0f rows/s) [%d/%d days, ETA %d:%02d]", directory, n,
                     seconds, n / max(seconds, 1e-9), index + 1, len(args.inputs), eta // 60, eta % 60)
        write_manifest(tmp, Manifest(kind="criteo_nvt_encoded", inputs=json.loads(args.inputs_json), rows=rows,
                                     extra={"engine": ENGINE, "nvtabular": nvt.__version__, "device": args.device,
                                            "workflow": str(args.workflow), "inputs": list(args.inputs)}),
                       checksum=False)  # sizes only: docs/ARCHITECTURE.md "Manifests"
    total = sum(rows.values())
    seconds = time.monotonic() - started
    log.info("nvtabular transform: %d rows in %.1f s (%.0f rows/s)", total, seconds, total / max(seconds, 1e-9))
    return {"output": str(args.output), "rows": rows}


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Criteo preprocessing with NVIDIA's NVTabular workflow for DLRM")
    add_device_args(parser)
    parser.add_argument("--part-size", default=PART_SIZE, help="Dask partition size of the input datasets")
    sub = parser.add_subparsers(dest="job", required=True)
    fit = sub.add_parser("fit", help="fit the workflow on the window's days; write it and the dictionary")
    fit.add_argument("--days", required=True, nargs="+", help="columnar/ directories of the dictionary window")
    fit.add_argument("--output", required=True, type=Path)
    fit.add_argument("--frequency-threshold", type=int, default=15)
    fit.add_argument("--threshold-overrides", default="")
    fit.add_argument("--inputs-json", default="{}")
    apply = sub.add_parser("transform", help="apply a fitted workflow to columnar/ directories")
    apply.add_argument("--workflow", required=True, type=Path, help="a fit output's nvt_workflow/ directory")
    apply.add_argument("--inputs", required=True, nargs="+")
    apply.add_argument("--output", required=True, type=Path)
    apply.add_argument("--inputs-json", default="{}")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> object:
    args = parse_args(argv)
    args.device = resolve_device(args.device)
    configure_logging(f"nvtabular {args.job}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return fit_main(args) if args.job == "fit" else transform_main(args)


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result) if isinstance(result, DictionaryResult) else result))
