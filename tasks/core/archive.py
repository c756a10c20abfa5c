"""Unpacking a downloaded zip safely: every member must land inside the target folder (no zip-slip), no links, and
no more bytes than the deployment's cap on expanded bytes (RECFLOW_EXPANDED_MAX_BYTES: a zip bomb is refused when the
cap is reached, not when the disk is full). `copy_capped` is the same cap for any stream that expands (gunzip).

`extract_zip` writes into a folder the caller owns; wrap it in tasks.core.storage.atomic_directory so the unpacked
tree appears complete or not at all (and a retry after a kill starts from a clean temporary).
"""

from __future__ import annotations

import stat
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tasks.core.config import NotAllowed


class ArchiveError(ValueError):
    """A zip that cannot be unpacked as it is: corrupt, a member escaping the folder, a link, a required member
    missing. The message is one line naming the archive and the member; bad input does not get better on retry."""


class ExpansionLimitExceeded(ArchiveError, NotAllowed):
    """Decompressing would write more than the deployment's cap: a decompression bomb, or a file far larger than any
    expected. Bad input: the message names the setting that would allow it, and nothing is left marked complete."""


def expanded_max_bytes() -> int:
    """The deployment's cap on the bytes one decompression may write (RECFLOW_EXPANDED_MAX_BYTES)."""
    from tasks.core.config import load_settings

    return load_settings().expanded_max_bytes


def copy_capped(source: BinaryIO, sink: BinaryIO, *, limit: int, what: str, already: int = 0,
                chunk_bytes: int = 1 << 20) -> int:
    """Copy a decompressing stream into `sink`, refusing once `already` + the bytes copied would pass `limit` (never
    writing past it); returns the bytes written. `what` names the archive / member in the refusal."""
    written = 0
    while chunk := source.read(min(chunk_bytes, limit - already - written + 1)):
        written += len(chunk)
        if already + written > limit:
            raise ExpansionLimitExceeded(f"{what} expands to more than {limit} bytes; refusing to unpack it (a "
                                         f"decompression bomb? set RECFLOW_EXPANDED_MAX_BYTES to allow more)")
        sink.write(chunk)
    return written


# What zipfile raises on a zip it cannot read as it is: corrupt bytes, a truncated file, a compression method it lacks
# (Deflate64, which Windows' Explorer writes for large files); an encrypted member is a RuntimeError (unreadable()).
_UNREADABLE = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError)


def unreadable(archive: Path, exc: BaseException) -> ArchiveError | None:
    """The one-line ArchiveError for what zipfile raised while reading `archive`, None when that was no fault of
    the archive (a full disk while writing, a permission: retried, not refused)."""
    if isinstance(exc, _UNREADABLE):
        return ArchiveError(f"{archive.name}: corrupt or unsupported zip archive ({type(exc).__name__}: {exc})")
    if isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        return ArchiveError(f"{archive.name}: {exc} (recflow reads unencrypted zips only)")
    return None


def _check_member(info: zipfile.ZipInfo, archive: Path) -> None:
    name = info.filename
    path = PurePosixPath(name)
    unsafe = (not name or name.startswith(("/", "\\")) or "\\" in name or "\x00" in name
              or (len(name) > 1 and name[1] == ":") or any(part == ".." for part in path.parts))
    if unsafe:
        raise ArchiveError(f"{archive.name}: member {name!r} would be written outside the extraction folder; "
                           "refusing to unpack it")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ArchiveError(f"{archive.name}: member {name!r} is a symbolic link; refusing to unpack it")


def zip_members(archive: Path) -> list[str]:
    """Names of the archive's members (a corrupt zip fails with one line)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{archive.name}: not a readable zip archive ({exc})") from None


def extract_zip(archive: Path, folder: Path, *, required: Sequence[str] = (), chunk_bytes: int = 1 << 20,
                max_bytes: int | None = None) -> list[str]:
    """Unpack `archive` into the existing `folder`; returns the file members written.

    Every member name is checked before anything is written (absolute paths, '..' segments, backslashes, drive
    letters and symbolic links are refused), and each written path is checked to lie under `folder`. `required`
    members must be present. A member whose bytes fail the zip's CRC fails the whole extraction. `max_bytes`: the
    most bytes all members may expand to (None: RECFLOW_EXPANDED_MAX_BYTES); the sizes the zip declares are checked
    before anything is written, the bytes actually written while writing (a zip may lie about its sizes)."""
    folder = Path(folder)
    root = folder.resolve()
    limit = expanded_max_bytes() if max_bytes is None else max_bytes
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member(info, archive)
            names = {info.filename for info in infos}
            if len(names) != len(infos):
                twice = next(name for name in names if sum(i.filename == name for i in infos) > 1)
                raise ArchiveError(f"{archive.name}: member {twice!r} appears more than once (which copy is the "
                                   "data?); refusing to unpack it")
            missing = [name for name in required if name not in names]
            if missing:
                shown = sorted(names)[:10]
                raise ArchiveError(f"{archive.name} holds no {', '.join(missing)} (members: {shown}"
                                   f"{'…' if len(names) > 10 else ''})")
            declared = sum(info.file_size for info in infos)
            if declared > limit:
                raise ExpansionLimitExceeded(f"{archive.name} declares {declared} bytes of members, more than the "
                                             f"{limit} allowed; refusing to unpack it (set RECFLOW_EXPANDED_MAX_BYTES "
                                             "to allow more)")
            written, total = [], 0
            for info in infos:
                target = (folder / info.filename).resolve()
                if not target.is_relative_to(root):
                    raise ArchiveError(f"{archive.name}: member {info.filename!r} resolves outside the extraction "
                                       "folder; refusing to unpack it")
                try:
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    sink = open(target, "wb")  # noqa: SIM115 - closed below, with the member's stream
                except (FileExistsError, NotADirectoryError, IsADirectoryError):
                    raise ArchiveError(f"{archive.name}: member {info.filename!r} and another member are a file "
                                       "and a folder of the same name; refusing to unpack it") from None
                with zf.open(info) as source, sink:
                    total += copy_capped(source, sink, limit=limit, already=total, chunk_bytes=chunk_bytes,
                                         what=f"{archive.name} (at member {info.filename!r})")
                written.append(info.filename)
            return written
    except (*_UNREADABLE, RuntimeError) as exc:
        if (error := unreadable(archive, exc)) is None:
            raise
        raise error from None
