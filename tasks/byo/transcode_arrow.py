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
Memory: two steps of `STEP_ROWS` lines from every file (the one being written and the next, read and parsed
meanwhile) plus one write batch, whatever the number of rows. The output
directory is replaced atomically with _MANIFEST.json last (extra.engine = "arrow").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from tasks.byo.contract import (MAX_LINE_BYTES, BlockLines, TranscodeResult, check_bad_rows, check_lines,
                                column_bad, open_csv, parse_block)
from tasks.byo.contract import parse_transcode_args as parse_args
from tasks.byo.spec import (CATEGORICAL_CHANNEL, FLOAT16_MAX, LABEL_CHANNEL, MAPPINGS, NUMERICAL_CHANNEL,
                            CsvChunk, csv_chunks, declared_cardinalities, load_csv_spec, renamed_features,
                            resolve_cardinalities)
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest

log = logging.getLogger(__name__)

STEP_ROWS = 1 << 15          # lines taken from every file of a mapping per step (memory ~ this x the row's width)
READ_BYTES = 1 << 20         # one read from a file's (decompressed) stream
WRITE_ROWS = 1 << 18         # rows per batch handed to the split-binary writer
PARSE_BLOCK_BYTES = 1 << 20  # pyarrow's CSV block: its unit of parallel parsing
SPILL = "_spill"
MAX_ID_DIGITS = 18           # CATEGORICAL_PATTERN's [0-9]{1,18}
_NEWLINE = ord("\n")
_ID_BYTES = b"0123456789,\n"
_NUMBER_BYTES = b"0123456789,\n.-+eE"
_DIGIT_0, _SIGNS, _LOWER = ord("0"), (ord("+"), ord("-")), 0x20
_OVERLONG = b"\x00"          # an over-long line is replaced by this one byte, which breaks every row rule


