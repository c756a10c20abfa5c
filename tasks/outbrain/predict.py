"""Rank ads with a published outbrain_wide_deep version: Outbrain rows in, each display's ads best first out.

  python -m tasks.outbrain.predict rank --model-dir DIR --tables VALIDATED [--clicks-table clicks_test]
                                        [--out submission.csv] [--limit N]
  python -m tasks.outbrain.predict score --model-dir DIR --validated VALIDATED --features FEATURES --map-k 12
                                         --metrics-out metrics.json

A published version is self-contained: the Wide & Deep weights and sizes (model.weights.h5, model_config.json), the
FeatureSpecs of its training features, and the feature statistics fitted on its train split (stats/: Spark's CTR
counts, IDF tables, medians and count normalisation, or NVTabular's saved Workflow in stats/nvt_workflow/). The
rows to rank are a validated snapshot's tables (outbrain_ingest writes them; Kaggle's clicks_test.csv holds
display_id, ad_id): their features are computed by the engine that built the version's features (the same Spark
SQL, or the same NVTabular Workflow, as the training rows'), with the version's own statistics, so what a version
scores is what it was trained on.

`rank` writes Kaggle's submission format (`display_id,ad_id` then one line per display: its ad ids, best first,
space-separated) and prints the first `--limit` displays as JSON lines {"display_id", "ads", "scores"}.

`score` is the gate's same-rows comparison: MAP@k (and AUC, logloss) of this version on another run's validation
displays: that run's validation display ids, their rows of clicks_train (with the clicks), featurised with this
version's statistics.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MODEL_FILES = ("model.weights.h5", "model_config.json")
FEATURE_SPEC = "feature_spec.yaml"
TFRECORD_FEATURE_SPEC = "tfrecords/feature_spec.yaml"
STATS = "stats"
VALID_CLICKS = "clicks_valid"
BATCH_ROWS = 65536


def model_files(train_dir: Path, features_dir: Path) -> dict[str, Path]:
    """name in a published version -> local file, for what `rank` and `score` need: the model, the FeatureSpecs
    and every file of the fitted feature statistics."""
    stats = features_dir / STATS
    return {**{name: train_dir / name for name in MODEL_FILES},
            FEATURE_SPEC: features_dir / FEATURE_SPEC, TFRECORD_FEATURE_SPEC: features_dir / TFRECORD_FEATURE_SPEC,
            **{f"{STATS}/{p.relative_to(stats).as_posix()}": p for p in sorted(stats.rglob("*")) if p.is_file()}}


def missing_for_scoring(names: list[str]) -> list[str]:
    """What a published version lacks to be scored by this module."""
    missing = [name for name in (*MODEL_FILES, FEATURE_SPEC) if name not in names]
    if not any(name.startswith(f"{STATS}/") for name in names):
        missing.append(f"{STATS}/")
    return missing


def _feature_batches(features_dir: Path, columns: list[str]) -> Iterator[Any]:
    import pyarrow.dataset as ds

    files = sorted(str(p) for p in features_dir.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no featurised rows in {features_dir}")
    # Files are in (display_id, ad) order across files and within each (the transform writes them so).
    for path in files:
        yield from ds.dataset(path, format="parquet").to_batches(columns=columns, batch_size=BATCH_ROWS)


def _scores(model_dir: Path, features_dir: Path, extra: list[str]) -> Iterator[tuple[Any, np.ndarray]]:
    """(batch with the `extra` columns, logits) over the featurised rows, in file order."""
    import tensorflow as tf

    from models.wide_deep.evaluate import load_model, make_scorer
    from tasks.formats.tfrecord import padded_lists

    model = load_model(model_dir / MODEL_FILES[0])
    config = model.config
    scorer = make_scorer(model)
    columns = [*config.onehot, *config.multihot, *config.numerical]
    for batch in _feature_batches(features_dir, [*columns, *extra]):
        features = {name: tf.constant(batch.column(name).to_numpy(zero_copy_only=False).astype(np.int64)[:, None])
                    for name in config.onehot}
        features.update({name: tf.constant(padded_lists(batch.column(name), config.hotness[name], name))
                         for name in config.multihot})
        features.update({name: tf.constant(np.nan_to_num(batch.column(name).to_numpy(zero_copy_only=False))
                                           .astype(np.float32)[:, None]) for name in config.numerical})
        yield batch, scorer(features).numpy().astype(np.float64)


def _featurise(model_dir: Path, tables: Path, clicks_table: str, work: Path) -> Path:
    from tasks.core.config import load_settings
    from tasks.outbrain.features import transform_rows

    out = work / "features"
    transform_rows(load_settings(), tables, model_dir / STATS, out, clicks_table=clicks_table)
    return out


def rank(model_dir: Path, tables: Path, *, clicks_table: str = "clicks_test", out: Path | None = None,
         limit: int = 0, work: Path | None = None) -> list[dict[str, Any]]:
    """Each display's ads ranked by the version (module docstring); returns the first `limit` displays."""
    from tasks.outbrain.features import DISPLAY_ID, RAW_AD_ID

    with tempfile.TemporaryDirectory(prefix="outbrain-rank-", dir=work) as scratch:
        featurised = _featurise(model_dir, tables, clicks_table, Path(scratch))
        ids, ads, scores = [], [], []
        for batch, logits in _scores(model_dir, featurised, [DISPLAY_ID, RAW_AD_ID]):
            ids.append(batch.column(DISPLAY_ID).to_numpy())
            ads.append(batch.column(RAW_AD_ID).to_numpy())
            scores.append(logits)
    display_ids, ad_ids, logits = np.concatenate(ids), np.concatenate(ads), np.concatenate(scores)
    order = np.lexsort((-logits, display_ids))  # by display, then best first
    display_ids, ad_ids, logits = display_ids[order], ad_ids[order], logits[order]
    starts = np.flatnonzero(np.r_[True, display_ids[1:] != display_ids[:-1]])
    ends = np.r_[starts[1:], display_ids.size]
    shown: list[dict[str, Any]] = []
    if out is not None:
        from tasks.core.storage import atomic_file

        with atomic_file(out, "w") as sink:
            sink.write("display_id,ad_id\n")
            for start, end in zip(starts, ends):
                sink.write(f"{display_ids[start]},{' '.join(map(str, ad_ids[start:end]))}\n")
    for start, end in list(zip(starts, ends))[:limit]:
        shown.append({"display_id": int(display_ids[start]), "ads": [int(a) for a in ad_ids[start:end]],
                      "scores": [round(float(s), 6) for s in logits[start:end]]})
    log.info("ranked %d ads of %d displays%s", display_ids.size, starts.size, f" into {out}" if out else "")
    return shown


