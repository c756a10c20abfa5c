"""Small split-binary datasets with a planted click signal, for tests and demos.

Click probability = sigmoid(bias + sum of per-id effects of the first `signal_features` categoricals
+ numeric_weight * num_0). The other features are noise. A model that learns reaches a test AUC well above 0.5:
about 0.86 with the defaults (chance is 0.5), which tests assert as >= 0.7.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.formats.feature_spec import FeatureSpec
from tasks.formats.split_binary import write_dataset

DEFAULT_CARDINALITIES = (40, 25, 12, 8, 300)


@dataclass(frozen=True)
class PlantedSignal:
    """The generating model: per-id logit effects of the signal features, the numeric weight and the bias."""

    effects: tuple[np.ndarray, ...]
    numeric_weight: float
    bias: float

    def logits(self, numerical: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        total = np.full(len(numerical), self.bias, dtype=np.float64)
        for i, effect in enumerate(self.effects):
            total += effect[categorical[:, i]]
        return total + self.numeric_weight * numerical[:, 0].astype(np.float64)


def make_signal(cardinalities: Sequence[int], signal_features: int, seed: int) -> PlantedSignal:
    rng = np.random.default_rng(seed)
    effects = tuple(rng.normal(0.0, 1.0, size=int(card)) for card in cardinalities[:signal_features])
    return PlantedSignal(effects=effects, numeric_weight=1.0, bias=-1.0)


def _batches(
    signal: PlantedSignal, rows: int, n_numerical: int, cardinalities: Sequence[int], seed: int, chunk_rows: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for start in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - start)
        # float16 is what the files hold: round here so the planted logits see the stored values.
        numerical = rng.normal(0.0, 1.0, size=(n, n_numerical)).astype(np.float16).astype(np.float32)
        categorical = np.stack([rng.integers(0, int(card), size=n) for card in cardinalities], axis=1)
        probability = 1.0 / (1.0 + np.exp(-signal.logits(numerical, categorical)))
        label = rng.random(n) < probability
        yield label, numerical, categorical


def make_synthetic_dataset(
    out_dir: Path,
    train_rows: int = 20_000,
    test_rows: int = 5_000,
    n_numerical: int = 4,
    cardinalities: Sequence[int] = DEFAULT_CARDINALITIES,
    signal_features: int = 3,
    seed: int = 0,
    chunk_rows: int = 4096,
) -> FeatureSpec:
    """Write train/ and test/ split-binary mappings + feature_spec.yaml under out_dir (via tasks.formats.split_binary)."""
    if not 0 < signal_features <= len(cardinalities) or n_numerical < 1:
        raise ValueError(f"need 1..{len(cardinalities)} signal features and >= 1 numerical feature")
    signal = make_signal(cardinalities, signal_features, seed)
    mappings = {
        "train": _batches(signal, train_rows, n_numerical, cardinalities, seed + 1, chunk_rows),
        "test": _batches(signal, test_rows, n_numerical, cardinalities, seed + 2, chunk_rows),
    }
    return write_dataset(Path(out_dir), mappings, list(cardinalities), n_numerical)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="write a small split-binary dataset with a planted click signal")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train_rows", type=int, default=20_000)
    parser.add_argument("--test_rows", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_synthetic_dataset(args.out, args.train_rows, args.test_rows, seed=args.seed)
    print(f"wrote synthetic split-binary dataset to {args.out}", flush=True)
    return args.out


if __name__ == "__main__":
    main()
