"""What byo's two transcode engines (spark_jobs/byo/transcode.py, tasks/byo/transcode_arrow.py) and its validation
step agree on: the row rules as code (how a block of CSV lines is parsed and each value checked), the transcode's
command line, its bad-row check and its result record. Every engine imports these from here, none from another
engine or from the validation step (issue #25 item 2); the rules' text and patterns live in tasks/byo/spec.py.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tasks.byo.spec import FLOAT16_MAX, MAPPINGS, NUMERICAL_CHANNEL, PATTERNS
from tasks.core.validation import UTF8_BOM, keep_lines, line_bounds

# A line longer than this (bytes, without its newline) is a bad row for the validation and for both transcode
# engines, wherever it falls in their reads (the arrow engine never holds more than this of it, the validation no
# more than one block).
MAX_LINE_BYTES = 1 << 20
_CR, _COMMA = ord("\r"), ord(",")


@dataclass(frozen=True)
class TranscodeResult:
    output: str
    rows: dict[str, int]
    dropped: dict[str, int]
    cardinalities: list[int]
    seconds: float
    features: dict[str, str] = field(default_factory=dict)  # input name -> output name


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".lz4", ".zst")


def open_csv(path: Path, name: str | None = None) -> CsvStream:
    """A CSV file as a binary stream, decompressed while read when its name says so (.gz; also .bz2, .lz4, .zst:
    pyarrow's detection by extension, as the transcode reads it)."""
    import pyarrow as pa

    return CsvStream(pa.input_stream(str(path), compression="detect"), name or str(path),
                     path.name.endswith(COMPRESSED_SUFFIXES))


class CsvStream:
    """read(n) over a CSV file as the row rules see it. A UTF-8 byte-order mark that starts the file is not data: it
    is dropped, as pandas (NVIDIA's transcoder) and Hadoop's line reader (the Spark engine) drop it. A compressed file
    that cannot be decompressed (truncated, damaged, or not compressed at all) raises DataQualityError naming the
    file and where, in one line (pyarrow's own error names neither: 'Truncated compressed stream'). Reads are
    large (a block, or 1 MiB): the first one holds the whole mark when there is one."""

    def __init__(self, stream, name: str, compressed: bool) -> None:
        self.stream, self.name, self.compressed = stream, name, compressed
        self.offset = 0

    def read(self, n: int) -> bytes:
        try:
            data = self.stream.read(n)
        except OSError as exc:
            if not self.compressed:
                raise
            from tasks.core.validation import DataQualityError

            raise DataQualityError(f"{self.name}: cannot be decompressed after {self.offset:,} bytes ({exc}): the file "
                                   "is truncated or damaged, or not compressed as its name says") from None
        if self.offset == 0 and data.startswith(UTF8_BOM):
            data, self.offset = data[len(UTF8_BOM):], len(UTF8_BOM)
        self.offset += len(data)
        return data

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> CsvStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stray_returns(block: bytes, ends: np.ndarray) -> np.ndarray:
    r"""Per line of a block (`ends`: its line_bounds' ends), the block offset of its first carriage return that does
    not end the line, or -1. Lines end at '\n'; a '\r' right before it (or at the end of the block's last line) is
    part of the line end, as pandas (NVIDIA's transcode) and Spark's default reader take CRLF files.
    Any other '\r' breaks its row: pyarrow's CSV parser would start a new row at it, so such a line must never
    reach parse_block. The line cap counts the bytes before '\n', a CRLF's '\r' with them."""
    first = np.full(len(ends), -1, dtype=np.int64)
    if b"\r" in block:  # a byte search: most files have none
        returns = np.flatnonzero(np.frombuffer(block, np.uint8) == _CR)
        lines = np.searchsorted(ends, returns)  # a line's end is its newline's offset (or the block's length)
        stray = returns != ends[lines] - 1
        held, index = np.unique(lines[stray], return_index=True)
        first[held] = returns[stray][index]
    return first


@dataclass(frozen=True)
class BlockLines:
    r"""The lines of a block of CSV bytes as the row rules see them before any value is parsed: bounds, field counts
    and stray carriage returns. `parseable` marks the lines parse_block may be given (the right field count, no
    stray '\r'); the others are bad rows whatever their values. The validation names why; the engines drop them."""

    arr: np.ndarray        # the block as uint8
    starts: np.ndarray     # line starts (block offsets)
    ends: np.ndarray       # line ends (the newline's offset, or the block's length)
    commas: np.ndarray     # commas before each block offset (len(arr) + 1)
    fields: np.ndarray     # fields per line
    returns: np.ndarray    # per line, the offset of its first stray '\r' or -1 (stray_returns)
    parseable: np.ndarray  # bool per line

    @classmethod
    def of(cls, block: bytes, expected_fields: int) -> BlockLines:
        arr = np.frombuffer(block, np.uint8)
        starts, ends = line_bounds(arr)
        commas = np.concatenate(([0], np.cumsum(arr == _COMMA)))
        fields = commas[ends] - commas[starts] + 1
        returns = stray_returns(block, ends)
        return cls(arr, starts, ends, commas, fields, returns, (fields == expected_fields) & (returns < 0))

    def return_field(self, line: int) -> int:
        r"""The 0-based field holding the line's first stray '\r' (the line must have one)."""
        return int(self.commas[self.returns[line]] - self.commas[self.starts[line]])

    def keep(self, block: bytes, good: np.ndarray) -> bytes:
        """The block with only the `good` lines (the block itself when all are)."""
        return block if good.all() else keep_lines(self.arr, self.starts, self.ends, good)


# Every byte outside ASCII read as DEL (0x7f): no row rule accepts either (every rule is ASCII), so the field holding
# one is bad as it was, and pyarrow's CSV parser, which stops at invalid UTF-8 in a string column, never sees it.
_ASCII_ONLY = bytes(range(128)) + b"\x7f" * 128


def parse_block(data: bytes, names: tuple[str, ...]):
    """The lines of `data` (each with the right field count) as a table of strings, one column per feature; a byte
    outside ASCII reads as DEL (the caller shows a bad value from the line's own bytes)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    return pacsv.read_csv(
        pa.py_buffer(data if data.isascii() else data.translate(_ASCII_ONLY)),
        read_options=pacsv.ReadOptions(column_names=list(names), block_size=max(1 << 20, len(data) + 1)),
        parse_options=pacsv.ParseOptions(delimiter=",", quote_char=False, escape_char=False,
                                          ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False))


def column_bad(column, channel: str) -> tuple[np.ndarray, np.ndarray]:
    """(mask of values breaking the channel's rule, values as float64 with 0 where bad). `column`: a string Array.
    Converted through buffers, not to_numpy / pa.scalar, which import pandas (a third of a second a process)."""
    import pyarrow.compute as pc

    matches = pc.match_substring_regex(column, PATTERNS[channel])
    ok = bool_numpy(matches)
    values = np.zeros(len(column), np.float64)
    good = pc.cast(pc.filter(column, matches), "float64")
    values[ok] = np.frombuffer(good.buffers()[1], np.float64)[good.offset:good.offset + len(good)]
    if channel == NUMERICAL_CHANNEL:
        ok &= np.abs(values) <= FLOAT16_MAX
        values = np.where(ok, values, 0.0)
    return ~ok, values


def bool_numpy(array) -> np.ndarray:
    """A BooleanArray without nulls as a numpy bool array, from its bitmap."""
    bits = np.unpackbits(np.frombuffer(array.buffers()[1], np.uint8), bitorder="little")
    return bits[array.offset:array.offset + len(array)].astype(bool)


def check_bad_rows(expected_json: str | None, dropped: dict[str, int]) -> None:
    """--expected-bad-rows (the validation's count per mapping) must equal what the transcode dropped."""
    expected = json.loads(expected_json) if expected_json else None
    if expected is not None and {m: int(expected.get(m, 0)) for m in MAPPINGS} != dropped:
        raise RuntimeError(f"the transcode found bad rows {dropped} but the validation counted {expected}: the two "
                           "disagree on the row rules")


def count_lines(path: Path, name: str, read_bytes: int = 16 << 20, progress=None) -> int:
    r"""The lines of a CSV file (decompressed where its name says so) as every reader numbers them: one per '\n',
    and a last line without one. `progress`: a tasks.core.progress.ProgressLog advanced by the bytes read."""
    lines, last = 0, b"\n"
    with open_csv(path, name) as stream:
        while chunk := stream.read(read_bytes):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
            if progress is not None:
                progress.advance(len(chunk))
    return lines + (last != b"\n")


def check_lines(expected_json: str | None, mapping: str, counts: dict[str, int], skipped_over: int | None = None,
                counted_by: str = "the validation counted") -> None:
    """Every file of the mapping (`counts`: file -> lines read) must hold the lines the validation counted
    (--expected-lines, per mapping). `skipped_over`: the reader's own line cap (bytes), when it skips longer lines;
    `counted_by`: where the expected count comes from, for the error."""
    expected = json.loads(expected_json) if expected_json else {}
    if mapping not in expected:
        return
    want = int(expected[mapping])
    for name, lines in counts.items():
        if lines < want and skipped_over is not None:
            raise ValueError(f"{name}: {want - lines} line(s) longer than {skipped_over} bytes skipped by the reader "
                             f"({counted_by} {want} lines, the reader read {lines}); the Spark engine holds a "
                             "line whole and cannot number the rows after a skipped one: remove such lines (the "
                             "validation's quarantine.jsonl names every line over "
                             f"{MAX_LINE_BYTES} bytes) or transcode with engine=arrow, which streams them")
        if lines != want:
            raise RuntimeError(f"{name}: {lines} lines read, but the validation counted {want}: the file changed "
                               "after it was validated")


def parse_transcode_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CSV files + CSV FeatureSpec -> split-binary train/test + spec")
    parser.add_argument("--spec", required=True, type=Path, help="the CSV FeatureSpec yaml (paths relative to it)")
    parser.add_argument("--source-dir", type=Path, default=None, help="where the CSVs are (default: the spec's dir)")
    parser.add_argument("--output", required=True, type=Path, help="dataset directory (replaced atomically)")
    parser.add_argument("--expected-bad-rows", default=None,
                        help="JSON {mapping: bad rows} from the validation; a different count is an error")
    parser.add_argument("--expected-lines", default=None,
                        help="JSON {mapping: lines} from the validation; a file holding another count is an error")
    parser.add_argument("--inputs-json", default="{}", help="what identifies this work, recorded in the manifest")
    return parser.parse_args(argv)
