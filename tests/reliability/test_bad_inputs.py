"""Bad-input corpus, data inputs: raw Criteo days (validate_raw), downloads, FeatureSpecs and split-binary datasets
(validate_dataset). Each case fails with one clear line naming what and where, or is quarantined within budget; leaves
nothing marked complete (no manifest, download sidecar or destination file); and raises our own error type, never a
bare library traceback (tests/reliability/contract.py). Every case is its own test; the line it produced is printed
as `[error line] ...` (run with -s to collect them).

Sibling modules: test_bad_artifacts.py (checkpoints, artifact store, publish, Spark), test_bad_params.py (DAG params).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.criteo import layout as criteo_layout
from tasks.core.config import Settings
from tasks.criteo.schema import RAW_COLUMNS
from tasks.core.storage import MANIFEST_NAME
from tests.reliability.contract import DAY, ROWS, good_day_lines, nothing_complete, one_line, snapshot
from tests.servers import free_port

pytestmark = pytest.mark.reliability

BAD_LINE = 3


# ---- raw Criteo days: validate_raw ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_lines() -> list[bytes]:
    return list(good_day_lines())


def with_field(line: bytes, name: str, value: bytes) -> bytes:
    parts = line.split(b"\t")
    parts[RAW_COLUMNS.index(name)] = value
    return b"\t".join(parts)


def column_of(line: bytes, name: str) -> int:
    """1-based byte column where field `name` starts."""
    return sum(len(p) + 1 for p in line.split(b"\t")[: RAW_COLUMNS.index(name)]) + 1


def validate(tmp_path: Path, data: bytes, budget: float = 0.0, block_bytes: int = 64 << 20) -> dict:
    """The validate_raw task function on a raw day holding `data`."""
    from tasks.criteo.ingest import validate_day

    raw = criteo_layout.raw_day(tmp_path, DAY)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_bytes(data)
    return validate_day(Settings(data_root=tmp_path, validation_block_bytes=block_bytes), DAY, bad_row_budget=budget)


def validation_failure(tmp_path: Path, data: bytes, *named: str, **kw) -> str:
    from tasks.criteo.raw_validation import DataQualityError

    with pytest.raises(DataQualityError) as caught:
        validate(tmp_path, data, **kw)
    message = one_line(caught.value, *named)
    nothing_complete(tmp_path / "criteo")
    return message


BAD_ROWS = [  # id, edit of line BAD_LINE, field at fault (None: the row as a whole), reason in the error line
    ("wrong-field-count", lambda l: l.rsplit(b"\t", 1)[0], None, "has 39 fields, expected 40"),
    ("too-many-fields", lambda l: l + b"\t0", None, "has 41 fields, expected 40"),
    ("non-numeric-integer", lambda l: with_field(l, "int_4", b"12a"), "int_4", "'12a' not an integer"),
    ("float-in-integer-column", lambda l: with_field(l, "int_0", b"1.5"), "int_0", "'1.5' not an integer"),
    ("invalid-utf8", lambda l: with_field(l, "cat_3", b"\xff\xfe0000ab"), "cat_3",
     "'\\xff\\xfe0000ab' not 8 lowercase hex characters"),
    ("wrong-hex-uppercase", lambda l: with_field(l, "cat_7", b"ABCDEF01"), "cat_7", "'ABCDEF01' not 8 lowercase hex"),
    ("wrong-hex-length", lambda l: with_field(l, "cat_25", b"abc1234"), "cat_25", "'abc1234' not 8 lowercase hex"),
    ("label-outside-0-1", lambda l: with_field(l, "label", b"2"), "label", "'2' label must be 0 or 1"),
    ("carriage-return", lambda l: l + b"\r", "cat_25", "carriage return (\\r) inside the row"),
]


@pytest.mark.parametrize("edit, field, reason", [c[1:] for c in BAD_ROWS], ids=[c[0] for c in BAD_ROWS])
def test_bad_row_fails_the_day_naming_line_field_and_column(tmp_path, good_lines, edit, field, reason):
    lines = list(good_lines)
    lines[BAD_LINE - 1] = edit(lines[BAD_LINE - 1])
    where = f"day_0 line {BAD_LINE}"
    if field:
        where += f", field {RAW_COLUMNS.index(field) + 1} ({field}), column {column_of(lines[BAD_LINE - 1], field)}"
    out = criteo_layout.validated_day(tmp_path, DAY)
    validation_failure(tmp_path, b"\n".join(lines) + b"\n", f"day_0: 1 bad rows of {ROWS}",
                       f"first: {where}: {reason}", str(out))
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == 1  # kept for a person to read


def test_empty_day_file_fails(tmp_path):
    validation_failure(tmp_path, b"", "day_0: empty day file (0 rows)")


def test_huge_line_is_skipped_as_one_bad_row_in_bounded_memory(tmp_path, good_lines):
    lines = list(good_lines)
    lines[BAD_LINE - 1] = b"a" * 200_000  # blocks of 64 KiB: the line never sits in memory whole
    validation_failure(tmp_path, b"\n".join(lines) + b"\n", f"day_0: 1 bad rows of {ROWS}",
                       "first: day_0 line 3: line is 200000 bytes, longer than 65536", block_bytes=64 << 10)


def test_label_column_all_empty_fails(tmp_path, good_lines):
    lines = [with_field(line, "label", b"") for line in good_lines]
    validation_failure(tmp_path, b"\n".join(lines) + b"\n", f"day_0: {ROWS} bad rows of {ROWS} (100.000%",
                       "first: day_0 line 1, field 1 (label), column 1: '' label must be 0 or 1")


def test_categorical_column_always_empty_is_valid(tmp_path, good_lines):
    lines = [with_field(line, "cat_3", b"") for line in good_lines]
    result = validate(tmp_path, b"\n".join(lines) + b"\n")
    assert (result["total"], result["bad"]) == (ROWS, 0)
    assert (criteo_layout.validated_day(tmp_path, DAY) / MANIFEST_NAME).is_file()


def test_bad_row_within_budget_is_quarantined_and_the_day_passes(tmp_path, good_lines):
    lines = list(good_lines)
    lines[BAD_LINE - 1] = with_field(lines[BAD_LINE - 1], "int_2", b"x")
    result = validate(tmp_path, b"\n".join(lines) + b"\n", budget=0.01)
    assert (result["good"], result["bad"]) == (ROWS - 1, 1)
    out = criteo_layout.validated_day(tmp_path, DAY)
    quarantined = [json.loads(row) for row in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["column_name"], q["file"]) for q in quarantined] == [(BAD_LINE, "int_2", "day_0")]
    assert (out / MANIFEST_NAME).is_file()


# ---- download ---------------------------------------------------------------------------------------------------


def download_failure(tmp_path: Path, url: str, error: type, *named: str, **kw) -> str:
    """download() into the raw area must raise `error` and leave neither destination, sidecar nor .part. The URL
    itself is on the allow-list unless the case says otherwise (the allow-list cases are further down)."""
    from tasks.core.download import download

    destination = criteo_layout.raw_day(tmp_path, DAY)
    kw.setdefault("allowed_prefixes", [url])
    kw.setdefault("allowed_file_roots", [tmp_path])
    with pytest.raises(error) as caught:
        download(url, destination, **kw)
    message = one_line(caught.value, *named)
    assert not destination.parent.exists() or sorted(destination.parent.iterdir()) == []
    return message


def gzip_source(tmp_path: Path, good_lines: list[bytes], cut) -> str:
    source = tmp_path / "source" / "day_0.gz"
    source.parent.mkdir()
    source.write_bytes(cut(gzip.compress(b"\n".join(good_lines) + b"\n")))
    return source.as_uri()


def test_truncated_gzip(tmp_path, good_lines):
    from tasks.core.download import DownloadError

    url = gzip_source(tmp_path, good_lines, lambda gz: gz[: len(gz) // 2])
    download_failure(tmp_path, url, DownloadError, f"corrupt or truncated gzip {url} near", "compressed byte")


def test_corrupt_gzip(tmp_path, good_lines):
    from tasks.core.download import DownloadError

    def corrupt(gz: bytes) -> bytes:
        middle = len(gz) // 2
        return gz[:middle] + bytes(b ^ 0x5A for b in gz[middle:middle + 64]) + gz[middle + 64:]

    url = gzip_source(tmp_path, good_lines, corrupt)
    download_failure(tmp_path, url, DownloadError, f"corrupt or truncated gzip {url} near", "compressed byte")


def test_gzip_truncated_to_zero_bytes(tmp_path, good_lines):
    from tasks.core.download import DownloadError

    url = gzip_source(tmp_path, good_lines, lambda gz: b"")
    download_failure(tmp_path, url, DownloadError, "gzip", url)


def test_unreachable_source(tmp_path):
    from tasks.core.download import DownloadError

    url = f"http://127.0.0.1:{free_port()}/day_0"  # nothing listens there
    download_failure(tmp_path, url, DownloadError, f"cannot reach {url}", "Connection refused", timeout_s=5)


def test_http_404(tmp_path, http_server):
    from tasks.core.download import SourceNotFound

    url = http_server.url("criteo/day_0")
    download_failure(tmp_path, url, SourceNotFound, f"HTTP 404 for {url}")


def test_checksum_mismatch(tmp_path, http_server, good_lines):
    from tasks.core.download import ChecksumMismatch

    (http_server.root / "day_0").write_bytes(b"\n".join(good_lines))
    wrong = hashlib.sha256(b"another file").hexdigest()
    url = http_server.url("day_0")
    download_failure(tmp_path, url, ChecksumMismatch, f"sha256 mismatch for {url}: expected {wrong}, got",
                     expected_sha256=wrong)


def test_s3_uri_with_dotdot_key(tmp_path, s3_server, s3_bucket):
    from tasks.core.download import DownloadError

    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="secret", Body=b"not for criteo")
    url = f"s3://{s3_bucket}/raw/../secret"
    download_failure(tmp_path, url, DownloadError, f"invalid S3 URI {url}", "'..'", s3_client=client)


def test_s3_missing_key(tmp_path, s3_server, s3_bucket):
    from tasks.core.download import SourceNotFound

    url = f"s3://{s3_bucket}/raw/day_0"
    download_failure(tmp_path, url, SourceNotFound, f"S3 NoSuchKey for {url}", s3_client=s3_server.client())


def test_credentials_in_source_url_are_refused_without_echoing_them(tmp_path):
    from tasks.core.download import DownloadError

    message = download_failure(tmp_path, "https://reader:fake-password@example.invalid/day_0", DownloadError,
                               "credentials in source URL https://example.invalid/day_0")
    assert "fake-password" not in message


# ---- FeatureSpec and split-binary datasets: validate_dataset ------------------------------------------------------

CARDINALITIES = [5, 7, 300]  # int8, int8, int16


def _rows(n: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    cats = np.stack([rng.integers(0, card, n) for card in CARDINALITIES], axis=1)
    cats[0] = np.array(CARDINALITIES) - 1  # row 0 holds every table's largest id
    return rng.integers(0, 2, n), rng.normal(size=(n, 2)).astype(np.float32), cats


@pytest.fixture(scope="module")
def dataset_template(tmp_path_factory) -> Path:
    from tasks.formats.split_binary import write_dataset

    out = tmp_path_factory.mktemp("template") / "dataset"
    write_dataset(out, {"train": [_rows(20, 1)], "test": [_rows(10, 2)], "validation": [_rows(10, 3)]},
                  CARDINALITIES, n_numerical=2)
    return out


@pytest.fixture
def dataset(dataset_template: Path, tmp_path: Path) -> Path:
    from tasks.criteo.preprocess import validate_dataset

    copy = shutil.copytree(dataset_template, tmp_path / "dataset")
    assert validate_dataset(copy)["rows"] == {"train": 20, "test": 10, "validation": 10}  # valid before the edit
    return copy


def dataset_failure(dataset: Path, *named: str) -> str:
    from tasks.criteo.preprocess import DatasetInvalid, validate_dataset

    before = snapshot(dataset)
    with pytest.raises(DatasetInvalid) as caught:
        validate_dataset(dataset)
    assert snapshot(dataset) == before
    nothing_complete(dataset)
    return one_line(caught.value, f"dataset {dataset}: ", *named)


def _set(d: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value


SPEC_EDITS = [  # id, edit of the parsed feature_spec.yaml, what the error line names
    ("missing-label-channel", lambda d: d["channel_spec"].pop("label"), "channel_spec: channels must be exactly"),
    ("missing-categorical-channel", lambda d: d["channel_spec"].pop("categorical"), "missing ['categorical']"),
    ("numerical-dtype-float32", lambda d: _set(d, ("feature_spec", "num_0", "dtype"), "float32"),
     "numerical feature 'num_0' has dtype float32, must be float16"),
    ("categorical-dtype-float", lambda d: _set(d, ("feature_spec", "cat_1.bin", "dtype"), "float16"),
     "feature_spec.cat_1.bin: categorical dtype float16 is not an integer type"),
    ("label-dtype-int8", lambda d: _set(d, ("feature_spec", "label", "dtype"), "int8"),
     "label 'label' has dtype int8, must be bool"),
    ("dtype-not-numpy", lambda d: _set(d, ("feature_spec", "cat_0.bin", "dtype"), "int33"),
     "feature_spec.cat_0.bin: dtype 'int33' is not a numpy dtype"),
    ("cardinality-too-small-for-the-data", lambda d: _set(d, ("feature_spec", "cat_1.bin", "cardinality"), 3),
     "train/cat_1.bin row 0: id 6 >= cardinality 3"),
    ("path-escapes-directory", lambda d: _set(d, ("source_spec", "train", 1, "files"), ["../outside/label.bin"]),
     "source_spec.train chunk 1 (../outside/label.bin)", "resolves outside the feature spec's directory"),
    ("path-escapes-through-subdirectory", lambda d: _set(d, ("source_spec", "test", 2, "files"), ["test/../../x"]),
     "source_spec.test chunk 2 (test/../../x)", "resolves outside"),
    ("path-absolute", lambda d: _set(d, ("source_spec", "train", 1, "files"), ["/etc/passwd"]),
     "file '/etc/passwd' is absolute"),
]


@pytest.mark.parametrize("checked", [False, True], ids=["scanned", "writer-checked"])
@pytest.mark.parametrize("edit, named", [(c[1], c[2:]) for c in SPEC_EDITS], ids=[c[0] for c in SPEC_EDITS])
def test_bad_feature_spec_is_named(dataset, edit, named, checked):
    """Also where the manifest says the writer checked the values (validate_dataset does not scan those): the claim
    holds for the spec it was written with, so a yaml edited since is checked as any other (the cardinality case is
    caught by the scan it then gets)."""
    from tasks.core.storage import Manifest, write_manifest
    from tasks.criteo.preprocess import DatasetInvalid, validate_dataset
    from tasks.formats.split_binary import CHECKED_AT_WRITE

    if checked:  # the transform's manifest, as record_transform writes it
        write_manifest(dataset, Manifest(kind="criteo_transform", inputs={}, extra={CHECKED_AT_WRITE: CARDINALITIES},
                                         rows={"train": 20, "test": 10, "validation": 10}), checksum=False)
    spec_path = dataset / "feature_spec.yaml"
    document = yaml.safe_load(spec_path.read_text())
    edit(document)
    spec_path.write_text(yaml.safe_dump(document))
    if not checked:
        dataset_failure(dataset, *named)
        return
    before = snapshot(dataset)
    with pytest.raises(DatasetInvalid) as caught:
        validate_dataset(dataset)
    assert snapshot(dataset) == before
    one_line(caught.value, f"dataset {dataset}: ", *named)


def _swap_cat_files(d: dict) -> None:
    chunks = d["source_spec"]["train"]
    chunks[2]["files"], chunks[3]["files"] = chunks[3]["files"], chunks[2]["files"]


@pytest.mark.parametrize("pipeline", ["criteo", "byo"])
@pytest.mark.parametrize("edit, named", [
    (_swap_cat_files, ("train/cat_1.bin row 0: id 6 >= cardinality 5",)),  # same cardinalities, other files
    (lambda d: d["channel_spec"].pop("categorical"), ("categorical",)),  # too broken to compare with what was written
], ids=["files-swapped", "no-categorical-channel"])
def test_a_yaml_edited_after_the_writer_checked_the_values_is_not_vouched_for(dataset, pipeline, edit, named):
    """The writer's claim covers the feature spec it wrote: a yaml edited since is scanned (or refused) and named in
    one line by either pipeline's validate_dataset, never trusted and never a bare KeyError."""
    from tasks.byo import pipeline as byo_pipeline
    from tasks.core.storage import Manifest, write_manifest
    from tasks.criteo import preprocess as criteo_preprocess
    from tasks.formats.split_binary import CHECKED_AT_WRITE

    module = criteo_preprocess if pipeline == "criteo" else byo_pipeline
    write_manifest(dataset, Manifest(kind="criteo_transform", inputs={}, extra={CHECKED_AT_WRITE: CARDINALITIES},
                                     rows={"train": 20, "test": 10, "validation": 10}), checksum=False)
    assert module.validate_dataset(dataset)["rows"]["train"] == 20  # trusted as written
    spec_path = dataset / "feature_spec.yaml"
    document = yaml.safe_load(spec_path.read_text())
    edit(document)
    spec_path.write_text(yaml.safe_dump(document))
    with pytest.raises(module.DatasetInvalid) as caught:
        module.validate_dataset(dataset)
    one_line(caught.value, f"dataset {dataset}: ", *named)


