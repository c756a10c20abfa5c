"""The machinery every raw-file validation shares, whatever the dataset: reading a file in blocks of whole lines,
the quarantine of bad rows, the bad-row budget and its one-line error, hash-bucketed key spills on disk (duplicate
and cross-file key checks in bounded memory) and the Great Expectations plumbing of an evidence frame.

A dataset's own module supplies what differs: its row rules (which columns, which regexes), its bad-row type (any
object with `line`, a `kind` for the report's counts, `describe(file_name)` for the error line and `text`), and its
GX suite. Nothing here knows a column name.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import logging
import os
import pickle
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

QUOTED_CHARS = 40             # at most this many characters of a bad value reach an error line
QUARANTINE_LIMIT = 1_000_000  # rows written to quarantine.jsonl per validation; beyond that only counted
EVIDENCE_BAD_ROWS = 1_000     # quarantined rows kept as GX evidence (so its report shows real failures)
_NEWLINE = 10
UTF8_BOM = b"\xef\xbb\xbf"


class DataQualityError(ValueError):
    """A file breaks its data contract (bad rows over the budget, a wrong header, a missing or empty file, a broken
    cross-file key). The message is one line naming the file, line and column; bad input is not retried."""


class ArchiveUnusable(DataQualityError):
    """A downloaded archive that cannot be unpacked as it is (corrupt, a member missing, named twice or escaping the
    folder): the download task fails without retry on it, which it does not on every DataQualityError (a checksum
    file served as an error page, a source answering 403 for a while: a retry may fetch them right)."""


class BadRowLike(Protocol):
    line: int
    text: str

    @property
    def kind(self) -> str: ...

    def describe(self, file_name: str) -> str: ...


@dataclass(frozen=True)
class BadField:
    """A bad row of a delimited text file, as a validation reports it (a BadRowLike)."""

    line: int                # 1-based line number in the file
    column: int              # 1-based field number; 0 when the line as a whole is wrong
    column_name: str | None  # the file's own name of the column
    byte: int                # 1-based byte column where the field starts (1 for whole-line problems)
    reason: str              # what is wrong, with the value: "'x1' is not an integer"
    rule: str                # the same without the value, what the report counts
    text: str                # the line, for humans, truncated

    def describe(self, file_name: str) -> str:
        where = f"{file_name} line {self.line}" + (f" column {self.column_name}" if self.column_name else "")
        return f"{where}: {self.reason}"

    @property
    def kind(self) -> str:
        return f"{self.column_name}: {self.rule}" if self.column_name else self.rule


# ---- reading a file as blocks of whole lines ----------------------------------------------------------------------


@dataclass(frozen=True)
class LongLine:
    """A line longer than the reader's limit, skipped without being held in memory."""

    line: int    # 1-based line number
    length: int  # bytes, without the newline
    head: bytes  # its first bytes, for the quarantine


def iter_line_blocks(path: Path, block_bytes: int, max_line_bytes: int,
                     opener: Callable[[Path], Any] | None = None) -> Iterator[tuple[int, bytes, list[LongLine]]]:
    """Yield (first line number, block of whole lines, over-long lines skipped before it); memory ~ block_bytes
    whatever the file's size, even when a hostile file holds no newline at all. `opener`: how to open the file as a
    binary stream (default: as it is; e.g. gzip.open to read a .gz file's lines)."""
    for first_line, block, skipped, _ in counted_line_blocks(path, block_bytes, max_line_bytes, opener):
        yield first_line, block, skipped


def counted_line_blocks(path: Path, block_bytes: int, max_line_bytes: int, opener: Callable[[Path], Any] | None = None
                        ) -> Iterator[tuple[int, bytes, list[LongLine], int]]:
    """iter_line_blocks' blocks with the newlines each holds, counted once here for the line numbers (a caller that
    needs them too, e.g. to check the block, takes them from here: counting is ~20 ms per 64 MB).

    A block's cut last line is read again with the next block: a plain file seeks back to its start, so each block
    is copied once (cut off the bytes read); a stream from `opener` (decompressing: it cannot seek back cheaply)
    keeps the line's start and puts it before the next read."""
    line_no, carry = 1, b""
    with (opener or _open_binary)(path) as raw:
        f = _PushbackReader(raw)
        seeks = opener is None
        while chunk := f.read(block_bytes):
            data = carry + chunk if carry else chunk  # carry: the start of one line, the only thing held over
            carry = b""
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > max_line_bytes:  # no line end in sight: skip the line, keep memory bounded
                    yield line_no, b"", [_skip_long_line(f, data, line_no)], 0
                    line_no += 1
                else:
                    carry = data
                continue
            if cut < len(data) - 1:
                if seeks:
                    f.step_back(len(data) - cut - 1)
                else:
                    carry = data[cut + 1:]
                data = data[: cut + 1]
            lines = data.count(b"\n")
            yield line_no, data, [], lines
            line_no += lines
    if carry:
        yield line_no, carry, [], 0


