"""CSV files for any CSV FeatureSpec, as NVIDIA's gen_csv.py writes them (one file per chunk, no header, the
chunk's features as columns in order, ids in [0, cardinality)), but with a planted signal so that a model can learn:
the label is a Bernoulli draw whose logit depends on the first few categorical and numerical features. (NVIDIA's
gen_csv always writes label 0.) Used by the demo and the tests.

Rows are aligned across the chunk files of a mapping: line k of every file is row k, as the transcode reads them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.byo.spec import MAPPINGS, csv_chunks, declared_cardinalities
from tasks.formats.feature_spec import CATEGORICAL_CHANNEL, LABEL_CHANNEL, NUMERICAL_CHANNEL, FeatureSpec
from tasks.core.storage import atomic_file

SIGNAL_FEATURES = 3      # categoricals and numericals that carry the signal (each)
AUTO_CARDINALITY = 1000  # ids drawn for a feature whose cardinality is 'auto'
BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class PlantedSignal:
    """logit = bias + sum of a per-id effect of the first categoricals + weights . first numericals."""

    effects: dict[str, np.ndarray]   # categorical name -> effect per id
    weights: dict[str, float]        # numerical name -> weight (values are uniform in [-1, 1))
    bias: float


def planted_signal(spec: FeatureSpec, seed: int, strength: float = 2.0) -> PlantedSignal:
    rng = np.random.default_rng(seed)
    cards = generation_cardinalities(spec)
    effects = {name: rng.normal(0.0, strength, size=cards[name])
               for name in spec.channel_spec[CATEGORICAL_CHANNEL][:SIGNAL_FEATURES]}
    weights = {name: float(rng.choice([-1.0, 1.0]) * strength)
               for name in spec.channel_spec[NUMERICAL_CHANNEL][:SIGNAL_FEATURES]}
    return PlantedSignal(effects, weights, bias=0.0)


def generation_cardinalities(spec: FeatureSpec, auto: int = AUTO_CARDINALITY) -> dict[str, int]:
    """Ids are drawn below the declared cardinality ('auto': below `auto`)."""
    return {name: card or auto for name, card in declared_cardinalities(spec).items()}


def _rows(spec: FeatureSpec, signal: PlantedSignal, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    cards = generation_cardinalities(spec)
    values: dict[str, np.ndarray] = {}
    for name, card in cards.items():
        # Zipf-like ids: a few frequent ids per feature, so embeddings see enough of each to learn their effect.
        values[name] = np.minimum(rng.zipf(1.3, size=n) - 1, card - 1).astype(np.int64)
    for name in spec.channel_spec[NUMERICAL_CHANNEL]:
        values[name] = rng.uniform(-1.0, 1.0, size=n)
    logit = np.full(n, signal.bias)
    for name, effect in signal.effects.items():
        logit += effect[values[name]]
    for name, weight in signal.weights.items():
        logit += weight * values[name]
    values[spec.channel_spec[LABEL_CHANNEL][0]] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return values


def _format(values: np.ndarray, float_format: str) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.char.mod(float_format, values)
    return values.astype(str)


def write_csvs(spec: FeatureSpec, out_dir: Path, rows: dict[str, int], seed: int = 0,
               float_format: str = "%.5g") -> dict[str, int]:
    """Write every chunk file of the spec under out_dir (the spec's relative paths), `rows[mapping]` rows each;
    each file appears whole or not at all. float_format: how numericals are written ("%.17g": every bit of the
    float64, as NVIDIA's gen_csv writes them through pandas). Returns rows per mapping."""
    out_dir = Path(out_dir)
    signal = planted_signal(spec, seed)
    rng = np.random.default_rng(seed + 1)
    for mapping in MAPPINGS:
        chunks = csv_chunks(spec, mapping)
        with contextlib.ExitStack() as stack:  # each file renamed into place only when every write finished
            files = {name: stack.enter_context(atomic_file(out_dir / name, "w"))
                     for name in dict.fromkeys(chunk.file for chunk in chunks)}
            for start in range(0, rows[mapping], BLOCK_ROWS):
                values = _rows(spec, signal, min(BLOCK_ROWS, rows[mapping] - start), rng)
                for chunk in chunks:
                    columns = [_format(values[name], float_format) for name in chunk.features]
                    text = "\n".join(",".join(parts) for parts in zip(*columns)) + "\n"
                    files[chunk.file].write(text)
    return dict(rows)
