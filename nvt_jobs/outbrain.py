"""Outbrain tables -> NVIDIA Wide & Deep's features with an NVTabular Workflow, the second engine beside
spark_jobs/outbrain/features.py (same interface, same outputs). Runs in NVTabular's own environment:

  <.venv-nvtabular python> -m nvt_jobs.outbrain --device cpu --workers 2 fit --tables VALIDATED_SNAPSHOT_DIR \
      --output DIR [--seed 0] [--parquet-files 8]
  <.venv-nvtabular python> -m nvt_jobs.outbrain --device cpu --workers 2 transform --tables TABLES_DIR \
      --clicks-table clicks_test --stats FEATURES_DIR/stats --output DIR

`fit` joins the validated tables (pandas, as NVIDIA's create_parquets does with cudf), splits the rows with the Spark
path's rule, fits NVIDIA's Workflow (TensorFlow2/Recommendation/WideAndDeep data/outbrain/nvtabular/utils/
workflow.py) on the train rows, transforms both splits and writes
  stats/nvt_workflow/   the fitted Workflow (workflow.save: the graph, JoinGroupby's train counts, the medians, the
                        count normalisation, the document vectors and lists): `transform` and `predict` load it;
  parquet/train/, parquet/valid/  the Spark path's columns, order and dtypes; train in the Spark path's seeded
                        order (the same rows in the same order when nothing collides), valid by (display_id, ad_id);
  stats.json            rows, displays and positives per mapping, seconds.
`transform` applies the saved Workflow to new rows (clicked may be absent) and adds ad_id_raw, sorted by
(display_id, ad_id_raw), as the Spark transform does.

Where this follows the Spark path rather than NVIDIA's workflow.py (so both engines agree; docs/OUTBRAIN.md,
"NVTabular engine"):
  - split: r = Spark's xxhash64(seed, display_id) top 53 bits / 2^53, reproduced in numpy (tasks/core/xxhash.py):
    the same display ids in train and valid as the Spark path, by construction and checked by the tests;
  - missing publisher_id: -1 - document_id; platform: coalesce(platform, 1) - 1;
  - days since published outside [0, 3650] -> null -> the exact train median (ExactFillMedian: FillMedian's dask
    quantile is approximate across partitions), then LogOp;
  - CTRs and counts of a null key are 0 (JoinGroupby groups nulls with dropna=False and pandas joins NaN to NaN);
  - similarities: ColumnSimilarity(metric="inner") over unit TF-IDF vectors weighted with idf = ln(documents / df)
    as sql/idf.sql (NVTabular's "tfidf" takes N = the matrix's rows = max document_id + 1);
  - multi-hot lists: the event document's 3 highest-confidence terms (ties: smaller term), hashed per term before
    the join: HashBucket cannot hash list columns on CPU (pandas hashes the whole list and fails);
  - documents: the term matrices and lists come from the fit's tables and are saved in the Workflow (NVIDIA's way);
    the Spark transform recomputes the vectors of the tables it is given with the saved idf. On the fit's snapshot
    (the gate, `predict` of the same snapshot) both give the same features; a document first seen after the fit
    has similarities 0 and empty lists here.
Hashing differs by design: HashBucket is pandas' hash_pandas_object on CPU and cudf's murmur3 on GPU, Spark's is
xxhash64; an id is a function of its raw value in each engine, the ids themselves differ. ValueHashBucket replaces
HashBucket on CPU, whose pandas path hashes the row index with the value (merlin.core.dispatch.hash_series). Ids
are hashed as int64 (a null as NULL_ID), geo strings as strings, the same at fit and transform.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from nvt_jobs.common import add_device_args, configure_logging, dask_cluster, dataset, resolve_device, run_job
from nvt_jobs.outbrain_ops import (document_similarity, exact_fill_median, nullable_join_groupby, value_hash_bucket,
                                  value_hashes)
from tasks.core.xxhash import spark_xxhash64
from tasks.outbrain.contract import (CTR_THRESHOLDS, DISPLAY_ID, HASH_BUCKET_SIZES, LABEL, MULTIHOT_COLUMNS,
                                     NUMERIC_COLUMNS, ONEHOT_COLUMNS, PARQUET_DIR, RAW_AD_ID, STATS_DIR, STATS_FILE,
                                     TRAIN_MAX_DAY, VALID_FRACTION, parse_features_args)
from tasks.outbrain.schema import DAY_MS, TIMESTAMP_ORIGIN_MS

log = logging.getLogger("recflow.nvt.outbrain")

WORKFLOW_DIR = "nvt_workflow"  # under stats/: what a published version carries
CTR_INPUTS = list(CTR_THRESHOLDS)
COUNT_FEATURES = ("ad_id", "document_id_promo")  # <key>_count: log(1 + train views), normalised
NULLABLE_IDS = ("document_id", "document_id_promo", "campaign_id", "advertiser_id", "source_id", "publisher_id",
                "source_id_promo", "publisher_id_promo")
TERM_KINDS = {"topics": ("documents_topics", "topic_id", "topic_id_list"),
              "entities": ("documents_entities", "entity_id", "entity_id_list"),
              "categories": ("documents_categories", "category_id", "category_id_list")}
SIMILARITY = "document_id_document_id_promo_sim_{kind}"
MAX_DAYS = 3650
# Output dtypes of the Spark path's parquet (spark_jobs/outbrain/features.py): the TFRecord writer, FeatureSpec and
# trainer read either engine's files unchanged.
FLOAT64_COLUMNS = tuple(SIMILARITY.format(kind=kind) for kind in ("categories", "topics", "entities"))


@dataclass(frozen=True)
class FeaturesResult:
    output: str
    stats: dict


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The features job's command line (tasks/outbrain/contract.py), plus --device and --workers."""
    return parse_features_args(argv, description="Outbrain tables -> Wide & Deep features (NVTabular)",
                               extend=add_device_args)


