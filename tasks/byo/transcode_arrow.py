"""BYO transcode on one machine (no JVM): the same split-binary dataset as spark_jobs/byo/transcode.py, byte for
byte, from the same argv (that module's parse_args), with pyarrow and numpy in the calling process.

How it reads: every chunk file of a mapping is streamed side by side, the same number of lines from each per step
(`STEP_ROWS`), so line k of every file is row k without numbering or joining anything. A file is read through
pyarrow's input stream (`.gz` and other compressed names are decompressed while streaming). Each file's lines are
parsed by one of two paths that decide the same thing:

  * fast: the block's bytes hold only what the row rules can accept without a regex (digits, commas and newlines
    for a file with an id or label column, at most 18 characters a field; digits, '.', '-' for a numerical-only
    file), and pyarrow parses it typed (int64 ids, float64 numbers; a wrong field count or an unparseable value
    makes it fall back);
  * exact: the validation's own machinery (tasks/byo/validation.py): field counts per line with numpy, the row
    rules' regexes (tasks/byo/spec.py PATTERNS) with pyarrow's kernels.

A row bad in any file of its mapping is dropped from all of them (the Spark job's and the validation's rule);
numericals are rounded float64 -> float32 here and to float16 by the writer (NVIDIA's double rounding).

Pass 1 writes each mapping's good rows to spill files in the output's temporary folder (label, numerical already as
float16, ids as int32) while tracking the largest id of every categorical; the cardinalities (`auto` = max id + 1,
a declared one must cover it) then fix the id dtypes, and pass 2 streams the spill into the split-binary writer.
Memory: one step of `STEP_ROWS` lines from every file plus one write batch, whatever the number of rows. The output
directory is replaced atomically with _MANIFEST.json last (extra.engine = "arrow").
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from spark_jobs.byo.transcode import TranscodeResult, check_bad_rows, parse_args
from tasks.byo.spec import (CATEGORICAL_CHANNEL, FLOAT16_MAX, LABEL_CHANNEL, MAPPINGS, NUMERICAL_CHANNEL,
                            CsvChunk, csv_chunks, load_csv_spec, renamed_features, resolve_cardinalities)
from tasks.byo.validation import MAX_LINE_BYTES, _column_bad, _parse_block, open_csv
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest
from tasks.core.validation import keep_lines, line_bounds

log = logging.getLogger(__name__)

STEP_ROWS = 1 << 17          # lines taken from every file of a mapping per step
READ_BYTES = 4 << 20         # one read from a file's (decompressed) stream
WRITE_ROWS = 1 << 18         # rows per batch handed to the split-binary writer
SPILL = "_spill"
MAX_ID_DIGITS = 18           # CATEGORICAL_PATTERN's [0-9]{1,18}
_NEWLINE, _COMMA = ord("\n"), ord(",")
_ID_BYTES = b"0123456789,\n"
_NUMBER_BYTES = b"0123456789,\n.-+eE"
_EXPONENT = (ord("e"), ord("E"))
_SIGN = (ord("+"), ord("-"))
_OVERLONG = b"\x00"          # an over-long line is replaced by this one byte, which breaks every row rule


class LineReader:
    """Whole lines of one file, `take(n)` at a time; a line longer than max_line_bytes is skipped while reading
    (memory stays bounded) and stands as one bad line, as the validation counts it."""

    def __init__(self, path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.path, self.max_line_bytes = path, max_line_bytes
        self.stream = open_csv(path)
        self.buffer, self.ends, self.eof, self.skipping = b"", np.zeros(0, np.int64), False, False

    def close(self) -> None:
        self.stream.close()

    def _fill(self) -> None:
        data = self.stream.read(READ_BYTES)
        if not data:
            self.eof = True
            if self.buffer and (not len(self.ends) or self.ends[-1] != len(self.buffer) - 1):
                self.buffer += b"\n"  # the last line without a newline
                self.ends = np.append(self.ends, len(self.buffer) - 1)
            return
        if self.skipping:  # inside an over-long line: drop bytes up to its end
            cut = data.find(b"\n")
            if cut < 0:
                return
            data, self.skipping = data[cut + 1:], False
        offset = len(self.buffer)
        self.buffer += data
        found = np.flatnonzero(np.frombuffer(data, np.uint8) == _NEWLINE) + offset
        self.ends = np.concatenate((self.ends, found))
        tail = len(self.buffer) - (int(self.ends[-1]) + 1 if len(self.ends) else 0)
        if tail > self.max_line_bytes:
            self.buffer = self.buffer[:len(self.buffer) - tail] + _OVERLONG + b"\n"
            self.ends = np.append(self.ends, len(self.buffer) - 1)
            self.skipping = True

    def take(self, n: int) -> tuple[bytes, int]:
        """(the next n lines, or fewer at the end of the file, each ending in a newline; how many)."""
        while len(self.ends) < n and not self.eof:
            self._fill()
        count = min(n, len(self.ends))
        if count == 0:
            return b"", 0
        cut = int(self.ends[count - 1]) + 1
        block, self.buffer, self.ends = self.buffer[:cut], self.buffer[cut:], self.ends[count:] - cut
        return block, count


@dataclass
class ParsedLines:
    """One file's lines of a step: ok[i] = line i follows every rule; values by feature (anything where not ok)."""

    ok: np.ndarray
    values: dict[str, np.ndarray]


