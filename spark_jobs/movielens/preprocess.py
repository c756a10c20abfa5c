"""MovieLens ratings -> NVIDIA NCF's leave-one-out dataset (torch_tensor chunks + feature_spec.yaml).

  spark-submit spark_jobs/movielens/preprocess.py --ratings VALIDATED_PARQUET_DIR --output DIR \
      [--min-ratings 20] [--test-negatives 100] [--seed 1] [--inputs-json '{...}']

Input: the validation step's parquet of good rows: line (1-based line in the raw file), user_id, item_id, rating,
timestamp (unix seconds). The physical order of the files does not matter: file order is `line`.

Semantics. We build NCF for TensorFlow, so NVIDIA's TF1 recipe (TensorFlow/Recommendation/NCF: convert.py, ncf.py,
input_pipeline.py) is followed unless stated; the places where the PyTorch recipe (PyTorch/Recommendation/NCF:
convert.py, feature_spec.py, dataloading.py) is followed instead are marked [PyTorch].
  1. min-ratings filter: users with fewer than --min-ratings rows are dropped, counted on the raw rows (duplicates
     of a (user, item) pair count), before anything else. TF1: 20 (the default); 0 turns it off [PyTorch: its
     convert.py as of DeepLearningExamples 729963dd has no filter; earlier versions had TF1's]. ml-20m users all
     have >= 20 ratings, so on ml-20m both give the same dataset.
  2. factorize: users and items get ids 0..n-1 in order of first appearance in the unsorted file (pd.factorize on
     the filtered rows), i.e. ordered by min(line). An item rated only by filtered-out users gets no id.
  3. order by timestamp, ties by file line; rating and timestamp dropped; a repeated (user, item) keeps its first
     row in that order (drop_duplicates). NVIDIA sorts with pandas' default quicksort, which is not stable, so the
     order of equal timestamps there is arbitrary (and the test item of a user whose last two ratings share a
     second is arbitrary); ours is the stable sort's (file order), reproducible.
  4. leave-one-out: each user's last remaining interaction in that order is its test positive; train = the rest,
     sorted by (user, item) (TF1; PyTorch keeps the grouped time order, which its loader shuffles anyway).
  5. test negatives: --test-negatives per user (default 100 in both recipes), uniform in [0, items) with rejection
     of the user's train items only (both recipes: the test item itself may be drawn, which the metric's duplicate
     mask is for), with replacement across draws. NVIDIA draws from one global stream (numpy in TF1, torch with
     seed 1 in PyTorch); here each user's draws come from its own Philox stream seeded by SeedSequence([seed,
     user]), inside a mapInArrow function, so the output is the same bytes for the same input and seed whatever
     the partitioning. [deviation] Both recipes draw in [0, max train item + 1); we draw in [0, item cardinality),
     the whole data's (step 6), so an item seen only as some user's test positive can be a negative of the others
     (the model has an embedding row for it either way).
  6. cardinalities [PyTorch]: users = max user id + 1, items = max item id + 1 over the whole factorized data
     (train and test positives); TF1's ncf.py takes train.max() + 1, which misses an item seen only in test.
Output layout [PyTorch] (TF1 pickles two DataFrames and samples the negatives in the trainer; the PyTorch layout
carries them, so training and evaluation read the same fixed negatives):
  feature_spec.yaml (NVIDIA's NCF template, test_samples_per_series = negatives + 1), train_data_0.pt int64 [N, 2]
  (user, item), train_data_1.pt float32 [N, 1] ones, test_data_0.pt int64 [U * (negatives + 1), 2], users
  ascending, each user's positive FIRST then its negatives (PyTorch's order; TF1 puts the positive last),
  test_data_1.pt float32 labels (1 then zeros); mappings/users.parquet (user, user_id) and mappings/items.parquet
  (item, item_id) for mapping raw ids at prediction time; stats.json; _MANIFEST.json last. Replaced atomically.

Where the work happens. Spark does the row work (filter, factorize, sort, dedup, leave-one-out, sampling) and writes
ordered parquet into a temporary folder of the output; the driver then streams those files into the tensors. A
torch_tensor chunk is one whole tensor (NVIDIA's loader torch.loads each file), so that last step holds O(train
rows) in one process: ml-20m's 20M train pairs are 320 MB (+ 80 MB of labels, + 222 MB of test pairs), fine. At a
much bigger scale the chunk format itself would have to change (several files per chunk, or a memory-mappable raw
layout like split binary), as NVIDIA's loader also holds the whole dataset in device memory. The factorization
ranks the distinct ids (with their first line, found by Spark) in the driver, which writes the mapping files from
them: O(distinct ids), 138k users / 27k items for ml-20m; with hundreds of millions of distinct ids it would become a
distributed rank (per-partition counts + offsets, as RDD.zipWithIndex does) and a Spark-written mapping.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_jobs.common import configure_logging, log, reuse_level, run_job, spark_session
from tasks.core.storage import Manifest, atomic_directory, write_manifest
from tasks.formats.torch_tensor import ITEM, USER
from tasks.movielens.schema import ITEM_ID, LINE, MIN_RATINGS_PER_USER, TIMESTAMP, USER_ID

TEST_ITEM, IS_TEST, SERIES = "test_item", "is_test", "series"
MAPPINGS_DIR = "mappings"
USERS_FILE, ITEMS_FILE = "users.parquet", "items.parquet"
SEEN_FILE = "seen.parquet"
STATS_FILE = "stats.json"
PARQUET_TMP = "_parquet"
KIND = "movielens_preprocess"


@dataclass(frozen=True)
class PreprocessResult:
    output: str
    stats: dict


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MovieLens ratings -> NCF leave-one-out torch_tensor dataset")
    parser.add_argument("--ratings", required=True, help="parquet directory of validated ratings")
    parser.add_argument("--output", required=True, type=Path, help="dataset directory (replaced atomically)")
    parser.add_argument("--min-ratings", type=int, default=MIN_RATINGS_PER_USER,
                        help="drop users with fewer raw rows (0: keep all)")
    parser.add_argument("--test-negatives", type=int, default=100, help="sampled negatives per user's test positive")
    parser.add_argument("--seed", type=int, default=1, help="seed of the test negatives")
    parser.add_argument("--inputs-json", default="{}", help="what identifies this work, recorded in the manifest")
    args = parser.parse_args(argv)
    if args.min_ratings < 0 or args.test_negatives < 1 or args.seed < 0:
        parser.error("--min-ratings and --seed must be >= 0, --test-negatives >= 1")
    return args


# ---- the row work (Spark) ----------------------------------------------------------------------------------------

def filter_min_ratings(ratings, min_ratings: int):
    """Rows of users with at least min_ratings raw rows (0: all rows)."""
    from pyspark.sql import functions as F

    if min_ratings <= 0:
        return ratings
    kept = ratings.groupBy(USER_ID).agg(F.count("*").alias("n")).where(F.col("n") >= min_ratings).select(USER_ID)
    return ratings.join(kept, on=USER_ID, how="left_semi")


def factorize(spark, rows, raw: str, index: str):
    """(arrow table, DataFrame) of (index, raw): ids 0..n-1 in order of first appearance in the file (pd.factorize
    on the unsorted rows), i.e. distinct raw ids ordered by their first line.

    Spark finds each id's first line; the distinct ids (not the rows) are ranked in the driver, which writes the
    mapping file from them anyway (ml-20m: 138k users, 27k items). See the module docstring for bigger scales.
    """
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import functions as F

    first = rows.groupBy(raw).agg(F.min(LINE).alias("first_line")).orderBy("first_line").toArrow()
    ordered = first.column(raw).to_numpy()
    table = pa.table({index: np.arange(len(ordered), dtype=np.int64), raw: ordered.astype(np.int64)})
    return table, F.broadcast(spark.createDataFrame(table))


def first_interactions(rows, users, items):
    """(user, item, timestamp, line): each (user, item) pair once, its first row in (timestamp, line) order."""
    from pyspark.sql import functions as F

    ids = rows.join(users, on=USER_ID).join(items, on=ITEM_ID)
    first = F.min(F.struct(TIMESTAMP, LINE)).alias("first")
    return (ids.groupBy(USER, ITEM).agg(first)
            .select(USER, ITEM, F.col(f"first.{TIMESTAMP}").alias(TIMESTAMP), F.col(f"first.{LINE}").alias(LINE)))


def leave_one_out(pairs):
    """(test positives: user, test_item; train: user, item): each user's last pair in (timestamp, line) order is
    its test positive; the rest is train."""
    from pyspark.sql import functions as F

    last = pairs.groupBy(USER).agg(F.max(F.struct(TIMESTAMP, LINE, ITEM)).alias("last"))
    positives = last.select(USER, F.col(f"last.{ITEM}").alias(TEST_ITEM))
    # One row per user: broadcast (ml-20m: 138k rows, ~2 MB), so the 20M pairs are not sorted for a join.
    train = (pairs.join(F.broadcast(positives), on=USER).where(F.col(ITEM) != F.col(TEST_ITEM)).select(USER, ITEM))
    return positives, train


def sample_negatives(seed: int, user: int, train_items, n_items: int, count: int):
    """`count` items uniform in [0, n_items), none in the user's train items, drawn with replacement from the user's
    own Philox stream (SeedSequence([seed, user])): the same items whatever else is in the batch."""
    import numpy as np

    train = np.unique(np.asarray(train_items, dtype=np.int64))
    if len(train) >= n_items:
        raise ValueError(f"user {user} has all {n_items} items in train: no test negative can be sampled")
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, user])))
    accept = 1.0 - len(train) / n_items
    out = np.empty(count, dtype=np.int64)
    filled = 0
    while filled < count:
        need = count - filled
        draws = rng.integers(0, n_items, size=int(need / accept * 1.1) + 8, dtype=np.int64)
        if len(train):
            at = np.minimum(np.searchsorted(train, draws), len(train) - 1)
            draws = draws[train[at] != draws]
        kept = draws[:need]
        out[filled:filled + len(kept)] = kept
        filled += len(kept)
    return out


def series_of_users(users, items, is_test, seed: int, n_items: int, negatives: int):
    """(user, series) RecordBatch for rows holding every row of each of their users, grouped by user: each user's
    one test row (its positive) first, then negatives sampled outside its train rows' items."""
    import numpy as np
    import pyarrow as pa

    width = negatives + 1
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]]) if len(users) else np.empty(0, dtype=np.int64)
    ends = np.r_[starts[1:], len(users)]
    series = np.empty((len(starts), width), dtype=np.int64)
    for row, (start, end) in enumerate(zip(starts, ends)):
        user, test = int(users[start]), is_test[start:end]
        if int(test.sum()) != 1:
            raise RuntimeError(f"user {user}: {int(test.sum())} test positives, expected 1")
        own = items[start:end]
        series[row, 0] = own[test][0]
        series[row, 1:] = sample_negatives(seed, user, own[~test], n_items, negatives)
    flat = pa.ListArray.from_arrays(pa.array(np.arange(0, len(starts) * width + 1, width, dtype=np.int32)),
                                    pa.array(series.ravel()))
    return pa.RecordBatch.from_arrays([pa.array(users[starts].astype(np.int64)), flat], names=[USER, SERIES])


