"""NVTabular 23.08 operators as nvt_jobs/outbrain.py needs them on CPU (pandas) as well as on GPU (cudf): each fixes
one thing the stock operator does differently, or not at all, on a CPU Dataset (docs/OUTBRAIN.md, "NVTabular
engine"). Factories, so NVTabular is imported only when a workflow is built."""

from __future__ import annotations

import numpy as np
import pandas as pd

NULL_ID = np.iinfo(np.int64).min  # a null id's value when hashed (ids are >= 0, missing publishers < 0)


def exact_fill_median():
    from nvtabular.ops import FillMedian

    class ExactFillMedian(FillMedian):
        """FillMedian with the exact median (the mean of the two middle values, as Spark's numeric_stats.sql): the
        days are integers in [0, 3650], so the fit counts values instead of dask's approximate quantile."""

        def fit(self, col_selector, ddf):
            return {col: ddf[col].dropna().value_counts() for col in col_selector.names}

        def fit_finalize(self, dask_stats):
            for col, counts in dask_stats.items():
                counts = counts.sort_index()
                below, total = counts.cumsum().to_numpy(), int(counts.sum())
                days = counts.index.to_numpy(np.float64)
                if total == 0:
                    self.medians[col] = 0.0
                    continue
                low = days[np.searchsorted(below, (total + 1) // 2)]
                high = days[np.searchsorted(below, total // 2 + 1)]
                self.medians[col] = float((low + high) / 2)

    return ExactFillMedian()


def nullable_join_groupby(**kwargs):
    from nvtabular.ops import JoinGroupby

    class NullableJoinGroupby(JoinGroupby):
        """JoinGroupby whose `count` of a key unseen at fit may be null on CPU: JoinGroupby casts the joined count to
        int32 (AGG_DTYPES), which pandas cannot do with a null (cudf can); here it stays float64 until
        train_statistic fills 0. The module-level table is swapped for this call only (one thread per worker)."""

        def transform(self, col_selector, df):
            from nvtabular.ops import join_groupby

            if not isinstance(df, pd.DataFrame):
                return super().transform(col_selector, df)
            saved = join_groupby.AGG_DTYPES
            join_groupby.AGG_DTYPES = {**saved, "count": np.float64}
            try:
                return super().transform(col_selector, df)
            finally:
                join_groupby.AGG_DTYPES = saved

    return NullableJoinGroupby(**kwargs)


def value_hashes(col):
    """A hash of each value alone: pandas' hash_pandas_object(index=False), on either device (merlin's hash_series
    on pandas goes through dask's hash_object_dispatch, which hashes the row's index with the value: a value's bucket
    would change with its row number). On a GPU the column is hashed on the host too, not with cudf's murmur3: a
    workflow fitted on one device must give the same ids when predict or a transform applies it on the other. The
    nullable ids (float64 columns) are hashed as int64, a null as NULL_ID: pandas mixes the bits of small whole
    floats poorly (3 collisions among 339 document ids in 100000 buckets, none as int64)."""
    if col.dtype.kind == "f":
        col = col.fillna(NULL_ID).astype("int64")
    if isinstance(col, pd.Series):
        return pd.util.hash_pandas_object(col, index=False).to_numpy()
    import cupy

    return cupy.asarray(pd.util.hash_pandas_object(col.to_pandas(), index=False).to_numpy())


def value_hash_bucket(buckets: dict[str, int]):
    from nvtabular.ops import HashBucket

    class ValueHashBucket(HashBucket):
        """HashBucket whose bucket is a function of the value alone (value_hashes), as on GPU."""

        def transform(self, col_selector, df):
            for col, count in self.num_buckets.items():
                df[col] = (value_hashes(df[col]) % np.uint64(count)).astype(self.output_dtype)
            return df

    return ValueHashBucket(buckets)


def document_rows(index: np.ndarray, ids) -> np.ndarray:
    """Rows of the term matrices for document ids (null or without terms: the empty last row)."""
    ids = ids.to_pandas() if hasattr(ids, "to_pandas") else ids  # cudf on GPU: the lookup runs on the host
    values = ids.fillna(-1).to_numpy(np.float64)
    found = np.minimum(np.searchsorted(index, values), len(index) - 1) if len(index) else np.zeros(len(values), int)
    known = (index[found] == values) if len(index) else np.zeros(len(values), bool)
    return np.where(known, found, len(index)).astype(np.int64)


def document_similarity(matrix, index: np.ndarray):
    from nvtabular.ops import ColumnSimilarity

    class DocumentSimilarity(ColumnSimilarity):
        """ColumnSimilarity over a matrix whose rows are `index` (the documents with terms), not document ids: the
        ids are looked up first (NVIDIA's matrices are indexed by id, which needs every id below the row count)."""

        def __init__(self, features, documents: np.ndarray):
            super().__init__(features, metric="inner", on_device=False)
            self.documents = documents

        def transform(self, col_selector, df):
            rows = type(df)({name: document_rows(self.documents, df[name]) for name in col_selector.names})
            return super().transform(col_selector, rows)

    return DocumentSimilarity(matrix, index)
