"""tasks.core.storage: atomic files and directories, manifests, the completed-output check, stale temporaries."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.core.storage import (
    MANIFEST_NAME,
    STALE_FOREIGN_TEMPORARY_S,
    Manifest,
    atomic_directory,
    atomic_file,
    completed_manifest,
    describe_files,
    file_sha256,
    fingerprint,
    read_manifest,
    remove_stale_temporaries,
    write_manifest,
    write_text_atomic,
)


class Boom(RuntimeError):
    pass


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-"))


def test_atomic_file_success_replaces_old_content(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_file(target) as f:
        f.write(b"new content")
        # Readers still see the old file until the block ends.
        assert target.read_bytes() == b"old"
    assert target.read_bytes() == b"new content"
    assert _temporaries(tmp_path) == []


def test_atomic_file_failure_keeps_old_content_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(Boom):
        with atomic_file(target, "w") as f:
            f.write("half written")
            raise Boom("writer died")
    assert target.read_text() == "old"
    assert _temporaries(tmp_path) == []


def test_atomic_file_failure_without_previous_file_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    with pytest.raises(Boom):
        with atomic_file(target, "w") as f:
            f.write("x")
            raise Boom
    assert not target.exists()
    assert _temporaries(target.parent) == []


def test_atomic_file_creates_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.txt"
    write_text_atomic(target, "hello")
    assert target.read_text() == "hello"


def test_atomic_directory_success_replaces_whole_directory(tmp_path: Path) -> None:
    final = tmp_path / "day=3"
    final.mkdir()
    (final / "old_only.txt").write_text("old")
    (final / "shared.txt").write_text("old")
    with atomic_directory(final) as tmp:
        assert tmp != final and tmp.is_dir() and list(tmp.iterdir()) == []
        (tmp / "shared.txt").write_text("new")
        (tmp / "nested").mkdir()
        (tmp / "nested" / "part.bin").write_bytes(b"\x00\x01")
        assert (final / "old_only.txt").read_text() == "old"  # old one still complete during the block
    assert sorted(p.relative_to(final).as_posix() for p in final.rglob("*")) == [
        "nested", "nested/part.bin", "shared.txt"]
    assert (final / "shared.txt").read_text() == "new"
    assert _temporaries(tmp_path) == []


def test_atomic_directory_failure_keeps_old_directory_and_leaves_no_temporary(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "a.txt").write_text("old")
    with pytest.raises(Boom):
        with atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("new")
            (tmp / "b.txt").write_text("new")
            raise Boom("job failed")
    assert sorted(p.name for p in final.iterdir()) == ["a.txt"]
    assert (final / "a.txt").read_text() == "old"
    assert _temporaries(tmp_path) == []


def test_atomic_directory_failure_on_keyboard_interrupt_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(final) as tmp:
            (tmp / "a.txt").write_text("new")
            raise KeyboardInterrupt
    assert not final.exists()
    assert _temporaries(tmp_path) == []


def _populate(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(b"abc" * 1000)
    (directory / "part").mkdir(exist_ok=True)
    (directory / "part" / "x.txt").write_text("hello")


def test_write_and_read_manifest(tmp_path: Path) -> None:
    _populate(tmp_path)
    inputs = {"raw": {"sha256": "ab" * 32, "bytes": 10}, "budget": 0.001}
    written = write_manifest(tmp_path, Manifest(kind="test", inputs=inputs, rows={"good": 7}, extra={"k": "v"}))
    assert set(written.files) == {"data.bin", "part/x.txt"}
    assert written.files["data.bin"] == {"bytes": 3000, "sha256": file_sha256(tmp_path / "data.bin")}
    assert written.created_at

    read = read_manifest(tmp_path)
    assert read is not None
    assert read["kind"] == "test"
    assert read["inputs"] == inputs
    assert read["inputs_fingerprint"] == fingerprint(inputs)
    assert read["rows"] == {"good": 7}
    assert read["extra"] == {"k": "v"}
    assert read["files"] == written.files
    assert MANIFEST_NAME not in read["files"]
    assert _temporaries(tmp_path) == []


def test_write_manifest_without_checksums_records_sizes_only(tmp_path: Path) -> None:
    _populate(tmp_path)
    written = write_manifest(tmp_path, Manifest(kind="test", inputs={}), checksum=False)
    assert written.files["part/x.txt"] == {"bytes": 5}


def test_describe_files_excludes_manifest(tmp_path: Path) -> None:
    _populate(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert set(describe_files(tmp_path)) == {"data.bin", "part/x.txt"}


def test_read_manifest_missing_or_corrupt_is_none(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_NAME).write_text('{"kind": "trunc')
    assert read_manifest(tmp_path) is None


def test_fingerprint_is_stable_and_key_order_independent() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint({})) == 16


def test_completed_manifest_matches_same_inputs(tmp_path: Path) -> None:
    _populate(tmp_path)
    inputs = {"raw": "x", "rules": 1}
    write_manifest(tmp_path, Manifest(kind="test", inputs=inputs, rows={"good": 3}))
    found = completed_manifest(tmp_path, {"rules": 1, "raw": "x"})
    assert found is not None and found["rows"] == {"good": 3}


def test_completed_manifest_fingerprint_mismatch_is_none(tmp_path: Path) -> None:
    _populate(tmp_path)
    write_manifest(tmp_path, Manifest(kind="test", inputs={"raw": "x", "rules": 1}))
    assert completed_manifest(tmp_path, {"raw": "x", "rules": 2}) is None


def test_completed_manifest_deleted_file_is_none(tmp_path: Path) -> None:
    _populate(tmp_path)
    inputs = {"raw": "x"}
    write_manifest(tmp_path, Manifest(kind="test", inputs=inputs))
    (tmp_path / "part" / "x.txt").unlink()
    assert completed_manifest(tmp_path, inputs) is None


def test_completed_manifest_resized_file_is_none(tmp_path: Path) -> None:
    _populate(tmp_path)
    inputs = {"raw": "x"}
    write_manifest(tmp_path, Manifest(kind="test", inputs=inputs))
    with open(tmp_path / "data.bin", "ab") as f:
        f.write(b"!")
    assert completed_manifest(tmp_path, inputs) is None


def test_completed_manifest_without_manifest_is_none(tmp_path: Path) -> None:
    _populate(tmp_path)
    assert completed_manifest(tmp_path, {}) is None
    assert completed_manifest(tmp_path / "missing", {}) is None


def test_completed_manifest_tampered_manifest_is_none(tmp_path: Path) -> None:
    _populate(tmp_path)
    inputs = {"raw": "x"}
    write_manifest(tmp_path, Manifest(kind="test", inputs=inputs))
    doc = json.loads((tmp_path / MANIFEST_NAME).read_text())
    doc["inputs_fingerprint"] = "0" * 16
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(doc))
    assert completed_manifest(tmp_path, inputs) is None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has it (until the kernel reuses it, far later)


def test_remove_stale_temporaries_only_takes_dead_writers_leftovers(tmp_path: Path) -> None:
    host, dead = socket.gethostname().replace("~", "_"), _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".tmp-out~{host}~{dead}~12345678").mkdir()       # killed writer: removed
        (tmp_path / f".tmp-out~{host}~{dead}~12345678" / "part.bin").write_bytes(b"x")
        (tmp_path / f".tmp-file.txt~{host}~{dead}~abcdef01").write_text("partial")
        (tmp_path / f".tmp-out~{host}~{live.pid}~0badf00d").mkdir()   # a live writer's work: kept
        (tmp_path / f".tmp-out~{host}~{os.getpid()}~0badf00e").mkdir()  # our own: kept
        (tmp_path / f".tmp-out~other-host~{dead}~0badf00f").mkdir()  # another host's, fresh: kept
        old_foreign = tmp_path / ".tmp-out~other-host~1~00000001"
        old_foreign.mkdir()
        os.utime(old_foreign, (time.time() - 2 * STALE_FOREIGN_TEMPORARY_S,) * 2)  # a day old: removed
        (tmp_path / "keep.txt").write_text("keep")
        (tmp_path / "keep_dir").mkdir()
        (tmp_path / "keep_dir" / f".tmp-nested~{host}~{dead}~1").write_text("not at top level")

        assert remove_stale_temporaries(tmp_path, "file.txt") == 1  # only that output's leftovers
        assert remove_stale_temporaries(tmp_path) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f".tmp-out~{host}~{live.pid}~0badf00d", f".tmp-out~{host}~{os.getpid()}~0badf00e",
             f".tmp-out~other-host~{dead}~0badf00f", "keep.txt", "keep_dir"])
        assert (tmp_path / "keep_dir" / f".tmp-nested~{host}~{dead}~1").exists()
        assert remove_stale_temporaries(tmp_path) == 0
    finally:
        live.kill()
        live.wait()


def test_a_manifest_never_lists_a_killed_writers_temporary(tmp_path: Path) -> None:
    # A writer killed while writing the manifest leaves its temporary; the retry's manifest must not list it: the
    # manifest's own atomic write removes it, and the output would then be "complete" with a file missing.
    host, dead = socket.gethostname().replace("~", "_"), _dead_pid()
    (tmp_path / "model.pt").write_bytes(b"w" * 10)
    (tmp_path / f".tmp-{MANIFEST_NAME}~{host}~{dead}~67a17206").write_text("{")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".lock-day=1").write_text("")
    write_manifest(tmp_path, Manifest(kind="test", inputs={}), checksum=False)
    manifest = read_manifest(tmp_path)
    assert list(manifest["files"]) == ["model.pt"]
    assert completed_manifest(tmp_path, {}) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST_NAME, "model.pt", "sub"]


def test_a_new_attempt_reclaims_the_killed_attempts_temporary(tmp_path: Path) -> None:
    # What a SIGKILLed writer leaves (its own `with` never finished), then the retry's atomic_directory.
    host, dead = socket.gethostname().replace("~", "_"), _dead_pid()
    leftover = tmp_path / f".tmp-day=3~{host}~{dead}~deadbeef"
    leftover.mkdir()
    (leftover / "part-0.parquet").write_bytes(b"x" * 1000)
    with atomic_directory(tmp_path / "day=3") as out:
        (out / "data.bin").write_bytes(b"y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day=3"]


def test_remove_stale_temporaries_missing_directory(tmp_path: Path) -> None:
    assert remove_stale_temporaries(tmp_path / "nope") == 0


def test_progress_log_lines_carry_counts_rate_and_eta(caplog) -> None:
    import logging

    from tasks.core.progress import ProgressLog

    now = [0.0]
    progress = ProgressLog("writing train", total=1000, every_s=5.0, logger=logging.getLogger("t"),
                           clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        now[0] = 1.0
        progress.advance(100)  # inside the interval: no line
        now[0] = 10.0
        progress.advance(400)
    assert [r.getMessage() for r in caplog.records] == ["writing train: 500/1000 rows (50%), 50 rows/s, ETA 0:00:10"]
    resumed = ProgressLog("downloading x", unit="bytes", done=2_000_000, logger=logging.getLogger("t"),
                          clock=lambda: now[0])
    now[0] = 12.0
    resumed.report(3_000_000, total=4_000_000)
    # The resumed 2 MB do not count in the rate: 1 MB in 2 s.
    assert resumed.line(12.0) == "downloading x: 3.0 MB of 4.0 MB (75%), 0.5 MB/s, ETA 0:00:02"


# --- partition locks ------------------------------------------------------------------------------------------------

_HOLD_LOCK = """
import sys, time
from pathlib import Path
from tasks.core.storage import partition_lock
with partition_lock(Path(sys.argv[1]), "ds", "day=3", label="day 3"):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _lock_holder(root: Path, hold_s: float) -> subprocess.Popen:
    """A child process that holds ds/day=3's lock for hold_s seconds (started once it holds it)."""
    child = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(root), str(hold_s)], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert child.stdout.readline().strip() == "locked"
    return child


