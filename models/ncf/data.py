"""NCF dataset reader (NVIDIA's PyTorch NCF layout, reference/nvidia-formats.md §5.2 and Appendix C) and the
per-epoch training sample.

A dataset directory holds feature_spec.yaml whose `source_spec` lists, per mapping (`train`, `test`), chunks of
`type: torch_tensor` with the features each file holds as columns (paths relative to the yaml). `channel_spec`
names the user, item and label features (`user_ch`, `item_ch`, `label_ch`), `feature_spec` gives cardinalities,
and `metadata.test_samples_per_series` (S) says how many consecutive test rows belong to one user: the positive
first, then S-1 sampled negatives.

Tensors are read with `torch.load(weights_only=True)` and turned into numpy at once; torch is imported only here,
inside the loader, so a TensorFlow trainer does not load it otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.formats.feature_spec import read_spec_document

FEATURE_SPEC_FILE = "feature_spec.yaml"
USER_CHANNEL, ITEM_CHANNEL, LABEL_CHANNEL = "user_ch", "item_ch", "label_ch"
TORCH_TENSOR = "torch_tensor"
DEFAULT_SAMPLES_PER_SERIES = 101  # NVIDIA: 1 positive + --valid_negative 100


class NcfDataError(ValueError):
    """A dataset that does not follow the NCF feature-spec layout; the message names the file and what is wrong."""


@dataclass(frozen=True)
class NcfSpec:
    path: Path
    user: str
    item: str
    label: str
    users: int  # cardinalities: ids are in [0, users) and [0, items)
    items: int
    samples_per_series: int
    source_spec: dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Interactions:
    """One mapping's rows as numpy: user and item ids (int64) and labels (float32)."""

    users: np.ndarray
    items: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.users.shape[0])


@dataclass(frozen=True)
class RankingSeries:
    """The test mapping as [U, S] arrays: row u is one user's series, column 0 its positive."""

    users: np.ndarray  # [U] the user of each series
    items: np.ndarray  # [U, S]

    @property
    def samples_per_series(self) -> int:
        return int(self.items.shape[1])


def _one_feature(spec_path: Path, channel_spec: dict[str, Any], channel: str) -> str:
    features = channel_spec.get(channel)
    if not isinstance(features, list) or len(features) != 1:
        raise NcfDataError(f"{spec_path}: channel_spec.{channel} must list exactly one feature, got {features!r}")
    return str(features[0])


def read_spec(dataset_dir: Path | str, feature_spec: str = FEATURE_SPEC_FILE) -> NcfSpec:
    path = Path(dataset_dir) / feature_spec
    document = read_spec_document(path, NcfDataError)
    features, channels = document.get("feature_spec") or {}, document.get("channel_spec") or {}
    user, item = _one_feature(path, channels, USER_CHANNEL), _one_feature(path, channels, ITEM_CHANNEL)
    label = _one_feature(path, channels, LABEL_CHANNEL)
    cards = {}
    for name in (user, item):
        card = (features.get(name) or {}).get("cardinality")
        if not isinstance(card, int) or card < 1:
            raise NcfDataError(f"{path}: feature_spec.{name}.cardinality must be a positive integer, got {card!r}")
        cards[name] = card
    samples = (document.get("metadata") or {}).get("test_samples_per_series", DEFAULT_SAMPLES_PER_SERIES)
    if not isinstance(samples, int) or samples < 2:
        raise NcfDataError(f"{path}: metadata.test_samples_per_series must be an integer >= 2, got {samples!r}")
    return NcfSpec(path=path, user=user, item=item, label=label, users=cards[user], items=cards[item],
                   samples_per_series=samples, source_spec=document.get("source_spec") or {})


def _load_tensor(path: Path) -> np.ndarray:
    import torch

    try:
        tensor = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise NcfDataError(f"{path}: missing data file") from None
    except Exception as exc:  # foreign or hostile files: the safe loader refuses them
        raise NcfDataError(f"{path}: not a tensor file ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") \
            from None
    if not isinstance(tensor, torch.Tensor):
        raise NcfDataError(f"{path}: holds a {type(tensor).__name__}, not a tensor")
    array = tensor.numpy()
    return array.reshape(-1, 1) if array.ndim == 1 else array