def test_feature_spec_that_is_not_yaml(dataset):
    (dataset / "feature_spec.yaml").write_text("feature_spec: [unclosed\n  channel_spec: {\n")
    dataset_failure(dataset, f"{dataset / 'feature_spec.yaml'}: not valid YAML")


def _patch(path: Path, dtype: str, row: int, value: int) -> None:
    data = np.fromfile(path, dtype=dtype)
    data[row] = value
    data.tofile(path)


BINARY_EDITS = [  # id, edit of the written files, what the error line names
    ("mismatched-lengths", lambda d: d.joinpath("train/cat_1.bin").open("ab").write(b"\x01"),
     "train/cat_1.bin: 21 rows but train/label.bin has 20 rows"),
    ("partial-trailing-row", lambda d: d.joinpath("train/numerical.bin").open("ab").write(b"\x00"),
     "train/numerical.bin: 81 bytes is not a whole number of 4-byte rows"),
    ("id-at-cardinality", lambda d: _patch(d / "test/cat_1.bin", "int8", 4, 7), "test/cat_1.bin row 4: id 7 >= "
     "cardinality 7"),
    ("negative-id", lambda d: _patch(d / "train/cat_2.bin", "<i2", 2, -1), "train/cat_2.bin row 2: id -1 < 0"),
    ("label-byte-2", lambda d: _patch(d / "validation/label.bin", "u1", 3, 2),
     "validation/label.bin row 3: byte 2 is not 0 or 1"),
    ("missing-file", lambda d: (d / "validation/cat_0.bin").unlink(), "validation/cat_0.bin: file is missing"),
]


