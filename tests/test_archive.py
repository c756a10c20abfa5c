"""tasks.core.archive: a zip that cannot be unpacked as it is fails in one ArchiveError line naming it (bad input:
the ingest DAGs fail it without retry); a failure that is no fault of the archive is not turned into one."""

from __future__ import annotations

import contextlib
import errno
import zipfile
from pathlib import Path

import pytest

from tasks.core.archive import ArchiveError, extract_zip, unreadable


def _zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members:
            twice = name in zf.namelist()
            with pytest.warns(UserWarning, match="Duplicate name") if twice else contextlib.nullcontext():
                zf.writestr(name, data)
    return path


def _patched(path: Path, offset_of: str, value: bytes) -> None:
    """Patch the 2 bytes at `offset_of` ('method' or 'flags') of every local and central header."""
    data = bytearray(path.read_bytes())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(signature)
        while at >= 0:
            where = at + flags_at + (2 if offset_of == "method" else 0)
            data[where:where + 2] = value
            at = data.find(signature, at + 4)
    path.write_bytes(bytes(data))


def test_a_member_named_twice_is_refused(tmp_path):
    archive = _zip(tmp_path / "ml.zip", [("ml/ratings.csv", b"a"), ("ml/ratings.csv", b"b")])
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError, match=r"^ml.zip: member 'ml/ratings.csv' appears more than once"):
        extract_zip(archive, tmp_path / "out")


@pytest.mark.parametrize("damage, expected", [
    ("method", r"^x.zip: corrupt or unsupported zip archive \(NotImplementedError: "),  # Deflate64 (9) and others
    ("flags", r"^x.zip: File .* is encrypted, password required for extraction \(recflow reads unencrypted"),
])
def test_a_member_zipfile_cannot_read_is_one_line(tmp_path, damage, expected):
    archive = _zip(tmp_path / "x.zip", [("a.csv", b"1,2\n")])
    _patched(archive, damage, b"\x09\x00" if damage == "method" else b"\x01\x00")
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError, match=expected):
        extract_zip(archive, tmp_path / "out")


@pytest.mark.parametrize("second", ["a/b.csv", "a/"])  # a file in the folder, or the folder's own entry
def test_a_file_and_a_folder_of_one_name_is_refused(tmp_path, second):
    archive = _zip(tmp_path / "x.zip", [("a", b"file"), (second, b"1\n" if second.endswith(".csv") else b"")])
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError, match=rf"^x.zip: member '{second}' and another member are a file and a folder"):
        extract_zip(archive, tmp_path / "out")


def test_a_full_disk_is_not_the_archives_fault():
    assert unreadable(Path("x.zip"), OSError(errno.ENOSPC, "No space left on device")) is None
    assert unreadable(Path("x.zip"), RuntimeError("something else")) is None
    assert isinstance(unreadable(Path("x.zip"), zipfile.BadZipFile("bad")), ArchiveError)
