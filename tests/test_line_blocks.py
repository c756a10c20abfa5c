"""Reading a file as blocks of whole lines (tasks.core.validation.counted_line_blocks): a plain file seeks back to
a cut line, a decompressing stream keeps it; both must hand out the same blocks, line numbers and skipped lines."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from tasks.core.validation import counted_line_blocks, iter_line_blocks


def _lines(seed: int) -> bytes:
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        kind = rng.random()
        width = rng.choice([0, 1, 5, 30, 90]) if kind < 0.9 else rng.choice([150, 400, 1000])  # some over the cap
        out.append(bytes(rng.choice(b"abc\t\r x") for _ in range(width)))
    text = b"\n".join(out)
    return text if seed % 2 else text + b"\n"  # with and without a last newline


def _numbered(blocks: list, lines: list[bytes], cap: int) -> tuple[dict[int, bytes], list]:
    """line number -> line, from the blocks, and the skipped lines; checks each block's count on the way."""
    seen: dict[int, bytes] = {}
    skips = []
    for first_line, block, skipped, count in blocks:
        assert count == block.count(b"\n")
        for long in skipped:
            assert len(lines[long.line - 1]) == long.length > cap and lines[long.line - 1].startswith(long.head)
            seen[long.line] = lines[long.line - 1]
            skips.append(long)
        parts = block.split(b"\n")
        for offset, line in enumerate(parts[:count] if block.endswith(b"\n") else parts):
            if block:
                seen[first_line + offset] = line
    return seen, skips


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("block_bytes", [7, 64, 333, 1 << 16])
def test_seeking_and_streaming_readers_hand_out_every_line_once_numbered(tmp_path: Path, seed: int,
                                                                         block_bytes: int) -> None:
    """The two cut blocks at different places (a stream's next block is the cut line + a full read, a plain file's
    a full read from the cut line), but both hand out every line once, in order, with its number, and skip the
    same over-long lines."""
    data = _lines(seed)
    plain, packed = tmp_path / "lines.txt", tmp_path / "lines.txt.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    results = []
    for blocks in (list(counted_line_blocks(plain, block_bytes, max_line_bytes=200)),
                   list(counted_line_blocks(packed, block_bytes, max_line_bytes=200, opener=gzip.open))):
        seen, skips = _numbered(blocks, lines, 200)
        assert [seen[n] for n in range(1, len(lines) + 1)] == lines and len(seen) == len(lines)
        assert all(len(block) <= 200 + 2 * block_bytes for _, block, _, _ in blocks)  # memory stays bounded
        results.append(skips)
    if block_bytes < 200:  # every line over the cap is skipped, however the blocks fall
        assert results[0] == results[1] and len(results[0]) > 0
    # (with blocks above the cap, a long line that a block holds whole is handed on to the checks, which then
    # report it: which ones depends on where the blocks fall)
    assert [b[:3] for b in iter_line_blocks(plain, block_bytes, 200)] == [
        b[:3] for b in counted_line_blocks(plain, block_bytes, 200)]


def test_a_cut_line_after_a_skipped_one_is_read_again_from_its_start(tmp_path: Path) -> None:
    """A long line's skip reads past its end and hands the rest back: stepping back to a cut line then has to
    count those handed-back bytes too."""
    path = tmp_path / "lines.txt"
    path.write_bytes(b"x" * 50 + b"\nab\ncdefgh\nij\n")
    blocks = list(counted_line_blocks(path, 8, max_line_bytes=20))
    assert [(first, block) for first, block, _, _ in blocks] == [(1, b""), (2, b"ab\n"), (3, b"cdefgh\n"),
                                                                 (4, b"ij\n")]
    assert blocks[0][2][0].length == 50
