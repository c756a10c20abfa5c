"""Bring-your-own data a user may really hand over: refused by the validation in one line (file, line, column)
before any transcode or training, or fetched as named (S3 keys with Hive-style folders)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.byo.demo import write_demo_source
from tasks.byo.spec import MAX_CARDINALITY, load_csv_spec
from tasks.byo.validation import validate_csvs
from tasks.core.storage import MANIFEST_NAME
from tasks.core.validation import DataQualityError


def _validate(spec_path: Path, out: Path, budget: float = 0.05) -> dict:
    return validate_csvs(load_csv_spec(spec_path), spec_path.parent, out, inputs={}, budget=budget)


def _set_lines(path: Path, replace: dict[int, str]) -> None:
    """Lines (1-based) of `path` replaced."""
    lines = path.read_text().splitlines()
    for number, text in replace.items():
        lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_an_id_past_what_an_auto_cardinality_holds_is_refused_naming_file_line_and_column(tmp_path):
    """'auto' is max id + 1: a raw 64-bit id (a hash) would make a table no int32 id can index. Refused while the
    rows are checked, not after a whole transcode pass with a line naming no file."""
    spec_path = write_demo_source(tmp_path / "source", 300, 100, seed=3)
    spec_path.write_text(spec_path.read_text().replace("cardinality: 127", "cardinality: auto"))
    assert "cardinality: auto" in spec_path.read_text()
    catpart = spec_path.parent / "train" / "catpart1.csv"
    fields = catpart.read_text().splitlines()[6].split(",")
    fields[2] = str(MAX_CARDINALITY)  # one past the largest id an int32 table of MAX_CARDINALITY rows holds
    _set_lines(catpart, {7: ",".join(fields)})
    with pytest.raises(DataQualityError, match=rf"^train/catpart1.csv line 7 column 3 \(cat_5.bin\): id "
                                               rf"{MAX_CARDINALITY} is too big for an 'auto' cardinality"):
        _validate(spec_path, tmp_path / "validated")
    assert not (tmp_path / "validated").exists()
    fields[2] = str(MAX_CARDINALITY - 1)  # the largest: accepted
    _set_lines(catpart, {7: ",".join(fields)})
    assert _validate(spec_path, tmp_path / "validated")["max_ids"]["cat_5.bin"] == MAX_CARDINALITY - 1


def test_the_bad_row_budget_holds_for_the_test_rows_on_their_own(tmp_path):
    """60 bad labels of 100 test rows: within a 50% budget of all 400 rows, not of the test rows. Refused, naming
    the first bad test row (the train rows once let such a test set through)."""
    spec_path = write_demo_source(tmp_path / "source", 300, 100, seed=4)
    _set_lines(spec_path.parent / "test" / "label.csv", {n: "2" for n in range(1, 61)})
    with pytest.raises(DataQualityError, match=r"^test/label.csv line 1 column 1 \(label\): value '2' is not 0 or 1 "
                                               r"\(60 bad rows of 100, 60% > budget 50%\)") as refused:
        _validate(spec_path, tmp_path / "validated", budget=0.5)
    assert "quarantine and GX report in" in str(refused.value)


def test_a_mapping_whose_labels_are_all_one_class_is_refused_before_training(tmp_path):
    """AUC (evaluate, the gate) needs both labels: found in the validation, not after hours of training."""
    spec_path = write_demo_source(tmp_path / "source", 300, 100, seed=5)
    _set_lines(spec_path.parent / "test" / "label.csv", {n: "0" for n in range(1, 101)})
    with pytest.raises(DataQualityError, match=r"^source_spec.test: every good row's label is 0 \(100 lines, 0 bad\): "
                                               r"training and its AUC need rows of both labels, 0 and 1$"):
        _validate(spec_path, tmp_path / "validated")
    assert not (tmp_path / "validated" / MANIFEST_NAME).exists()  # the report stays for the user, never complete
    assert (tmp_path / "validated" / "report.json").is_file()


def test_data_files_in_hive_style_s3_folders_are_fetched_by_their_keys(s3_server, s3_bucket, tmp_path):
    """An S3 key is taken verbatim: 'date=2024-01-01/…' was percent-encoded ('date%3D…') and not found."""
    from tasks.byo.pipeline import data_file_url, fetch_sources
    from tasks.core.config import Settings

    spec_path = write_demo_source(tmp_path / "source", 60, 20, seed=6)
    spec_text = spec_path.read_text().replace("- train/", "- date=2024-01-01 part/train/")
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="byo/feature_spec.yaml", Body=spec_text.encode())
    for path in spec_path.parent.rglob("*.csv"):
        rel = path.relative_to(spec_path.parent).as_posix()
        key = f"byo/date=2024-01-01 part/{rel}" if rel.startswith("train/") else f"byo/{rel}"
        client.put_object(Bucket=s3_bucket, Key=key, Body=path.read_bytes())
    settings = Settings(data_root=tmp_path / "data", source_allowed_prefixes=(f"s3://{s3_bucket}/byo",))
    run = {"spec_uri": f"s3://{s3_bucket}/byo/feature_spec.yaml", "data_uri": f"s3://{s3_bucket}/byo"}
    fetched = fetch_sources(settings, "r1", run, s3_client=client)
    assert "date=2024-01-01 part/train/label.csv" in fetched["files"] and len(fetched["files"]) == 8
    assert (Path(fetched["path"]) / "date=2024-01-01 part" / "train" / "label.csv").read_bytes() == \
        (spec_path.parent / "train" / "label.csv").read_bytes()
    # http(s) and file:// paths are decoded by their readers: encoded there
    assert data_file_url("https://host/byo", "date=1 x/a.csv") == "https://host/byo/date%3D1%20x/a.csv"
    assert data_file_url("file:///data/byo", "a b.csv") == "file:///data/byo/a%20b.csv"


def test_a_spec_that_names_a_key_twice_is_refused_naming_the_line(tmp_path):
    """YAML keeps the last of two equal keys: a feature written twice (one of them edited) would lose the first
    without a word."""
    from tasks.formats.feature_spec import FeatureSpecError

    spec_path = write_demo_source(tmp_path / "source", 60, 20, seed=7)
    text = spec_path.read_text()
    assert load_csv_spec(spec_path)
    lines = text.splitlines()
    at = lines.index("  num_0: {}")
    spec_path.write_text("\n".join([*lines[:at + 1], "  num_0: {dtype: float16}", *lines[at + 1:]]) + "\n")
    with pytest.raises(FeatureSpecError, match=rf"line {at + 2}: key 'num_0' appears twice in one mapping"):
        load_csv_spec(spec_path)


def test_a_file_named_in_both_train_and_test_is_a_warning(tmp_path, caplog):
    spec_path = write_demo_source(tmp_path / "source", 60, 20, seed=8)
    spec_path.write_text(spec_path.read_text().replace("- test/label.csv", "- train/label.csv"))
    with caplog.at_level("WARNING", logger="tasks.byo.spec"):
        load_csv_spec(spec_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "names train/label.csv in both source_spec.train and source_spec.test" in warnings[0]


def test_the_spark_engine_refuses_files_hadoop_cannot_decompress_before_it_starts(tmp_path):
    """Hadoop's Lz4Codec reads its own block format, not the LZ4 frames `lz4` and pyarrow write: one line saying to
    use the arrow engine, instead of a Spark job failing on every retry (.gz, .bz2 and .zst it reads)."""
    from tasks.byo.pipeline import _check_spark_reads
    from tasks.formats.feature_spec import FeatureSpecError

    spec_path = write_demo_source(tmp_path / "source", 60, 20, seed=9)
    _check_spark_reads(spec_path)  # plain files
    spec_path.write_text(spec_path.read_text().replace("label.csv", "label.csv.gz")
                         .replace("numerical.csv", "numerical.csv.zst").replace("catpart0.csv", "catpart0.csv.lz4"))
    with pytest.raises(FeatureSpecError, match=r"^train/catpart0.csv.lz4 \(and 1 more\): the spark engine reads "
                                               r"plain, .gz, .bz2, .zst files, not LZ4 frames .* engine arrow"):
        _check_spark_reads(spec_path)
