"""FeatureSpec: NVIDIA's yaml files round-trip byte for byte, the dtype rule, and each check rule's error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tasks.formats.feature_spec import (
    FeatureSpec,
    FeatureSpecError,
    get_categorical_feature_type,
)

NVIDIA_DIR = Path(__file__).parent / "data" / "nvidia"
CRITEO_F15 = NVIDIA_DIR / "criteo_f15.yaml"
SMALL_CSV = NVIDIA_DIR / "small_csv.yaml"
# reference/nvidia-formats.md §1.7, channel order cat_0..cat_25
CRITEO_F15_CARDINALITIES = [
    7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667, 104, 4, 968,
    15, 8165896, 2675940, 7156453, 302516, 12022, 97, 35,
]


@pytest.mark.parametrize("path", [CRITEO_F15, SMALL_CSV], ids=["criteo_f15", "small_csv"])
def test_nvidia_yaml_round_trips_byte_for_byte(path: Path, tmp_path: Path) -> None:
    spec = FeatureSpec.from_yaml(path)
    assert spec.base_directory == str(path.parent.resolve())
    original = path.read_text()
    assert spec.to_string() == original  # same dumper output: sorted keys, &id001 anchor
    written = spec.to_yaml(tmp_path / "feature_spec.yaml")
    # NVIDIA writes print(yaml.dump(...)): the dump plus one newline.
    assert written.read_text() == original + "\n"
    reloaded = FeatureSpec.from_yaml(written)
    assert reloaded.to_dict() == spec.to_dict() == yaml.safe_load(original)
    assert reloaded.base_directory == str(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_criteo_f15_passes_both_nvidia_checks_and_exposes_its_layout() -> None:
    spec = FeatureSpec.from_yaml(CRITEO_F15)
    spec.check_feature_spec(tf2_compatible=True)
    spec.check_feature_spec(tf2_compatible=False)
    assert spec.get_number_of_numerical_features() == 13
    assert spec.get_categorical_feature_names() == [f"cat_{i}.bin" for i in range(26)]
    assert spec.get_categorical_sizes() == CRITEO_F15_CARDINALITIES
    assert spec.cat_positions_to_names([3, 0]) == ["cat_3.bin", "cat_0.bin"]
    label, numerical, categorical = spec.get_mapping_paths("test")
    assert label == NVIDIA_DIR.resolve() / "test" / "label.bin"
    assert numerical == NVIDIA_DIR.resolve() / "test" / "numerical.bin"
    assert list(categorical) == [f"cat_{i}.bin" for i in range(26)]
    assert categorical["cat_25.bin"] == NVIDIA_DIR.resolve() / "test" / "cat_25.bin"


def test_csv_input_spec_fails_the_split_binary_check_like_nvidia() -> None:
    # small_csv.yaml is transcoder input (type csv, no dtypes): NVIDIA's check_feature_spec rejects it as well.
    spec = FeatureSpec.from_yaml(SMALL_CSV)
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_0\.bin: no dtype"):
        spec.check_feature_spec()


@pytest.mark.parametrize(
    ("size", "expected"),
    [(1, np.int8), (126, np.int8), (127, np.int16), (32766, np.int16), (32767, np.int32), (2**31 - 2, np.int32)],
)
def test_categorical_dtype_rule_is_strictly_less_than_max(size: int, expected: type) -> None:
    assert get_categorical_feature_type(size) is expected


def test_categorical_dtype_rule_rejects_int32_max() -> None:
    with pytest.raises(FeatureSpecError, match="2147483647"):
        get_categorical_feature_type(2**31 - 1)


def test_default_spec_is_byte_identical_to_nvidia_criteo_f15() -> None:
    spec = FeatureSpec.get_default_feature_spec(13, CRITEO_F15_CARDINALITIES)
    assert spec.base_directory is None
    assert spec.to_string() == CRITEO_F15.read_text()


def test_default_spec_layout_names_and_chunk_order() -> None:
    spec = FeatureSpec.get_default_feature_spec(2, [np.int64(126), 127, 32767])
    assert spec.channel_spec == {
        "categorical": ["cat_0.bin", "cat_1.bin", "cat_2.bin"], "numerical": ["num_0", "num_1"], "label": ["label"],
    }
    assert spec.feature_spec["cat_0.bin"] == {"dtype": "int8", "cardinality": 126}
    assert type(spec.feature_spec["cat_0.bin"]["cardinality"]) is int  # numpy ints would dump as python/object tags
    assert spec.feature_spec["cat_1.bin"]["dtype"] == "int16"
    assert spec.feature_spec["cat_2.bin"]["dtype"] == "int32"
    assert spec.feature_spec["num_1"] == {"dtype": "float16"} and spec.feature_spec["label"] == {"dtype": "bool"}
    assert list(spec.source_spec) == ["train", "test"]
    for mapping in ("train", "test"):
        chunks = spec.source_spec[mapping]
        assert [c["files"] for c in chunks] == [[f"{mapping}/numerical.bin"], [f"{mapping}/label.bin"]] + [
            [f"{mapping}/cat_{i}.bin"] for i in range(3)
        ]
        assert [c["features"] for c in chunks] == [["num_0", "num_1"], ["label"], ["cat_0.bin"], ["cat_1.bin"],
                                                   ["cat_2.bin"]]
        assert {c["type"] for c in chunks} == {"split_binary"}
    assert spec.metadata == {}
    assert "numerical: &id001" in spec.to_string() and spec.to_string().count("features: *id001") == 2
    spec.check_feature_spec()


# ---- each check rule, violated ------------------------------------------------------------------------------


def _spec_dict() -> dict[str, Any]:
    return copy.deepcopy(FeatureSpec.get_default_feature_spec(3, [10, 200, 40000]).to_dict())


def _check(d: dict[str, Any], **kwargs: bool) -> None:
    FeatureSpec.from_dict(d, base_directory="/data/criteo").check_feature_spec(**kwargs)


def _drop_label_channel(d: dict[str, Any]) -> None:
    del d["channel_spec"]["label"]


def _two_labels(d: dict[str, Any]) -> None:
    d["feature_spec"]["label2"] = {"dtype": "bool"}
    d["channel_spec"]["label"].append("label2")
    for mapping in ("train", "test"):
        d["source_spec"][mapping].append({"type": "split_binary", "features": ["label2"], "files": [f"{mapping}/l2"]})


def _numerical_float32(d: dict[str, Any]) -> None:
    d["feature_spec"]["num_1"]["dtype"] = "float32"


def _two_categoricals_in_one_chunk(d: dict[str, Any]) -> None:
    chunks = d["source_spec"]["train"]
    chunks[2]["features"] = ["cat_0.bin", "cat_1.bin"]
    del chunks[3]


def _missing_test_mapping(d: dict[str, Any]) -> None:
    del d["source_spec"]["test"]


def _extra_validation_mapping(d: dict[str, Any]) -> None:
    d["source_spec"]["validation"] = copy.deepcopy(d["source_spec"]["test"])


def _auto_cardinality(d: dict[str, Any]) -> None:
    d["feature_spec"]["cat_1.bin"]["cardinality"] = "auto"


def _path_with_dotdot(d: dict[str, Any]) -> None:
    d["source_spec"]["test"][3]["files"] = ["test/../../elsewhere/cat_1.bin"]


def _absolute_path(d: dict[str, Any]) -> None:
    d["source_spec"]["train"][1]["files"] = ["/etc/passwd"]


def _numerical_out_of_order(d: dict[str, Any]) -> None:
    d["source_spec"]["test"][0]["features"] = ["num_1", "num_0", "num_2"]


def _feature_missing_from_mapping(d: dict[str, Any]) -> None:
    del d["source_spec"]["test"][4]


def _wrong_chunk_type(d: dict[str, Any]) -> None:
    d["source_spec"]["train"][2]["type"] = "csv"


def _two_files(d: dict[str, Any]) -> None:
    d["source_spec"]["train"][2]["files"].append("train/more.bin")


def _int64_categorical(d: dict[str, Any]) -> None:
    d["feature_spec"]["cat_0.bin"]["dtype"] = "int64"


def _cardinality_too_big_for_dtype(d: dict[str, Any]) -> None:
    d["feature_spec"]["cat_0.bin"]["cardinality"] = 129  # ids up to 128 do not fit int8


def _label_int8(d: dict[str, Any]) -> None:
    d["feature_spec"]["label"]["dtype"] = "int8"


def _unparseable_dtype(d: dict[str, Any]) -> None:
    d["feature_spec"]["num_0"]["dtype"] = "float17"


def _feature_in_no_channel(d: dict[str, Any]) -> None:
    d["feature_spec"]["orphan"] = {"dtype": "float16"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_drop_label_channel, r"channel_spec: .*missing \['label'\]"),
        (_two_labels, r"channel_spec\.label: exactly one label feature required, found 2"),
        (_numerical_float32, r"source_spec\.train chunk 0 \(train/numerical\.bin\): .*'num_1' has dtype float32"),
        (_two_categoricals_in_one_chunk, r"chunk 2 \(train/cat_0\.bin\): a categorical chunk must hold exactly 1"),
        (_missing_test_mapping, r"source_spec: mappings must be exactly .*found \['train'\]"),
        (_extra_validation_mapping, r"found \['test', 'train', 'validation'\]"),
        (_auto_cardinality, r"feature_spec\.cat_1\.bin: cardinality 'auto' is only allowed"),
        (_path_with_dotdot, r"source_spec\.test chunk 3 .*resolves outside"),
        (_absolute_path, r"source_spec\.train chunk 1 .*'/etc/passwd' is absolute"),
        (_numerical_out_of_order, r"source_spec\.test chunk 0 .*channel_spec order"),
        (_feature_missing_from_mapping, r"source_spec\.test: features \['cat_2\.bin'\] are in no chunk"),
        (_wrong_chunk_type, r"chunk 2: type 'csv' is not 'split_binary'"),
        (_two_files, r"chunk 2: needs exactly 1 file"),
        (_int64_categorical, r"feature_spec\.cat_0\.bin: categorical dtype 'int64' is not one of"),
        (_cardinality_too_big_for_dtype, r"feature_spec\.cat_0\.bin: cardinality 129 does not fit dtype int8"),
        (_label_int8, r"label 'label' has dtype int8, must be bool"),
        (_unparseable_dtype, r"feature_spec\.num_0: dtype 'float17' is not a numpy dtype"),
        (_feature_in_no_channel, r"feature_spec: features \['orphan'\] are in no channel"),
    ],
)
def test_each_violated_rule_names_where(mutate: Any, message: str) -> None:
    d = _spec_dict()
    _check(d)  # valid before the mutation
    mutate(d)
    with pytest.raises(FeatureSpecError, match=message):
        _check(d)


@pytest.mark.parametrize("card", [10.0, True, 0, -5, "10", None])
def test_non_int_or_non_positive_cardinality_is_rejected(card: Any) -> None:
    d = _spec_dict()
    d["feature_spec"]["cat_0.bin"]["cardinality"] = card
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_0\.bin: cardinality"):
        _check(d)


def test_missing_cardinality_is_rejected() -> None:
    d = _spec_dict()
    del d["feature_spec"]["cat_2.bin"]["cardinality"]
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_2\.bin: categorical feature has no cardinality"):
        _check(d)


def test_auto_cardinality_accepted_only_when_allowed() -> None:
    d = _spec_dict()
    _auto_cardinality(d)
    _check(d, allow_auto=True)


def test_int64_categorical_accepted_without_tf2_compatibility() -> None:
    # NVIDIA's PyTorch check accepts any numpy int (its wider_dtypes.yaml uses int64); TF2's does not.
    d = _spec_dict()
    _int64_categorical(d)
    _check(d, tf2_compatible=False)


def test_dotdot_that_stays_inside_base_directory_is_fine() -> None:
    d = _spec_dict()
    d["source_spec"]["test"][3]["files"] = ["test/../test/cat_1.bin"]
    _check(d)


def test_unknown_top_level_section_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "feature_spec.yaml"
    path.write_text(CRITEO_F15.read_text() + "extra_section: {}\n")
    with pytest.raises(FeatureSpecError, match=r"unknown top-level section\(s\) \['extra_section'\]"):
        FeatureSpec.from_yaml(path)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "feature_spec.yaml"
    path.write_text("feature_spec: [unclosed\n")
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.yaml: not valid YAML"):
        FeatureSpec.from_yaml(path)


def test_to_yaml_default_path_and_mapping_paths_need_base_directory(tmp_path: Path) -> None:
    spec = FeatureSpec.get_default_feature_spec(1, [5])
    with pytest.raises(FeatureSpecError, match="base_directory"):
        spec.to_yaml()
    with pytest.raises(FeatureSpecError, match="base_directory"):
        spec.get_mapping_paths("train")
    spec.base_directory = str(tmp_path)
    assert spec.to_yaml() == tmp_path / "feature_spec.yaml"
    assert FeatureSpec.from_yaml(tmp_path / "feature_spec.yaml").to_dict() == spec.to_dict()
    with pytest.raises(FeatureSpecError, match="no mapping 'validation'"):
        spec.get_mapping_paths("validation")