class LineReader:
    """Whole lines of one file, `take(n)` at a time; a line longer than max_line_bytes (without its newline) is
    skipped while reading (memory stays bounded) and stands as one bad line (one NUL byte, which breaks every row
    rule). Reads are at most max_line_bytes, so only a line that spans reads can be too long, and it is measured
    exactly wherever the reads cut it: the validation's rule (tasks/byo/validation.py)."""

    def __init__(self, path: Path, max_line_bytes: int = MAX_LINE_BYTES, name: str | None = None) -> None:
        self.path, self.max_line_bytes = path, max_line_bytes
        self.read_bytes = min(READ_BYTES, max_line_bytes)
        self.stream = open_csv(path, name)
        self.parts: list[bytes] = []   # whole lines read and not taken yet, in order
        self.counts: list[int] = []    # lines in each part
        self.tail = b""                # the start of a line whose end is not read yet
        self.eof, self.skipping = False, False

    def close(self) -> None:
        self.stream.close()

    def _fill(self) -> None:
        data = self.stream.read(self.read_bytes)
        if not data:
            self.eof = True
            if self.tail:  # the last line without a newline
                self._add(self.tail + b"\n", 1)
                self.tail = b""
            return
        if self.skipping:  # inside an over-long line: drop bytes up to its end
            cut = data.find(b"\n")
            if cut < 0:
                return
            data, self.skipping = data[cut + 1:], False
        cut = data.rfind(b"\n")
        if cut < 0:
            self.tail += data
        else:
            start = 0
            if self.tail:  # the line it started ends in this read
                start = data.find(b"\n") + 1
                if len(self.tail) + start - 1 > self.max_line_bytes:
                    self._add(_OVERLONG + b"\n", 1)
                else:  # kept as a part of no newline before the rest, which ends it
                    self._add(self.tail, 0)
                    start = 0
            if start <= cut:
                self._add(memoryview(data)[start:cut + 1], data.count(b"\n", start, cut + 1))  # joined in take
            self.tail = data[cut + 1:]
        if len(self.tail) > self.max_line_bytes:
            self._add(_OVERLONG + b"\n", 1)
            self.tail, self.skipping = b"", True

    def _add(self, lines, count: int) -> None:
        self.parts.append(lines)
        self.counts.append(count)

    def take(self, n: int) -> tuple[bytes, int]:
        """(the next n lines, or fewer at the end of the file, each ending in a newline; how many)."""
        while sum(self.counts) < n and not self.eof:
            self._fill()
        taken, count = [], 0
        while self.parts and count < n:
            part, lines = self.parts.pop(0), self.counts.pop(0)
            if count + lines > n:  # split the part after its (n - count)-th line
                want = n - count
                arr = np.frombuffer(part, np.uint8)
                cut = int(np.flatnonzero(arr == _NEWLINE)[want - 1]) + 1
                self.parts.insert(0, part[cut:])
                self.counts.insert(0, lines - want)
                part, lines = part[:cut], want
            taken.append(part)
            count += lines
        return b"".join(taken), count


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
    if chunk.channels == (LABEL_CHANNEL,) and len(block) == 2 * count and (arr[1::2] == _NEWLINE).all():
        digits = arr[0::2] - _DIGIT_0  # the label alone, one byte a line (an empty line or "10" shifts the pairs)
        return ParsedLines(digits <= 1, {chunk.features[0]: digits.astype(np.float64)})
    if chunk.channels == (CATEGORICAL_CHANNEL,) and b"," not in block:  # one id a line, two fields none
        return _parse_id_lines(chunk.features[0], arr, count)  # its digits summed straight from the bytes
    if not numbers_only and np.diff(np.flatnonzero(arr < _DIGIT_0), prepend=-1).max() > MAX_ID_DIGITS + 1:
        return None  # a field of more than 18 digits (only digits and separators are left: separators < '0')
    if numbers_only and (b"e" in block or b"E" in block) and _long_exponent(arr):
        return None
    types = {CATEGORICAL_CHANNEL: pa.int64(), NUMERICAL_CHANNEL: pa.float64(), LABEL_CHANNEL: pa.string()}
    try:
        table = pacsv.read_csv(
            pa.py_buffer(block),
            # 1 MB blocks parsed by pyarrow's threads; a small block in this thread (thread start-up costs more)
            read_options=pacsv.ReadOptions(column_names=list(chunk.features), block_size=PARSE_BLOCK_BYTES,
                                           use_threads=len(block) > 4 * PARSE_BLOCK_BYTES),
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
            bad, numbers = column_bad(column.combine_chunks(), channel)
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


def _parse_id_lines(name: str, arr: np.ndarray, count: int) -> ParsedLines | None:
    """Lines of one id each (only digits and newlines: checked by the caller), 1 to 18 digits, as int64: Horner's
    rule over the digit columns counted back from each line's end, one column of every line at a time (a line
    shorter than the column keeps its value). None when a line is empty or too long (the exact path then names the
    rule)."""
    ends = np.flatnonzero(arr == _NEWLINE)
    if len(ends) != count:
        return None
    lengths = np.diff(ends, prepend=-1) - 1
    if not len(lengths) or lengths.min() < 1 or lengths.max() > MAX_ID_DIGITS:
        return None
    values = np.zeros(count, np.int64)
    for back in range(int(lengths.max()), 0, -1):  # the digit `back` places before the newline, if the line has it
        digits = arr.take(ends - back, mode="clip").astype(np.int64) - _DIGIT_0
        values = np.where(lengths >= back, values * 10 + digits, values)
    return ParsedLines(np.ones(count, bool), {name: values})


def _long_exponent(arr: np.ndarray) -> bool:
    """Some exponent has 4 digits or more (NUMERICAL_PATTERN allows 1 to 3; a float parser takes any number)."""
    marks = np.flatnonzero((arr | _LOWER) == ord("e"))
    # clipped reads past the end land on the block's final newline, which is no digit
    start = marks + 1 + np.isin(arr.take(marks + 1, mode="clip"), _SIGNS)
    digits = [(arr.take(start + k, mode="clip") >= _DIGIT_0) & (arr.take(start + k, mode="clip") <= ord("9"))
              for k in range(4)]
    return bool(np.logical_and.reduce(digits).any())


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
    lines = BlockLines.of(block, len(chunk.features))
    good = lines.parseable
    ok = good.copy()
    values = {f: np.zeros(count, np.float64) for f in chunk.features}
    rows = np.flatnonzero(good)
    if len(rows):
        table = parse_block(lines.keep(block, good), chunk.features)
        for index, (feature, channel) in enumerate(zip(chunk.features, chunk.channels)):
            bad, numbers = column_bad(table.column(index).combine_chunks(), channel)
            ok[rows[bad]] = False
            values[feature][rows] = numbers
    return ParsedLines(ok, values)


def parse_lines(chunk: CsvChunk, block: bytes, count: int) -> ParsedLines:
    """`count` lines, each ending in '\n' (CRLF line ends too: without another '\r', the fast path reads them as LF)."""
    if b"\r" in block:
        lf = block.replace(b"\r\n", b"\n")
        if b"\r" in lf:
            return _exact_parse(chunk, block, count)
        block = lf
    return _fast_parse(chunk, block, count) or _exact_parse(chunk, block, count)


@dataclass
class MappingCounts:
    """What reading one mapping found: lines, good rows written, bad rows dropped."""

    lines: int = 0
    rows: int = 0
    bad: int = 0


def good_rows(spec, source_dir: Path, mapping: str, counts: MappingCounts, max_ids: dict[str, int],
              pool: ThreadPoolExecutor) -> Iterator[tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """One mapping's good rows in file order, a step at a time: (label int8, numericals float32 rows, ids int64
    per categorical). The files are read side by side and parsed in `pool`'s threads (pyarrow and most of numpy
    release the GIL), the next step while the caller writes this one; a row bad in any file is dropped; max_ids
    tracks the largest id of every categorical."""
    chunks = csv_chunks(spec, mapping)
    for chunk in chunks:
        if not (source_dir / chunk.file).is_file():
            raise FileNotFoundError(f"{chunk.file}: file is missing ({source_dir / chunk.file}); "
                                    f"source_spec.{mapping} names it")
    numerical = spec.channel_spec[NUMERICAL_CHANNEL]
    categorical = spec.channel_spec[CATEGORICAL_CHANNEL]
    label = spec.channel_spec[LABEL_CHANNEL][0]
    progress = ProgressLog(f"{mapping}: reading CSV lines", every_s=30.0, logger=log)
    readers = [LineReader(source_dir / chunk.file, name=chunk.file) for chunk in chunks]
    # One step ahead: a single thread reads and parses step k+1 (its files in `pool`) while the caller consumes
    # step k, so the split-binary write overlaps the parsing (memory: two steps instead of one).
    ahead = ThreadPoolExecutor(1, thread_name_prefix=f"byo-{mapping}-step")
    step = ahead.submit(_read_step, mapping, chunks, readers, pool, 0)
    try:
        while True:
            count, parsed = step.result()
            if count == 0:
                return
            step = ahead.submit(_read_step, mapping, chunks, readers, pool, counts.lines + count)
            good = np.flatnonzero(np.logical_and.reduce([p.ok for p in parsed]))
            values = {name: column for p in parsed for name, column in p.values.items()}
            ids = [values[name][good].astype(np.int64) for name in categorical]
            for name, column in zip(categorical, ids):
                if len(column):
                    max_ids[name] = max(max_ids[name], int(column.max()))
            counts.lines += count
            counts.rows += len(good)
            counts.bad += count - len(good)
            progress.report(counts.lines)
            yield (values[label][good].astype(np.int8),
                   np.column_stack([values[name][good] for name in numerical]).astype(np.float32), ids)
    finally:
        step.cancel()
        wait([step])  # the step in flight uses the readers
        ahead.shutdown()
        for reader in readers:
            reader.close()


def _read_step(mapping: str, chunks: list[CsvChunk], readers: list[LineReader], pool: ThreadPoolExecutor,
               before: int) -> tuple[int, list[ParsedLines]]:
    """The next STEP_ROWS lines of every file, each parsed in `pool` (read and parse in one job per file):
    (lines, each file's ParsedLines); the files must hold the same number of lines (`before`: lines already read)."""
    def read_and_parse(job: tuple[CsvChunk, LineReader]) -> tuple[int, ParsedLines | None]:
        chunk, reader = job
        block, count = reader.take(STEP_ROWS)
        return count, parse_lines(chunk, block, count) if count else None

    taken = list(pool.map(read_and_parse, zip(chunks, readers)))
    found = {chunk.file: count for chunk, (count, _) in zip(chunks, taken)}
    if len(set(found.values())) != 1:
        _line_count_mismatch(mapping, chunks, readers, found, before)
    return taken[0][0], [parsed for _, parsed in taken]


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


def declared_batches(batches: Iterator[tuple], spec) -> Iterator[tuple]:
    """Good-row batches checked against the declared cardinalities as they stream (every cardinality declared:
    the dtypes are known before the first row, so nothing needs spilling)."""
    declared = declared_cardinalities(spec)
    for label, numerical, ids in batches:
        for name, column in zip(declared, ids):
            if len(column) and int(column.max()) >= declared[name]:
                resolve_cardinalities(spec, {name: int(column.max()) + 1})  # raises NVIDIA's rule's error line
        yield label, numerical, ids


def spill(batches: Iterator[tuple], directory: Path) -> int:
    """Pass 1 with an `auto` cardinality: good rows to spill files (label int8, numericals already float16, ids
    int32: an id beyond int32 fails the cardinality checks before pass 2 reads them back); returns rows."""
    directory.mkdir(parents=True)
    rows, files = 0, {}
    try:
        for label, numerical, ids in batches:
            parts = {"label": label, "numerical": numerical.astype(np.float16)}
            parts |= {str(index): column.astype(np.int32) for index, column in enumerate(ids)}
            for name, array in parts.items():
                if name not in files:
                    files[name] = open(directory / name, "wb")
                files[name].write(array.tobytes())
            rows += len(label)
    finally:
        for f in files.values():
            f.close()
    return rows


def spilled_batches(directory: Path, rows: int, n_numerical: int, n_categorical: int) -> Iterator[tuple]:
    """Pass 2: the spill in WRITE_ROWS batches, as (label, numerical float16 rows, [ids])."""
    with open(directory / "label", "rb") as label_f, open(directory / "numerical", "rb") as num_f:
        id_files = [open(directory / str(i), "rb") for i in range(n_categorical)]
        try:
            for start in range(0, rows, WRITE_ROWS):
                n = min(WRITE_ROWS, rows - start)
                label = np.fromfile(label_f, np.int8, n)
                numerical = np.fromfile(num_f, np.float16, n * n_numerical).reshape(n, n_numerical)
                yield label, numerical, [np.fromfile(f, np.int32, n) for f in id_files]
        finally:
            for f in id_files:
                f.close()


def main(argv: Sequence[str]) -> TranscodeResult:
    """The transcode job's command line (tasks/byo/contract.py, the Spark job's too), run here."""
    from tasks.formats.split_binary import CHECKED_AT_WRITE, write_dataset

    args = parse_args(argv)
    started = time.monotonic()
    spec = load_csv_spec(args.spec)
    source_dir = (args.source_dir or args.spec.parent).resolve()
    categorical = spec.channel_spec[CATEGORICAL_CHANNEL]
    n_numerical = len(spec.channel_spec[NUMERICAL_CHANNEL])
    max_ids = {name: -1 for name in categorical}
    counts = {m: MappingCounts() for m in MAPPINGS}
    one_pass = None not in declared_cardinalities(spec).values()
    with atomic_directory(args.output) as tmp, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        streams = {m: good_rows(spec, source_dir, m, counts[m], max_ids, pool) for m in MAPPINGS}
        if one_pass:  # every cardinality declared: straight into the writer, checked as the ids stream
            cardinalities = resolve_cardinalities(spec, {})
            write_dataset(tmp, {m: declared_batches(stream, spec) for m, stream in streams.items()},
                          cardinalities, n_numerical)
        else:
            spilled = {m: spill(stream, tmp / SPILL / m) for m, stream in streams.items()}
        for mapping, found in counts.items():
            if found.rows == 0:
                raise ValueError(f"source_spec.{mapping}: no good row in {found.lines} lines")
        lines = {m: c.lines for m, c in counts.items()}
        dropped = {m: c.bad for m, c in counts.items()}
        log.info("lines %s, bad rows dropped %s", lines, dropped)
        for mapping in MAPPINGS:  # the files of a mapping agree (_read_step): one count stands for them all
            check_lines(args.expected_lines, mapping, {f"source_spec.{mapping}": lines[mapping]})
        check_bad_rows(args.expected_bad_rows, dropped)
        if not one_pass:
            cardinalities = resolve_cardinalities(spec, {name: found + 1 for name, found in max_ids.items()})
            write_dataset(tmp, {m: spilled_batches(tmp / SPILL / m, rows, n_numerical, len(categorical))
                                for m, rows in spilled.items()}, cardinalities, n_numerical)
            shutil.rmtree(tmp / SPILL)
        log.info("cardinalities: %s", dict(zip(categorical, cardinalities)))
        rows = {m: c.rows for m, c in counts.items()}
        write_manifest(tmp, Manifest(kind="byo_transcode", inputs=json.loads(args.inputs_json), rows=rows,
                                     extra={"cardinalities": cardinalities, "dropped": dropped, "lines": lines,
                                            "features": renamed_features(spec), "engine": "arrow",
                                            CHECKED_AT_WRITE: list(cardinalities)}),
                       checksum=False)  # sizes only: docs/ARCHITECTURE.md "Manifests"
    seconds = time.monotonic() - started
    log.info("dataset %s: %s rows in %.2f s (%.0f CSV rows/s, arrow engine, %s)", args.output, rows, seconds,
             sum(lines.values()) / max(seconds, 1e-9), "one pass" if one_pass else "spilled for auto cardinalities")
    return TranscodeResult(str(args.output), rows, dropped, cardinalities, seconds, renamed_features(spec))


if __name__ == "__main__":
    import sys
    from dataclasses import asdict

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(json.dumps(asdict(main(sys.argv[1:]))))