def test_series_batches(batches: Iterator, seed: int, n_items: int, negatives: int) -> Iterator:
    """mapInArrow body: (user, item, is_test) rows, grouped by user within the partition -> (user, series =
    [test_item, negatives...]). Streams: it holds one Arrow batch and the rows of the user it ends in (a user's
    rows may straddle batches), never one list per user of the partition."""
    import numpy as np

    held = None
    for batch in batches:
        columns = [batch.column(name).to_numpy(zero_copy_only=False) for name in (USER, ITEM, IS_TEST)]
        if held is not None:
            columns = [np.concatenate([h, c]) for h, c in zip(held, columns)]
        users = columns[0]
        if not len(users):
            continue
        others = np.flatnonzero(users != users[-1])
        last = int(others[-1]) + 1 if len(others) else 0  # the first row of the batch's last user
        held = [c[last:] for c in columns]
        if last:
            yield series_of_users(*(c[:last] for c in columns), seed, n_items, negatives)
    if held is not None:
        yield series_of_users(*held, seed, n_items, negatives)


def test_series(positives, train, n_items: int, negatives: int, seed: int):
    """(user, series): every user's positive then its sampled negatives.

    The positives and the train pairs go through one shuffle by user, sorted within each partition (Spark's sort
    spills), and the sampling walks each partition's rows in that order: the heap it needs does not grow with the
    users or their items (the earlier `collect_list` of every user's train items ran out of a 2g heap at ml-20m's
    size). Each user's draws come from its own stream, so the partitioning does not change a byte of the output.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    # Imported, not this file's own function: spark-submit runs this file as __main__ (pickled by value); the
    # module's function is pickled by reference and imported by the workers (PYTHONPATH / --py-files).
    from spark_jobs.movielens.preprocess import test_series_batches as sample

    rows = (positives.select(USER, F.col(TEST_ITEM).alias(ITEM), F.lit(True).alias(IS_TEST))
            .unionByName(train.select(USER, ITEM, F.lit(False).alias(IS_TEST)))
            .repartition(USER).sortWithinPartitions(USER))
    schema = StructType([StructField(USER, LongType(), False), StructField(SERIES, ArrayType(LongType(), False))])
    return rows.mapInArrow(lambda batches: sample(batches, seed, n_items, negatives), schema)


# ---- the driver's part: ordered parquet -> tensors ---------------------------------------------------------------

def part_files(directory: Path) -> list[Path]:
    """Spark's part files in partition order (numeric, not lexical)."""
    return sorted(directory.glob("part-*.parquet"), key=lambda p: int(p.name.split("-")[1]))