# pyarrow's CSV block size for a block of lines: parsed in 2 MiB pieces its working set stays in the CPU's caches;
# one piece the size of a 64 MiB block of click-log rows took 2.2x the CPU (0.43-0.56 against 0.18-0.21 s, issue #27
# round 6).
PARSE_CHUNK_BYTES = 2 << 20


def read_csv_block(data: bytes, column_names: list[str], parse_options: Any, convert_options: Any) -> Any:
    """The lines of `data` as a pyarrow Table whose columns are one chunk each, parsed in this thread in
    PARSE_CHUNK_BYTES pieces; a block holding a line longer than a piece (pyarrow cannot split it: "straddling
    object") is parsed as one piece. Raises pyarrow.ArrowInvalid as read_csv does (e.g. a line's field count)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    def read(block_size: int):
        return pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(column_names=column_names, block_size=block_size, use_threads=False),
            parse_options=parse_options, convert_options=convert_options)

    if len(data) > PARSE_CHUNK_BYTES:
        try:
            return read(PARSE_CHUNK_BYTES).combine_chunks()
        except pa.ArrowInvalid as error:
            if "straddl" not in str(error):
                raise
    return read(max(len(data), 1 << 20))


def _open_binary(path: Path):
    return open(path, "rb")


class _PushbackReader:
    """read(n) over a binary stream, serving bytes handed back first: skipping a long line reads past its end and
    hands the rest back, instead of seeking (a decompressing stream cannot seek back cheaply)."""

    def __init__(self, stream) -> None:
        self.stream, self.pending = stream, b""

    def read(self, n: int) -> bytes:
        if not self.pending:
            return self.stream.read(n)
        head, self.pending = self.pending[:n], self.pending[n:]
        return head + (self.stream.read(n - len(head)) if len(head) < n else b"")

    def unread(self, data: bytes) -> None:
        self.pending = data + self.pending

    def step_back(self, n: int) -> None:
        """Read the last n bytes that read() returned again (a seekable stream: seeks, dropping what was handed
        back, which lies after them)."""
        self.stream.seek(-(n + len(self.pending)), io.SEEK_CUR)
        self.pending = b""


def _skip_long_line(f: _PushbackReader, head: bytes, line_no: int) -> LongLine:
    length = len(head)
    while chunk := f.read(1 << 20):
        end = chunk.find(b"\n")
        if end >= 0:
            length += end
            f.unread(chunk[end + 1:])
            break
        length += len(chunk)
    return LongLine(line_no, length, head[:200])


def line_bounds(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, at the newline) offsets of every line of a block held as uint8."""
    ends = np.flatnonzero(arr == _NEWLINE)
    if len(arr) and (len(ends) == 0 or ends[-1] != len(arr) - 1):
        ends = np.append(ends, len(arr))  # last line without a trailing newline
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    return starts, ends


def keep_lines(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, keep: np.ndarray) -> bytes:
    """The block with only the kept lines (each with its newline), built with one vectorised mask."""
    delta = np.zeros(len(arr) + 1, dtype=np.int32)
    drop = np.flatnonzero(~keep)
    np.add.at(delta, starts[drop], 1)
    np.add.at(delta, np.minimum(ends[drop] + 1, len(arr)), -1)
    return arr[np.cumsum(delta[:-1]) == 0].tobytes()


