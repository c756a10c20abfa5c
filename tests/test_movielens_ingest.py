"""tasks.movielens.ingest: download_snapshot (file:// and a real HTTP server, the published md5, zip-slip, atomic
unzip on retry) and validate_snapshot (typed parquet in file order, quarantine with line numbers, the budget's
one-line error, ml-1m), on synthetic archives from tasks.movielens.synthetic."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tasks.core.config import Settings
from tasks.core.download import ChecksumMismatch, SourceNotAllowed
from tasks.core.storage import MANIFEST_NAME, _HOST, read_manifest
from tasks.movielens import layout
from tasks.movielens.ingest import (
    DataQualityError, StepInputMissing, checksum_url, download_snapshot, file_md5, parse_md5_file, validate_snapshot,
)
from tasks.core.validation import DistinctPairs
from tasks.movielens.raw_ratings import check_block
from tasks.movielens.schema import ML_1M, ML_20M, VALIDATED_COLUMNS, validated_arrow_schema
from tasks.movielens.settings import MovieLensSettings, load_movielens_settings
from tasks.movielens.synthetic import generate_ratings, md5_line, write_archive
from tests.http_range_server import start_range_server

PARAMS = {"users": 120, "items": 200, "ratings_per_user": 22, "seed": 5}
MD5 = "cd245b17a1ae2cc31bb14903e1204af3"  # ml-20m.zip's published md5, not a secret  # pragma: allowlist secret
NOW = 1_700_000_000  # validation's clock in the direct check_block tests


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Small blocks, so even these small files are validated in many blocks (boundaries, carry-over, buckets).
    return Settings(data_root=tmp_path / "data", validation_block_bytes=8 << 10)


def source_archive(settings: Settings, name: str = "ml-20m", **overrides) -> Path:
    return write_archive(layout.source_dir(settings.data_root), name, **{**PARAMS, **overrides})


def files_under(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")) if directory.exists() else []


def read_validated(settings: Settings, name: str):
    import pyarrow.parquet as pq

    return pq.read_table(layout.validated_ratings(settings.data_root, name))


# --- the published checksum --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    f"MD5 (ml-20m.zip) = {MD5}\n",                      # GroupLens (BSD md5)
    f"{MD5}  ml-20m.zip\n",                              # GNU md5sum
    f"{MD5.upper()} *ml-20m.zip\n",                      # GNU, binary mode, upper-case hex
    f"{'0' * 32}  ml-1m.zip\n{MD5}  ./ml-20m.zip\n",     # a list of files: ours is picked
    f"{MD5}\n",                                          # a bare digest
])
def test_md5_files_in_both_formats_are_parsed(text: str) -> None:
    assert parse_md5_file(text, "ml-20m.zip") == MD5


@pytest.mark.parametrize("text", ["MD5 (ml-1m.zip) = " + MD5, "not a checksum", "", f"{MD5}  ml-20m.zip\n{'1' * 32}"])
def test_md5_files_without_our_digest_fail_with_one_line(text: str) -> None:
    with pytest.raises(ValueError,
                       match=r"^(no|conflicting) md5s? for ml-20m\.zip in https://h/x\.md5: expected") as info:
        parse_md5_file(text, "ml-20m.zip", shown="https://h/x.md5")
    assert "\n" not in str(info.value)


def test_checksum_url_keeps_a_query_string_last() -> None:
    assert checksum_url("https://h/d/ml-20m.zip") == "https://h/d/ml-20m.zip.md5"
    assert checksum_url("https://h/d/ml-20m.zip?sig=1") == "https://h/d/ml-20m.zip.md5?sig=1"
    assert checksum_url("file:///data/ml-20m.zip") == "file:///data/ml-20m.zip.md5"


def test_settings_load_from_the_environment(tmp_path: Path) -> None:
    loaded = load_movielens_settings({"RECFLOW_MOVIELENS_SOURCE": "https://files.example/ml/{name}.zip",
                                      "RECFLOW_MOVIELENS_DATASET": "ml-1m", "RECFLOW_MOVIELENS_BAD_ROW_BUDGET": "0.02"})
    deployment = Settings(data_root=tmp_path)
    assert loaded.source_url(tmp_path, "ml-1m") == "https://files.example/ml/ml-1m.zip"
    assert loaded.allowed_source_prefixes(deployment) == ("https://files.example/ml/",)
    assert (loaded.dataset, loaded.budget(deployment)) == ("ml-1m", 0.02)
    default = load_movielens_settings({})
    assert default.source_url(tmp_path, "ml-20m") == (tmp_path / "movielens/source/ml-20m.zip").as_uri()
    assert default.budget(deployment) == deployment.bad_row_budget and default.allowed_source_prefixes(deployment) == ()
    with pytest.raises(ValueError, match="unknown MovieLens snapshot 'ml-100k'"):
        load_movielens_settings({"RECFLOW_MOVIELENS_DATASET": "ml-100k"})


# --- download_snapshot -------------------------------------------------------------------------------------------


def test_download_from_file_source_verifies_unzips_and_is_cached_on_retry(settings: Settings) -> None:
    archive = source_archive(settings)
    first = download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    root = settings.data_root
    ratings = layout.ratings_file(root, "ml-20m")
    assert first["md5"] == archive.with_name("ml-20m.zip.md5").read_text().split(" = ")[1].strip()
    assert (first["archive"], first["extracted"], first["ratings_file"]) == (
        str(layout.raw_archive(root, "ml-20m")), str(layout.extracted_dir(root, "ml-20m")), str(ratings))
    assert not first["cached"]
    with zipfile.ZipFile(archive) as zf:
        assert ratings.read_bytes() == zf.read("ml-20m/ratings.csv")
    assert files_under(layout.extracted_dir(root, "ml-20m")) == [
        MANIFEST_NAME, "ml-20m", "ml-20m/README.txt", "ml-20m/movies.csv", "ml-20m/ratings.csv"]
    written = ratings.stat().st_mtime_ns
    second = download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    assert second["cached"] and second["md5"] == first["md5"] and ratings.stat().st_mtime_ns == written


def test_download_over_http_fetches_the_zip_once_and_notices_a_new_snapshot(settings: Settings,
                                                                             tmp_path: Path) -> None:
    served = tmp_path / "served"
    write_archive(served, "ml-1m", **PARAMS)
    server, base = start_range_server(served)
    try:
        movielens = MovieLensSettings(source=base + "/{name}.zip")  # its folder is the allowed prefix
        result = download_snapshot(settings, "ml-1m", movielens=movielens)
        assert server.requests == [("/ml-1m.zip.md5", None), ("/ml-1m.zip", None)]
        assert result["source"] == f"{base}/ml-1m.zip" and not result["cached"]
        assert layout.ratings_file(settings.data_root, "ml-1m").is_file()
        # The weekly check: only the published checksum is read again; the verified copy answers the rest.
        assert download_snapshot(settings, "ml-1m", movielens=movielens)["cached"]
        assert server.requests[2:] == [("/ml-1m.zip.md5", None)]
        # GroupLens publishes a new snapshot at the same URL: its new md5 makes the old copy stale.
        write_archive(served, "ml-1m", **{**PARAMS, "seed": PARAMS["seed"] + 1})
        renewed = download_snapshot(settings, "ml-1m", movielens=movielens)
        assert server.requests[3:] == [("/ml-1m.zip.md5", None), ("/ml-1m.zip", None)]
        assert not renewed["cached"] and renewed["md5"] != result["md5"]
        assert renewed["md5"] == file_md5(layout.raw_archive(settings.data_root, "ml-1m"))
    finally:
        server.shutdown()
        server.server_close()


def test_download_from_s3_with_the_default_credential_chain(settings: Settings, tmp_path: Path, s3_server,
                                                             s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    archive = write_archive(tmp_path / "served", "ml-20m", **PARAMS)
    client = s3_server.client()
    for path in (archive, archive.with_name("ml-20m.zip.md5")):
        client.put_object(Bucket=s3_bucket, Key=f"grouplens/{path.name}", Body=path.read_bytes())
    movielens = MovieLensSettings(source=f"s3://{s3_bucket}/grouplens/{{name}}.zip")
    result = download_snapshot(settings, "ml-20m", movielens=movielens)
    with zipfile.ZipFile(archive) as zf:
        assert layout.ratings_file(settings.data_root, "ml-20m").read_bytes() == zf.read(ML_20M.member)
    assert result["source"] == f"s3://{s3_bucket}/grouplens/ml-20m.zip" and not result["cached"]


def test_md5_mismatch_fails_with_one_line_and_leaves_nothing_complete(settings: Settings) -> None:
    archive = source_archive(settings)
    checksum = archive.with_name("ml-20m.zip.md5")
    good = checksum.read_text()
    checksum.write_text(md5_line("ml-20m.zip", "0" * 32))
    with pytest.raises(ChecksumMismatch) as info:
        download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"md5 mismatch for {archive.as_uri()}: published {'0' * 32}")
    raw = layout.extracted_dir(settings.data_root, "ml-20m").parent
    assert files_under(raw) == []  # no zip, no checksum, no sidecar, no extraction
    checksum.write_text(good)  # the mirror fixed: the retry downloads both again and succeeds
    assert not download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())["cached"]


def test_source_outside_the_allowed_prefixes_writes_nothing(settings: Settings) -> None:
    movielens = MovieLensSettings(source="https://mirror.example/movielens/{name}.zip")
    with pytest.raises(SourceNotAllowed, match="not under an allowed prefix"):
        download_snapshot(settings, "ml-20m", source="https://evil.example/ml-20m.zip", movielens=movielens)
    assert not settings.data_root.exists()  # not even the snapshot's lock file


@pytest.mark.parametrize("member", ["../escaped.txt", "/tmp/absolute.txt", "ml-20m/../../escaped.txt"])
def test_zip_slip_members_are_refused(settings: Settings, member: str) -> None:
    source_archive(settings, extra_members={member: b"planted"})
    with pytest.raises(DataQualityError, match=r"^ml-20m\.zip: member .* would be written outside the extraction "
                                               r"folder; refusing to unpack it \(from file://"):
        download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    raw = layout.extracted_dir(settings.data_root, "ml-20m").parent
    assert not layout.extracted_dir(settings.data_root, "ml-20m").exists()
    assert not any(p.name in ("escaped.txt", "absolute.txt") for p in settings.data_root.rglob("*"))
    assert not [p for p in raw.iterdir() if p.name.startswith(".tmp-")]


def test_archive_without_its_ratings_file_fails_with_one_line(settings: Settings) -> None:
    folder = layout.source_dir(settings.data_root)
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "ml-20m.zip", "w") as zf:
        zf.writestr("ml-20m/movies.csv", "movieId,title,genres\n")
    (folder / "ml-20m.zip.md5").write_text(md5_line("ml-20m.zip", hashlib.md5((folder / "ml-20m.zip").read_bytes())
                                                    .hexdigest()))
    with pytest.raises(DataQualityError, match=r"^ml-20m\.zip holds no ml-20m/ratings\.csv \(members: "
                                               r"\['ml-20m/movies\.csv'\]\) \(from file://"):
        download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    assert not layout.extracted_dir(settings.data_root, "ml-20m").exists()


def test_a_killed_unzip_is_redone_atomically_on_retry(settings: Settings) -> None:
    """A first attempt killed mid-unzip left its temporary sibling and (an older layout) a half folder without a
    manifest; the retry removes the dead writer's temporary and replaces the folder with a complete one."""
    archive = source_archive(settings)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    extracted = layout.extracted_dir(settings.data_root, "ml-20m")
    leftover = extracted.parent / f".tmp-ml-20m~{_HOST}~{dead_pid}~deadbeef"
    (leftover / "ml-20m").mkdir(parents=True)
    (leftover / "ml-20m" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,")
    (extracted / "ml-20m").mkdir(parents=True)
    (extracted / "ml-20m" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,")
    result = download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    assert not result["cached"] and not leftover.exists()
    with zipfile.ZipFile(archive) as zf:
        assert layout.ratings_file(settings.data_root, "ml-20m").read_bytes() == zf.read("ml-20m/ratings.csv")
    assert read_manifest(extracted)["inputs"]["md5"] == result["md5"]
    # A later truncation of an extracted file (sizes no longer match the manifest) is repaired the same way.
    layout.ratings_file(settings.data_root, "ml-20m").write_text("truncated")
    assert not download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())["cached"]
    assert layout.ratings_file(settings.data_root, "ml-20m").stat().st_size > 1000


# --- validate_snapshot -------------------------------------------------------------------------------------------


def test_validation_before_download_says_what_to_run(settings: Settings) -> None:
    with pytest.raises(StepInputMissing,
                       match=r"^MovieLens ml-20m has no complete download in .*: run download first$"):
        validate_snapshot(settings, "ml-20m", bad_row_budget=0.01)


def test_good_snapshot_validates_to_typed_rows_in_file_order_with_the_generators_counts(settings: Settings) -> None:
    source_archive(settings)
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    result = validate_snapshot(settings, "ml-20m", bad_row_budget=0.0)
    data = generate_ratings("ml-20m", **PARAMS)  # what the archive holds
    assert {k: result[k] for k in ("rows", "good_rows", "bad_rows", "duplicates", "users", "items", "min_timestamp",
                                   "max_timestamp")} == {
        "rows": data.rows, "good_rows": data.rows, "bad_rows": 0, "duplicates": data.duplicates,
        "users": len(np.unique(data.user_ids)), "items": len(np.unique(data.item_ids)),
        "min_timestamp": int(data.timestamps.min()), "max_timestamp": int(data.timestamps.max())}
    assert data.duplicates > 0 and not result["cached"]
    table = read_validated(settings, "ml-20m")
    assert table.schema == validated_arrow_schema() and tuple(table.column_names) == VALIDATED_COLUMNS
    columns = table.to_pydict()
    assert columns["line"] == list(range(2, data.rows + 2))  # the header is line 1
    assert columns["user_id"] == data.user_ids.tolist() and columns["item_id"] == data.item_ids.tolist()
    assert columns["rating"] == data.ratings.tolist() and columns["timestamp"] == data.timestamps.tolist()
    out = layout.validated_dir(settings.data_root, "ml-20m")
    assert (out / "quarantine.jsonl").read_text() == ""
    report = json.loads((out / "report.json").read_text())
    assert report["gx"]["success"] is True and report["gx"]["statistics"]["evaluated_expectations"] == 11
    assert read_manifest(out)["inputs_fingerprint"] == result["fingerprint"]
    again = validate_snapshot(settings, "ml-20m", bad_row_budget=0.0)
    assert again["cached"] and {**again, "cached": False} == result


BAD_20M = {  # line -> (text, column named in the quarantine, rule)
    3: ("1,2,7.5,1112486027", "rating", "is not in 0.5..5"),
    10: ("1,2,4.3,1112486027", "rating", "is not a multiple of 0.5"),
    11: ("x1,2,4.0,1112486027", "userId", "is not an integer"),
    12: ("1,0,4.0,1112486027", "movieId", "is not a positive id"),
    20: ("1,2,4.0,12", "timestamp", "is not a plausible time"),
    21: ("1,2,4.0", None, "wrong number of fields"),
    40: ("", None, "empty line"),
}


def test_bad_rows_under_budget_are_quarantined_with_their_line_numbers(settings: Settings) -> None:
    source_archive(settings, bad_lines={line: text for line, (text, _, _) in BAD_20M.items()})
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    result = validate_snapshot(settings, "ml-20m", bad_row_budget=0.01)
    data = generate_ratings("ml-20m", **PARAMS)
    assert (result["rows"], result["bad_rows"], result["good_rows"]) == (data.rows, 7, data.rows - 7)
    out = layout.validated_dir(settings.data_root, "ml-20m")
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["column_name"]) for q in quarantined] == [(k, v[1]) for k, v in BAD_20M.items()]
    assert all(q["rule"].startswith(BAD_20M[q["line"]][2]) and q["file"] == "ratings.csv" for q in quarantined)
    assert quarantined[0]["reason"] == "'7.5' is not in 0.5..5" and quarantined[0]["byte"] == 5
    lines = read_validated(settings, "ml-20m").column("line").to_pylist()
    assert not set(BAD_20M) & set(lines) and len(lines) == data.rows - 7 and lines == sorted(lines)
    report = json.loads((out / "report.json").read_text())
    assert report["reasons"]["rating: is not in 0.5..5"] == 1 and report["first_bad"].startswith("ratings.csv line 3")
    unexpected = {(r["expectation_config"]["type"], r["expectation_config"]["kwargs"].get("column")):
                  r["result"].get("unexpected_count") for r in report["gx"]["result"]["results"]}
    assert report["gx"]["success"] is True  # 7 bad lines in ~2,700 of evidence: within mostly = 0.99
    assert {key: unexpected[key] for key in [  # GX, parsing on its own, finds the planted lines among its evidence
        ("expect_column_values_to_be_in_set", "rating"), ("expect_column_values_to_be_between", "timestamp"),
        ("expect_column_values_to_be_between", "item_id"), ("expect_column_values_to_be_between", "field_count"),
        ("expect_column_values_to_not_be_null", "user_id")]} == {
        ("expect_column_values_to_be_in_set", "rating"): 2, ("expect_column_values_to_be_between", "timestamp"): 1,
        ("expect_column_values_to_be_between", "item_id"): 1, ("expect_column_values_to_be_between", "field_count"): 2,
        ("expect_column_values_to_not_be_null", "user_id"): 2}
    assert read_manifest(out) is not None


