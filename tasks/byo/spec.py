"""A user's CSV FeatureSpec (NVIDIA's transcoder input, reference/nvidia-formats.md §6 and Appendix A): loaded,
checked, and turned into the split-binary spec the transcode writes.

The input spec is NVIDIA's yaml with `type: csv` chunks: a chunk may hold several features (its CSV's columns, in
order), dtypes are optional (NVIDIA's transcoder ignores them), and a categorical's cardinality is an integer or
`auto` (max id + 1, found by the transcode). Otherwise NVIDIA's check_feature_spec rules hold: mappings exactly
train and test, channels exactly categorical / numerical / label with one label, every feature in one channel and in
one chunk of every mapping, one file per chunk. A bad spec fails with one line naming the key at fault.

The row rules (what a CSV value must look like) live here too, as regexes that the Python validation
(tasks/byo/validation.py) and the Spark transcode (spark_jobs/byo/transcode.py) both apply, so the two agree on
which rows are bad.
"""

from __future__ import annotations

import logging
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.formats.feature_spec import (AUTO_CARDINALITY, CARDINALITY_SELECTOR, CATEGORICAL_CHANNEL,
                                        DTYPE_SELECTOR, FEATURES_SELECTOR, FILES_SELECTOR, LABEL_CHANNEL,
                                        NUMERICAL_CHANNEL, TEST_MAPPING, TRAIN_MAPPING, TYPE_SELECTOR, FeatureSpec,
                                        FeatureSpecError, _chunk_file_error)

CSV_CHUNK = "csv"
MAPPINGS = (TRAIN_MAPPING, TEST_MAPPING)
CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL)
DELIMITER = ","
# Row rules. NVIDIA's gen_csv writes integers as floats ("4.0") when a chunk mixes types, and pandas reads them
# back as the same integer: an integral float is accepted for ids and labels.
CATEGORICAL_PATTERN = r"^[0-9]{1,18}(?:\.0*)?$"
NUMERICAL_PATTERN = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?$"
LABEL_PATTERN = r"^[01](?:\.0*)?$"
FLOAT16_MAX = 65504.0  # numericals are stored as float16: larger magnitudes would become inf
RULE_TEXT = {
    CATEGORICAL_CHANNEL: "is not a non-negative integer id",
    NUMERICAL_CHANNEL: "is not a number",
    LABEL_CHANNEL: "is not 0 or 1",
}
MAX_SPEC_BYTES = 1 << 20      # a spec file; NVIDIA's Criteo spec is 6 KB
MAX_CARDINALITY = int(np.iinfo(np.int32).max) - 1  # the split-binary ids are int32 at most (feature_spec's dtypes)
MAX_SPEC_NODES = 100_000      # YAML nodes with aliases expanded (~10,000 features)
MAX_SPEC_CHARS = 4 << 20      # scalar characters with aliases expanded
SHOWN_CHARS = 200             # a value quoted in an error line
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60
PATTERNS = {CATEGORICAL_CHANNEL: CATEGORICAL_PATTERN, NUMERICAL_CHANNEL: NUMERICAL_PATTERN,
            LABEL_CHANNEL: LABEL_PATTERN}


@dataclass(frozen=True)
class CsvChunk:
    """One CSV file of a mapping: where it is (relative to the spec) and its columns, in order, with channels."""

    mapping: str
    index: int
    file: str
    features: tuple[str, ...]
    channels: tuple[str, ...]


def load_csv_spec(path: str | os.PathLike[str]) -> FeatureSpec:
    """Read and check a CSV input spec (see the module docstring); FeatureSpecError with one line on a bad one."""
    path = Path(path).resolve()
    check_spec_size(path)
    spec = FeatureSpec.from_yaml(path)
    try:
        check_csv_spec(spec)
    except FeatureSpecError as err:
        raise FeatureSpecError(f"{path}: {err}") from None
    shared = set.intersection(*({chunk.file for chunk in csv_chunks(spec, m)} for m in MAPPINGS))
    if shared:
        logging.getLogger(__name__).warning(
            "%s names %s in both source_spec.train and source_spec.test: the test rows are trained on, so the AUC "
            "that evaluate and the gate measure is not a held-out one", path, ", ".join(sorted(shared)))
    return spec