def whole_line_problems(block: bytes, arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, first_line: int,
                        quote: Callable[[bytes], str] | None = None) -> list[BadField]:
    """Empty lines, and lines holding a control character (tab, lone CR, NUL, ...), which no row of a text format
    that uses none has. `arr`, `starts`, `ends`: the block as bytes and its line_bounds; `quote`: how the error line
    shows the character (default quoted_value)."""
    quote = quote or quoted_value
    bad = [BadField(first_line + int(i), 0, None, 1, "empty line", "empty line", "")
           for i in np.flatnonzero(ends == starts)]
    control = np.flatnonzero(((arr < 32) & (arr != _NEWLINE)) | (arr == 127))
    if len(control):
        lines, first = np.unique(np.searchsorted(ends, control), return_index=True)
        for line, pos in zip(lines, control[first]):
            byte = int(pos - starts[line]) + 1
            bad.append(BadField(first_line + int(line), 0, None, byte,
                                f"control character {quote(block[pos:pos + 1])} at byte {byte}",
                                "control character", display_text(block[starts[line]:ends[line]])))
    return bad


def mark_failures(checks: list[tuple[np.ndarray, str]], column: int, rules: list[str], failed_column: np.ndarray,
                  failed_rule: np.ndarray) -> None:
    """Mark the rows failing a column's `checks` ([(failing mask, rule)], in the column's order: the first rule a row
    fails wins) with the column (1-based) and the rule (its 1-based place in `rules`, where it is appended)."""
    for failing, rule in reversed(checks):  # reversed: the first rule of a column is written last, so it wins
        hit = np.flatnonzero(failing)
        if len(hit):
            rules.append(rule)
            failed_column[hit], failed_rule[hit] = column, len(rules)


def first_lines(block: bytes, first_line: int, wanted: int) -> list[tuple[int, bytes]]:
    """(line number, line) of up to the block's first `wanted` lines, empty ones left out: the lines of a file a
    validation hands GX as evidence, taken block by block until it has enough."""
    if wanted <= 0:
        return []
    lines = block.split(b"\n", wanted)[:wanted]
    return [(first_line + i, line) for i, line in enumerate(lines) if line]


def write_good_rows(writer: Any, good: Any) -> int:
    """Append a block's typed good rows (a pyarrow Table, or None) to the validated parquet `writer`; how many."""
    if good is None or good.num_rows == 0:
        return 0
    writer.write_table(good)
    return good.num_rows


def display_text(raw: bytes, limit: int = 500) -> str:
    """A raw line for humans (quarantine, reports): decoded, invalid bytes escaped, truncated."""
    return raw[:limit].decode("utf-8", errors="backslashreplace") + ("…" if len(raw) > limit else "")


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if char in "'\\":
        return "\\" + char
    if char.isprintable():
        return char
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def quoted_value(raw: bytes, limit: int = QUOTED_CHARS) -> str:
    """A field's value as an error line shows it: in quotes, at most `limit` characters, invalid UTF-8 as \\xNN and
    every non-printable character escaped (control and format characters: terminal escapes, line and paragraph
    separators, bidi overrides), quote and backslash escaped, and the byte size after a longer value. A hostile
    file can neither flood nor forge the task log; the quarantine keeps the row itself."""
    text = raw[: limit * 4].decode("utf-8", errors="surrogateescape")  # 4 bytes per character at most
    shown, used = [], 0
    for char in text:
        token = _escaped(char)
        if used + len(token) > limit:
            break
        shown.append(token)
        used += len(token)
    else:
        if len(raw) <= limit * 4:  # every byte shown
            return f"'{''.join(shown)}'"
    return f"'{''.join(shown)}'… ({len(raw)} bytes)"


def split_header(block: bytes, file_name: str, expected: str) -> tuple[bytes, str | None]:
    """A file's first block without its header line (CRLF or LF), and the one-line problem when the header is not
    `expected` (None when it is). A UTF-8 byte-order mark before the header is not part of it (a spreadsheet's "CSV
    UTF-8" export writes one; pandas drops it too): what follows validation reads the validated output, never the
    raw file."""
    end = block.find(b"\n")
    line = (block if end < 0 else block[:end]).rstrip(b"\r").removeprefix(UTF8_BOM)
    if line != expected.encode():
        return b"", f"{file_name} line 1: header {quoted_value(line, 120)} is not the expected '{expected}'"
    return (b"" if end < 0 else block[end + 1:]), None


# ---- quarantine, budget, report -----------------------------------------------------------------------------------