def test_bad_rows_over_budget_fail_with_one_line_and_leave_no_manifest(settings: Settings) -> None:
    source_archive(settings, bad_lines={line: text for line, (text, _, _) in BAD_20M.items()})
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    validate_snapshot(settings, "ml-20m", bad_row_budget=0.05)  # passes: a manifest for that budget
    out = layout.validated_dir(settings.data_root, "ml-20m")
    with pytest.raises(DataQualityError) as info:
        validate_snapshot(settings, "ml-20m", bad_row_budget=0.001)
    message = str(info.value)
    total = generate_ratings("ml-20m", **PARAMS).rows
    assert "\n" not in message
    assert message.startswith(f"ratings.csv line 3 column rating: '7.5' is not in 0.5..5 (7 bad rows of {total}, ")
    assert message.endswith(f"% > budget 0.1%); quarantine and GX report in {out}")
    assert read_manifest(out) is None  # the earlier pass's manifest went with the replaced folder
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == 7
    assert json.loads((out / "report.json").read_text())["rows"]["bad"] == 7


def test_a_wrong_header_fails_with_one_line(settings: Settings) -> None:
    source_archive(settings, bad_lines={1: "user,movie,rating,timestamp"})
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    with pytest.raises(DataQualityError, match=r"^ratings\.csv line 1: header 'user,movie,rating,timestamp' is not "
                                               r"the expected 'userId,movieId,rating,timestamp'$"):
        validate_snapshot(settings, "ml-20m", bad_row_budget=0.5)
    out = layout.validated_dir(settings.data_root, "ml-20m")
    assert read_manifest(out) is None and "header" in json.loads((out / "report.json").read_text())["failure"]


