"""FeatureSpec: the dataset description (feature_spec.yaml) of NVIDIA DeepLearningExamples' DLRM, read, checked
and written so that NVIDIA's own PyTorch and TF2 code accepts our files unchanged.

The interface and the yaml format follow NVIDIA's `dlrm/data/feature_spec.py` (PyTorch) and
`dataloading/feature_spec.py` (TF2): four plain dict sections, paths relative to the yaml's directory, PyYAML's
default dumper (sorted keys, the shared numerical list as an `&id001` anchor). `check_feature_spec` enforces
NVIDIA's rules 1-7 (reference/nvidia-formats.md §1.4) and a few of our own, raising `FeatureSpecError` with one
line that names the section, feature or file at fault instead of a bare `assert`.
"""

from __future__ import annotations

import operator
import os
import posixpath
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tasks.core.storage import atomic_file

CATEGORICAL_CHANNEL = "categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
SPLIT_BINARY = "split_binary"
TRAIN_MAPPING = "train"
TEST_MAPPING = "test"
TYPE_SELECTOR = "type"
FEATURES_SELECTOR = "features"
FILES_SELECTOR = "files"
DTYPE_SELECTOR = "dtype"
CARDINALITY_SELECTOR = "cardinality"

FEATURE_SPEC_FILE = "feature_spec.yaml"
AUTO_CARDINALITY = "auto"  # CSV transcoder input only: the transcoder replaces it by max id + 1
# TF2's reader compares the dtype *string* against this set, so "<i4" would fail there even though numpy parses it.
TF2_CATEGORICAL_DTYPES = frozenset({"int8", "int16", "int32"})
_SECTIONS = ("feature_spec", "source_spec", "channel_spec", "metadata")
_CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL)
_CATEGORICAL_TYPES = (np.int8, np.int16, np.int32)


class FeatureSpecError(ValueError):
    """A feature spec that NVIDIA's loaders (or our stricter rules) would not accept; the message says where."""


