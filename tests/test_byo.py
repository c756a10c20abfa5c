"""Bring your own dataset: the CSV FeatureSpec (tasks/byo/spec.py), the CSV generator, the validation and the Spark
transcode (spark_jobs/byo/transcode.py), on NVIDIA's own small_csv.yaml (tests/data/byo, reference Appendix A)
with two cardinalities turned `auto`.

One module fixture generates the CSVs (with one bad row), validates them and runs the transcode once in the
session's local[2] Spark (the job's spark_session() picks it up through getOrCreate); the tests read its output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.byo.spec import (check_csv_spec, csv_chunks, declared_cardinalities, load_csv_spec,
                            resolve_cardinalities)
from tasks.byo.synthetic import planted_signal, write_csvs
from tasks.byo.validation import validate_csvs
from tasks.core.storage import MANIFEST_NAME, read_manifest
from tasks.formats.feature_spec import FeatureSpec, FeatureSpecError, get_categorical_feature_type
from tasks.formats.split_binary import check_dataset
from tests.split_binary_rows import read_rows
from tests.test_split_binary import _read_like_pytorch, _read_like_tf2

SMALL_CSV = Path(__file__).parent / "data" / "byo" / "small_csv.yaml"
ROWS = {"train": 300, "test": 120}
AUTO = ("cat_1.bin", "cat_2.bin")
BAD_LINE = 7  # train/catpart1.bin line 7: a non-integer id -> the row is dropped from every train file


def small_csv_spec(folder: Path, **cardinalities) -> Path:
    """small_csv.yaml written into `folder`, with some cardinalities replaced."""
    spec = yaml.safe_load(SMALL_CSV.read_text())
    for name, card in cardinalities.items():
        spec["feature_spec"][name.replace("__", ".")]["cardinality"] = card
    path = folder / "feature_spec.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.dump(spec))
    return path


def read_csv_rows(spec: FeatureSpec, folder: Path, mapping: str) -> dict[str, list[str]]:
    """feature -> its column of strings, every chunk file of the mapping."""
    columns: dict[str, list[str]] = {}
    for chunk in csv_chunks(spec, mapping):
        lines = (folder / chunk.file).read_text().splitlines()
        for index, name in enumerate(chunk.features):
            columns[name] = [line.split(",")[index] if len(line.split(",")) > index else "" for line in lines]
    return columns


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[FeatureSpec, Path]:
    folder = tmp_path_factory.mktemp("byo-source")
    spec_path = small_csv_spec(folder, cat_1__bin="auto", cat_2__bin="auto")
    spec = load_csv_spec(spec_path)
    write_csvs(spec, folder, ROWS, seed=5)
    path = folder / "train" / "catpart1.bin"
    lines = path.read_text().split("\n")
    lines[BAD_LINE - 1] = "3,x7,1"
    path.write_text("\n".join(lines))
    return spec, folder


@pytest.fixture(scope="module")
def validated(source, tmp_path_factory) -> dict:
    spec, folder = source
    return validate_csvs(spec, folder, tmp_path_factory.mktemp("byo-val") / "validated", inputs={"test": 1},
                         budget=0.01)


@pytest.fixture(scope="module")
def transcoded(spark, source, validated, tmp_path_factory):
    from spark_jobs.byo.transcode import main

    spec, folder = source
    out = tmp_path_factory.mktemp("byo-out") / "dataset"
    result = main(["--spec", str(folder / "feature_spec.yaml"), "--output", str(out),
                   "--expected-bad-rows", json.dumps(validated["bad_rows"])])
    return out, result


# ---- spec and generator (no Spark) ----------------------------------------------------------------------------------


def test_nvidias_small_csv_spec_is_accepted_with_declared_and_auto_cardinalities(tmp_path):
    spec = load_csv_spec(SMALL_CSV)
    assert declared_cardinalities(spec)["cat_5.bin"] == 127
    auto = load_csv_spec(small_csv_spec(tmp_path, cat_1__bin="auto"))
    assert declared_cardinalities(auto)["cat_1.bin"] is None
    assert [c.features for c in csv_chunks(spec, "train")][2] == ("cat_0.bin", "cat_1.bin", "cat_2.bin")
    # NVIDIA's split-binary check rejects a CSV spec (no dtypes, csv chunks): the two checks are distinct
    with pytest.raises(FeatureSpecError):
        spec.check_feature_spec()


def test_cardinalities_auto_is_max_plus_one_and_declared_must_cover_the_data():
    spec = load_csv_spec(SMALL_CSV)
    spec.feature_spec["cat_1.bin"]["cardinality"] = "auto"
    found = {"cat_0.bin": 10, "cat_1.bin": 777, "cat_2.bin": 1, "cat_3.bin": 3, "cat_4.bin": 50, "cat_5.bin": 0}
    assert resolve_cardinalities(spec, found) == [10, 777, 45000, 100, 50, 127]
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_4\.bin: declared cardinality 50 does not cover "
                                               r"id 50"):
        resolve_cardinalities(spec, {**found, "cat_4.bin": 51})


def test_generator_writes_aligned_chunks_with_ids_in_range_and_a_learnable_label(source):
    spec, folder = source
    for mapping, n in ROWS.items():
        columns = read_csv_rows(spec, folder, mapping)
        assert {len(v) for v in columns.values()} == {n}
    clean = load_csv_spec(SMALL_CSV)
    out = folder.parent / "generated-again"
    write_csvs(clean, out, {"train": 4000, "test": 10}, seed=1)
    columns = read_csv_rows(clean, out, "train")
    for name, card in declared_cardinalities(clean).items():
        ids = np.array(columns[name], dtype=np.int64)
        assert ids.min() >= 0 and ids.max() < card, name
    label = np.array(columns["label"], dtype=np.int64)
    assert 0.1 < label.mean() < 0.9
    # the planted signal: the label follows the first categorical's effect
    effect = planted_signal(clean, seed=1).effects["cat_0.bin"][np.array(columns["cat_0.bin"], dtype=np.int64)]
    assert label[effect > 0].mean() - label[effect < 0].mean() > 0.2


def test_validation_counts_the_bad_row_within_budget_and_records_the_largest_ids(source, validated):
    spec, folder = source
    assert validated["rows"] == ROWS and validated["bad_rows"] == {"train": 1, "test": 0}
    out = Path(validated["path"])
    assert (out / MANIFEST_NAME).is_file()
    bad = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(b["file"], b["line"], b["column"], b["column_name"]) for b in bad] == [
        ("train/catpart1.bin", BAD_LINE, 2, "cat_4.bin")]
    report = json.loads((out / "report.json").read_text())
    assert report["gx"]["train__catpart1.bin"]["statistics"]["evaluated_expectations"] > 0
    train = read_csv_rows(spec, folder, "train")
    assert validated["max_ids"]["cat_1.bin"] == max(int(v) for v in train["cat_1.bin"])


# ---- the Spark transcode ----------------------------------------------------------------------------------------


@pytest.mark.spark
def test_transcode_output_passes_nvidias_checks_and_readers(transcoded):
    out, result = transcoded
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    spec.check_feature_spec(tf2_compatible=True)
    summary = check_dataset(spec)
    assert summary.rows == {"train": ROWS["train"] - 1, "test": ROWS["test"]} == result.rows
    assert result.dropped == {"train": 1, "test": 0}
    # NVIDIA's default layout: features renamed in channel order, one split_binary chunk each
    assert spec.channel_spec["categorical"] == [f"cat_{i}.bin" for i in range(6)]
    assert [c["files"] for c in spec.source_spec["train"][:2]] == [["train/numerical.bin"], ["train/label.bin"]]
    for mapping, batch in (("train", 64), ("test", 50)):
        pytorch = _read_like_pytorch(out / "feature_spec.yaml", mapping, batch)
        assert sum(len(b[2]) for b in pytorch) == summary.rows[mapping]  # short last batch kept
        tf2 = _read_like_tf2(out / "feature_spec.yaml", mapping, batch)
        assert len(tf2) == summary.rows[mapping] // batch  # partial batch dropped, as TF2 does
    manifest = read_manifest(out)
    assert manifest["extra"]["features"]["cat_5.bin"] == "cat_5.bin" and manifest["rows"] == result.rows


@pytest.mark.spark
def test_transcode_equals_the_csvs_row_for_row_without_the_bad_row(source, transcoded):
    spec_in, folder = source
    out, _ = transcoded
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    for mapping, n in ROWS.items():
        columns = read_csv_rows(spec_in, folder, mapping)
        keep = np.ones(n, bool)
        if mapping == "train":
            keep[BAD_LINE - 1] = False
        numerical, categorical, label = read_rows(spec, mapping, 0, n)
        expected_num = np.array([columns[f] for f in spec_in.channel_spec["numerical"]], dtype=np.float64).T[keep]
        # NVIDIA's rule: float64 -> float32 -> float16 (tests/test_byo_arrow.py plants values where it matters)
        np.testing.assert_array_equal(numerical, expected_num.astype(np.float32).astype(np.float16))
        expected_cat = np.array([[int(v) for v in columns[f]] if f != "cat_4.bin" or mapping == "test" else
                                 [int(v) if v.isdigit() else -1 for v in columns[f]]
                                 for f in spec_in.channel_spec["categorical"]]).T[keep]
        np.testing.assert_array_equal(categorical, expected_cat)
        np.testing.assert_array_equal(label, np.array(columns["label"], dtype=np.int64)[keep] == 1)


@pytest.mark.spark
def test_transcode_sets_auto_to_max_plus_one_and_dtypes_by_cardinality(source, transcoded):
    spec_in, folder = source
    out, result = transcoded
    spec = FeatureSpec.from_yaml(out / "feature_spec.yaml")
    found = {}
    for mapping in ROWS:
        columns = read_csv_rows(spec_in, folder, mapping)
        for name in AUTO:
            found[name] = max(found.get(name, 0), max(int(v) for v in columns[name]) + 1)
    cards = spec.get_categorical_sizes()
    assert cards == result.cardinalities == [10, found["cat_1.bin"], found["cat_2.bin"], 100, 50, 127]
    for name, card in zip(spec.get_categorical_feature_names(), cards):
        assert spec.feature_spec[name]["dtype"] == np.dtype(get_categorical_feature_type(card)).name
    assert spec.feature_spec["cat_5.bin"]["dtype"] == "int16"  # 127 -> int16: NVIDIA's strict '<' rule


@pytest.mark.spark
def test_transcode_rerun_replaces_the_output_and_never_appends(source, transcoded):
    from spark_jobs.byo.transcode import main

    _, folder = source
    out, _ = transcoded
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.bin")}
    main(["--spec", str(folder / "feature_spec.yaml"), "--output", str(out)])
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.bin")}
    assert after == before  # same bytes: replaced, not doubled
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.spark
def test_transcode_fails_naming_an_under_declared_feature_and_writes_nothing(spark, source, tmp_path):
    from spark_jobs.byo.transcode import main

    spec_in, folder = source
    spec = yaml.safe_load((folder / "feature_spec.yaml").read_text())
    spec["feature_spec"]["cat_3.bin"]["cardinality"] = 2  # the generated ids go up to 99
    (folder / "under.yaml").write_text(yaml.dump(spec))
    with pytest.raises(FeatureSpecError, match=r"feature_spec\.cat_3\.bin: declared cardinality 2 does not cover"):
        main(["--spec", str(folder / "under.yaml"), "--output", str(tmp_path / "dataset")])
    assert not (tmp_path / "dataset").exists()
    check_csv_spec(spec_in)