def test_a_byte_order_mark_before_the_header_is_not_part_of_it(settings: Settings) -> None:
    """As pandas reads it (a spreadsheet's "CSV UTF-8" export writes one): every row good, numbered from line 2."""
    source_archive(settings, bad_lines={1: "\ufeffuserId,movieId,rating,timestamp"})
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    result = validate_snapshot(settings, "ml-20m", bad_row_budget=0.0)
    rows = generate_ratings("ml-20m", **PARAMS).rows
    assert (result["rows"], result["good_rows"]) == (rows, rows)
    assert read_validated(settings, "ml-20m").column("line").to_pylist()[:2] == [2, 3]


def test_a_ratings_file_deleted_after_download_is_missing_input(settings: Settings) -> None:
    source_archive(settings)
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    layout.ratings_file(settings.data_root, "ml-20m").unlink()
    with pytest.raises(StepInputMissing, match="no complete download .*: run download first"):
        validate_snapshot(settings, "ml-20m", bad_row_budget=0.01)


def test_ml1m_snapshot_validates_with_its_own_format(settings: Settings) -> None:
    bad = {1: "1::2::4.5::978300760", 7: "1::2:3::978300760", 9: "1::2::6::978300760"}
    source_archive(settings, "ml-1m", bad_lines=bad)
    download_snapshot(settings, "ml-1m", movielens=MovieLensSettings())
    result = validate_snapshot(settings, "ml-1m", bad_row_budget=0.02)
    data = generate_ratings("ml-1m", **PARAMS)
    assert (result["rows"], result["bad_rows"]) == (data.rows, 3)
    out = layout.validated_dir(settings.data_root, "ml-1m")
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["line"], q["column_name"], q["reason"]) for q in quarantined] == [
        (1, "Rating", "'4.5' is not an integer"), (7, None, "has 3 fields, expected 4 (separated by '::')"),
        (9, "Rating", "'6' is not in 1..5")]
    lines = read_validated(settings, "ml-1m").column("line").to_pylist()
    assert lines[:3] == [2, 3, 4] and len(lines) == data.rows - 3  # no header: the first row is line 1
    with pytest.raises(DataQualityError, match=r"^ratings\.dat line 1 column Rating: '4\.5' is not an integer "
                                               r"\(3 bad rows of \d+, "):
        validate_snapshot(settings, "ml-1m", bad_row_budget=0.0)