def load_mapping(spec: NcfSpec, mapping: str) -> Interactions:
    """Every column of `mapping` as numpy, checked against the spec (ids within cardinality, equal row counts)."""
    chunks = spec.source_spec.get(mapping)
    if not chunks:
        raise NcfDataError(f"{spec.path}: source_spec has no mapping {mapping!r}")
    columns: dict[str, np.ndarray] = {}
    for chunk in chunks:
        if chunk.get("type") != TORCH_TENSOR or len(chunk.get("files") or []) != 1:
            raise NcfDataError(f"{spec.path}: {mapping} chunk {chunk.get('features')} must be type "
                               f"{TORCH_TENSOR} with one file (NVIDIA's loader reads one file per chunk)")
        file = spec.path.parent / chunk["files"][0]
        array = _load_tensor(file)
        names = list(chunk.get("features") or [])
        if array.ndim != 2 or array.shape[1] != len(names):
            raise NcfDataError(f"{file}: shape {tuple(array.shape)}, expected [rows, {len(names)}] for {names}")
        for index, name in enumerate(names):
            columns[name] = array[:, index]
    missing = [n for n in (spec.user, spec.item, spec.label) if n not in columns]
    if missing:
        raise NcfDataError(f"{spec.path}: mapping {mapping!r} has no column for {missing}")
    rows = {name: columns[name].shape[0] for name in (spec.user, spec.item, spec.label)}
    if len(set(rows.values())) != 1:
        raise NcfDataError(f"{spec.path}: mapping {mapping!r} columns differ in length {rows}")
    users = columns[spec.user].astype(np.int64, copy=False)
    items = columns[spec.item].astype(np.int64, copy=False)
    for name, ids, card in ((spec.user, users, spec.users), (spec.item, items, spec.items)):
        if ids.size and (ids.min() < 0 or ids.max() >= card):
            raise NcfDataError(f"{spec.path}: mapping {mapping!r} {name} ids span [{ids.min()}, {ids.max()}], "
                               f"outside the cardinality {card}")
    return Interactions(users=users, items=items, labels=columns[spec.label].astype(np.float32, copy=False))


def ranking_series(spec: NcfSpec, rows: Interactions) -> RankingSeries:
    """Reshape the test mapping into one series per user and check NVIDIA's layout (one user per series, the
    positive first)."""
    s = spec.samples_per_series
    if len(rows) == 0 or len(rows) % s:
        raise NcfDataError(f"{spec.path}: {len(rows)} test rows are not a whole number of series of {s}")
    users = rows.users.reshape(-1, s)
    labels = rows.labels.reshape(-1, s)
    if (users != users[:, :1]).any():
        bad = int(np.argmax((users != users[:, :1]).any(axis=1)))
        raise NcfDataError(f"{spec.path}: test series {bad} (rows {bad * s}..{bad * s + s - 1}) mixes users")
    if (labels[:, 0] != 1).any() or (labels[:, 1:] != 0).any():
        bad = int(np.argmax((labels[:, 0] != 1) | (labels[:, 1:] != 0).any(axis=1)))
        raise NcfDataError(f"{spec.path}: test series {bad} is not [positive, {s - 1} negatives] (labels "
                           f"{labels[bad, :5].tolist()}...)")
    return RankingSeries(users=users[:, 0].copy(), items=rows.items.reshape(-1, s))


def epoch_sample(positives: Interactions, n_items: int, negatives: int, seed: int,
                 epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, labels) of one epoch: every positive plus `negatives` items per positive drawn uniformly from
    [0, n_items) without checking them against the user's positives (NVIDIA's trick), shuffled.

    Depends only on (seed, epoch): every worker draws the same sample and takes its own shard, and a resumed run
    sees the epoch it was killed in again. Ids are int32 where they fit (the values are those of the int64 draw), and
    each array is built in place and shuffled one at a time: at ml-20m's size (99.5M samples) the epoch holds
    ~1.2 GB plus one 0.8 GB permutation, not the ~5 GB of int64 copies it once took.
    """
    rng = np.random.default_rng([seed, epoch])
    n = len(positives)
    total = n * (1 + negatives)
    fits = n_items <= np.iinfo(np.int32).max and (n == 0 or int(positives.users.max()) <= np.iinfo(np.int32).max)
    ids = np.int32 if fits else np.int64
    users = np.empty(total, dtype=ids)
    users[:n] = positives.users
    users[n:].reshape(n, negatives)[:] = positives.users[:, None]  # np.repeat's order, without its int64 copy
    items = np.empty(total, dtype=ids)
    items[:n] = positives.items
    items[n:] = rng.integers(0, n_items, size=n * negatives, dtype=np.int64)
    labels = np.zeros(total, dtype=np.float32)
    labels[:n] = 1.0
    order = rng.permutation(total)
    users = users[order]  # one array at a time: each unshuffled copy is freed as its shuffled one is made
    items = items[order]
    labels = labels[order]
    return users, items, labels


def steps_per_epoch(positives: int, negatives: int, global_batch: int) -> int:
    """Full global batches per epoch (the last partial batch is dropped, as NVIDIA does)."""
    return positives * (1 + negatives) // global_batch


def worker_batch(arrays: tuple[np.ndarray, ...], step_in_epoch: int, global_batch: int, worker: int,
                 workers: int) -> tuple[np.ndarray, ...]:
    """This worker's contiguous share of global batch `step_in_epoch` (global_batch is divisible by workers)."""
    local = global_batch // workers
    start = step_in_epoch * global_batch + worker * local
    return tuple(a[start:start + local] for a in arrays)