def _fast_parse(chunk: CsvChunk, block: bytes, count: int) -> ParsedLines | None:
    """The typed parse, or None when the block's bytes or a field could break a rule the parser would accept."""
    numbers_only = all(channel == NUMERICAL_CHANNEL for channel in chunk.channels)
    if block.translate(None, _NUMBER_BYTES if numbers_only else _ID_BYTES):
        return None
    arr = np.frombuffer(block, np.uint8)
    separators = np.flatnonzero((arr == _COMMA) | (arr == _NEWLINE))
    if not numbers_only and np.diff(separators, prepend=-1).max() - 1 > MAX_ID_DIGITS:
        return None
    if numbers_only and not _short_exponents(arr, separators):
        return None
    types = {CATEGORICAL_CHANNEL: pa.int64(), NUMERICAL_CHANNEL: pa.float64(), LABEL_CHANNEL: pa.string()}
    try:
        table = pacsv.read_csv(
            pa.py_buffer(block),
            read_options=pacsv.ReadOptions(column_names=list(chunk.features), block_size=max(1 << 20, len(block))),
            parse_options=pacsv.ParseOptions(quote_char=False, escape_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={f: types[c] for f, c in zip(chunk.features, chunk.channels)},
                null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid:
        return None
    if table.num_rows != count:
        return None
    ok = np.ones(count, bool)
    values = {}
    for feature, channel, column in zip(chunk.features, chunk.channels, table.columns):
        if channel == LABEL_CHANNEL:
            bad, numbers = _column_bad(column.combine_chunks(), channel)
            ok &= ~bad
            values[feature] = numbers
            continue
        if column.null_count:
            ok &= _valid(column)
        numbers = _numpy(column)
        if channel == NUMERICAL_CHANNEL:
            with np.errstate(invalid="ignore"):
                ok &= np.abs(numbers) <= FLOAT16_MAX  # NaN where null: already not ok
        values[feature] = numbers
    return ParsedLines(ok, values)


def _short_exponents(arr: np.ndarray, separators: np.ndarray) -> bool:
    """Every exponent has 1 to 3 digits (NUMERICAL_PATTERN; a float parser takes any number of them)."""
    marks = np.flatnonzero((arr == _EXPONENT[0]) | (arr == _EXPONENT[1]))
    if not len(marks):
        return True
    ends = separators[np.searchsorted(separators, marks)]
    signed = np.isin(arr[np.minimum(marks + 1, len(arr) - 1)], _SIGN)
    return bool((ends - marks - 1 - signed <= 3).all())


def _numpy(column) -> np.ndarray:
    """A fixed-width column's values as numpy (anything under a null), read from its data buffers: without pandas,
    which to_numpy(zero_copy_only=False) and pa.scalar import (a third of a second per process)."""
    dtype = column.type.to_pandas_dtype()
    chunks = [np.frombuffer(chunk.buffers()[1], dtype)[chunk.offset:chunk.offset + len(chunk)]
              for chunk in column.chunks]
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def _valid(column) -> np.ndarray:
    """Where a column is not null, from its validity bitmaps."""
    masks = []
    for chunk in column.chunks:
        bitmap = chunk.buffers()[0]
        if bitmap is None:
            masks.append(np.ones(len(chunk), bool))
        else:
            bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
            masks.append(bits[chunk.offset:chunk.offset + len(chunk)].astype(bool))
    return masks[0] if len(masks) == 1 else np.concatenate(masks)


def _exact_parse(chunk: CsvChunk, block: bytes, count: int) -> ParsedLines:
    """The validation's rules line by line: field count, then each channel's regex (and float16's range)."""
    arr = np.frombuffer(block, np.uint8)
    starts, ends = line_bounds(arr)
    commas = np.concatenate(([0], np.cumsum(arr == _COMMA)))
    good = commas[ends] - commas[starts] + 1 == len(chunk.features)
    ok = good.copy()
    values = {f: np.zeros(count, np.float64) for f in chunk.features}
    rows = np.flatnonzero(good)
    if len(rows):
        table = _parse_block(block if good.all() else keep_lines(arr, starts, ends, good), chunk.features)
        for index, (feature, channel) in enumerate(zip(chunk.features, chunk.channels)):
            bad, numbers = _column_bad(table.column(index).combine_chunks(), channel)
            ok[rows[bad]] = False
            values[feature][rows] = numbers
    return ParsedLines(ok, values)


def parse_lines(chunk: CsvChunk, block: bytes, count: int) -> ParsedLines:
    return _fast_parse(chunk, block, count) or _exact_parse(chunk, block, count)


@dataclass
class MappingSpill:
    """One mapping's good rows in spill files (label int8, numerical float16, ids int32) and what pass 1 found."""

    directory: Path
    lines: int = 0
    rows: int = 0
    bad: int = 0


def _spill_mapping(spec, source_dir: Path, mapping: str, spill: MappingSpill, max_ids: dict[str, int],
                   progress: ProgressLog) -> None:
    """Pass 1 over one mapping: files side by side, bad rows dropped, good rows appended to the spill files."""
    chunks = csv_chunks(spec, mapping)
    for chunk in chunks:
        if not (source_dir / chunk.file).is_file():
            raise FileNotFoundError(f"{chunk.file}: file is missing ({source_dir / chunk.file}); "
                                    f"source_spec.{mapping} names it")
    numerical = spec.channel_spec[NUMERICAL_CHANNEL]
    categorical = spec.channel_spec[CATEGORICAL_CHANNEL]
    label = spec.channel_spec[LABEL_CHANNEL][0]
    spill.directory.mkdir(parents=True)
    readers = [LineReader(source_dir / chunk.file) for chunk in chunks]
    names = ("label", "numerical", *(str(index) for index in range(len(categorical))))
    files = {name: open(spill.directory / name, "wb") for name in names}
    try:
        while True:
            taken = [reader.take(STEP_ROWS) for reader in readers]
            counts = {chunk.file: count for chunk, (_, count) in zip(chunks, taken)}
            if len(set(counts.values())) != 1:
                _line_count_mismatch(mapping, chunks, readers, counts, spill.lines)
            count = taken[0][1]
            if count == 0:
                break
            parsed = [parse_lines(chunk, block, count) for chunk, (block, _) in zip(chunks, taken)]
            ok = np.logical_and.reduce([p.ok for p in parsed])
            values = {name: column for p in parsed for name, column in p.values.items()}
            good = np.flatnonzero(ok)
            files["label"].write(values[label][good].astype(np.int8).tobytes())
            number_rows = np.column_stack([values[name][good] for name in numerical]).astype(np.float32)
            files["numerical"].write(number_rows.astype(np.float16).tobytes())
            for index, name in enumerate(categorical):
                ids = values[name][good].astype(np.int64)
                if len(ids):
                    max_ids[name] = max(max_ids[name], int(ids.max()))
                # An id beyond int32 fails the cardinality checks before pass 2 reads these back.
                files[str(index)].write(ids.astype(np.int32).tobytes())
            spill.lines += count
            spill.rows += len(good)
            spill.bad += count - len(good)
            progress.report(spill.lines)
    finally:
        for f in files.values():
            f.close()
        for reader in readers:
            reader.close()


def _line_count_mismatch(mapping: str, chunks: list[CsvChunk], readers: list[LineReader], counts: dict[str, int],
                         before: int) -> None:
    totals = {}
    for chunk, reader in zip(chunks, readers):
        total, taken = before + counts[chunk.file], 1
        while taken:
            _, taken = reader.take(STEP_ROWS)
            total += taken
        totals[chunk.file] = total
    raise ValueError(f"source_spec.{mapping}: the files have different numbers of lines {totals}; line k of every "
                     "file is row k")


def _spilled_batches(spill: MappingSpill, n_numerical: int, n_categorical: int) -> Iterator[tuple]:
    """Pass 2: the spill in WRITE_ROWS batches, as (label, numerical float16 rows, [ids])."""
    with open(spill.directory / "label", "rb") as label_f, open(spill.directory / "numerical", "rb") as num_f:
        id_files = [open(spill.directory / str(i), "rb") for i in range(n_categorical)]
        try:
            for start in range(0, spill.rows, WRITE_ROWS):
                n = min(WRITE_ROWS, spill.rows - start)
                label = np.fromfile(label_f, np.int8, n)
                numerical = np.fromfile(num_f, np.float16, n * n_numerical).reshape(n, n_numerical)
                yield label, numerical, [np.fromfile(f, np.int32, n) for f in id_files]
        finally:
            for f in id_files:
                f.close()


def main(argv: Sequence[str]) -> TranscodeResult:
    """The Spark job's command line (spark_jobs/byo/transcode.py parse_args), run here."""
    from tasks.formats.split_binary import write_dataset

    args = parse_args(argv)
    started = time.monotonic()
    spec = load_csv_spec(args.spec)
    source_dir = (args.source_dir or args.spec.parent).resolve()
    categorical = spec.channel_spec[CATEGORICAL_CHANNEL]
    n_numerical = len(spec.channel_spec[NUMERICAL_CHANNEL])
    max_ids = {name: -1 for name in categorical}
    with atomic_directory(args.output) as tmp:
        spills = {m: MappingSpill(tmp / SPILL / m) for m in MAPPINGS}
        for mapping in MAPPINGS:
            progress = ProgressLog(f"{mapping}: reading CSV lines", every_s=30.0, logger=log)
            _spill_mapping(spec, source_dir, mapping, spills[mapping], max_ids, progress)
            if spills[mapping].rows == 0:
                raise ValueError(f"source_spec.{mapping}: no good row in {spills[mapping].lines} lines")
        lines = {m: s.lines for m, s in spills.items()}
        dropped = {m: s.bad for m, s in spills.items()}
        log.info("lines %s, bad rows dropped %s", lines, dropped)
        check_bad_rows(args.expected_bad_rows, dropped)
        cardinalities = resolve_cardinalities(spec, {name: found + 1 for name, found in max_ids.items()})
        log.info("cardinalities: %s", dict(zip(categorical, cardinalities)))
        write_dataset(tmp, {m: _spilled_batches(s, n_numerical, len(categorical)) for m, s in spills.items()},
                      cardinalities, n_numerical)
        shutil.rmtree(tmp / SPILL)
        rows = {m: s.rows for m, s in spills.items()}
        write_manifest(tmp, Manifest(kind="byo_transcode", inputs=json.loads(args.inputs_json), rows=rows,
                                     extra={"cardinalities": cardinalities, "dropped": dropped, "lines": lines,
                                            "features": renamed_features(spec), "engine": "arrow"}))
    seconds = time.monotonic() - started
    log.info("dataset %s: %s rows in %.2f s (%.0f CSV rows/s, arrow engine)", args.output, rows, seconds,
             sum(lines.values()) / max(seconds, 1e-9))
    return TranscodeResult(str(args.output), rows, dropped, cardinalities, seconds, renamed_features(spec))


if __name__ == "__main__":
    import sys
    from dataclasses import asdict

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(json.dumps(asdict(main(sys.argv[1:]))))