def write_mapping(table, target: Path) -> None:
    """One parquet file (index, raw id), in index order."""
    import pyarrow.parquet as pq

    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)


def write_train(parquet_dir: Path, out: Path, items: int) -> int:
    """train_data_0.pt / train_data_1.pt from the (user, item)-ordered parquet, and seen.parquet (the same pairs as
    int32 columns user, item: what a published model leaves out of a user's recommendations, read by row group);
    returns the row count."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.formats.torch_tensor import pair_file, label_file, read_parquet_columns, save_tensor

    pairs = read_parquet_columns(part_files(parquet_dir), [USER, ITEM], np.dtype(np.int64), "train pairs")
    keys = pairs[:, 0] * items + pairs[:, 1]
    if len(keys) > 1 and not np.all(keys[1:] > keys[:-1]):
        raise RuntimeError("train pairs are not strictly ordered by (user, item)")
    save_tensor(out / pair_file("train"), pairs)
    save_tensor(out / label_file("train"), np.ones((len(pairs), 1), dtype=np.float32))
    pq.write_table(pa.table({USER: pairs[:, 0].astype(np.int32), ITEM: pairs[:, 1].astype(np.int32)}),
                   out / SEEN_FILE, row_group_size=1 << 18)
    return len(pairs)


def write_test(parquet_dir: Path, out: Path, users: int, negatives: int) -> int:
    """test_data_0.pt / test_data_1.pt: per user (ascending) its series of negatives + 1 items, positive first."""
    import numpy as np
    import pyarrow.parquet as pq

    from tasks.formats.torch_tensor import pair_file, label_file, save_tensor

    width = negatives + 1
    pairs = np.empty((users * width, 2), dtype=np.int64)
    done = 0
    for path in part_files(parquet_dir):
        for batch in pq.ParquetFile(path).iter_batches(columns=[USER, SERIES]):
            n = batch.num_rows
            if done + n > users:
                raise RuntimeError(f"test series: more than {users} users")
            series = batch.column(SERIES).flatten().to_numpy()
            if len(series) != n * width:
                raise RuntimeError(f"test series: {len(series)} items for {n} users, expected {width} each")
            pairs[done * width:(done + n) * width, 0] = np.repeat(batch.column(USER).to_numpy(), width)
            pairs[done * width:(done + n) * width, 1] = series
            done += n
    if done != users or not np.array_equal(pairs[::width, 0], np.arange(users)):
        raise RuntimeError(f"test series: expected users 0..{users - 1} once each, in order; found {done} series")
    labels = np.zeros((users, width), dtype=np.float32)
    labels[:, 0] = 1.0
    save_tensor(out / pair_file("test"), pairs)
    save_tensor(out / label_file("test"), labels.reshape(-1, 1))
    return len(pairs)


# ---- main --------------------------------------------------------------------------------------------------------

def main(argv: Sequence[str]) -> PreprocessResult:
    from pyspark.sql import functions as F

    from tasks.formats.torch_tensor import write_feature_spec

    args = parse_args(argv)
    configure_logging(f"movielens_preprocess min_ratings={args.min_ratings}")
    started = time.monotonic()
    spark = spark_session("recflow movielens preprocess")
    ratings = spark.read.parquet(args.ratings).select(LINE, USER_ID, ITEM_ID, TIMESTAMP)
    rows_in = ratings.count()
    filtered = filter_min_ratings(ratings, args.min_ratings).persist(reuse_level(spark))
    rows_kept = filtered.count()
    log.info("%d ratings read, %d kept by min_ratings=%d", rows_in, rows_kept, args.min_ratings)
    if rows_kept == 0:
        raise ValueError(f"no ratings left: {rows_in} rows read, none from a user with >= {args.min_ratings} ratings")
    user_ids, users = factorize(spark, filtered, USER_ID, USER)
    item_ids, items = factorize(spark, filtered, ITEM_ID, ITEM)
    pairs = first_interactions(filtered, users, items).persist(reuse_level(spark))
    counts = pairs.agg(F.count("*").alias("pairs"), F.max(USER).alias("user"), F.max(ITEM).alias("item")).first()
    n_pairs, n_users, n_items = int(counts["pairs"]), int(counts["user"]) + 1, int(counts["item"]) + 1
    if (n_users, n_items) != (len(user_ids), len(item_ids)):
        raise RuntimeError(f"max ids + 1 ({n_users} users, {n_items} items) differ from the distinct ids "
                           f"({len(user_ids)}, {len(item_ids)})")
    log.info("%d users, %d items, %d distinct (user, item) pairs (%d duplicates dropped)", n_users, n_items, n_pairs,
             rows_kept - n_pairs)
    positives, train = leave_one_out(pairs)
    series = test_series(positives, train, n_items, args.test_negatives, args.seed)
    with atomic_directory(args.output) as tmp:
        parquet = tmp / PARQUET_TMP
        train.orderBy(USER, ITEM).write.parquet(str(parquet / "train"))
        series.orderBy(USER).write.parquet(str(parquet / "test"))
        log.info("Spark's part done in %.1f s; writing tensors", time.monotonic() - started)
        write_mapping(user_ids, tmp / MAPPINGS_DIR / USERS_FILE)
        write_mapping(item_ids, tmp / MAPPINGS_DIR / ITEMS_FILE)
        train_rows = write_train(parquet / "train", tmp, n_items)
        test_rows = write_test(parquet / "test", tmp, n_users, args.test_negatives)
        shutil.rmtree(parquet)
        if train_rows != n_pairs - n_users:
            raise RuntimeError(f"{train_rows} train rows, expected {n_pairs} pairs - {n_users} test positives")
        write_feature_spec(tmp, n_users, n_items, args.test_negatives + 1)
        seconds = time.monotonic() - started
        stats = {"rows_in": rows_in, "rows_after_filter": rows_kept, "duplicates_dropped": rows_kept - n_pairs,
                 "users": n_users, "items": n_items, "train_rows": train_rows, "test_rows": test_rows,
                 "seconds": round(seconds, 3), "rows_per_s": round(rows_in / max(seconds, 1e-9), 1)}
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
        manifest = Manifest(kind=KIND, inputs=json.loads(args.inputs_json),
                            rows={"train": train_rows, "test": test_rows},
                            extra={"users": n_users, "items": n_items, "min_ratings": args.min_ratings,
                                   "test_negatives": args.test_negatives, "seed": args.seed, "stats": stats})
        write_manifest(tmp, manifest)
    for frame in (filtered, pairs):
        frame.unpersist()
    log.info("dataset %s: %d train rows, %d test rows (%d users x %d), %d items; %.1f s, %.0f rows/s", args.output,
             train_rows, test_rows, n_users, args.test_negatives + 1, n_items, seconds, stats["rows_per_s"])
    return PreprocessResult(str(args.output), stats)


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result)))