def read_spec_document(path: Path, error: type[Exception]) -> dict[str, Any]:
    """The YAML document of the feature spec file at `path`; `error` with one line naming the file when there is
    none or its top level is not a mapping (each reader raises its own error type)."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{path}: no feature spec here") from None
    if not isinstance(document, dict):
        raise error(f"{path}: not a feature spec (top level is {type(document).__name__})")
    return document


def get_categorical_feature_type(size: int) -> type[np.signedinteger]:
    """Smallest of int8/int16/int32 whose max is strictly greater than `size` (NVIDIA's rule: 127 -> int16).

    NVIDIA calls this with the cardinality, so the largest id (cardinality - 1) always fits with room to spare.
    """
    for numpy_type in _CATEGORICAL_TYPES:
        if size < np.iinfo(numpy_type).max:
            return numpy_type
    raise FeatureSpecError(f"categorical feature of cardinality {size} is too big for int32 ids (max 2147483646)")


def _chunk_file_error(where: str, file: Any) -> str | None:
    """Why a chunk's file path is unsafe, or None: it must stay inside the feature spec's directory."""
    if not isinstance(file, str) or not file:
        return f"{where}: file {file!r} must be a non-empty relative path"
    if os.path.isabs(file) or posixpath.isabs(file) or file.startswith("\\"):
        return f"{where}: file {file!r} is absolute; paths must be relative to the feature spec's directory"
    normalised = posixpath.normpath(file.replace("\\", "/"))
    if normalised == ".." or normalised.startswith("../"):
        return f"{where}: file {file!r} resolves outside the feature spec's directory"
    return None


class FeatureSpec:
    """NVIDIA's FeatureSpec: `feature_spec`, `source_spec`, `channel_spec`, `metadata` dicts + `base_directory`."""

    def __init__(
        self,
        feature_spec: dict[str, dict[str, Any]] | None = None,
        source_spec: dict[str, list[dict[str, Any]]] | None = None,
        channel_spec: dict[str, list[str]] | None = None,
        metadata: dict[str, Any] | None = None,
        base_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        self.feature_spec: dict[str, dict[str, Any]] = feature_spec if feature_spec is not None else {}
        self.source_spec: dict[str, list[dict[str, Any]]] = source_spec if source_spec is not None else {}
        self.channel_spec: dict[str, list[str]] = channel_spec if channel_spec is not None else {}
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.base_directory: str | None = os.fspath(base_directory) if base_directory is not None else None

    def __repr__(self) -> str:
        return f"FeatureSpec(base_directory={self.base_directory!r}, channels={self.channel_spec!r})"

    # ---- reading and writing ------------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> FeatureSpec:
        """Load a feature_spec.yaml; base_directory is the yaml's directory (made absolute, unlike NVIDIA's)."""
        path = os.path.abspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                # libyaml's safe loader where PyYAML has it: the same values ~10x faster (a 40-feature spec: 70 ms
                # of a ~1 s transcode in pure python)
                loaded = yaml.load(f, Loader=yaml.CSafeLoader) if hasattr(yaml, "CSafeLoader") else yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise FeatureSpecError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from err
        return cls.from_dict(loaded, base_directory=os.path.dirname(path))

    @classmethod
    def from_dict(cls, source_dict: Any, base_directory: str | os.PathLike[str] | None) -> FeatureSpec:
        """Build from the yaml's top-level mapping; only the four NVIDIA sections are allowed."""
        if not isinstance(source_dict, dict):
            raise FeatureSpecError(f"feature spec must be a mapping of sections {_SECTIONS}, got {source_dict!r}")
        unknown = sorted(set(source_dict) - set(_SECTIONS))
        if unknown:
            # NVIDIA's from_dict fails on these too (TypeError from **kwargs); say which key and what is allowed.
            raise FeatureSpecError(f"feature spec: unknown top-level section(s) {unknown}; allowed: {list(_SECTIONS)}")
        return cls(base_directory=base_directory, **source_dict)

    def to_dict(self) -> dict[str, Any]:
        """The four sections, sharing (not copying) their objects so the numerical list dumps as an anchor."""
        return {name: getattr(self, name) for name in _SECTIONS}

    def to_string(self) -> str:
        return yaml.dump(self.to_dict())

    def to_yaml(self, output_path: str | os.PathLike[str] | None = None) -> Path:
        """Write the yaml atomically (default: base_directory/feature_spec.yaml); returns the path written.

        The text is byte-identical to NVIDIA's `print(yaml.dump(...), file=f)`, trailing blank line included.
        """
        if not output_path:
            if self.base_directory is None:
                raise FeatureSpecError("to_yaml: no output path given and base_directory is not set")
            output_path = os.path.join(self.base_directory, FEATURE_SPEC_FILE)
        path = Path(output_path)
        with atomic_file(path, "w") as f:
            f.write(self.to_string() + "\n")
        return path

    # ---- accessors (NVIDIA's names) -----------------------------------------------------------------------

    def get_number_of_numerical_features(self) -> int:
        return len(self.channel_spec[NUMERICAL_CHANNEL])

    def get_categorical_feature_names(self) -> list[str]:
        """Categorical names in channel order, which is the embedding-table order."""
        return self.channel_spec[CATEGORICAL_CHANNEL]

    def get_categorical_sizes(self) -> list[int]:
        return [self.feature_spec[name][CARDINALITY_SELECTOR] for name in self.get_categorical_feature_names()]

    def cat_positions_to_names(self, positions: list[int]) -> list[str]:
        names = self.get_categorical_feature_names()
        return [names[i] for i in positions]

    def get_mapping_paths(self, mapping: str) -> tuple[Path | None, Path | None, dict[str, Path]]:
        """(label_path, numerical_path, {categorical name: path}) of a mapping, joined onto base_directory."""
        if self.base_directory is None:
            raise FeatureSpecError("get_mapping_paths: base_directory is not set")
        if mapping not in self.source_spec:
            raise FeatureSpecError(f"source_spec: no mapping {mapping!r} (has {sorted(self.source_spec)})")
        label_name = self.channel_spec[LABEL_CHANNEL][0]
        categorical = set(self.channel_spec[CATEGORICAL_CHANNEL])
        numerical = set(self.channel_spec[NUMERICAL_CHANNEL])
        label_path: Path | None = None
        numerical_path: Path | None = None
        categorical_paths: dict[str, Path] = {}
        for chunk in self.source_spec[mapping]:
            first = chunk[FEATURES_SELECTOR][0]
            path = Path(os.path.abspath(os.path.join(self.base_directory, chunk[FILES_SELECTOR][0])))
            if first in numerical:
                numerical_path = path
            elif first in categorical:
                categorical_paths[first] = path
            elif first == label_name:
                label_path = path
        return label_path, numerical_path, categorical_paths

    @staticmethod
    def get_default_feature_spec(
        number_of_numerical_features: int, categorical_feature_cardinalities: Any
    ) -> FeatureSpec:
        """NVIDIA's default layout: num_i, cat_i.bin, label; per mapping numerical, label, then cat_i chunks."""
        try:
            cardinalities = [operator.index(card) for card in categorical_feature_cardinalities]
        except TypeError as err:
            raise FeatureSpecError(
                f"cardinalities must be integers, got {list(categorical_feature_cardinalities)}"
            ) from err
        numerical_names = [f"num_{i}" for i in range(number_of_numerical_features)]
        categorical_names = [f"cat_{i}.bin" for i in range(len(cardinalities))]
        features: dict[str, dict[str, Any]] = {
            name: {DTYPE_SELECTOR: str(np.dtype(get_categorical_feature_type(card))), CARDINALITY_SELECTOR: card}
            for name, card in zip(categorical_names, cardinalities)
        }
        for name in numerical_names:
            features[name] = {DTYPE_SELECTOR: str(np.dtype(np.float16))}
        features[LABEL_CHANNEL] = {DTYPE_SELECTOR: str(np.dtype(np.bool_))}
        # One list object shared by channel_spec and both numerical chunks: PyYAML then writes the anchor/alias
        # pair NVIDIA's files have (`numerical: &id001` ... `features: *id001`).
        channels = {CATEGORICAL_CHANNEL: categorical_names, NUMERICAL_CHANNEL: numerical_names,
                    LABEL_CHANNEL: [LABEL_CHANNEL]}
        source: dict[str, list[dict[str, Any]]] = {}
        for mapping in (TRAIN_MAPPING, TEST_MAPPING):
            chunks = [_chunk(numerical_names, f"{mapping}/numerical.bin")]
            chunks.append(_chunk([LABEL_CHANNEL], f"{mapping}/label.bin"))
            chunks += [_chunk([name], f"{mapping}/{name}") for name in categorical_names]
            source[mapping] = chunks
        return FeatureSpec(feature_spec=features, source_spec=source, channel_spec=channels, metadata={})

    # ---- checks -------------------------------------------------------------------------------------------

    def check_feature_spec(self, tf2_compatible: bool = True, allow_auto: bool = False) -> None:
        """Raise FeatureSpecError unless NVIDIA's DLRM loaders accept this spec (rules 1-7 of §1.4).

        Beyond NVIDIA: file paths must stay inside base_directory, cardinalities must be positive ints that fit
        the declared dtype, categorical dtypes must be integers. tf2_compatible adds TF2's int8/16/32-only rule;
        allow_auto accepts `cardinality: auto` (CSV transcoder input before transcoding).
        """
        for section in ("feature_spec", "source_spec", "channel_spec"):
            if not isinstance(getattr(self, section), dict):
                raise FeatureSpecError(f"{section}: must be a mapping, got {type(getattr(self, section)).__name__}")
        mappings = sorted(self.source_spec)
        if mappings != sorted([TRAIN_MAPPING, TEST_MAPPING]):
            raise FeatureSpecError(
                f"source_spec: mappings must be exactly ['test', 'train'] (NVIDIA's loaders accept no others), "
                f"found {mappings}"
            )
        self._check_channels()
        self._check_features(tf2_compatible, allow_auto)
        for mapping in (TRAIN_MAPPING, TEST_MAPPING):
            self._check_mapping(mapping)

    def _check_channels(self) -> None:
        """Rules 2 and 3: the three channels, one label, unique names, channels == feature_spec keys."""
        found = sorted(self.channel_spec)
        if found != sorted(_CHANNELS):
            missing = sorted(set(_CHANNELS) - set(found))
            extra = sorted(set(found) - set(_CHANNELS))
            raise FeatureSpecError(
                f"channel_spec: channels must be exactly {list(_CHANNELS)}; missing {missing}, unexpected {extra}"
            )
        owner: dict[str, str] = {}
        for channel in _CHANNELS:
            names = self.channel_spec[channel]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise FeatureSpecError(f"channel_spec.{channel}: must be a list of feature names, got {names!r}")
            for name in names:
                if name in owner:
                    where = "twice" if owner[name] == channel else f"also in channel {owner[name]!r}"
                    raise FeatureSpecError(f"channel_spec.{channel}: feature {name!r} listed {where}")
                owner[name] = channel
        labels = self.channel_spec[LABEL_CHANNEL]
        if len(labels) != 1:
            raise FeatureSpecError(
                f"channel_spec.label: exactly one label feature required, found {len(labels)} {labels}"
            )
        not_in_channels = sorted(set(self.feature_spec) - set(owner))
        if not_in_channels:
            raise FeatureSpecError(f"feature_spec: features {not_in_channels} are in no channel of channel_spec")
        undefined = sorted(set(owner) - set(self.feature_spec))
        if undefined:
            raise FeatureSpecError(f"channel_spec: features {undefined} have no entry in feature_spec")

    def _check_features(self, tf2_compatible: bool, allow_auto: bool) -> None:
        """Rules 4 and 5 (dtype parses, categorical cardinality is an int) plus our dtype/cardinality fit."""
        categorical = set(self.channel_spec[CATEGORICAL_CHANNEL])
        for name, props in self.feature_spec.items():
            where = f"feature_spec.{name}"
            if not isinstance(props, dict) or DTYPE_SELECTOR not in props:
                raise FeatureSpecError(f"{where}: no dtype (every feature needs one, e.g. float16, bool, int32)")
            try:
                dtype = np.dtype(props[DTYPE_SELECTOR])
            except (TypeError, ValueError) as err:
                raise FeatureSpecError(f"{where}: dtype {props[DTYPE_SELECTOR]!r} is not a numpy dtype") from err
            if name in categorical:
                _check_categorical(where, props, dtype, tf2_compatible, allow_auto)

    def _check_mapping(self, mapping: str) -> None:
        """Rules 6 and 7 for one mapping, plus our rule that files stay inside base_directory."""
        chunks = self.source_spec[mapping]
        if not isinstance(chunks, list):
            raise FeatureSpecError(f"source_spec.{mapping}: must be a list of chunks, got {type(chunks).__name__}")
        seen: set[str] = set()
        for index, chunk in enumerate(chunks):
            where = f"source_spec.{mapping} chunk {index}"
            if not isinstance(chunk, dict) or not {TYPE_SELECTOR, FEATURES_SELECTOR, FILES_SELECTOR} <= set(chunk):
                raise FeatureSpecError(f"{where}: a chunk needs 'type', 'features' and 'files', got {chunk!r}")
            if chunk[TYPE_SELECTOR] != SPLIT_BINARY:
                raise FeatureSpecError(f"{where}: type {chunk[TYPE_SELECTOR]!r} is not {SPLIT_BINARY!r}")
            features, files = chunk[FEATURES_SELECTOR], chunk[FILES_SELECTOR]
            if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
                raise FeatureSpecError(f"{where}: needs a list of at least one feature name, got {features!r}")
            if not isinstance(files, list) or len(files) != 1:
                raise FeatureSpecError(f"{where}: needs exactly 1 file, got {files!r}")
            where = f"{where} ({files[0]})"
            if (problem := _chunk_file_error(where, files[0])) is not None:
                raise FeatureSpecError(problem)
            for feature in features:
                if feature in seen:
                    raise FeatureSpecError(f"{where}: feature {feature!r} appears in more than one chunk")
                seen.add(feature)
            self._check_chunk_features(where, features)
        missing = sorted(set(self.feature_spec) - seen)
        if missing:
            raise FeatureSpecError(f"source_spec.{mapping}: features {missing} are in no chunk of this mapping")

    def _check_chunk_features(self, where: str, features: list[str]) -> None:
        """Rule 6 by channel of the chunk's first feature: 1 categorical, all numericals in order, 1 bool label."""
        first = features[0]
        if first in self.channel_spec[CATEGORICAL_CHANNEL]:
            if len(features) != 1:
                raise FeatureSpecError(f"{where}: a categorical chunk must hold exactly 1 feature, holds {features}")
        elif first in self.channel_spec[NUMERICAL_CHANNEL]:
            expected = self.channel_spec[NUMERICAL_CHANNEL]
            if features != expected:
                raise FeatureSpecError(
                    f"{where}: the numerical chunk must hold all numerical features in channel_spec order "
                    f"{expected}, holds {features}"
                )
            for name in features:
                dtype = self.feature_spec[name][DTYPE_SELECTOR]
                if np.dtype(dtype) != np.float16:
                    raise FeatureSpecError(f"{where}: numerical feature {name!r} has dtype {dtype}, must be float16")
        elif first in self.channel_spec[LABEL_CHANNEL]:
            if len(features) != 1:
                raise FeatureSpecError(f"{where}: the label chunk must hold exactly 1 feature, holds {features}")
            dtype = self.feature_spec[first][DTYPE_SELECTOR]
            if np.dtype(dtype) != np.bool_:
                raise FeatureSpecError(f"{where}: label {first!r} has dtype {dtype}, must be bool")
        else:
            raise FeatureSpecError(f"{where}: feature {first!r} is in no channel of channel_spec")


def _chunk(features: list[str], file: str) -> dict[str, Any]:
    return {TYPE_SELECTOR: SPLIT_BINARY, FEATURES_SELECTOR: features, FILES_SELECTOR: [file]}


def _check_categorical(
    where: str, props: dict[str, Any], dtype: np.dtype, tf2_compatible: bool, allow_auto: bool
) -> None:
    """Integer dtype (TF2: int8/16/32 by name), integer cardinality > 0 whose largest id fits the dtype."""
    if dtype.kind not in "iu":
        raise FeatureSpecError(f"{where}: categorical dtype {props[DTYPE_SELECTOR]} is not an integer type")
    if tf2_compatible and props[DTYPE_SELECTOR] not in TF2_CATEGORICAL_DTYPES:
        raise FeatureSpecError(f"{where}: categorical dtype {props[DTYPE_SELECTOR]!r} is not one of "
                               f"{sorted(TF2_CATEGORICAL_DTYPES)} (NVIDIA's TF2 loader accepts only these)")
    if CARDINALITY_SELECTOR not in props:
        raise FeatureSpecError(f"{where}: categorical feature has no cardinality")
    card = props[CARDINALITY_SELECTOR]
    if isinstance(card, str) and card == AUTO_CARDINALITY:
        if allow_auto:
            return
        raise FeatureSpecError(f"{where}: cardinality 'auto' is only allowed in CSV input specs (allow_auto=True); "
                               "a split-binary spec needs the actual integer")
    # bool is an int subclass in Python (True would pass NVIDIA's isinstance check); it is never a cardinality.
    if not isinstance(card, int) or isinstance(card, bool):
        raise FeatureSpecError(f"{where}: cardinality {card!r} is not an integer")
    if card <= 0:
        raise FeatureSpecError(f"{where}: cardinality {card} must be positive")
    if card - 1 > np.iinfo(dtype).max:
        raise FeatureSpecError(
            f"{where}: cardinality {card} does not fit dtype {dtype} (largest id {card - 1} > {np.iinfo(dtype).max})"
        )