# --- the row checker and the duplicate counter, directly ---------------------------------------------------------


@pytest.mark.parametrize("fmt, line, where", [
    (ML_20M, b"1,2,3.5,1112486027\r", None),                         # CRLF line end: tolerated
    (ML_20M, b"1,2,3.5,1112486027\r9", (None, "control character")),  # a lone CR is not a line end
    (ML_20M, b"1,\t2,3.5,1112486027", (None, "control character")),
    (ML_20M, b'"1",2,3.5,1112486027', ("userId", "is not an integer")),  # no CSV quoting in the format
    (ML_20M, b"1,2,3.5,1112486027,9", (None, "wrong number of fields")),
    (ML_20M, b"1,2,abc,1112486027", ("rating", "is not a number")),
    (ML_20M, b"1,2,0.0,1112486027", ("rating", "is not in 0.5..5")),
    (ML_20M, b"1,2,3.500001,1112486027", ("rating", "is not a multiple of 0.5")),  # np.isclose's tolerance took it
    (ML_20M, b"1,2,3.5,99999999999", ("timestamp", "is not a plausible time")),
    (ML_20M, b"1,99999999999999999999,3.5,1112486027", ("movieId", "is not an integer")),  # past int64
    (ML_1M, b"1::2::3::978300760", None),
    (ML_1M, b"1::2::3.0::978300760", ("Rating", "is not an integer")),
    (ML_1M, b"1,2,3,978300760", (None, "wrong number of fields")),
    (ML_1M, b"1::-2::3::978300760", ("MovieID", "is not an integer")),
])
def test_row_rules(fmt, line: bytes, where) -> None:
    good = fmt.separator.join(["5", "6", "4", "978300760"]).encode()
    block = good + b"\n" + line + b"\n" + good + b"\n"
    checked = check_block(block, 10, fmt, NOW)
    assert checked.lines == 3
    if where is None:
        assert checked.bad == [] and checked.good.column("line").to_pylist() == [10, 11, 12]
    else:
        assert [(b.line, b.column_name, b.rule.split(" (")[0]) for b in checked.bad] == [(11, *where)]
        assert checked.good.column("line").to_pylist() == [10, 12]