@pytest.mark.parametrize("edit, named", [(c[1], c[2]) for c in BINARY_EDITS], ids=[c[0] for c in BINARY_EDITS])
def test_bad_split_binary_file_is_named(dataset, edit, named):
    edit(dataset)
    dataset_failure(dataset, named)


def test_writer_refuses_ids_at_cardinality_and_writes_nothing(tmp_path):
    from tasks.formats.split_binary import write_dataset

    label, numerical, cats = _rows(10, 4)
    cats[3, 1] = CARDINALITIES[1]
    out = tmp_path / "dataset"
    with pytest.raises(ValueError) as caught:
        write_dataset(out, {"train": [(label, numerical, cats)], "test": [_rows(5, 5)]}, CARDINALITIES, 2)
    one_line(caught.value, f"{out / 'train' / 'cat_1.bin'} row 3: id 7 outside [0, 7)")
    assert not (out / "train").exists() and not (out / "feature_spec.yaml").exists()
    nothing_complete(tmp_path)


# ---- values a trigger form accepts but the deployment does not allow: refused where they are used ---------------

FORM_SOURCES = [  # id, configured RECFLOW_CRITEO_SOURCE (None: the default file:// one), source_url, error line
    ("source-any-host-with-a-file-source", None, "https://evil.example/day_0",
     "source https://evil.example/day_0 is not under an allowed prefix [] "
     "(set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)"),
    ("source-host-that-extends-the-mirror", "https://mirror.example/criteo/day_{day}.gz",
     "https://mirror.example.evil.io/criteo/day_0.gz?X-Amz-Signature=abc",
     "source https://mirror.example.evil.io/criteo/day_0.gz?<hidden> is not under an allowed prefix "
     "['https://mirror.example/criteo/'] (set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)"),
    ("source-sibling-folder-of-the-mirror", "https://mirror.example/criteo/day_{day}.gz",
     "https://mirror.example/criteo-private/day_0.gz",
     "source https://mirror.example/criteo-private/day_0.gz is not under an allowed prefix "
     "['https://mirror.example/criteo/'] (set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)"),
    ("source-encoded-dotdot-out-of-the-mirror", "https://mirror.example/criteo/day_{day}.gz",
     "https://mirror.example/criteo/%2e%2e/secret",
     "source https://mirror.example/criteo/%2e%2e/secret has a '.', '..', empty or encoded-slash path segment: "
     "not allowed in a source URL"),
    ("source-another-bucket", "s3://raw-bucket/criteo/day_{day}.gz", "s3://secrets/day_0",
     "source s3://secrets/day_0 is not under an allowed prefix ['s3://raw-bucket/criteo/'] "
     "(set RECFLOW_SOURCE_ALLOWED_PREFIXES to allow more)"),
]


