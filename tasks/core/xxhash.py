"""Spark SQL's xxhash64 (org.apache.spark.sql.catalyst.expressions.XxHash64, seed 42) in numpy, vectorised: the
engines that must order or split rows exactly as a Spark job does compute the same hashes without a JVM. numpy
only, so NVTabular's environment imports it too."""

from __future__ import annotations

import numpy as np

_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                                   0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))
SPARK_HASH_SEED = 42


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def xxhash64_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64.hashInt: a 4-byte int hashed with the running hash as seed (uint64 arrays, wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        h = seed + _P5 + np.uint64(4)
        h = h ^ (np.asarray(values, dtype=np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)) * _P1
        return _fmix(_rotl(h, 23) * _P2 + _P3)


def xxhash64_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64.hashLong: an 8-byte long hashed with the running hash as seed."""
    with np.errstate(over="ignore"):
        h = seed + _P5 + np.uint64(8)
        h = h ^ _rotl(np.asarray(values, dtype=np.int64).view(np.uint64) * _P2, 31) * _P1
        return _fmix(_rotl(h, 27) * _P1 + _P4)


def spark_xxhash64(literal: int, *longs: np.ndarray) -> np.ndarray:
    """F.xxhash64(F.lit(literal), *bigint columns) as int64, rows of non-null columns: a literal that fits an int
    hashes as 4 bytes, a bigger one as 8; each column is hashed with the previous hash as seed."""
    n = len(longs[0]) if longs else 1
    h = np.full(n, SPARK_HASH_SEED, dtype=np.uint64)
    literal_array = np.full(n, literal, dtype=np.int64)
    h = xxhash64_int(literal_array, h) if -(1 << 31) <= literal < (1 << 31) else xxhash64_long(literal_array, h)
    for values in longs:
        h = xxhash64_long(values, h)
    return h.view(np.int64)
