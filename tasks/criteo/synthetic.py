"""Synthetic Criteo Terabyte day files with a planted, learnable signal.

The public dataset cannot be downloaded here, so this writes the exact public format: TSV, no header, 40 fields per
row (label, 13 integer fields that may be negative or empty, 26 categorical fields as 8-hex strings or empty),
`day_N` files, optionally gzipped. Categorical values follow a bounded power law (a few values are very common, a
long tail is rare), so frequency thresholding behaves as on the real data. The click label is drawn from a logistic
model over a handful of categorical features and one integer feature, with per-value weights fixed by the seed and
shared by every day, so a model trained on some days scores well above AUC 0.5 on another.

Usage: python -m tasks.criteo.synthetic OUT_DIR --days 0-2 --rows 100000 [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, NUM_CAT_FEATURES, NUM_INT_FEATURES
from tasks.core.storage import atomic_file

log = logging.getLogger(__name__)

# Vocabulary sizes per categorical column: the shape of criteo_f15's cardinalities, scaled down ~100x.
VOCAB_SIZES: tuple[int, ...] = (
    60000, 3000, 2000, 1000, 2000, 4, 700, 140, 63, 40000, 20000, 10000, 11,
    220, 1000, 104, 4, 97, 15, 50000, 25000, 40000, 3000, 1200, 97, 35,
)
# Columns that carry the planted signal (index into CAT_COLUMNS) and the integer feature that does.
SIGNAL_CATEGORICALS: tuple[int, ...] = (0, 2, 5, 8, 13, 16, 24)
SIGNAL_INTEGER = 0
_HEX_MULTIPLIER = 2654435761  # odd, so id -> (id * m + salt) mod 2**32 is a bijection: no collisions in a column


@dataclass(frozen=True)
class PlantedSignal:
    """The logistic model labels are drawn from; identical for every day of one seed."""

    bias: float
    cat_weights: dict[int, np.ndarray]  # column index -> weight per value id
    int_weight: float

    @classmethod
    def from_seed(cls, seed: int, weight_scale: float = 1.2) -> PlantedSignal:
        rng = np.random.default_rng(seed)
        weights = {c: rng.normal(0.0, weight_scale, VOCAB_SIZES[c]) for c in SIGNAL_CATEGORICALS}
        return cls(bias=-1.6, cat_weights=weights, int_weight=0.5)

    def logits(self, cat_ids: np.ndarray, cat_missing: np.ndarray, int_values: np.ndarray,
               int_missing: np.ndarray) -> np.ndarray:
        logit = np.full(cat_ids.shape[0], self.bias)
        for c, weights in self.cat_weights.items():
            logit += np.where(cat_missing[:, c], 0.0, weights[cat_ids[:, c]])
        x = np.log1p(np.clip(int_values[:, SIGNAL_INTEGER], 0, None))
        logit += self.int_weight * np.where(int_missing[:, SIGNAL_INTEGER], 0.0, x - 1.5)
        return logit


def _power_law_cdf(size: int, alpha: float = 1.15) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


class CriteoDayGenerator:
    """Generates row blocks of one synthetic day; vocabularies and signal depend only on the seed."""

    def __init__(self, seed: int = 1234):
        self.seed = seed
        self.signal = PlantedSignal.from_seed(seed)
        self._cdfs = [_power_law_cdf(v) for v in VOCAB_SIZES]
        salt_rng = np.random.default_rng(seed + 1)
        salts = salt_rng.integers(0, 2**32, NUM_CAT_FEATURES, dtype=np.uint64)
        self._hex_vocab = [
            np.char.mod("%08x", (np.arange(v, dtype=np.uint64) * _HEX_MULTIPLIER + salts[c]) % (2**32))
            for c, v in enumerate(VOCAB_SIZES)
        ]
        self._cat_missing_rate = salt_rng.uniform(0.0, 0.35, NUM_CAT_FEATURES)
        self._int_missing_rate = salt_rng.uniform(0.0, 0.4, NUM_INT_FEATURES)
        self._int_scale = salt_rng.uniform(0.5, 4.0, NUM_INT_FEATURES)

    def blocks(self, day: int, rows: int, block_rows: int = 65536) -> Iterator[dict[str, np.ndarray]]:
        """Yield column blocks (label, int_*, cat_*) for `rows` rows of the given day."""
        rng = np.random.default_rng([self.seed, day])
        done = 0
        while done < rows:
            n = min(block_rows, rows - done)
            yield self._block(rng, n)
            done += n

    def _block(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        cat_ids = np.empty((n, NUM_CAT_FEATURES), dtype=np.int64)
        for c, cdf in enumerate(self._cdfs):
            cat_ids[:, c] = np.searchsorted(cdf, rng.random(n))
        np.minimum(cat_ids, np.array(VOCAB_SIZES) - 1, out=cat_ids)
        cat_missing = rng.random((n, NUM_CAT_FEATURES)) < self._cat_missing_rate
        # Heavy-tailed counts; int_1 can be negative (as in the real data, where -1..-3 occur).
        int_values = np.floor(rng.lognormal(0.0, self._int_scale, (n, NUM_INT_FEATURES))).astype(np.int64)
        int_values[:, 1] -= rng.integers(0, 4, n) * (rng.random(n) < 0.1)
        int_missing = rng.random((n, NUM_INT_FEATURES)) < self._int_missing_rate
        logits = self.signal.logits(cat_ids, cat_missing, int_values, int_missing)
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logits))).astype(np.int8)
        block: dict[str, np.ndarray] = {LABEL: labels}
        for i, name in enumerate(INT_COLUMNS):
            block[name] = np.where(int_missing[:, i], "", int_values[:, i].astype(str))
        for c, name in enumerate(CAT_COLUMNS):
            block[name] = np.where(cat_missing[:, c], "", self._hex_vocab[c][cat_ids[:, c]])
        return block


def format_block(block: dict[str, np.ndarray]) -> bytes:
    """Criteo TSV text of a block: one line per row, 40 tab-separated fields, each line ending in a newline."""
    columns = [block[LABEL].astype(str)] + [block[c] for c in INT_COLUMNS] + [block[c] for c in CAT_COLUMNS]
    table = np.stack(columns, axis=1)
    lines = ["\t".join(row) for row in table.tolist()]
    return ("\n".join(lines) + "\n").encode("ascii")


def write_criteo_day(path: Path, day: int, rows: int, seed: int = 1234, compress: bool = False,
                     generator: CriteoDayGenerator | None = None) -> Path:
    """Write one synthetic day file atomically (gzip-compressed when `compress`). Returns the path written."""
    generator = generator or CriteoDayGenerator(seed)
    start = time.monotonic()
    with atomic_file(path, "wb") as raw:
        # filename and mtime fixed: the gzip header must not carry the temporary file's name or the time.
        sink = (gzip.GzipFile(filename=path.name.removesuffix(".gz"), fileobj=raw, mode="wb", compresslevel=3,
                              mtime=0) if compress else raw)
        for block in generator.blocks(day, rows):
            sink.write(format_block(block))
        if compress:
            sink.close()
    log.info("wrote synthetic Criteo day %d: %d rows to %s in %.1f s", day, rows, path, time.monotonic() - start)
    return path


def ensure_days(directory: Path, days: Sequence[int], rows: int, seed: int = 1234) -> Path:
    """Write day_N files into `directory` unless identical ones (same day, rows, seed) are already there."""
    generator = None
    for day in days:
        path = directory / f"day_{day}"
        stamp = path.with_name(path.name + ".synthetic.json")
        wanted = {"day": day, "rows": rows, "seed": seed}
        if path.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
            continue
        generator = generator or CriteoDayGenerator(seed)
        write_criteo_day(path, day, rows, generator=generator)
        stamp.write_text(json.dumps(wanted))
    return directory


def parse_day_range(text: str) -> list[int]:
    """'3' -> [3]; '0-2' -> [0, 1, 2]."""
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--days", type=parse_day_range, default=[0], help="day or range, e.g. 0-2")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per day")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--gzip", action="store_true", help="write day_N.gz")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[Path]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    generator = CriteoDayGenerator(args.seed)
    suffix = ".gz" if args.gzip else ""
    return [
        write_criteo_day(args.out_dir / f"day_{day}{suffix}", day, args.rows, compress=args.gzip,
                         generator=generator)
        for day in args.days
    ]


if __name__ == "__main__":
    main()