def test_partition_lock_makes_a_second_holder_wait_and_names_the_first(tmp_path, caplog) -> None:
    import logging

    from tasks.core.storage import partition_lock, partition_lock_path

    holder = _lock_holder(tmp_path, 1.5)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="tasks.core.storage"):
        with partition_lock(tmp_path, "ds", "day=3", timeout_s=60, label="day 3"):
            waited = time.monotonic() - start
            assert holder.poll() is not None  # it held the lock until it exited
            assert partition_lock_path(tmp_path, "ds", "day=3").read_text().split()[0] == str(os.getpid())
    assert holder.wait(10) == 0 and waited >= 0.5
    assert f"waiting for day 3's lock held by pid {holder.pid} on host {socket.gethostname()}" in caplog.text
    assert "got day 3's lock after waiting" in caplog.text
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [".lock-day=3"]  # hidden, kept, nothing else


def test_partition_lock_wait_is_bounded_and_a_killed_holder_releases_it(tmp_path) -> None:
    from tasks.core.storage import PartitionLockTimeout, partition_lock

    holder = _lock_holder(tmp_path, 60)
    try:
        with pytest.raises(PartitionLockTimeout, match=rf"day 3's lock .* is still held by pid {holder.pid} on host "
                                                       r".* after \d+ s: giving up .*RECFLOW_PARTITION_LOCK_TIMEOUT_S"):
            with partition_lock(tmp_path, "ds", "day=3", timeout_s=0.5, label="day 3"):
                pytest.fail("the lock was given while its holder lived")
    finally:
        holder.kill()
        holder.wait(10)
    start = time.monotonic()
    with partition_lock(tmp_path, "ds", "day=3", timeout_s=5):  # the kernel dropped the dead holder's lock
        assert time.monotonic() - start < 1.0
    with partition_lock(tmp_path, "ds", "day=4", timeout_s=0):  # another partition never waits for day 3
        with partition_lock(tmp_path, "ds", "day=3", timeout_s=0):
            pass


@pytest.mark.parametrize("dataset, key", [("ds", "../x"), ("ds", "a/b"), ("../ds", "day=1"), ("ds", "")])
def test_partition_lock_names_stay_inside_the_data_root(tmp_path, dataset, key) -> None:
    from tasks.core.storage import partition_lock

    with pytest.raises(ValueError, match="cannot name a lock"):
        with partition_lock(tmp_path, dataset, key):
            pass