# ---- the split, as the Spark path draws it --------------------------------------------------------------------

def split_uniform(seed: int, display_ids: np.ndarray) -> np.ndarray:
    """sql/outbrain/joined.sql's r: the top 53 bits of xxhash64(seed, display_id) / 2^53."""
    return (spark_xxhash64(seed, display_ids).view(np.uint64) >> np.uint64(11)).astype(np.float64) / 2.0 ** 53


# ---- the joined rows (NVIDIA's create_parquets) ------------------------------------------------------------------

def read_table(tables: Path, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    import pyarrow.dataset as ds

    return ds.dataset(str(tables / name), format="parquet").to_table(columns=columns).to_pandas()


def joined_rows(tables: Path, clicks_table: str, seed: int) -> pd.DataFrame:
    """One row per clicks row with its event, promoted content and both documents' metadata (left joins, as
    sql/outbrain/joined.sql), the split flag `is_train` and the Spark path's train order `order_key`."""
    clicks = read_table(tables, clicks_table)
    if LABEL not in clicks.columns:
        clicks[LABEL] = pd.array([pd.NA] * len(clicks), dtype="Int32")
    clicks = clicks[[DISPLAY_ID, "ad_id", LABEL]]
    events = read_table(tables, "events", [DISPLAY_ID, "document_id", "timestamp", "platform", "geo_location"])
    promoted = read_table(tables, "promoted_content").rename(columns={"document_id": "document_id_promo"})
    meta = read_table(tables, "documents_meta")
    meta["publisher_id"] = meta["publisher_id"].astype("float64").fillna(-1.0 - meta["document_id"])
    meta = meta[["document_id", "source_id", "publisher_id", "publish_time"]]
    rows = (clicks.merge(events, on=DISPLAY_ID, how="left")
            .merge(promoted, on="ad_id", how="left")
            .merge(meta, on="document_id", how="left")
            .merge(meta.rename(columns=lambda c: f"{c}_promo"), on="document_id_promo", how="left"))
    rows["platform"] = (rows["platform"].astype("float64").fillna(1.0) - 1).astype(np.int64)
    for column in NULLABLE_IDS:
        rows[column] = rows[column].astype("float64")
    rows["geo_location"] = rows["geo_location"].astype(object).where(rows["geo_location"].notna(), None)
    timestamp = rows["timestamp"].astype("float64")
    r = split_uniform(seed, rows[DISPLAY_ID].to_numpy(np.int64))
    rows["is_train"] = ((timestamp // DAY_MS <= TRAIN_MAX_DAY) & (r >= VALID_FRACTION)).to_numpy()
    rows["timestamp"] = timestamp
    rows[RAW_AD_ID] = rows["ad_id"].astype(np.int64)
    rows["order_key"] = spark_xxhash64(seed, rows[DISPLAY_ID].to_numpy(np.int64), rows[RAW_AD_ID].to_numpy())
    return rows


# ---- the documents: TF-IDF vectors and term lists ----------------------------------------------------------------

def document_terms(tables: Path) -> pd.DataFrame:
    """(kind, document_id, term, confidence) of the three term tables, terms as strings, a pair listed twice
    keeping its highest confidence (sql/outbrain/document_terms.sql)."""
    frames = []
    for kind, (table, column, _) in TERM_KINDS.items():
        frame = read_table(tables, table).dropna()
        frames.append(pd.DataFrame({"kind": kind, "document_id": frame["document_id"].astype(np.int64),
                                    "term": frame[column].astype(str),
                                    "confidence": frame["confidence_level"].astype(np.float32)}))
    terms = pd.concat(frames, ignore_index=True)
    return terms.groupby(["kind", "document_id", "term"], as_index=False, sort=False)["confidence"].max()


def document_index(terms: pd.DataFrame) -> np.ndarray:
    """The sorted ids of every document with a term: row i of the term matrices is document index[i]; one more row
    (len(index)), empty, stands for any other document."""
    return np.unique(terms["document_id"].to_numpy())


def tfidf_matrix(terms: pd.DataFrame, kind: str, index: np.ndarray):
    """A kind's documents x terms matrix of unit TF-IDF vectors (sql/outbrain/idf.sql, document_vectors.sql:
    weight = confidence x ln(documents / df), divided by the document's L2 norm; zero vectors dropped)."""
    import scipy.sparse

    of_kind = terms[terms["kind"] == kind]
    documents = of_kind["document_id"].nunique()
    term_codes, _ = pd.factorize(of_kind["term"])
    df = np.bincount(term_codes)
    weight = of_kind["confidence"].to_numpy(np.float64) * np.log(documents / df[term_codes])
    rows = np.searchsorted(index, of_kind["document_id"].to_numpy())
    norm = np.sqrt(np.bincount(rows, weight * weight, minlength=len(index) + 1))[rows]
    keep = (norm > 0) & (weight != 0)
    return scipy.sparse.coo_matrix((weight[keep] / norm[keep], (rows[keep], term_codes[keep])),
                                   shape=(len(index) + 1, max(len(df), 1))).tocsr()


def document_lists(terms: pd.DataFrame) -> pd.DataFrame:
    """document_id (float64, the joined rows' key) -> the three multi-hot lists: every term of the document, highest
    confidence first (ties: the smaller term), each hashed into its bucket count. ListSlice(3) in the Workflow
    keeps the first 3 (sql/outbrain/document_lists.sql)."""
    ranked = terms.sort_values(["kind", "document_id", "confidence", "term"], ascending=[True, True, False, True])
    lists = None
    for kind, (_, _, name) in TERM_KINDS.items():
        of_kind = ranked[ranked["kind"] == kind]
        hashed = pd.Series(value_hashes(of_kind["term"]) % np.uint64(HASH_BUCKET_SIZES[name]),
                           index=of_kind.index).astype(np.int64)
        grouped = hashed.groupby(of_kind["document_id"], sort=False).agg(list).rename(name)
        lists = grouped.to_frame() if lists is None else lists.join(grouped, how="outer")
    lists.index = lists.index.astype("float64")
    return lists.rename_axis("document_id").reset_index()


# ---- the Workflow (NVIDIA's create_workflow) ---------------------------------------------------------------------

def days_since_published(col: pd.Series, df: pd.DataFrame) -> pd.Series:
    """Whole days from the publish time to the event (NVIDIA's DaysSincePublished), null outside [0, 3650]."""
    published_ms = (col.astype("int64") // 10 ** 9 * 1000).where(col.notna())
    days = np.floor((df["timestamp"] + TIMESTAMP_ORIGIN_MS - published_ms) / DAY_MS)
    return days.where((days >= 0) & (days <= MAX_DAYS))


def train_statistic(col: pd.Series, df: pd.DataFrame) -> pd.Series:
    """JoinGroupby's train statistics of a key, for the rows' keys: <key>_clicked_sum -> the CTR (clicks / views,
    0 below NVIDIA's view threshold), <key>_count -> the views; both 0 for an unseen or a null key. (LambdaOp
    hands this the dependency columns too: the keys pass through.)"""
    if col.name in CTR_INPUTS:
        return col
    if col.name.endswith(f"_{LABEL}_sum"):
        key = col.name[:-len(f"_{LABEL}_sum")]
        views = df[f"{key}_count"]
        ctr = col.astype(np.float32) / views.astype(np.float32)
        return ctr.where((views >= CTR_THRESHOLDS[key]) & df[key].notna(), 0).fillna(0).astype(np.float32)
    key = col.name[:-len("_count")]
    return col.where(df[key].notna(), 0).fillna(0).astype(np.float64)


def lists_or_empty(col: pd.Series) -> pd.Series:
    """A document without terms of a kind joins no list: an empty one (the Spark path's array()). pandas only:
    ListSlice fails on its NaN; cudf slices a null list to null, which spark_layout writes as []."""
    if not isinstance(col, pd.Series):
        return col
    return col.apply(lambda v: list(v) if isinstance(v, (list, np.ndarray)) else [])


def build_workflow(terms: pd.DataFrame, work_dir: Path):
    """NVIDIA's Workflow over the joined rows, with the changes the module docstring lists."""
    import nvtabular as nvt
    from nvtabular.ops import JoinExternal, LambdaOp, ListSlice, LogOp, Normalize, Rename

    geo = ["geo_location"]
    country = geo >> LambdaOp(lambda col: col.str.slice(0, 2)) >> Rename(postfix="_country")
    state = geo >> LambdaOp(lambda col: col.str.slice(0, 5)) >> Rename(postfix="_state")
    onehot_inputs = [c for c in ONEHOT_COLUMNS if not c.startswith("geo_location_")]
    buckets = {name: HASH_BUCKET_SIZES[name] for name in ONEHOT_COLUMNS}
    onehots = (onehot_inputs + country + state) >> value_hash_bucket(buckets)

    dates = (["publish_time", "publish_time_promo"]
             >> LambdaOp(days_since_published, dependency=["timestamp"])
             >> Rename(postfix="_days_since_published") >> exact_fill_median() >> LogOp())

    stats = (CTR_INPUTS >> nullable_join_groupby(cont_cols=[LABEL], stats=["sum", "count"], out_path=str(work_dir))
             >> LambdaOp(train_statistic, dependency=CTR_INPUTS))
    ctrs = (stats[[f"{c}_{LABEL}_sum" for c in CTR_INPUTS]]
            >> Rename(f=lambda name: name.replace(f"_{LABEL}_sum", "_ctr")))
    counts = stats[[f"{c}_count" for c in COUNT_FEATURES]] >> LogOp() >> Normalize()

    index = document_index(terms)
    pair = [["document_id", "document_id_promo"]]
    similarities = None
    for kind in ("categories", "topics", "entities"):
        sim = pair >> document_similarity(tfidf_matrix(terms, kind, index), index) >> Rename(postfix=f"_{kind}")
        similarities = sim if similarities is None else similarities + sim

    lists = (["document_id"] >> JoinExternal(document_lists(terms), on=["document_id"], how="left",
                                             columns_ext=["document_id", *MULTIHOT_COLUMNS], cache="host"))
    multihots = lists[list(MULTIHOT_COLUMNS)] >> LambdaOp(lists_or_empty) >> ListSlice(3)

    passthrough = [LABEL, DISPLAY_ID, RAW_AD_ID, "is_train", "order_key"]
    features = onehots + multihots + similarities + ctrs + counts + dates + passthrough
    return nvt.Workflow(features)


# ---- writing ----------------------------------------------------------------------------------------------------

def spark_layout(frame: pd.DataFrame, extra: Sequence[str] = ()) -> pd.DataFrame:
    """The Workflow's output with the Spark path's columns, order and dtypes."""
    out = pd.DataFrame(index=frame.index)
    out[LABEL] = frame[LABEL].astype("Int32")
    for name in ONEHOT_COLUMNS:
        out[name] = frame[name].astype(np.int64)
    for name in MULTIHOT_COLUMNS:
        out[name] = frame[name].apply(lambda v: [int(x) for x in v] if isinstance(v, (list, np.ndarray)) else [])
    for name in NUMERIC_COLUMNS:
        out[name] = frame[name].astype(np.float64 if name in FLOAT64_COLUMNS else np.float32)
    out[DISPLAY_ID] = frame[DISPLAY_ID].astype(np.int64)
    for name in extra:
        out[name] = frame[name]
    return out.reset_index(drop=True)


def write_parts(frame: pd.DataFrame, target: Path, files: int) -> None:
    """`frame` in `files` part files, in its order (part-00000 holds the first rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target.mkdir(parents=True, exist_ok=True)
    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    fields = [pa.field(f.name, pa.list_(pa.field("element", pa.int64()))) if f.name in MULTIHOT_COLUMNS else f
              for f in schema]
    schema = pa.schema(fields)
    bounds = np.linspace(0, len(frame), files + 1).astype(int)
    for part, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        table = pa.Table.from_pandas(frame.iloc[start:end], schema=schema, preserve_index=False)
        pq.write_table(table, target / f"part-{part:05d}.parquet")


def mapping_counts(frame: pd.DataFrame) -> dict[str, int]:
    return {"rows": int(len(frame)), "displays": int(frame[DISPLAY_ID].nunique()),
            "positives": int(frame[LABEL].fillna(0).sum())}


def transformed(workflow, rows, device: str, what: str) -> pd.DataFrame:
    started = time.monotonic()
    parts = workflow.transform(rows).to_ddf()
    if device == "gpu":  # each partition to host memory where it is: the whole frame never sits on one GPU
        parts = parts.map_partitions(lambda part: part.to_pandas(), meta=parts._meta.to_pandas())
    frame = parts.compute()
    log.info("%s: %d rows transformed in %.1f s", what, len(frame), time.monotonic() - started)
    return frame


def rows_dataset(rows: pd.DataFrame, work_dir: Path, name: str, device: str, files: int = 4):
    """The joined rows as parquet part files (NVIDIA's create_parquets step) and a merlin Dataset over them: the
    Dask workers read their partitions from disk instead of receiving them from this process."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = work_dir / name
    target.mkdir(parents=True, exist_ok=True)
    files = max(1, min(files, len(rows) // 10000 or 1))
    bounds = np.linspace(0, len(rows), files + 1).astype(int)
    paths = []
    for part, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        path = target / f"part-{part:05d}.parquet"
        pq.write_table(pa.Table.from_pandas(rows.iloc[start:end], preserve_index=False), path)
        paths.append(str(path))
    return dataset(paths, device)


def fit(args: argparse.Namespace, device: str) -> dict:
    started = time.monotonic()
    rows = joined_rows(args.tables, args.clicks_table, args.seed)
    terms = document_terms(args.tables)
    log.info("joined %d rows, %d document terms in %.1f s", len(rows), len(terms), time.monotonic() - started)
    stats_dir = args.output / STATS_DIR
    work_dir = args.output / "_nvt_work"
    stats_dir.mkdir(parents=True, exist_ok=True)
    train_rows, valid_rows = rows[rows["is_train"]], rows[~rows["is_train"]]
    workflow = build_workflow(terms, work_dir)
    fitted = time.monotonic()
    train_set = rows_dataset(train_rows, work_dir, "train_rows", device)
    valid_set = rows_dataset(valid_rows, work_dir, "valid_rows", device)
    workflow.fit(train_set)
    log.info("workflow fitted on %d train rows in %.1f s", len(train_rows), time.monotonic() - fitted)
    workflow.save(str(stats_dir / WORKFLOW_DIR))
    train = transformed(workflow, train_set, device, "train")
    valid = transformed(workflow, valid_set, device, "valid")
    # The Spark path's orders: train by xxhash64(seed, display_id, ad_id) (a range partitioning then a local sort),
    # valid by (display_id, ad_id).
    train = train.sort_values("order_key", kind="stable")
    valid = valid.sort_values([DISPLAY_ID, RAW_AD_ID], kind="stable")
    write_parts(spark_layout(train), args.output / PARQUET_DIR / "train", args.parquet_files)
    write_parts(spark_layout(valid), args.output / PARQUET_DIR / "valid", args.parquet_files)
    shutil.rmtree(work_dir)
    return {"train": mapping_counts(train), "test": mapping_counts(valid)}


def transform(args: argparse.Namespace, device: str) -> dict:
    import nvtabular as nvt

    rows = joined_rows(args.tables, args.clicks_table, args.seed)
    work_dir = args.output / "_nvt_work"
    workflow = nvt.Workflow.load(str(args.stats / WORKFLOW_DIR))
    frame = transformed(workflow, rows_dataset(rows, work_dir, "rows", device), device, "rows")
    frame = frame.sort_values([DISPLAY_ID, RAW_AD_ID], kind="stable")
    shutil.rmtree(work_dir)
    write_parts(spark_layout(frame, [RAW_AD_ID]), args.output, args.parquet_files)
    return {"rows": mapping_counts(frame)}


def main(argv: Sequence[str]) -> FeaturesResult:
    import warnings

    args = parse_args(argv)
    configure_logging(f"nvt outbrain_features {args.mode}")
    warnings.filterwarnings("ignore", module="merlin")  # Triton dtype mappings, cupy-less CPU notes
    logging.getLogger("distributed").setLevel(logging.WARNING)  # the cluster's connect/close chatter
    device = resolve_device(args.device)
    started = time.monotonic()
    with dask_cluster(device, args.workers):
        counts = fit(args, device) if args.mode == "fit" else transform(args, device)
    seconds = time.monotonic() - started
    rows_in = sum(entry["rows"] for entry in counts.values())
    stats = {"mode": args.mode, "engine": "nvtabular", "device": device, **counts, "seconds": round(seconds, 3),
             "rows_per_s": round(rows_in / max(seconds, 1e-9), 1)}
    if args.mode == "fit":
        (args.output / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
    log.info("%s (%s): %s in %.1f s (%.0f rows/s)", args.mode, device, counts, seconds, stats["rows_per_s"])
    return FeaturesResult(str(args.output), stats)


if __name__ == "__main__":
    # The saved Workflow pickles this module's functions by reference: they must live in nvt_jobs.outbrain, not in
    # __main__, so `transform` (and Dask's workers) find them again.
    from nvt_jobs import outbrain

    result = run_job(outbrain.main, sys.argv[1:])
    print(json.dumps(asdict(result)))
