"""Score raw Criteo rows with a published criteo_dlrm version: raw TSV rows in, click probabilities out.

  python -m tasks.criteo.predict --model <store>/criteo_dlrm[/versions/<version>] --input day_23 \
      --output scores.tsv [--limit-rows N] [--bad-row-budget 0.001] [--engine eager|torchscript] \
      [--device auto|cpu|cuda] [--metrics-out metrics.json]

A published version is self-contained: the dictionary (value -> id per categorical column, parquet), the
preprocessing parameters (preprocessing.json), the weights (model.pt) and the TorchScript export (triton/). This
module turns raw rows into exactly the inputs training saw, with the training pipeline's own semantics
(spark_jobs/criteo/transform.py): categoricals -> dictionary id, 0 for missing / rare / unseen; numericals ->
log(x + 3), 0 when missing or x + 3 <= 0, rounded through float16 as split-binary stores them.

Rows are checked with ingest's rules (tasks.criteo.raw_rows): a bad row is skipped and reported with its
file/line/field/column, and the call fails with one line when bad rows exceed the bad-row budget. Streaming: one
block of lines (64 MiB) at a time; each block's scores are written before the next is read, with a progress line
(rows, rows/s, ETA when --limit-rows gives the total). The model runs on a GPU when there is one (--device auto):
NVIDIA's MLPs and interaction (~5 MFLOP a row) ran at 22-30K rows/s on this 2-core machine, ~1 h for the gate's
89M test rows.

Output: one line per good row, `<line number>\t<label>\t<probability>` (the label as the row gives it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL

log = logging.getLogger(__name__)

PREPROCESSING_FILE = "preprocessing.json"
DICTIONARY_PREFIX = "dictionary/values/"
SERVING_PREFIX = "triton/"  # the Triton model repository: the TorchScript export (as large as the weights)
TORCHSCRIPT_FILE = f"{SERVING_PREFIX}dlrm/1/model.pt"
MODEL_FILE = "model.pt"
SCORE_BATCH_ROWS = 65536


def preprocessing_spec(cardinalities: list[int], frequency_threshold: int, threshold_overrides: dict[str, int],
                       dictionary_days: list[int], engine: str = "spark") -> dict[str, Any]:
    """preprocessing.json: how raw Criteo rows became the model's inputs (published with the model). Every engine
    gives the same ids and values (docs/nvtabular.md); an nvtabular model also carries its fitted NVTabular
    workflow, from which its dictionary was read."""
    return {
        "engine": engine,
        **({"nvtabular_workflow": "dictionary/nvt_workflow/"} if engine == "nvtabular" else {}),
        "format": "criteo_tsv", "columns": {"label": LABEL, "numerical": list(INT_COLUMNS),
                                            "categorical": list(CAT_COLUMNS)},
        "numerical": {"transform": "log(x + 3)", "missing_or_nonpositive": 0.0, "stored_as": "float16"},
        "categorical": {"id_of_missing_rare_unseen": 0, "ids": "1..n by descending count in the window",
                        "frequency_threshold": frequency_threshold, "threshold_overrides": threshold_overrides,
                        "dictionary_days": dictionary_days, "cardinalities": cardinalities},
    }


class NotSelfContained(FileNotFoundError):
    """A published version without the dictionary / preprocessing needed to score raw rows (published before
    versions carried them)."""


SELF_CONTAINED_FILES = (PREPROCESSING_FILE, MODEL_FILE)


def missing_for_scoring(files: list[str]) -> list[str]:
    """What a version (given its manifest's file names) lacks to score raw rows."""
    missing = [name for name in SELF_CONTAINED_FILES if name not in files]
    if not any(name.startswith(DICTIONARY_PREFIX) for name in files):
        missing.append(DICTIONARY_PREFIX + "*.parquet")
    return missing


def read_by_eager_scoring(name: str) -> bool:
    """Whether scoring with --engine eager (what the gate runs) reads a version's file: all but the serving export."""
    return not name.startswith(SERVING_PREFIX)


def check_self_contained(version_dir: Path) -> None:
    files = [p.relative_to(version_dir).as_posix() for p in Path(version_dir).rglob("*") if p.is_file()]
    missing = missing_for_scoring(files)
    if missing:
        raise NotSelfContained(f"{version_dir} cannot score raw rows: it has no {', '.join(missing)}")


class CriteoFeatures:
    """Raw rows (the good-rows table of tasks.criteo.raw_rows.check_block) -> model inputs, from a published
    version's dictionary and preprocessing.json."""

    def __init__(self, version_dir: Path) -> None:
        from tasks.criteo.preprocess_arrow import DictionaryLookup

        self.spec = json.loads((version_dir / PREPROCESSING_FILE).read_text())
        if not any((version_dir / DICTIONARY_PREFIX).glob("*.parquet")):
            raise FileNotFoundError(f"{version_dir}: no {DICTIONARY_PREFIX}*.parquet: the version is not "
                                    "self-contained (published before dictionaries were)")
        # The preprocessing's own lookup (hash indexes built once, ids checked to be 1..n): the 26 columns' ~33M
        # values at NVIDIA's 1TB size are not hashed again for every block scored.
        self.lookup = DictionaryLookup(version_dir, self.spec.get("categorical", {}).get("cardinalities"),
                                       values_dir=version_dir / DICTIONARY_PREFIX)

    def transform(self, table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(numerical float32 [n, 13] through float16, categorical int64 [n, 26], label int8 [n])."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        numerical = np.zeros((n, len(INT_COLUMNS)), dtype=np.float32)
        for i, name in enumerate(INT_COLUMNS):
            column = table.column(name)
            text = pc.if_else(pc.equal(pc.binary_length(column), 0), pa.scalar(None, pa.binary()), column)
            values = pc.cast(pc.cast(text, pa.string()), pa.int64()).to_numpy(zero_copy_only=False)
            shifted = values.astype(np.float64) + 3.0  # NaN where missing
            with np.errstate(invalid="ignore", divide="ignore"):
                logged = np.where(shifted > 0, np.log(np.where(shifted > 0, shifted, 1.0)), 0.0)
            numerical[:, i] = np.nan_to_num(logged, nan=0.0).astype(np.float32).astype(np.float16)
        categorical = np.zeros((n, len(CAT_COLUMNS)), dtype=np.int64)
        for i, name in enumerate(CAT_COLUMNS):
            # Empty (missing) -> null, as ingest stores it: no dictionary holds "", and a column with one "" would
            # leave the int64-key path for index_in, which hashes the whole dictionary again every block.
            column = table.column(name)
            text = pc.if_else(pc.equal(pc.binary_length(column), 0), pa.scalar(None, pa.binary()), column)
            categorical[:, i] = self.lookup.ids(i, pc.cast(text, pa.string()).combine_chunks())
        label = pc.cast(pc.cast(table.column(LABEL), pa.string()), pa.int8()).to_numpy(zero_copy_only=False)
        return numerical, categorical, label


class Scorer:
    """The published model: eager (model.pt, returns logits) or the TorchScript export (returns probabilities)."""

    def __init__(self, version_dir: Path, engine: str = "eager", device: str = "cpu") -> None:
        """device: cpu, cuda or auto (CUDA when torch sees a GPU: models.torchkit.distributed.select_device)."""
        from models.torchkit.distributed import select_device

        self.engine, self.device = engine, select_device(device)
        if engine == "eager":
            from models.dlrm.evaluate import load_model_file, model_device

            self.model, _ = load_model_file(version_dir / MODEL_FILE, self.device)
            self.device = model_device(self.model)  # the CPU for tables that fit no single GPU
        elif engine == "torchscript":
            from models.dlrm.export import load_serving_model

            if not (version_dir / TORCHSCRIPT_FILE).is_file():  # a copy fetched for eager scoring (the gate's)
                raise NotSelfContained(f"{version_dir} has no {TORCHSCRIPT_FILE}: score it with --engine eager, or "
                                       "fetch the whole version (--model <store>/criteo_dlrm/versions/<version>)")
            self.model = load_serving_model(version_dir / TORCHSCRIPT_FILE).to(self.device)
        else:
            raise ValueError(f"unknown engine {engine!r}: expected eager or torchscript")

    def logits_and_probabilities(self, numerical: np.ndarray, categorical: np.ndarray
                                 ) -> tuple[np.ndarray, np.ndarray]:
        import torch

        logits, probabilities = [], []
        for start in range(0, len(numerical), SCORE_BATCH_ROWS):
            x = torch.from_numpy(numerical[start:start + SCORE_BATCH_ROWS]).to(self.device)
            c = torch.from_numpy(categorical[start:start + SCORE_BATCH_ROWS]).to(self.device)
            with torch.inference_mode():  # not torch.set_grad_enabled(False): that would hold for the whole process
                out = self.model(x, c).cpu()
            if self.engine == "eager":
                logits.append(out.float().numpy())
                probabilities.append(torch.sigmoid(out).float().numpy())
            else:
                p = out.squeeze(1).float()
                probabilities.append(p.numpy())
                logits.append(torch.logit(p.double(), eps=1e-12).float().numpy())
        if not logits:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(logits), np.concatenate(probabilities)


@dataclass
class PredictResult:
    input: str
    rows: int                       # lines read
    scored: int                     # good rows scored
    bad: int
    first_bad: list[str] = field(default_factory=list)
    metrics: dict[str, float] | None = None   # auc, logloss over the scored rows (when asked for)


def iter_scored_blocks(version_dir: Path, raw: Path, *, engine: str = "eager", limit_rows: int | None = None,
                       block_bytes: int = 64 << 20, bad_rows: list | None = None, device: str = "cpu"
                       ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(line numbers, labels, logits, probabilities) per block of good rows, in file order; bad rows are appended
    to `bad_rows` (tasks.criteo.raw_rows.BadRow). Stops after `limit_rows` good rows."""
    from tasks.criteo.raw_rows import check_block, iter_line_blocks

    check_self_contained(version_dir)
    features, scorer = CriteoFeatures(version_dir), Scorer(version_dir, engine, device)
    left = limit_rows
    for first_line, block, skipped in iter_line_blocks(raw, block_bytes):
        if bad_rows is not None:
            bad_rows.extend(skipped)
        checked = check_block(block, first_line, keep_good=True)
        bad_lines = {b.line for b in checked.bad_rows}
        if bad_rows is not None:
            bad_rows.extend(checked.bad_rows)
        if checked.good_rows is None or checked.good_rows.num_rows == 0:
            continue
        table = checked.good_rows
        lines = np.array([line for line in range(first_line, first_line + checked.lines) if line not in bad_lines],
                         dtype=np.int64)
        if left is not None:
            table, lines = table.slice(0, left), lines[:left]
            left -= table.num_rows
        numerical, categorical, label = features.transform(table)
        logits, probabilities = scorer.logits_and_probabilities(numerical, categorical)
        yield lines, label, logits, probabilities
        if left is not None and left <= 0:
            return


def predict_file(version_dir: Path, raw: Path, output: Path | None = None, *, engine: str = "eager",
                 limit_rows: int | None = None, bad_row_budget: float = 0.001, with_metrics: bool = False,
                 block_bytes: int = 64 << 20, device: str = "cpu") -> PredictResult:
    """Score the good rows of a raw Criteo file (see the module docstring); write them to `output` if given."""
    from models.common.metrics import StreamingPredictions
    from tasks.core.progress import ProgressLog
    from tasks.core.storage import atomic_file
    from tasks.criteo.raw_validation import DataQualityError

    progress: ProgressLog | None = None  # started at the first block: the rate leaves out loading the model
    bad: list = []
    metrics = StreamingPredictions() if with_metrics else None
    scored = last_line = 0
    with contextlib.ExitStack() as stack:  # the output appears only complete, and only when within budget
        out = stack.enter_context(atomic_file(Path(output), "w")) if output is not None else None
        for lines, label, logits, probabilities in iter_scored_blocks(
                version_dir, raw, engine=engine, limit_rows=limit_rows, block_bytes=block_bytes, bad_rows=bad,
                device=device):
            if progress is None:  # the first block's rows took no measured time: not in the rate
                progress = ProgressLog(f"scoring {raw.name}", total=limit_rows, logger=log, every_s=10.0,
                                       done=len(lines))
            scored += len(lines)
            progress.report(scored)
            last_line = int(lines[-1])
            if metrics is not None:
                metrics.add(label, logits)
            if out is not None:
                out.writelines(f"{line}\t{y}\t{p:.8g}\n" for line, y, p in zip(lines, label, probabilities))
        seen_bad = [b for b in bad if limit_rows is None or b.line <= last_line]
        total = scored + len(seen_bad)
        if total == 0:
            raise DataQualityError(f"{raw}: no rows to score")
        if len(seen_bad) > bad_row_budget * total:
            raise DataQualityError(f"{raw.name}: {len(seen_bad)} bad rows of {total} "
                                   f"({100 * len(seen_bad) / total:.3f}% > budget {100 * bad_row_budget:.3f}%); "
                                   f"first: {raw.name} {seen_bad[0].describe()}; nothing scored")
    result = PredictResult(str(raw), total, scored, len(seen_bad), [f"{raw.name} {b.describe()}" for b in seen_bad[:5]])
    if metrics is not None:
        computed = metrics.compute()
        result.metrics = {"auc": computed["auc"], "logloss": computed["logloss"], "rows": computed["rows"]}
    log.info("scored %d rows of %s (%d bad rows skipped)%s", scored, raw, len(seen_bad),
             f": auc {result.metrics['auc']:.4f}, logloss {result.metrics['logloss']:.4f}" if result.metrics else "")
    return result



def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="<store>/<model>/versions/<version>, or <store>/<model> for the latest version")
    model.add_argument("--model-dir", type=Path, help="a published version already fetched to a local directory")
    parser.add_argument("--input", type=Path, required=True, help="raw Criteo TSV (day_N format)")
    parser.add_argument("--output", type=Path, help="scores: <line>\\t<label>\\t<probability> per good row")
    parser.add_argument("--metrics-out", type=Path, help="also compute AUC / logloss against the rows' labels")
    parser.add_argument("--limit-rows", type=int, help="score only the first N good rows")
    parser.add_argument("--bad-row-budget", type=float, default=0.001)
    parser.add_argument("--engine", choices=("eager", "torchscript"), default="eager")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model runs (auto: a GPU when torch sees one; refused on a GPU node whose "
                             "torch is a CPU build)")
    parser.add_argument("--cache-dir", type=Path, help="where published versions are fetched (default: beside "
                                                         "the output, in .models/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> PredictResult:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(message)s")
    cache = args.cache_dir or (args.output or args.metrics_out or Path("scores")).resolve().parent / ".models"
    version_dir = args.model_dir
    if version_dir is None:
        from tasks.release.steps import fetch_model

        version_dir = fetch_model(args.model, cache)
    result = predict_file(version_dir, args.input, args.output, engine=args.engine, limit_rows=args.limit_rows,
                          bad_row_budget=args.bad_row_budget, with_metrics=args.metrics_out is not None,
                          device=args.device)
    if args.metrics_out:
        from tasks.core.storage import write_text_atomic

        write_text_atomic(args.metrics_out, json.dumps(asdict(result), indent=2, sort_keys=True))
    return result


if __name__ == "__main__":
    from tasks.core.process import ERROR_MARKER

    try:
        main()
    except Exception as exc:  # one line for the task log / the shell, as every recflow entry point
        print(f"{ERROR_MARKER} {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