def _nothing_written(root: Path) -> None:
    nothing_complete(root)
    assert not root.exists() or [p for p in root.rglob("*") if p.is_file()] == []  # not even a lock file


@pytest.mark.parametrize("configured, url, line", [c[1:] for c in FORM_SOURCES], ids=[c[0] for c in FORM_SOURCES])
def test_source_url_outside_the_allowed_prefixes_is_refused(tmp_path, configured, url, line):
    from tasks.core.config import NotAllowed, load_settings
    from tasks.core.download import SourceNotAllowed
    from tasks.criteo.ingest import download_day
    from tasks.criteo.settings import load_criteo_settings

    data = tmp_path / "data"
    criteo = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": configured} if configured else {})
    with pytest.raises(SourceNotAllowed) as caught:  # a NotAllowed: the DAG fails the task without retry
        download_day(load_settings({"RECFLOW_DATA_ROOT": str(data)}), DAY, source=url, criteo=criteo)
    assert isinstance(caught.value, NotAllowed) and one_line(caught.value) == line
    _nothing_written(data)


def test_connection_outside_the_allowed_ids_is_refused(tmp_path):
    from tasks.core.config import load_settings
    from tasks.core.download import ConnectionNotAllowed
    from tasks.criteo.ingest import download_day
    from tasks.criteo.settings import load_criteo_settings

    data = tmp_path / "data"
    criteo = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": "s3://raw-bucket/criteo/day_{day}.gz"})
    with pytest.raises(ConnectionNotAllowed) as caught:
        download_day(load_settings({"RECFLOW_DATA_ROOT": str(data)}), DAY, criteo=criteo, aws_conn_id="prod_admin")
    assert one_line(caught.value) == ("connection 'prod_admin' is not an allowed connection ['aws_default'] "
                                      "(set RECFLOW_ALLOWED_CONN_IDS to allow more)")
    _nothing_written(data)