def shown(value: Any) -> str:
    """A value as an error line quotes it: repr bounded in depth, items and length (a spec's value may be an alias
    bomb or a megabyte string)."""
    text = _REPR.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def check_spec_size(path: Path) -> None:
    """Refuse a spec file over MAX_SPEC_BYTES, or whose YAML, aliases expanded, holds more than MAX_SPEC_NODES
    nodes or MAX_SPEC_CHARS characters of scalars (a 400-byte alias bomb expands 9-fold per level), or whose top
    level is not a mapping; before anything walks or prints it."""
    import yaml

    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise FeatureSpecError(f"{path}: {size} bytes; a feature spec may hold at most {MAX_SPEC_BYTES}")
    try:
        # libyaml's composer where PyYAML has it: the same nodes (an alias is its anchor's node) ~10x faster
        root = yaml.compose(path.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise FeatureSpecError(f"{path}: not valid YAML ({' '.join(str(err).split())[:SHOWN_CHARS]})") from None
    nodes, chars = _expanded_size(root, {})
    if nodes > MAX_SPEC_NODES or chars > MAX_SPEC_CHARS:
        raise FeatureSpecError(f"{path}: with its aliases expanded the spec holds {nodes} YAML nodes and {chars} "
                               f"characters; at most {MAX_SPEC_NODES} nodes and {MAX_SPEC_CHARS} characters allowed "
                               "(an alias bomb?)")
    if not isinstance(root, yaml.MappingNode):
        raise FeatureSpecError(f"{path}: a feature spec is a mapping of sections (channel_spec, feature_spec, "
                               f"source_spec, metadata), got {'nothing' if root is None else root.tag}")
    if (twice := _duplicate_key(root)) is not None:
        key, line = twice
        raise FeatureSpecError(f"{path} line {line}: key {shown(key)} appears twice in one mapping (YAML would keep "
                               "the last one and drop the first without a word)")


def _duplicate_key(root) -> tuple[str, int] | None:
    """(the key, its second line) of the first mapping of the composed YAML that names a key twice, else None."""
    import yaml

    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        return key.value, key.start_mark.line + 1
                    keys.add(key.value)
                stack += [key, value]
        else:
            stack += node.value
    return None


def _expanded_size(node, seen: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(nodes, scalar characters) of a composed YAML node with every alias expanded; each distinct node is sized
    once (an alias is the same node object), so this is linear in the file however much it expands."""
    import yaml

    if node is None:
        return 0, 0
    if id(node) in seen:
        return seen[id(node)]
    if isinstance(node, yaml.ScalarNode):
        size = (1, len(node.value))
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        sizes = [_expanded_size(child, seen) for child in children]
        size = (1 + sum(n for n, _ in sizes), sum(c for _, c in sizes))
    seen[id(node)] = size
    return size


def check_csv_spec(spec: FeatureSpec) -> None:
    """NVIDIA's check_feature_spec rules as they apply to transcoder input (module docstring)."""
    for section in ("feature_spec", "source_spec", "channel_spec"):
        if not isinstance(getattr(spec, section), dict):
            raise FeatureSpecError(f"{section}: must be a mapping, got {type(getattr(spec, section)).__name__}")
    if spec.metadata is not None and not isinstance(spec.metadata, dict):
        raise FeatureSpecError(f"metadata: must be a mapping, got {type(spec.metadata).__name__}")
    _check_channels(spec)
    _check_features(spec)
    mappings = sorted(spec.source_spec)
    if mappings != sorted(MAPPINGS):
        raise FeatureSpecError(f"source_spec: mappings must be exactly ['test', 'train'], found {mappings}")
    for mapping in MAPPINGS:
        _check_mapping(spec, mapping)


def _check_channels(spec: FeatureSpec) -> None:
    found = sorted(spec.channel_spec)
    if found != sorted(CHANNELS):
        missing, extra = sorted(set(CHANNELS) - set(found)), sorted(set(found) - set(CHANNELS))
        raise FeatureSpecError(f"channel_spec: channels must be exactly {list(CHANNELS)}; missing {missing}, "
                               f"unexpected {extra}")
    owner: dict[str, str] = {}
    for channel in CHANNELS:
        names = spec.channel_spec[channel]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise FeatureSpecError(f"channel_spec.{channel}: must be a list of feature names, got {shown(names)}")
        for name in names:
            if name in owner:
                where = "twice" if owner[name] == channel else f"also in channel {shown(owner[name])}"
                raise FeatureSpecError(f"channel_spec.{channel}: feature {shown(name)} listed {where}")
            owner[name] = channel
    if len(spec.channel_spec[LABEL_CHANNEL]) != 1:
        raise FeatureSpecError(f"channel_spec.label: exactly one label feature required, found "
                               f"{spec.channel_spec[LABEL_CHANNEL]}")
    if not spec.channel_spec[NUMERICAL_CHANNEL]:
        raise FeatureSpecError("channel_spec.numerical: at least one numerical feature is required (NVIDIA's "
                               "split-binary layout always has numerical.bin, and DLRM's bottom MLP reads it)")
    unknown = sorted(set(spec.feature_spec) - set(owner))
    if unknown:
        raise FeatureSpecError(f"feature_spec.{unknown[0]}: feature is in no channel of channel_spec")
    undefined = sorted(set(owner) - set(spec.feature_spec))
    if undefined:
        raise FeatureSpecError(f"channel_spec: feature {shown(undefined[0])} has no entry in feature_spec")


def _check_features(spec: FeatureSpec) -> None:
    """dtype (optional) parses with numpy; a categorical's cardinality is a positive int or 'auto'."""
    categorical = set(spec.channel_spec[CATEGORICAL_CHANNEL])
    for name, props in spec.feature_spec.items():
        where = f"feature_spec.{name}"
        props = {} if props is None else props
        if not isinstance(props, dict):
            raise FeatureSpecError(f"{where}: must be a mapping (dtype, cardinality), got {shown(props)}")
        if DTYPE_SELECTOR in props:
            try:
                np.dtype(props[DTYPE_SELECTOR])
            except (TypeError, ValueError):
                raise FeatureSpecError(f"{where}: dtype {shown(props[DTYPE_SELECTOR])} is not a numpy "
                                       "dtype") from None
        if name not in categorical:
            continue
        if CARDINALITY_SELECTOR not in props:
            raise FeatureSpecError(f"{where}: categorical feature has no cardinality (an integer or 'auto')")
        card = props[CARDINALITY_SELECTOR]
        if card == AUTO_CARDINALITY:
            continue
        if not isinstance(card, int) or isinstance(card, bool) or card <= 0:
            raise FeatureSpecError(f"{where}: cardinality {shown(card)} is not a positive integer or 'auto'")
        if card > MAX_CARDINALITY:
            raise FeatureSpecError(f"{where}: cardinality {card} is too big for int32 ids (max {MAX_CARDINALITY})")


def _check_mapping(spec: FeatureSpec, mapping: str) -> None:
    chunks = spec.source_spec[mapping]
    if not isinstance(chunks, list) or not chunks:
        raise FeatureSpecError(f"source_spec.{mapping}: must be a non-empty list of chunks, got {shown(chunks)}")
    seen: set[str] = set()
    for index, chunk in enumerate(chunks):
        where = f"source_spec.{mapping}[{index}]"
        if not isinstance(chunk, dict) or not {TYPE_SELECTOR, FEATURES_SELECTOR, FILES_SELECTOR} <= set(chunk):
            raise FeatureSpecError(f"{where}: a chunk needs 'type', 'features' and 'files', got {shown(chunk)}")
        extra = sorted(set(chunk) - {TYPE_SELECTOR, FEATURES_SELECTOR, FILES_SELECTOR})
        if extra:
            raise FeatureSpecError(f"{where}: unknown key(s) {extra}")
        if chunk[TYPE_SELECTOR] != CSV_CHUNK:
            raise FeatureSpecError(f"{where}.type: {shown(chunk[TYPE_SELECTOR])} is not {CSV_CHUNK!r} (the transcoder "
                                   "reads CSV chunks only)")
        features, files = chunk[FEATURES_SELECTOR], chunk[FILES_SELECTOR]
        if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
            raise FeatureSpecError(f"{where}.features: needs a list of at least one feature name, got "
                                   f"{shown(features)}")
        if isinstance(files, list) and len(files) > 1:
            # NVIDIA's transcoder asserts one file per chunk; rows of several files would be their concatenation,
            # which no NVIDIA tool writes or reads for CSV chunks.
            raise FeatureSpecError(f"{where}.files: a CSV chunk reads exactly 1 file (NVIDIA's transcoder refuses "
                                   f"more), got {len(files)}: {shown(files)}; concatenate them into one file")
        if not isinstance(files, list) or len(files) != 1 or not isinstance(files[0], str):
            raise FeatureSpecError(f"{where}.files: needs a list of exactly 1 file path, got {shown(files)}")
        if (problem := _chunk_file_error(f"{where}.files", files[0])) is not None:
            raise FeatureSpecError(problem)
        for feature in features:
            if feature not in spec.feature_spec:
                raise FeatureSpecError(f"{where}.features: unknown feature {shown(feature)} (not in feature_spec)")
            if feature in seen:
                raise FeatureSpecError(f"{where}.features: feature {shown(feature)} appears in more than one chunk")
            seen.add(feature)
    missing = sorted(set(spec.feature_spec) - seen)
    if missing:
        raise FeatureSpecError(f"source_spec.{mapping}: feature {shown(missing[0])} is in no chunk of this mapping")


def channel_of(spec: FeatureSpec, feature: str) -> str:
    for channel in CHANNELS:
        if feature in spec.channel_spec[channel]:
            return channel
    raise FeatureSpecError(f"feature {shown(feature)} is in no channel")


def csv_chunks(spec: FeatureSpec, mapping: str) -> list[CsvChunk]:
    """The CSV files of a mapping, in source_spec order (a checked spec)."""
    return [CsvChunk(mapping, index, chunk[FILES_SELECTOR][0], tuple(chunk[FEATURES_SELECTOR]),
                     tuple(channel_of(spec, f) for f in chunk[FEATURES_SELECTOR]))
            for index, chunk in enumerate(spec.source_spec[mapping])]


def source_files(spec: FeatureSpec) -> list[str]:
    """Every CSV file the spec names (relative paths), once each, in spec order."""
    return list(dict.fromkeys(chunk.file for mapping in MAPPINGS for chunk in csv_chunks(spec, mapping)))


def declared_cardinalities(spec: FeatureSpec) -> dict[str, int | None]:
    """Categorical name -> declared cardinality, None for 'auto' (channel order)."""
    cards = {}
    for name in spec.channel_spec[CATEGORICAL_CHANNEL]:
        card = spec.feature_spec[name][CARDINALITY_SELECTOR]
        cards[name] = None if card == AUTO_CARDINALITY else int(card)
    return cards


def resolve_cardinalities(spec: FeatureSpec, found: dict[str, int]) -> list[int]:
    """NVIDIA's rule: 'auto' = the found max id + 1 (1 when the column holds no id); a declared cardinality must
    cover what was found. `found`: name -> max id + 1 over every mapping. Channel order."""
    cards = []
    for name, declared in declared_cardinalities(spec).items():
        needed = max(int(found.get(name, 0)), 1)
        if declared is None:
            cards.append(needed)
        elif declared < needed:
            raise FeatureSpecError(f"feature_spec.{name}: declared cardinality {declared} does not cover id "
                                   f"{needed - 1} found in the data (needs at least {needed}, or 'auto')")
        else:
            cards.append(declared)
    return cards


def output_spec(spec: FeatureSpec, cardinalities: list[int], base_directory: str | os.PathLike[str]) -> FeatureSpec:
    """The split-binary spec of the transcoded dataset: NVIDIA's default layout (features renamed num_i, cat_i.bin,
    label in channel order, as NVIDIA's transcode does), dtypes by the cardinality rule."""
    out = FeatureSpec.get_default_feature_spec(len(spec.channel_spec[NUMERICAL_CHANNEL]), cardinalities)
    out.base_directory = str(base_directory)
    out.check_feature_spec()
    return out


def renamed_features(spec: FeatureSpec) -> dict[str, str]:
    """Input feature name -> its name in the output spec (NVIDIA's transcode renames by channel position)."""
    names = {name: f"num_{i}" for i, name in enumerate(spec.channel_spec[NUMERICAL_CHANNEL])}
    names |= {name: f"cat_{i}.bin" for i, name in enumerate(spec.channel_spec[CATEGORICAL_CHANNEL])}
    names[spec.channel_spec[LABEL_CHANNEL][0]] = LABEL_CHANNEL
    return names


def spec_summary(spec: FeatureSpec) -> dict[str, Any]:
    """What a task returns to XCom about a spec: counts and declared cardinalities."""
    return {"numerical": len(spec.channel_spec[NUMERICAL_CHANNEL]),
            "categorical": len(spec.channel_spec[CATEGORICAL_CHANNEL]),
            "cardinalities": declared_cardinalities(spec), "files": source_files(spec)}