class Quarantine:
    """Bad rows of one or more files: written to quarantine.jsonl (up to `limit`), counted by kind, the first kept
    for the error line, a bounded sample kept as GX evidence. One object per validation output."""

    def __init__(self, path: Path, *, limit: int = QUARANTINE_LIMIT, evidence_rows: int = EVIDENCE_BAD_ROWS) -> None:
        self.path, self.limit, self.evidence_rows = path, limit, evidence_rows
        self._file = open(path, "w")  # noqa: SIM115 - closed by close(), the caller's context
        self.count = 0
        self.reasons: dict[str, Counter[str]] = {}       # per file name: bad rows by kind
        self.first: dict[str, BadRowLike] = {}           # per file name
        self.evidence: dict[str, list[tuple[int, bytes]]] = {}

    def record(self, file_name: str, bad: BadRowLike, fields: dict[str, Any] | None = None) -> None:
        """Quarantine one bad row of `file_name`; `fields` are written into its JSON line as well."""
        self.first.setdefault(file_name, bad)
        self.reasons.setdefault(file_name, Counter())[bad.kind] += 1
        if self.count < self.limit:
            row = asdict(bad) if is_dataclass(bad) else {"line": bad.line, "text": bad.text}
            self._file.write(json.dumps({"file": file_name, **row, **(fields or {})}) + "\n")
        sample = self.evidence.setdefault(file_name, [])
        if len(sample) < self.evidence_rows:
            sample.append((bad.line, bad.text.encode("utf-8", errors="replace")))
        self.count += 1

    def bad_in(self, file_name: str) -> int:
        return sum(self.reasons.get(file_name, Counter()).values())

    def reasons_in(self, file_name: str) -> dict[str, int]:
        """Bad rows of one file by kind, the commonest first."""
        return dict(self.reasons.get(file_name, Counter()).most_common())

    def close(self) -> None:
        self._file.close()


def bad_fraction(bad: int, total: int) -> float:
    """The share of bad rows; an empty file counts as wholly bad (nothing to learn from is a failure)."""
    return bad / total if total else 1.0


def budget_failure(first_bad: str | None, bad: int, total: int, budget: float, out: Path) -> str | None:
    """The one-line error of a file over the bad-row budget (None within it):
    `<file> line 3 column x: <reason> (7 bad rows of 100, 7% > budget 0.1%); quarantine and GX report in <out>`."""
    fraction = bad_fraction(bad, total)
    if total and fraction <= budget:
        return None
    return (f"{first_bad} ({bad} bad rows of {total}, {100 * fraction:.3g}% > budget {100 * budget:g}%); "
            f"quarantine and GX report in {out}")


def gx_section(result: dict[str, Any] | None, scope: str) -> dict[str, Any]:
    """The report's "gx" entry: what GX looked at, its verdict and statistics, and the whole result."""
    return {"scope": scope, "success": result.get("success") if result else None,
            "statistics": result.get("statistics") if result else None, "result": result}


# ---- keys spilled to disk, by hash bucket -------------------------------------------------------------------------