def _publish(settings, **kw):
    from datetime import datetime, timezone

    from tasks.criteo.dlrm import SPEC

    return SPEC.publish(settings, "manual__1", datetime(2026, 1, 5, tzinfo=timezone.utc), {"auc": 0.8}, {}, run={},
                   model_name="criteo_dlrm", registry_conn_id="", **kw)


@pytest.mark.parametrize("store", ["/etc/recflow", "s3://another-bucket/models", "link-out/models"],
                         ids=["another-directory", "another-bucket", "symlink-out-of-the-store"])
def test_publish_uri_outside_the_allowed_stores_is_refused(tmp_path, store):
    from tasks.core.config import load_settings
    from tasks.release.publish import PublishNotAllowed

    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "published").mkdir(parents=True)
    outside.mkdir()
    (data / "published" / "link-out").symlink_to(outside)  # a link out of an allowed store is followed first
    store = str(data / "published" / store) if store.startswith("link-out") else store
    settings = load_settings({"RECFLOW_DATA_ROOT": str(data)})
    with pytest.raises(PublishNotAllowed) as caught:
        _publish(settings, store_uri=store)
    assert one_line(caught.value) == (f"publish store {store} is not under an allowed store "
                                      f"['{data.resolve() / 'published'}'] (set RECFLOW_PUBLISH_ALLOWED to allow more)")
    _nothing_written(outside)
    assert not (data / "registry.db").exists()


