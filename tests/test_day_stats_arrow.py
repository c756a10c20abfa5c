"""The arrow day-stats engine (tasks/criteo/day_stats_arrow.py): validate_raw writes a day's typed columnar copy and
value counts in the pass that checks its rows. No Spark here; tests/test_day_stats_spark.py compares the two engines.

Each test builds a small synthetic day (a few thousand rows) and validates it with a small block size, so a day is
many blocks and the streaming paths (row groups of blocks, part files, spilled counts) are exercised.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.core.config import Settings
from tasks.core.storage import MANIFEST_NAME, completed_manifest, read_manifest
from tasks.criteo import ingest as criteo_ingest
from tasks.criteo import layout as criteo_layout
from tasks.criteo.day_stats_arrow import (
    COLUMNAR_SCHEMA, COUNTS_SCHEMA, KeyCounter, StatsTarget, hex_keys, hex_strings, write_day_stats,
)
from tasks.criteo.raw_validation import DataQualityError
from tasks.criteo.schema import CAT_COLUMNS, INT_COLUMNS, LABEL
from tasks.criteo.settings import CriteoSettings, load_criteo_settings
from tasks.criteo.synthetic import write_criteo_day

REPO = Path(__file__).resolve().parents[1]
DAY = 0
ROWS = 3000
BLOCK_BYTES = 32 << 10  # ~130 rows per block: a 3000-row day is ~25 blocks
BAD_LINES = (1, 700, 2999)  # label 2 on these lines


def write_day(root: Path, rows: int = ROWS, bad_lines: tuple[int, ...] = BAD_LINES) -> Path:
    raw = criteo_layout.raw_day(root, DAY)
    write_criteo_day(raw, DAY, rows, seed=5)
    lines = raw.read_bytes().split(b"\n")
    for line in bad_lines:
        lines[line - 1] = b"2" + lines[line - 1][1:]
    raw.write_bytes(b"\n".join(lines))
    return raw


def settings_for(root: Path, budget: float = 0.01) -> Settings:
    return Settings(data_root=root, bad_row_budget=budget, validation_block_bytes=BLOCK_BYTES)


def good_lines(raw: Path) -> list[bytes]:
    return [line for line in raw.read_bytes().split(b"\n") if line and not line.startswith(b"2")]


def expected_rows(lines: list[bytes]) -> list[dict]:
    rows = []
    for order, line in enumerate(lines):
        parts = line.decode("ascii").split("\t")
        row = {LABEL: int(parts[0])}
        row |= {name: int(v) if v else None for name, v in zip(INT_COLUMNS, parts[1:14])}
        row |= {name: v or None for name, v in zip(CAT_COLUMNS, parts[14:])}
        rows.append(row | {"row_order": order})
    return rows


def expected_counts(lines: list[bytes]) -> dict[tuple[int, str], int]:
    counts: Counter[tuple[int, str]] = Counter()
    for line in lines:
        for column, value in enumerate(line.decode("ascii").split("\t")[14:]):
            if value:
                counts[(column, value)] += 1
    return dict(counts)


def stats_content(directory: Path) -> tuple[list[dict], dict[tuple[int, str], int]]:
    columnar = pq.read_table(directory / "columnar").to_pylist()
    counts = {(r["column"], r["value"]): r["count"] for r in pq.read_table(directory / "counts").to_pylist()}
    return columnar, counts


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in criteo_layout.stats_root(root).glob(".tmp-*")) \
        if criteo_layout.stats_root(root).is_dir() else []


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> dict:
    """A day validated once with the arrow engine (the default)."""
    root = tmp_path_factory.mktemp("root")
    raw = write_day(root)
    result = criteo_ingest.validate_day(settings_for(root), DAY)
    return {"root": root, "raw": raw, "result": result, "stats": criteo_layout.stats_day(root, DAY)}


# ---- the pieces ---------------------------------------------------------------------------------------------------


def test_hex_keys_and_strings_are_inverse():
    values = np.array([0, 1, 0xDEADBEEF, 0xFFFFFFFF, 0x0BB659DA], dtype=np.uint64)
    text = "".join(f"{v:08x}" for v in values).encode()
    keys = hex_keys(np.frombuffer(text, np.uint8), 25)
    assert (keys >> np.uint64(32)).tolist() == [25] * len(values)
    assert (keys & np.uint64(0xFFFFFFFF)).tolist() == values.tolist()
    assert hex_strings(values).to_pylist() == [f"{v:08x}" for v in values]


def test_key_counter_spills_by_bucket_and_counts_exactly(tmp_path):
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 5000, 20_000).astype(np.uint64) | np.uint64(rng.integers(0, 26) << 32)
              for _ in range(12)]
    counter = KeyCounter(tmp_path / "spill", buffer_pairs=6_000, buckets=8)
    for keys in blocks:
        counter.add(keys)
    assert counter.spilled_pairs > 0 and len(list((tmp_path / "spill").iterdir())) == 8
    got: dict[int, int] = {}
    for keys, counts in counter.totals():
        assert np.all(np.diff(keys.astype(np.int64)) > 0) or len(keys) < 2  # sorted, distinct within a bucket
        for key, count in zip(keys.tolist(), counts.tolist()):
            assert key not in got  # a key lives in one bucket only
            got[key] = count
    assert got == dict(Counter(np.concatenate(blocks).tolist()))
    assert list((tmp_path / "spill").iterdir()) == []  # each bucket file is deleted once combined


# ---- validate_raw writes the stats --------------------------------------------------------------------------------


def test_validation_writes_typed_columnar_copy_in_file_order(validated):
    raw, stats = validated["raw"], validated["stats"]
    assert validated["result"]["good"] == ROWS - len(BAD_LINES)
    columnar, counts = stats_content(stats)
    assert columnar == expected_rows(good_lines(raw))  # dense row_order 0..good-1, in file order
    assert counts == expected_counts(good_lines(raw))
    for part in sorted((stats / "columnar").glob("*.parquet")):
        assert pq.read_schema(part).remove_metadata() == COLUMNAR_SCHEMA
    assert pq.read_schema(stats / "counts" / "part-00000.parquet").remove_metadata() == COUNTS_SCHEMA


def row_group_rows(stats: Path) -> list[int]:
    files = [pq.ParquetFile(p) for p in sorted((stats / "columnar").glob("*.parquet"))]
    return [f.metadata.row_group(i).num_rows for f in files for i in range(f.metadata.num_row_groups)]


def test_columnar_copy_streams_whole_blocks_into_bounded_row_groups(validated, tmp_path):
    """Row groups of whole validation blocks, cut at row_group_rows: memory is one row group, never the day; a
    day smaller than one row group is one row group."""
    assert row_group_rows(validated["stats"]) == [ROWS - len(BAD_LINES)]
    target = StatsTarget(tmp_path / "stats", DAY, {"x": 1})
    write_day_stats(validated["raw"], target, block_bytes=BLOCK_BYTES, row_group_rows=300)
    rows = row_group_rows(target.path)
    assert len(rows) > 5 and all(300 <= n < 300 + 200 for n in rows[:-1]) and sum(rows) == ROWS - len(BAD_LINES)
    assert stats_content(target.path) == stats_content(validated["stats"])


def test_stats_manifest_is_what_day_stats_expects(validated, monkeypatch):
    root, stats = validated["root"], validated["stats"]
    manifest = read_manifest(stats)
    assert manifest["kind"] == "criteo_day_stats" and manifest["rows"] == {"good": ROWS - len(BAD_LINES)}
    assert manifest["extra"]["engine"] == "arrow" and manifest["extra"]["day"] == DAY
    validation = read_manifest(criteo_layout.validated_day(root, DAY))
    raw = criteo_layout.raw_day(root, DAY)
    assert manifest["inputs"] == criteo_ingest.stats_inputs(validation["inputs_fingerprint"], raw)
    assert not (stats / "_spill").exists() and not any("_spill" in name for name in manifest["files"])

    def no_spark(*args, **kwargs):
        raise AssertionError("spark-submit ran although validation wrote the stats")

    monkeypatch.setattr("tasks.core.spark_submit.run_spark_job", no_spark)
    result = criteo_ingest.day_stats(settings_for(root), DAY)
    assert result["cached"] is True and result["rows"] == ROWS - len(BAD_LINES)
    assert result["distinct_values"] == {
        name: len({v for (c, v) in expected_counts(good_lines(raw)) if c == i}) for i, name in enumerate(CAT_COLUMNS)}


def test_a_raw_day_no_download_vouches_for_is_hashed_once_while_it_is_unchanged(tmp_path, monkeypatch):
    """Without a download sidecar (a day written in place), identifying the raw day means hashing it whole (~46 GB
    at full size): validate_raw does it once for its own inputs and the stats it writes; day_stats and a rerun find
    the hash recorded beside the unchanged file."""
    from tasks.core import storage

    write_day(tmp_path)
    raw = criteo_layout.raw_day(tmp_path, DAY)
    hashed: list[Path] = []
    real = storage.file_sha256
    monkeypatch.setattr(storage, "file_sha256", lambda path: (path == raw and hashed.append(path)) or real(path))
    criteo_ingest.validate_day(settings_for(tmp_path), DAY)
    assert hashed == [raw]
    assert criteo_ingest.day_stats(settings_for(tmp_path), DAY)["cached"] is True
    assert criteo_ingest.validate_day(settings_for(tmp_path), DAY)["cached"] is True
    assert len(hashed) == 1


def test_parts_roll_over_every_few_row_groups(validated, tmp_path):
    target = StatsTarget(tmp_path / "stats", DAY, {"x": 1})
    write_day_stats(validated["raw"], target, block_bytes=BLOCK_BYTES, row_group_rows=100, row_groups_per_part=4,
                    spill_buffer_pairs=5_000, spill_buckets=4)
    assert len(list((target.path / "columnar").glob("*.parquet"))) > 3
    assert stats_content(target.path) == stats_content(validated["stats"])  # spilled counts: the same


# ---- the engine setting -------------------------------------------------------------------------------------------


def test_engine_setting_comes_from_the_environment(monkeypatch):
    assert CriteoSettings().day_stats_engine == ""  # empty: by the Spark master
    assert load_criteo_settings({}).day_stats_engine == ""
    assert load_criteo_settings({"RECFLOW_CRITEO_DAY_STATS_ENGINE": "spark"}).day_stats_engine == "spark"
    with pytest.raises(ValueError, match="RECFLOW_CRITEO_DAY_STATS_ENGINE 'duckdb': expected one of arrow, spark"):
        load_criteo_settings({"RECFLOW_CRITEO_DAY_STATS_ENGINE": "duckdb"})
    with pytest.raises(ValueError, match="'Spark'"):
        criteo_ingest.day_stats(Settings(), DAY, engine="Spark")
    monkeypatch.setenv("RECFLOW_CRITEO_DAY_STATS_ENGINE", "duckdb")
    with pytest.raises(ValueError, match="RECFLOW_CRITEO_DAY_STATS_ENGINE 'duckdb'"):
        criteo_ingest.day_stats_engine(None, "local[*]")


def test_engine_default_is_arrow_on_a_local_master_and_spark_on_a_cluster(monkeypatch, caplog):
    monkeypatch.delenv("RECFLOW_CRITEO_DAY_STATS_ENGINE", raising=False)
    with caplog.at_level(logging.INFO, logger="tasks.core.spark_submit"):
        assert criteo_ingest.day_stats_engine(None, "local[*]") == "arrow"
        assert criteo_ingest.day_stats_engine(None, None) == "arrow"
        assert criteo_ingest.day_stats_engine(None, "spark://head:7077") == "spark"
        assert criteo_ingest.day_stats_engine(None, "local[2]", "cluster") == "spark"
        assert criteo_ingest.day_stats_engine("arrow", "yarn") == "arrow"  # asked for: wins
    assert caplog.messages[0] == ("criteo day stats engine: arrow (default on one machine: Spark master local[*], "
                                  "profile local)")
    assert caplog.messages[2].startswith("criteo day stats engine: spark (default with Spark master spark://")
    monkeypatch.setenv("RECFLOW_CRITEO_DAY_STATS_ENGINE", "arrow")
    assert criteo_ingest.day_stats_engine(None, "spark://head:7077") == "arrow"  # the deployment's setting wins


def test_validation_on_a_cluster_master_leaves_the_stats_to_spark(tmp_path, monkeypatch):
    """The default engine follows the master: validate_day on a cluster master writes no stats (Spark's day_stats
    job will), on a local one it writes them in its pass."""
    monkeypatch.delenv("RECFLOW_CRITEO_DAY_STATS_ENGINE", raising=False)
    cluster, local = tmp_path / "cluster", tmp_path / "local"
    for root, master in ((cluster, "spark://head:7077"), (local, "local[2]")):
        write_day(root)
        criteo_ingest.validate_day(settings_for(root), DAY, spark_master=master)
    assert not criteo_layout.stats_day(cluster, DAY).exists()
    assert read_manifest(criteo_layout.stats_day(local, DAY))["extra"]["engine"] == "arrow"


def test_spark_engine_validation_writes_no_stats_and_arrow_day_stats_recovers_them(validated, tmp_path, monkeypatch):
    """A day validated without stats (spark engine, or before this engine existed): day_stats with the arrow engine
    parses it again and writes the same stats, without Spark."""
    root = tmp_path / "root"
    write_day(root)
    monkeypatch.setenv("RECFLOW_CRITEO_DAY_STATS_ENGINE", "spark")
    criteo_ingest.validate_day(settings_for(root), DAY)
    assert not criteo_layout.stats_day(root, DAY).exists()
    monkeypatch.setattr("tasks.core.spark_submit.run_spark_job", lambda *a, **k: pytest.fail("Spark ran"))
    result = criteo_ingest.day_stats(settings_for(root), DAY, engine="arrow")
    assert result["cached"] is False and result["rows"] == ROWS - len(BAD_LINES)
    assert stats_content(criteo_layout.stats_day(root, DAY)) == stats_content(validated["stats"])
    # same inputs, same writer: the same files, byte for byte
    assert read_manifest(criteo_layout.stats_day(root, DAY))["files"] == read_manifest(validated["stats"])["files"]


# ---- failures: over budget, a crash ------------------------------------------------------------------------------


def test_a_day_over_budget_leaves_no_stats(tmp_path):
    write_day(tmp_path)
    with pytest.raises(DataQualityError, match="3 bad rows of 3000"):
        criteo_ingest.validate_day(settings_for(tmp_path, budget=0.0001), DAY)
    assert read_manifest(criteo_layout.validated_day(tmp_path, DAY)) is None
    assert not criteo_layout.stats_day(tmp_path, DAY).exists()
    assert leftovers(tmp_path) == []


def test_stats_are_published_before_the_validation_manifest(tmp_path, monkeypatch):
    """A crash between the two leaves complete stats and no validation; the retry validates and keeps the stats."""
    from tasks.criteo import raw_validation

    write_day(tmp_path)
    real = raw_validation.write_manifest

    def crash(directory, manifest, *args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(raw_validation, "write_manifest", crash)
    with pytest.raises(OSError, match="disk gone"):
        criteo_ingest.validate_day(settings_for(tmp_path), DAY)
    stats = criteo_layout.stats_day(tmp_path, DAY)
    assert read_manifest(stats) is not None and not criteo_layout.validated_day(tmp_path, DAY).exists()
    written = read_manifest(stats)["created_at"], (stats / MANIFEST_NAME).stat().st_mtime_ns

    monkeypatch.setattr(raw_validation, "write_manifest", real)
    criteo_ingest.validate_day(settings_for(tmp_path), DAY)
    assert (read_manifest(stats)["created_at"], (stats / MANIFEST_NAME).stat().st_mtime_ns) == written
    validation = read_manifest(criteo_layout.validated_day(tmp_path, DAY))
    raw = criteo_layout.raw_day(tmp_path, DAY)
    assert completed_manifest(stats, criteo_ingest.stats_inputs(validation["inputs_fingerprint"], raw))


def small_row_groups(init):
    """DayStatsWriter.__init__ with row groups of ~100 rows, so a small day's parquet is being written mid-day."""
    def with_small_row_groups(self, directory, **options):
        init(self, directory, **{"row_group_rows": 100, **options})
    return with_small_row_groups