class BucketSpill:
    """int64 rows of `width` columns spilled to hash-bucket files on disk by their first column (the key), so that
    all rows of one key meet in one bucket: a whole-file check (distinct keys, keys of one file present in another)
    then reads one bucket at a time. Memory: the pending rows (< flush_bytes) or one bucket (~ rows / buckets).
    Spills of equal `buckets` put a key in the same bucket, so two files' buckets can be compared pairwise."""

    def __init__(self, directory: Path, name: str, buckets: int, width: int, flush_bytes: int = 16 << 20) -> None:
        self.directory, self.name = Path(directory), name
        self.buckets, self.width, self.flush_bytes = max(1, buckets), width, flush_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._pending: list[list[np.ndarray]] = [[] for _ in range(self.buckets)]
        self._pending_bytes = 0
        self.rows = 0

    def bucket_of(self, keys: np.ndarray) -> np.ndarray:
        mixed = np.asarray(keys, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return ((mixed >> np.uint64(33)) % np.uint64(self.buckets)).astype(np.int64)

    def add(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.int64).reshape(-1, self.width)
        self.rows += len(rows)
        if self.buckets == 1:
            self._pending[0].append(rows)
        else:
            bucket = self.bucket_of(rows[:, 0])
            order = np.argsort(bucket, kind="stable")
            bounds = np.searchsorted(bucket[order], np.arange(self.buckets + 1))
            for b in range(self.buckets):
                if bounds[b + 1] > bounds[b]:
                    self._pending[b].append(rows[order[bounds[b]:bounds[b + 1]]])
        self._pending_bytes += rows.nbytes
        if self._pending_bytes >= self.flush_bytes:
            self._flush()

    def _file(self, b: int) -> Path:
        return self.directory / f"{self.name}-{b:04d}.bin"

    def _flush(self) -> None:
        for b, parts in enumerate(self._pending):
            if parts:
                with open(self._file(b), "ab") as f:
                    for part in parts:
                        f.write(part.tobytes())
        self._pending = [[] for _ in range(self.buckets)]
        self._pending_bytes = 0

    def bucket(self, b: int) -> np.ndarray:
        """Every row of bucket b, spilled and pending, in the order added ([n, width] int64)."""
        parts = list(self._pending[b])
        spilled = self._file(b)
        if spilled.is_file():
            parts.insert(0, np.fromfile(spilled, dtype=np.int64).reshape(-1, self.width))
        return np.concatenate(parts) if parts else np.empty((0, self.width), np.int64)


class DistinctPairs:
    """Counts distinct (a, b) pairs of a stream in bounded memory: a BucketSpill keyed by a, each bucket
    deduplicated on its own at the end (memory: one bucket, ~ the stream's pairs / buckets)."""

    def __init__(self, directory: Path, buckets: int, flush_bytes: int = 16 << 20) -> None:
        self._spill = BucketSpill(directory, "pairs", buckets, 2, flush_bytes)

    @property
    def rows(self) -> int:
        return self._spill.rows

    def add(self, first: np.ndarray, second: np.ndarray) -> None:
        self._spill.add(np.stack([np.asarray(first, np.int64), np.asarray(second, np.int64)], axis=1))

    def distinct(self) -> int:
        """Distinct pairs seen; reads each bucket back once."""
        total = 0
        for b in range(self._spill.buckets):
            pairs = self._spill.bucket(b)
            if not len(pairs):
                continue
            if pairs.min() >= 0 and pairs.max() < 2**31:
                total += len(np.unique((pairs[:, 0] << 32) | pairs[:, 1]))  # one int64 key: fast path
            else:
                total += len(np.unique(pairs, axis=0))
        return total


# ---- Great Expectations on an evidence frame ----------------------------------------------------------------------


_gx_run_lock = threading.Lock()
_gx_worker_lock = threading.Lock()
_gx_worker: _GxWorker | None = None
_gx_import_started = False


class _GxWorker:
    """A child process (`python -m tasks.core.gx_worker`) that imports Great Expectations as soon as it starts and then
    runs run_gx_suites' requests one at a time over its stdin / stdout: the import (~3.5 s of CPU, nearly all Python)
    runs beside this process's row checks on another core instead of holding this process's GIL. (Imported in a
    thread of this process, it slowed a 1M-row day's checks from ~3.9 to ~8.3 s of wall: issue #27.)"""

    def __init__(self) -> None:
        import subprocess

        code_root = str(Path(__file__).resolve().parents[2])  # the worker imports this checkout's tasks package
        path = os.pathsep.join(p for p in (code_root, os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen([sys.executable, "-m", "tasks.core.gx_worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
        self.lock = threading.Lock()
        atexit.register(self.stop)

    def stop(self) -> None:
        """End the child at this process's exit without waiting for it: an interpreter that imported GX takes ~1 s
        to shut down, and the child holds nothing to flush (it writes no files; its tqdm lock is a thread lock), so
        it is terminated once its stdin is closed."""
        import subprocess

        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        with contextlib.suppress(OSError):
            self.process.stdout.close()

    def run(self, frames: dict[str, tuple[Callable[[], Any], Any]], source_name: str) -> dict[str, dict[str, Any]]:
        """The suites' results, run in the child; raises OSError / EOFError / UnpicklingError when it is gone."""
        with self.lock:
            pickle.dump((frames, source_name), self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
            # The pipe is to the child this process started (like multiprocessing's); nothing else can write to it.
            ok, payload = pickle.load(self.process.stdout)  # nosec B301
        if not ok:
            raise RuntimeError(f"Great Expectations failed in its worker process: {payload}")
        return payload


def start_gx_worker() -> None:
    """Have Great Expectations imported off this process's GIL, once per process: in a worker process
    (_GxWorker) that run_gx_suites then uses, started when a validation starts so the import overlaps its row
    checks. Where no child process can be started, it is imported in a daemon thread instead."""
    global _gx_worker, _gx_import_started
    with _gx_worker_lock:
        if _gx_worker is not None or _gx_import_started or "great_expectations" in sys.modules:
            return
        try:
            _gx_worker = _GxWorker()
            return
        except OSError as error:
            log.warning("could not start the Great Expectations worker process (%s): importing it here", error)
        _gx_import_started = True
        logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its import logs hundreds of INFO lines
        threading.Thread(target=importlib.import_module, args=("great_expectations",), name="gx-import",
                         daemon=True).start()


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


_gx_wait = threading.local()


@contextlib.contextmanager
def releasing_while_gx_runs(release: Callable[[], None]) -> Iterator[None]:
    """Within it, this thread calls `release` (once) when it starts waiting for Great Expectations' results: a
    caller that runs N validations at a time (a slot each) lets the next one start its row checks meanwhile, as the
    rows of this one are done (issue #27: days waited 1-2 s on the GX worker's import while the cores had work)."""
    _gx_wait.release = release
    try:
        yield
    finally:
        _gx_wait.release = None


def _gx_wait_begins() -> None:
    release, _gx_wait.release = getattr(_gx_wait, "release", None), None
    if release is not None:
        release()


def run_gx_suites(frames: dict[str, tuple[Callable[[], Any], Any]], source_name: str) -> dict[str, dict[str, Any]]:
    """Validate each evidence frame with its suite ({name: (suite builder, pandas frame)}) in one ephemeral GX
    context (GX builds suites only once a context exists); returns the JSON-able validation result of each. GX's
    pandas engine is far too slow for whole files, so a dataset checks every row with its vectorised checker and
    hands GX a bounded evidence frame, parsed on its own. Runs in the GX worker process when start_gx_worker
    started one (the builders must then pickle: module-level functions or functools.partial of them), else in this
    process. A thread inside releasing_while_gx_runs releases its slot here."""
    global _gx_worker
    _gx_wait_begins()
    worker = _gx_worker
    if worker is not None and not _picklable([builder for builder, _ in frames.values()]):
        log.warning("%s: the GX suite builders do not pickle (a lambda?); running them in this process", source_name)
        worker = None
    if worker is not None:
        try:
            return worker.run(frames, source_name)
        except (OSError, EOFError, pickle.UnpicklingError) as error:  # the worker died: run here from now on
            log.warning("the Great Expectations worker process is gone (%s): running the suites here", error)
            with _gx_worker_lock:
                _gx_worker = None
    return run_gx_suites_here(frames, source_name)


def run_gx_suites_here(frames: dict[str, tuple[Callable[[], Any], Any]], source_name: str) -> dict[str, dict[str, Any]]:
    """run_gx_suites in this process (the GX worker's side, or the fallback)."""
    with _gx_run_lock:  # one run at a time per process: get_context sets GX's process-wide current context
        return _run_gx_suites(frames, source_name)


def _run_gx_suites(frames: dict[str, tuple[Callable[[], Any], Any]], source_name: str) -> dict[str, dict[str, Any]]:
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its import logs hundreds of INFO lines
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_pandas(source_name)
    results = {}
    for name, (build_suite, frame) in frames.items():
        definition = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("whole")
        batch = definition.get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(context.suites.add(build_suite()),
                                result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
        results[name] = result.to_json_dict()
    return results


def summarize_gx(result: dict[str, Any]) -> list[str]:
    """One line per failed expectation: type, column, unexpected count and a few examples."""
    lines = []
    for item in result.get("results", []):
        if item.get("success"):
            continue
        config = item.get("expectation_config", {})
        details = item.get("result", {})
        lines.append(f"{config.get('type')}({config.get('kwargs', {}).get('column', '')}): "
                     f"{details.get('unexpected_count', '?')} unexpected, "
                     f"e.g. {details.get('partial_unexpected_list', [])[:3]}")
    return lines