def test_publish_connection_outside_the_allowed_ids_is_refused(tmp_path):
    from tasks.core.config import load_settings
    from tasks.core.download import ConnectionNotAllowed

    settings = load_settings({"RECFLOW_DATA_ROOT": str(tmp_path), "RECFLOW_PUBLISH_URI": "s3://models/published"})
    with pytest.raises(ConnectionNotAllowed) as caught:
        _publish(settings, store_uri="s3://models/published/team-a", aws_conn_id="prod_admin")
    one_line(caught.value, "connection 'prod_admin' is not an allowed connection ['aws_default']",
             "RECFLOW_ALLOWED_CONN_IDS")
    _nothing_written(tmp_path)


# ---- hostile values in a bad row: what reaches the task log is bounded and escaped ------------------------------

HOSTILE_VALUES = [  # id, value of int_3, how the error line quotes it
    ("terminal-escapes", b"\x1b[2J\x1b[31mALL ROWS VALID\x1b[0m", r"'\x1b[2J\x1b[31mALL ROWS VALID\x1b[0m'"),
    ("forged-quote-and-line-separator", "1' ok\u2028day_0: 0 bad rows".encode(), r"'1\' ok\u2028day_0: 0 bad rows'"),
    ("bidi-override", "12\u202e43".encode(), r"'12\u202e43'"),
    ("flood", b"9" * 5000, "'" + "9" * 40 + "'… (5000 bytes)"),
    ("flood-of-escapes", b"\x00" * 5000, "'" + r"\x00" * 10 + "'… (5000 bytes)"),
]


@pytest.mark.parametrize("value, quoted", [c[1:] for c in HOSTILE_VALUES], ids=[c[0] for c in HOSTILE_VALUES])
def test_hostile_bad_value_is_bounded_and_escaped_in_the_error_line(tmp_path, good_lines, value, quoted):
    lines = list(good_lines)
    lines[BAD_LINE - 1] = with_field(lines[BAD_LINE - 1], "int_3", value)
    column = column_of(lines[BAD_LINE - 1], "int_3")
    message = validation_failure(tmp_path, b"\n".join(lines) + b"\n", f"day_0: 1 bad rows of {ROWS}",
                                 f"first: day_0 line {BAD_LINE}, field 5 (int_3), column {column}: {quoted} "
                                 "not an integer;")
    assert len(message) < 400 + len(str(tmp_path))
    report = json.loads((criteo_layout.validated_day(tmp_path, DAY) / "report.json").read_text())
    assert report["reasons"] == {"int_3: not an integer": 1}  # the value never becomes a reason kind