def _valid_tables(validated: Path, features: Path, work: Path) -> Path:
    """A tables folder for the transform: the validated snapshot's document tables (linked) and the clicks_train
    rows of the validation displays of `features` (the other run's split), streamed."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from tasks.outbrain.features import DISPLAY_ID, INPUT_TABLES

    valid = ds.dataset(str(features / "parquet" / "valid"), format="parquet").to_table(columns=[DISPLAY_ID])
    displays = pc.unique(valid[DISPLAY_ID])
    tables = work / "tables"
    (tables / VALID_CLICKS).mkdir(parents=True)
    for name in INPUT_TABLES[1:]:  # all but clicks_train
        (tables / name).symlink_to((validated / name).resolve(), target_is_directory=True)
    clicks = ds.dataset(str(validated / "clicks_train"), format="parquet")
    with pq.ParquetWriter(tables / VALID_CLICKS / "part-00000.parquet", clicks.schema) as writer:
        for batch in clicks.to_batches(batch_size=1 << 20):
            kept = batch.filter(pc.is_in(batch.column(DISPLAY_ID), value_set=displays))
            if kept.num_rows:
                writer.write_batch(kept)
    return tables


def score(model_dir: Path, validated: Path, features: Path, *, k: int = 12, work: Path | None = None) -> dict:
    """MAP@k, AUC and logloss of the version on the validation displays of `features` (module docstring)."""
    from models.common.metrics import StreamingPredictions
    from models.wide_deep.metrics import MapAccumulator
    from tasks.outbrain.features import DISPLAY_ID, LABEL

    ranking, clicks = MapAccumulator(k), StreamingPredictions()
    with tempfile.TemporaryDirectory(prefix="outbrain-score-", dir=work) as scratch:
        tables = _valid_tables(validated, features, Path(scratch))
        featurised = _featurise(model_dir, tables, VALID_CLICKS, Path(scratch))
        for batch, logits in _scores(model_dir, featurised, [DISPLAY_ID, LABEL]):
            labels = batch.column(LABEL).to_numpy(zero_copy_only=False).astype(np.int8)
            ranking.add(batch.column(DISPLAY_ID).to_numpy(), logits, labels)
            clicks.add(labels, logits)
    result, binary = ranking.result(), clicks.compute()
    return {f"map@{k}": result.map, f"random_map@{k}": result.random_map, "auc": binary["auc"],
            "logloss": binary["logloss"], "rows": binary["rows"], "displays": result.displays}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m tasks.outbrain.predict", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ranker = commands.add_parser("rank", help="rank each display's ads (Kaggle's submission format)")
    ranker.add_argument("--model-dir", type=Path, required=True, help="a published version (local folder)")
    ranker.add_argument("--tables", type=Path, required=True,
                        help="a validated snapshot folder (outbrain_ingest's validated/<snapshot>/)")
    ranker.add_argument("--clicks-table", default="clicks_test", help="the table of (display_id, ad_id) to rank")
    ranker.add_argument("--out", type=Path, help="write the submission CSV here")
    ranker.add_argument("--limit", type=int, default=0, help="print the first N displays as JSON lines")
    scorer = commands.add_parser("score", help="MAP@k of the version on another run's validation displays")
    scorer.add_argument("--model-dir", type=Path, required=True)
    scorer.add_argument("--validated", type=Path, required=True, help="the validated snapshot of that run")
    scorer.add_argument("--features", type=Path, required=True, help="that run's features folder")
    scorer.add_argument("--map-k", type=int, default=12)
    scorer.add_argument("--metrics-out", type=Path, required=True)
    args = parser.parse_args(argv)
    missing = missing_for_scoring([p.relative_to(args.model_dir).as_posix() for p in args.model_dir.rglob("*")
                                   if p.is_file()]) if args.model_dir.is_dir() else [str(args.model_dir)]
    if missing:
        print(f"{args.model_dir} is not a complete outbrain_wide_deep version: no {', '.join(missing)}",
              file=sys.stderr)
        return 1
    if args.command == "rank":
        # Scratch (the featurised rows) beside the output, not in /tmp: at full size it is the size of the rows.
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        for line in rank(args.model_dir, args.tables, clicks_table=args.clicks_table, out=args.out,
                         limit=args.limit, work=args.out.parent if args.out else None):
            print(json.dumps(line))
        return 0
    from tasks.core.storage import write_text_atomic

    args.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    metrics = score(args.model_dir, args.validated, args.features, k=args.map_k, work=args.metrics_out.parent)
    write_text_atomic(args.metrics_out, json.dumps({"metrics": metrics}, indent=2))
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