def test_distinct_pairs_spill_to_buckets_and_count_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    users, items = rng.integers(1, 300, 50_000), rng.integers(1, 200, 50_000)
    items[:10] = 2**40  # ids past 32 bits take the exact slow path
    counter = DistinctPairs(tmp_path / "pairs", buckets=7, flush_bytes=64 << 10)
    for start in range(0, 50_000, 5_000):
        counter.add(users[start:start + 5_000], items[start:start + 5_000])
    assert len(list((tmp_path / "pairs").glob("pairs-*.bin"))) == 7  # spilled to disk
    assert counter.distinct() == len(np.unique(np.stack([users, items], 1), axis=0))


def test_validation_output_is_the_same_whatever_the_block_size(settings: Settings, tmp_path: Path) -> None:
    source_archive(settings, bad_lines={5: "1,2,9,1112486027"})
    download_snapshot(settings, "ml-20m", movielens=MovieLensSettings())
    small = validate_snapshot(settings, "ml-20m", bad_row_budget=0.01)
    small_rows = read_validated(settings, "ml-20m").to_pydict()
    big_settings = Settings(data_root=settings.data_root, validation_block_bytes=64 << 20)
    shutil.rmtree(layout.validated_dir(settings.data_root, "ml-20m"))
    big = validate_snapshot(big_settings, "ml-20m", bad_row_budget=0.01)
    assert {**small, "cached": None} == {**big, "cached": None}
    assert read_validated(settings, "ml-20m").to_pydict() == small_rows
    assert os.path.getsize(layout.ratings_file(settings.data_root, "ml-20m")) > 5 * (8 << 10)  # several blocks
