"""Bad-input corpus, bring your own dataset: invalid CSV FeatureSpecs fail load_csv_spec with one line naming the
key at fault; invalid CSV files fail validate_csvs with one line naming file, line and column, and leave nothing
marked complete (tests/reliability/contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.byo.spec import load_csv_spec
from tasks.byo.synthetic import write_csvs
from tasks.byo.validation import validate_csvs
from tasks.core.validation import DataQualityError
from tasks.formats.feature_spec import FeatureSpecError
from tests.reliability.contract import nothing_complete, one_line

pytestmark = pytest.mark.reliability

SMALL_CSV = Path(__file__).parents[1] / "data" / "byo" / "small_csv.yaml"
ROWS = {"train": 40, "test": 20}
BAD_LINE = 3


def _spec() -> dict:
    return yaml.safe_load(SMALL_CSV.read_text())


def _drop_channel(spec):
    del spec["channel_spec"]["label"]


def _unknown_feature(spec):
    spec["source_spec"]["train"][2]["features"].append("cat_9.bin")


def _bad_dtype(spec):
    spec["feature_spec"]["num_0"]["dtype"] = "float17"


def _not_csv(spec):
    spec["source_spec"]["test"][1]["type"] = "parquet"


def _bad_cardinality(spec):
    spec["feature_spec"]["cat_2.bin"]["cardinality"] = "automatic"


def _escaping_path(spec):
    spec["source_spec"]["train"][0]["files"] = ["../../etc/passwd"]


def _validation_mapping(spec):
    spec["source_spec"]["validation"] = spec["source_spec"]["test"]


def _feature_twice(spec):
    spec["source_spec"]["train"][3]["features"].append("cat_0.bin")


SPECS = {  # case -> (edit, what the error line must name)
    "missing channel": (_drop_channel, ["channel_spec", "missing ['label']"]),
    "unknown feature": (_unknown_feature, ["source_spec.train[2].features", "cat_9.bin"]),
    "bad dtype": (_bad_dtype, ["feature_spec.num_0", "float17"]),
    "chunk not csv": (_not_csv, ["source_spec.test[1].type", "parquet"]),
    "cardinality not int or auto": (_bad_cardinality, ["feature_spec.cat_2.bin", "automatic"]),
    "file outside the spec's folder": (_escaping_path, ["source_spec.train[0].files", "../../etc/passwd"]),
    "extra mapping": (_validation_mapping, ["source_spec", "validation"]),
    "feature in two chunks": (_feature_twice, ["source_spec.train[3].features", "cat_0.bin"]),
}


@pytest.mark.parametrize("case", list(SPECS))
def test_an_invalid_spec_fails_with_one_line_naming_the_key(case, tmp_path):
    edit, named = SPECS[case]
    spec = _spec()
    edit(spec)
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.dump(spec))
    with pytest.raises(FeatureSpecError) as raised:
        load_csv_spec(path)
    one_line(raised.value, str(path), *named)


@pytest.fixture(scope="module")
def good_source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("byo-good")
    (folder / "feature_spec.yaml").write_text(SMALL_CSV.read_text())
    write_csvs(load_csv_spec(folder / "feature_spec.yaml"), folder, ROWS, seed=4)
    return folder


def _replace_field(line: str, column: int, value: str) -> str:
    parts = line.split(",")
    parts[column - 1] = value
    return ",".join(parts)


CSVS = {  # case -> (file, edit of line BAD_LINE, what the error line must name)
    "wrong column count": ("train/catpart0.bin", lambda line: line + ",5", ["line 3", "4 fields, expected 3"]),
    "non-integer id": ("train/catpart1.bin", lambda line: _replace_field(line, 2, "4.5"),
                       ["line 3 column 2 (cat_4.bin)", "'4.5' is not a non-negative integer id"]),
    "negative id": ("test/catpart2.bin", lambda line: _replace_field(line, 1, "-1"),
                    ["line 3 column 1 (cat_2.bin)", "'-1'"]),
    "id over cardinality": ("train/catpart0.bin", lambda line: _replace_field(line, 1, "10"),
                            ["line 3 column 1 (cat_0.bin)", "id 10 >= declared cardinality 10"]),
    "label 2": ("test/label.bin", lambda line: "2", ["line 3 column 1 (label)", "'2' is not 0 or 1"]),
    "numerical not a number": ("train/numerical.bin", lambda line: _replace_field(line, 3, "nan"),
                               ["line 3 column 3 (num_2)", "'nan' is not a number"]),
    "numerical beyond float16": ("train/numerical.bin", lambda line: _replace_field(line, 1, "1e6"),
                                 ["line 3 column 1 (num_0)", "float16"]),
}


@pytest.mark.parametrize("case", list(CSVS))
def test_an_invalid_csv_fails_with_one_line_naming_file_line_and_column(case, good_source, tmp_path):
    name, edit, named = CSVS[case]
    folder = tmp_path / "source"
    for path in good_source.rglob("*"):
        if path.is_file():
            (folder / path.relative_to(good_source)).parent.mkdir(parents=True, exist_ok=True)
            (folder / path.relative_to(good_source)).write_bytes(path.read_bytes())
    lines = (folder / name).read_text().split("\n")
    lines[BAD_LINE - 1] = edit(lines[BAD_LINE - 1])
    (folder / name).write_text("\n".join(lines))
    out = tmp_path / "validated"
    with pytest.raises(DataQualityError) as raised:
        validate_csvs(load_csv_spec(folder / "feature_spec.yaml"), folder, out, inputs={}, budget=0.0)
    one_line(raised.value, name, *named)
    nothing_complete(out)


def test_files_of_a_mapping_with_different_line_counts_fail(good_source, tmp_path):
    folder = tmp_path / "source"
    for path in good_source.rglob("*"):
        if path.is_file():
            (folder / path.relative_to(good_source)).parent.mkdir(parents=True, exist_ok=True)
            (folder / path.relative_to(good_source)).write_bytes(path.read_bytes())
    label = folder / "train" / "label.bin"
    label.write_text("".join(label.read_text().splitlines(keepends=True)[:-2]))
    with pytest.raises(DataQualityError) as raised:
        validate_csvs(load_csv_spec(folder / "feature_spec.yaml"), folder, tmp_path / "validated", inputs={},
                      budget=0.0)
    one_line(raised.value, "train/label.bin", f"line {ROWS['train'] - 1}", "no partner row")
    nothing_complete(tmp_path / "validated")