def test_an_error_mid_write_leaves_nothing(tmp_path, monkeypatch):
    from tasks.criteo.day_stats_arrow import DayStatsWriter

    write_day(tmp_path)
    real = DayStatsWriter.add

    def fail_on_fifth_block(self, good, typed=None):
        if self.blocks == 5:
            raise MemoryError("out of memory in block 6")
        real(self, good, typed)

    monkeypatch.setattr(DayStatsWriter, "add", fail_on_fifth_block)
    monkeypatch.setattr(DayStatsWriter, "__init__", small_row_groups(DayStatsWriter.__init__))
    with pytest.raises(MemoryError):
        criteo_ingest.validate_day(settings_for(tmp_path), DAY)
    assert not criteo_layout.stats_day(tmp_path, DAY).exists()
    assert not criteo_layout.validated_day(tmp_path, DAY).exists()
    assert leftovers(tmp_path) == []


KILL_CHILD = """
import os, signal, sys
from pathlib import Path
from tasks.core.config import Settings
from tasks.criteo import ingest
from tasks.criteo.day_stats_arrow import DayStatsWriter

real, real_init = DayStatsWriter.add, DayStatsWriter.__init__
DayStatsWriter.__init__ = lambda self, directory, **options: real_init(self, directory, **{"row_group_rows": 100,
                                                                                        **options})
def add(self, good, typed=None):
    if self.blocks == 8:  # columnar parts and spilled counts half written
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, good, typed)
DayStatsWriter.add = add
ingest.validate_day(Settings(data_root=Path(sys.argv[1]), bad_row_budget=0.01, validation_block_bytes=int(sys.argv[2])),
                    0)
"""


def test_a_kill_mid_write_leaves_no_partial_output_and_the_retry_completes(validated, tmp_path):
    """SIGKILL while the stats are half written (a machine's death): nothing is visible under the final names;
    the retry removes the dead writer's temporaries and writes what a clean run writes."""
    root = tmp_path / "root"
    write_day(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-c", KILL_CHILD, str(root), str(BLOCK_BYTES)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert not criteo_layout.stats_day(root, DAY).exists()
    assert not criteo_layout.validated_day(root, DAY).exists()
    left = leftovers(root)
    assert len(left) == 1 and left[0].startswith(".tmp-day=0~")  # the killed writer's half-written copy

    result = criteo_ingest.validate_day(settings_for(root), DAY)
    assert result["good"] == ROWS - len(BAD_LINES)
    assert leftovers(root) == []
    assert read_manifest(criteo_layout.stats_day(root, DAY))["files"] == read_manifest(validated["stats"])["files"]
    assert json.loads((criteo_layout.validated_day(root, DAY) / "quarantine.jsonl").read_text().splitlines()[0])[
        "line"] == BAD_LINES[0]
