"""tasks.outbrain.ingest: download_snapshot (.csv, .csv.gz and Kaggle's .csv.zip sources, SHA256SUMS, cached rerun,
allow-lists) and validate_snapshot (typed parquet per file, quarantine with line and column, cross-file keys, the
budget's one-line error, no manifest on failure), on synthetic snapshots from tasks.outbrain.synthetic."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.core.config import Settings
from tasks.core.download import ChecksumMismatch, SourceNotAllowed
from tasks.core.storage import read_manifest
from tasks.outbrain import layout
from tasks.outbrain.ingest import (
    DataQualityError, StepInputMissing, checksums_url, download_snapshot, parse_sha256sums, validate_snapshot,
)
from tasks.outbrain.schema import TABLES, arrow_schema
from tasks.outbrain.settings import OutbrainSettings, load_outbrain_settings
from tasks.outbrain.synthetic import write_snapshot
from tests.http_range_server import start_range_server

DISPLAYS, SEED = 300, 5
OUTBRAIN = OutbrainSettings()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Small blocks, so even these small files are validated in several blocks and spill buckets.
    return Settings(data_root=tmp_path / "data", validation_block_bytes=4 << 10)


def source(settings: Settings, compress: str = "none") -> dict:
    return write_snapshot(layout.source_dir(settings.data_root), displays=DISPLAYS, seed=SEED, compress=compress)


def edit_line(settings: Settings, name: str, line: int, text: str) -> None:
    """Replace one 1-based line of a source file and its SHA256SUMS entry (a consistent, published bad file)."""
    import hashlib

    folder = layout.source_dir(settings.data_root)
    path = folder / f"{name}.csv"
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = text.encode("utf-8", "surrogateescape")  # "\udcff": the byte 0xff, invalid UTF-8
    path.write_bytes(b"\n".join(lines))
    sums = folder / "SHA256SUMS"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums.write_text("".join(f"{digest}  {path.name}\n" if row.endswith(f"  {path.name}") else row + "\n"
                            for row in sums.read_text().splitlines()))


def ingest(settings: Settings, budget: float = 0.0) -> dict:
    download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    return validate_snapshot(settings, "kaggle", bad_row_budget=budget, outbrain=OUTBRAIN)


def quarantined(settings: Settings) -> list[dict]:
    out = layout.validated_dir(settings.data_root, "kaggle")
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


# --- settings and small helpers ----------------------------------------------------------------------------------


def test_settings_load_from_the_environment_and_expand_the_source_template(tmp_path: Path) -> None:
    loaded = load_outbrain_settings({"RECFLOW_OUTBRAIN_SOURCE": "https://mirror.example/outbrain/{file}.csv.zip",
                                     "RECFLOW_OUTBRAIN_SNAPSHOT": "s2016", "RECFLOW_OUTBRAIN_BAD_ROW_BUDGET": "0.01"})
    deployment = Settings(data_root=tmp_path)
    assert loaded.source_urls(tmp_path, "events") == ("https://mirror.example/outbrain/events.csv.zip",)
    assert loaded.allowed_source_prefixes(deployment) == ("https://mirror.example/outbrain/",)
    assert (loaded.snapshot, loaded.budget(deployment)) == ("s2016", 0.01)
    default = load_outbrain_settings({})
    base = (tmp_path / "outbrain/source/events").as_uri()
    assert default.source_urls(tmp_path, "events") == (f"{base}.csv", f"{base}.csv.gz", f"{base}.csv.zip")
    assert default.snapshot == "kaggle" and default.budget(deployment) == deployment.bad_row_budget
    assert OUTBRAIN.source_urls(tmp_path, "events", "s3://b/o/{file}?sig=1")[1] == "s3://b/o/events.csv.gz?sig=1"
    with pytest.raises(ValueError, match="snapshot '../x' is not a name"):
        OutbrainSettings(snapshot="../x")
    with pytest.raises(ValueError, match="has no {file} placeholder"):
        OutbrainSettings(source="https://mirror.example/outbrain/events.csv")


def test_checksums_live_beside_the_files_and_parse_in_sha256sum_format() -> None:
    assert checksums_url("https://h/o/events.csv.gz?sig=1") == "https://h/o/SHA256SUMS"
    assert checksums_url("file:///d/outbrain/events.csv") == "file:///d/outbrain/SHA256SUMS"
    digest = "a" * 64
    assert parse_sha256sums(f"{digest}  events.csv\n{digest.upper()} *clicks_train.csv.gz\n\n") == {
        "events.csv": digest, "clicks_train.csv.gz": digest}
    with pytest.raises(DataQualityError, match=r"^SHA256SUMS line 1: not '<64 hex digits>  <file>'$"):
        parse_sha256sums("abc  events.csv\n")


# --- download_snapshot -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", ["none", "gz", "zip"])
def test_download_accepts_csv_gz_and_zip_sources_and_a_rerun_transfers_nothing(settings: Settings,
                                                                               compress: str) -> None:
    written = source(settings, compress)
    first = download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    plain = write_snapshot(settings.data_root / "plain", displays=DISPLAYS, seed=SEED)
    for name in TABLES:
        raw = layout.raw_file(settings.data_root, "kaggle", name)
        assert raw.read_bytes() == Path(plain["files"][name]).read_bytes()
        assert first["files"][name]["served"] == Path(written["files"][name]).name
        assert first["files"][name]["sha256"] == written["sha256"][Path(written["files"][name]).name]
    assert not first["cached"] and first["checksums"].endswith("/SHA256SUMS")
    mtimes = {p: p.stat().st_mtime_ns for p in layout.raw_dir(settings.data_root, "kaggle").glob("*.csv")}
    second = download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    assert second["cached"] and second["fingerprint"] == first["fingerprint"]
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def test_download_over_http_reads_only_the_checksums_on_a_rerun(settings: Settings, tmp_path: Path) -> None:
    served = tmp_path / "served"
    write_snapshot(served, displays=DISPLAYS, seed=SEED, compress="gz")
    server, base = start_range_server(served)
    try:
        outbrain = OutbrainSettings(source=base + "/{file}")
        assert not download_snapshot(settings, "kaggle", outbrain=outbrain)["cached"]
        fetched = [path for path, _ in server.requests]
        assert "/SHA256SUMS" in fetched and "/events.csv.gz" in fetched and "/events.csv" not in fetched
        count = len(server.requests)  # .csv is not listed in SHA256SUMS: never asked for
        assert download_snapshot(settings, "kaggle", outbrain=outbrain)["cached"]
        assert [path for path, _ in server.requests[count:]] == ["/SHA256SUMS"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_checksum_mismatch_fails_with_one_line_naming_the_file(settings: Settings) -> None:
    source(settings, "gz")
    events = layout.source_dir(settings.data_root) / "events.csv.gz"
    events.write_bytes(events.read_bytes()[:-8] + b"\0" * 8)  # corrupted after SHA256SUMS was published
    with pytest.raises(ChecksumMismatch) as info:
        download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    message = str(info.value)
    assert "\n" not in message and message.startswith("events.csv.gz: sha256 mismatch for file://")
    raw = layout.raw_dir(settings.data_root, "kaggle")
    assert read_manifest(raw) is None and not (raw / "events.csv").exists()


def test_without_sha256sums_the_first_form_the_source_has_is_taken(settings: Settings) -> None:
    source(settings, "zip")
    (layout.source_dir(settings.data_root) / "SHA256SUMS").unlink()
    result = download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    assert result["checksums"] is None and result["files"]["events"]["served"] == "events.csv.zip"


def test_a_missing_file_fails_with_one_line(settings: Settings) -> None:
    source(settings)
    (layout.source_dir(settings.data_root) / "documents_meta.csv").unlink()
    with pytest.raises(DataQualityError, match=r"^no documents_meta\.csv, \.csv\.gz or \.csv\.zip listed in "
                                               r"SHA256SUMS at the source \(tried file://"):
        download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)


def test_a_source_outside_the_allowed_prefixes_writes_nothing(settings: Settings) -> None:
    outbrain = OutbrainSettings(source="https://mirror.example/outbrain/{file}")
    with pytest.raises(SourceNotAllowed, match="not under an allowed prefix"):
        download_snapshot(settings, "kaggle", source="https://evil.example/{file}", outbrain=outbrain)
    assert not settings.data_root.exists()  # not even the snapshot's lock file


# --- validate_snapshot -------------------------------------------------------------------------------------------


def test_validation_before_download_says_what_to_run(settings: Settings) -> None:
    with pytest.raises(StepInputMissing, match=r"^Outbrain kaggle has no complete download in .*: run download first$"):
        validate_snapshot(settings, "kaggle", outbrain=OUTBRAIN)


def test_a_good_snapshot_validates_to_typed_parquet_per_file_and_is_cached(settings: Settings) -> None:
    written = source(settings)
    result = ingest(settings)
    assert result["bad_rows"] == 0 and result["rows"] == sum(written["rows"].values()) and not result["cached"]
    for name, rows in written["rows"].items():
        table = pq.read_table(layout.validated_table(settings.data_root, "kaggle", name))
        assert table.schema == arrow_schema(TABLES[name]) and table.num_rows == rows
    events = pq.read_table(layout.validated_table(settings.data_root, "kaggle", "events")).to_pydict()
    assert None in events["platform"] and None in events["geo_location"] and "--" in events["geo_location"]
    meta = pq.read_table(layout.validated_table(settings.data_root, "kaggle", "documents_meta")).to_pydict()
    assert None in meta["publish_time"] and None in meta["publisher_id"]
    out = layout.validated_dir(settings.data_root, "kaggle")
    report = json.loads((out / "report.json").read_text())
    assert report["gx_success"] and report["tables"]["clicks_train"]["gx"]["statistics"]["evaluated_expectations"] == 8
    assert (out / "quarantine.jsonl").read_text() == "" and read_manifest(out) is not None
    again = validate_snapshot(settings, "kaggle", bad_row_budget=0.0, outbrain=OUTBRAIN)
    assert again["cached"] and {**again, "cached": False} == result


def test_bad_rows_within_budget_are_quarantined_with_file_line_and_column(settings: Settings) -> None:
    source(settings)
    edit_line(settings, "events", 5, "4,abcdef01234567,x9,100,1,US")
    edit_line(settings, "events", 6, "5,abcdef01234567,9,100,1,US>\udcff")  # invalid UTF-8 in a string column
    edit_line(settings, "documents_meta", 3, "2,7,7,2016-13-01 00:00:00")
    result = ingest(settings, budget=0.05)
    clicks = [line for line in clicks_lines(settings)[1:] if line.split(",")[0] in ("4", "5")]  # their displays'
    assert result["bad_rows"] == 3 + len(clicks)
    rows = [(q["file"], q["line"], q["column_name"], q["reason"]) for q in quarantined(settings)
            if q["file"] != "clicks_train.csv"]
    assert rows == [("events.csv", 5, "document_id", "'x9' is not an integer"),
                    ("events.csv", 6, "geo_location", r"'US>\xff' is not a location like US>SC>519, US>SC, US or --"),
                    ("documents_meta.csv", 3, "publish_time", "'2016-13-01 00:00:00' is not a real date and time")]


def test_over_budget_fails_with_one_line_naming_line_and_column_and_leaves_no_manifest(settings: Settings) -> None:
    source(settings)
    ingest(settings, budget=0.05)  # a first pass leaves a manifest for that budget
    edit_line(settings, "promoted_content", 4, "3,x7,1,1")
    download_snapshot(settings, "kaggle", outbrain=OUTBRAIN)
    out = layout.validated_dir(settings.data_root, "kaggle")
    with pytest.raises(DataQualityError) as info:
        validate_snapshot(settings, "kaggle", bad_row_budget=0.0, outbrain=OUTBRAIN)
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        "promoted_content.csv line 4 column document_id: 'x7' is not an integer (1 bad rows of ")
    assert message.endswith(f"> budget 0%); quarantine and GX report in {out}")
    assert read_manifest(out) is None and json.loads((out / "report.json").read_text())["failures"] == [message]


def test_a_wrong_header_fails_with_one_line(settings: Settings) -> None:
    source(settings)
    edit_line(settings, "clicks_train", 1, "display,ad,clicked")
    with pytest.raises(DataQualityError, match=r"^clicks_train\.csv line 1: header 'display,ad,clicked' is not the "
                                               r"expected 'display_id,ad_id,clicked'$"):
        ingest(settings, budget=0.5)
    assert read_manifest(layout.validated_dir(settings.data_root, "kaggle")) is None


def test_a_byte_order_mark_before_a_header_is_not_part_of_it(settings: Settings) -> None:
    written = source(settings)
    edit_line(settings, "events", 1, "\ufeff" + TABLES["events"].header)
    result = ingest(settings)
    assert result["bad_rows"] == 0 and result["rows"] == sum(written["rows"].values())


def clicks_lines(settings: Settings) -> list[str]:
    return (layout.source_dir(settings.data_root) / "clicks_train.csv").read_text().split("\n")


def test_two_clicks_in_a_display_break_it_whole(settings: Settings) -> None:
    source(settings)
    lines = clicks_lines(settings)
    display = lines[1].split(",")[0]
    unclicked = next(i for i, line in enumerate(lines[1:], 2) if line.startswith(display + ",") and line.endswith(",0"))
    edit_line(settings, "clicks_train", unclicked, lines[unclicked - 1][:-1] + "1")
    with pytest.raises(DataQualityError, match=rf"^clicks_train\.csv line 2 column display_id: display_id {display} "
                                               r"has 2 clicks \(clicked=1\), expected exactly 1 \(\d+ bad rows of"):
        ingest(settings)
    shown = [line for line in lines[1:] if line.startswith(display + ",")]
    result = validate_snapshot(settings, "kaggle", bad_row_budget=0.05, outbrain=OUTBRAIN)
    assert result["bad_rows"] == len(shown)  # every row of the broken display, dropped from clicks_train
    kept = pq.read_table(layout.validated_table(settings.data_root, "kaggle", "clicks_train")).column("display_id")
    assert int(display) not in kept.to_pylist() and len(kept) == result["tables"]["clicks_train"]["good"]


def test_a_display_missing_from_events_and_an_unknown_ad_are_named(settings: Settings) -> None:
    source(settings)
    lines = clicks_lines(settings)
    last_display = int(lines[-2].split(",")[0])
    events = (layout.source_dir(settings.data_root) / "events.csv").read_text().split("\n")
    row = next(i for i, line in enumerate(events[1:], 2) if line.startswith(f"{last_display},"))
    edit_line(settings, "events", row, events[row - 1].replace(f"{last_display},", "999999,", 1))
    edit_line(settings, "clicks_train", 2, lines[1].replace(",", ",424242,", 1).replace(
        "," + lines[1].split(",")[1] + ",", ",", 1))
    with pytest.raises(DataQualityError) as info:
        ingest(settings)
    assert str(info.value).startswith("clicks_train.csv line 2 column ad_id: ad_id 424242 is not in "
                                      "promoted_content.csv (")
    reasons = {q["reason"] for q in quarantined(settings)}
    assert f"display_id {last_display} is not in events.csv" in reasons


def test_a_repeated_event_display_fails_with_one_line(settings: Settings) -> None:
    source(settings)
    events = (layout.source_dir(settings.data_root) / "events.csv").read_text().split("\n")
    edit_line(settings, "events", 3, events[2].replace(events[2].split(",")[0], events[1].split(",")[0], 1))
    with pytest.raises(DataQualityError, match=r"^events\.csv line 3 column display_id: display_id 1 appears again "
                                               r"\(first at line 2\); 1 repeated keys"):
        ingest(settings, budget=0.5)


@pytest.mark.parametrize("when, real", [("2016-06-14 10:00:00", True), ("2016-02-29 00:00:00", True),
                                        ("2016-02-30 00:00:00", False), ("2016-04-31 01:02:03", False),
                                        ("2016-06-14 23:59:60", False), ("0000-01-01 00:00:00", False)])
def test_a_publish_time_that_is_no_real_date_is_a_bad_row(when: str, real: bool) -> None:
    """pyarrow's strptime rolls 2016-02-30 over to 2016-03-01: such a row was stored as another date."""
    from tasks.outbrain.raw_tables import check_block

    block = f"1,2,3,2016-01-01 00:00:00\n4,5,6,{when}\n".encode()
    checked = check_block(block, 2, TABLES["documents_meta"])
    assert [(b.line, b.column_name) for b in checked.bad] == ([] if real else [(3, "publish_time")])


def test_a_display_whose_events_row_was_quarantined_is_dropped_with_its_clicks(settings: Settings) -> None:
    """Kept, it joined to no event: no day (which decides the train / valid split), platform or geo."""
    source(settings)
    events = (layout.source_dir(settings.data_root) / "events.csv").read_text().split("\n")
    display = events[4].split(",")[0]
    edit_line(settings, "events", 5, ",".join([*events[4].split(",")[:-1], "usa"]))  # a bad geo_location
    shown = [line for line in clicks_lines(settings)[1:] if line.startswith(display + ",")]
    result = ingest(settings, budget=0.05)
    assert result["bad_rows"] == 1 + len(shown) and len(shown) >= 2
    reasons = [(q["file"], q["reason"]) for q in quarantined(settings)]
    assert ("events.csv", "'usa' is not a location like US>SC>519, US>SC, US or --") in reasons
    assert reasons.count(("clicks_train.csv", f"display_id {display} has its events.csv row quarantined")) == \
        len(shown)
    kept = pq.read_table(layout.validated_table(settings.data_root, "kaggle", "clicks_train")).column("display_id")
    assert int(display) not in kept.to_pylist()
