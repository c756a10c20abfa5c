"""The contract every bad-input case checks (tests/reliability): (a) + (c) one clear line from our own error type,
(b) nothing marked complete. Shared by the test_bad_* modules."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tasks.core.storage import MANIFEST_NAME

DAY, ROWS = 0, 200


def one_line(exc: BaseException, *named: str, plain: bool = True) -> str:
    """(a) + (c): a non-empty single-line message naming each of `named`, from our code (or a builtin we raised).

    plain: also no control characters (terminal colour codes) in it.
    """
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} with an empty message"
    assert "\n" not in message and "Traceback" not in message, f"multi-line error: {message!r}"
    if plain:
        assert not re.search(r"[\x00-\x1f\x7f]", message), f"control characters in: {message!r}"
    for part in named:
        assert part in message, f"{part!r} is not named in: {message}"
    module = type(exc).__module__
    assert module.startswith(("tasks.", "models.")) or module == "builtins", f"foreign error type {type(exc)}"
    print(f"[error line] {type(exc).__name__}: {message}")
    return message


def nothing_complete(root: Path) -> None:
    """(b): no manifest, download sidecar, pointer or half-written temporary anywhere below root."""
    if not root.exists():
        return
    marks = [p.relative_to(root).as_posix() for p in root.rglob("*")
             if p.name in (MANIFEST_NAME, "latest.json", "latest") or p.name.endswith(".download.json")
             or p.name.startswith(".tmp-")]
    assert marks == [], f"marked complete or left half-written: {marks}"


def snapshot(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@functools.cache
def good_day_lines() -> tuple[bytes, ...]:
    """ROWS valid synthetic Criteo rows (no trailing newline on each)."""
    from tasks.criteo.synthetic import CriteoDayGenerator, format_block

    block = next(CriteoDayGenerator(seed=7).blocks(DAY, ROWS, block_rows=ROWS))
    return tuple(format_block(block).split(b"\n")[:-1])
