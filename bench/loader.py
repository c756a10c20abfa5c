"""Figure 3, loader: SplitBinaryDataset batches/s and MB/s against np.fromfile: raw batches (the files' dtypes, the
GPU path: decoded on the device), host-decoded batches (the CPU path) without and with the prefetch thread.

The dataset is the Criteo-shaped split-binary train mapping of bench.datasets (13 float16 numericals, 26
categoricals of int8/int16/int32 by cardinality, a bool label). One sample = one full pass over every batch of the
training batch size; the consumer only holds each batch (no model), so this is the loader alone. It drops each batch
before taking the next, as a training step does, so the reader's span buffers are reused (models/dlrm/data.py
`_SpanBuffers`); a consumer holding many batches gets fresh buffers instead. The floor reads the same bytes with
np.fromfile, file by file, in one sequential pass. The files are read once before measuring, so every side reads
from the page cache (a cold-cache number needs dropping caches, which needs root). Samples are interleaved (floor,
raw, decoded, decoded + prefetch) in each repeat, and the ratios are paired. A sample makes as many passes as it
takes the floor to run for MIN_SAMPLE_S (timer noise on a sub-10 ms pass would swamp the figure); every side makes
the same number of passes.
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

from bench.common import Figure, Mode, Stat, log, paired_ratio
from bench.datasets import split_binary_dataset
from bench.floors import read_seconds

SECTION = "3 loader"
PREFETCH_DEPTH = 4  # models.dlrm.config.DlrmConfig.prefetch_depth's default
MIN_SAMPLE_S = 0.5


def loader_pass(dataset_dir: Path, batch_size: int, depth: int, raw: bool = False) -> tuple[int, int, float]:
    """(batches, bytes, seconds) of reading every batch of the train mapping through PrefetchingReader."""
    from models.dlrm.data import PrefetchingReader, SplitBinaryDataset
    from tasks.formats.feature_spec import FeatureSpec

    spec = FeatureSpec.from_yaml(dataset_dir / "feature_spec.yaml")
    with SplitBinaryDataset(spec, "train", batch_size) as dataset:
        batches = 0
        start = time.perf_counter()
        with PrefetchingReader(dataset, range(len(dataset)), depth, raw=raw) as reader:
            for _batch in reader:
                batches += 1
        seconds = time.perf_counter() - start
        return batches, dataset.stats.bytes, seconds


def _passes(fn, count: int) -> tuple[int, int, float]:
    """fn() -> (units, bytes, seconds), run `count` times; the totals."""
    units = total = 0
    seconds = 0.0
    for _ in range(count):
        u, b, s = fn()
        units, total, seconds = units + u, total + b, seconds + s
    return units, total, seconds


def measure(mode: Mode) -> dict:
    dataset_dir = split_binary_dataset(mode.loader_rows)
    batch = mode.train.batch_size
    mapping = dataset_dir / "train"
    read_seconds(mapping)  # warm the page cache; not a sample
    total, warm = read_seconds(mapping)
    passes = max(1, math.ceil(MIN_SAMPLE_S / max(warm, 1e-6)))
    samples: dict[str, list[float]] = {"floor_s": [], "raw_s": [], "plain_s": [], "prefetch_s": []}
    batches = 0
    sides = {"raw_s": (0, True), "plain_s": (0, False), "prefetch_s": (PREFETCH_DEPTH, False)}
    for repeat in range(mode.repeats):
        samples["floor_s"].append(_passes(lambda: (0, *read_seconds(mapping)), passes)[2])
        for key, (depth, raw_batches) in sides.items():
            batches, loaded, seconds = _passes(partial(loader_pass, dataset_dir, batch, depth, raw_batches), passes)
            if loaded != total * passes:  # every side must read the floor's bytes, or the ratio means nothing
                raise RuntimeError(f"loader ({key}) read {loaded} bytes but {passes} passes over the mapping hold "
                                   f"{total * passes}")
            samples[key].append(seconds)
        log.info("  loader repeat %d: floor %.3f s, raw %.3f s, decoded %.3f s, decoded + prefetch %.3f s",
                 repeat + 1, samples["floor_s"][-1], samples["raw_s"][-1], samples["plain_s"][-1],
                 samples["prefetch_s"][-1])
    # Per sample: `passes` passes, so batches and bytes are per sample too.
    return {"dataset": str(dataset_dir), "rows": mode.loader_rows, "batch_size": batch, "passes": passes,
            "batches": batches, "bytes": total * passes, **samples}


def figures(raw: dict) -> list[Figure]:
    batches, megabytes = raw["batches"], raw["bytes"] / 1e6
    floor_s = raw["floor_s"]
    floor_mbs = Stat.of([megabytes / s for s in floor_s])
    floor_bps = Stat.of([batches / s for s in floor_s])
    rows = []
    variants = [("raw_s", "raw batches (file dtypes, GPU path)"), ("plain_s", "decoded on the host (CPU path)"),
                ("prefetch_s", f"decoded, prefetch thread depth {PREFETCH_DEPTH}")]
    for key, label in [v for v in variants if v[0] in raw]:  # results from before raw batches lack raw_s
        seconds = raw[key]
        ratio = paired_ratio(floor_s, seconds)  # same bytes: the time ratio is the throughput ratio
        rows.append(Figure(SECTION, f"SplitBinaryDataset, {label}, batch {raw['batch_size']}", "batches/s",
                           Stat.of([batches / s for s in seconds]), "np.fromfile per file (same bytes, as batches)",
                           floor_bps, ratio, "paired", ">= 0.8"))
        rows.append(Figure(SECTION, f"SplitBinaryDataset, {label}", "MB/s", Stat.of([megabytes / s for s in seconds]),
                           "np.fromfile per file, one sequential pass", floor_mbs, ratio, "paired", ">= 0.8",
                           note=f"{raw['rows']:,} rows, {megabytes / raw['passes']:,.0f} MB, {raw['passes']} "
                                f"pass(es) per sample, page cache warm"))
    return rows
