"""Transcode a user's CSV files + FeatureSpec into NVIDIA's split-binary dataset (NVIDIA's transcode.py semantics,
reference/nvidia-formats.md §6), with Spark reading the CSVs.

  spark-submit spark_jobs/byo/transcode.py --spec SOURCE/feature_spec.yaml --output DIR [--expected-bad-rows JSON]
      [--expected-lines JSON]

Semantics:
  * rows: line k of every chunk file of a mapping is row k (NVIDIA zips the files' readers). Each line gets its
    number from the file's byte splits (input_file_block_start + monotonically_increasing_id, made dense from a
    per-split count: one small row per split is collected, never the data), the chunks are joined on it and the
    output is written in line order;
  * lines end at '\n' (a CRLF's '\r' is part of the line end; any other '\r' makes a bad row); a line longer than
    READ_CAP_BYTES is skipped by the reader, never held whole, and --expected-lines (the validation's lines per
    mapping; without it, the job counts each file's lines itself first) turns the gap it leaves into an error
    naming the file;
  * bad rows (tasks/byo/spec.py rules, the same the validation applies, and lines over
    tasks/byo/contract.py's MAX_LINE_BYTES) are dropped from every file of the mapping; --expected-bad-rows (the
    validation's count per mapping) makes a disagreement an error;
  * cardinalities: `auto` = max id + 1 over train and test; a declared cardinality must cover the largest id found,
    else the job fails naming the feature (NVIDIA asserts the same);
  * output: NVIDIA's default spec (features renamed num_i / cat_i.bin / label in channel order, as NVIDIA's
    transcode does; dtypes by the cardinality rule), train/ and test/ with label.bin, numerical.bin, cat_i.bin.
    The output directory is replaced atomically, never appended to (NVIDIA opens its outputs in append mode, so a
    re-run doubles the data), with _MANIFEST.json last.
Memory: Spark writes each mapping as ordered parquet into a temporary folder inside the output; the driver streams
those files in order, batch by batch, into the split-binary writer, and deletes them.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

from spark_jobs.common import LINE_TERMINATORS, configure_logging, log, reuse_level, run_job, spark_session, text_lines
from tasks.byo.contract import (COMPRESSED_SUFFIXES, MAX_LINE_BYTES, TranscodeResult, check_bad_rows, check_lines,
                                count_lines)
from tasks.byo.contract import parse_transcode_args as parse_args
from tasks.byo.spec import (CATEGORICAL_CHANNEL, DELIMITER, FLOAT16_MAX, MAPPINGS, NUMERICAL_CHANNEL,
                            PATTERNS, csv_chunks, load_csv_spec, renamed_features, resolve_cardinalities)
from tasks.core.progress import ProgressLog
from tasks.core.storage import Manifest, atomic_directory, write_manifest

# Hadoop's line reader skips a line longer than this as it reads (never holding more of it): a line over
# MAX_LINE_BYTES up to this is read and dropped as a bad row, as the validation and the arrow engine drop it; a longer
# one cannot be numbered, and --expected-lines turns it into a clear error (tasks.byo.contract.check_lines).
READ_CAP_BYTES = 8 * MAX_LINE_BYTES
LINE = "_line"
OK = "_ok"
PARQUET_TMP = "_parquet"
BATCH_ROWS = 1 << 18
PROGRESS_SECONDS = 30.0


def column_names(spec) -> tuple[str, list[str], list[str]]:
    """Spark column names (feature names may hold dots): label, n0.., c0.. in channel order."""
    return ("label", [f"n{i}" for i in range(len(spec.channel_spec[NUMERICAL_CHANNEL]))],
            [f"c{i}" for i in range(len(spec.channel_spec[CATEGORICAL_CHANNEL]))])


def spark_name(spec, feature: str) -> str:
    for channel, prefix in ((NUMERICAL_CHANNEL, "n"), (CATEGORICAL_CHANNEL, "c")):
        if feature in spec.channel_spec[channel]:
            return f"{prefix}{spec.channel_spec[channel].index(feature)}"
    return "label"


def numbered_lines(spark, path: Path):
    """(the file's lines with LINE = 1-based line number, line count). Dense from the byte splits: one row per
    split (its start, lines, first monotonically_increasing_id) is collected and turned into offsets."""
    from pyspark.sql import functions as F

    lines = (text_lines(spark, str(path), READ_CAP_BYTES).withColumn("_block", F.input_file_block_start())
             .withColumn("_mid", F.monotonically_increasing_id()))
    splits = sorted((int(r["_block"]), int(r["n"]), int(r["first"])) for r in
                    lines.groupBy("_block").agg(F.count("*").alias("n"), F.min("_mid").alias("first")).collect())
    offsets, total = [], 0
    for block, n, first in splits:
        offsets.append((block, first, total))
        total += n
    table = spark.createDataFrame(offsets, schema="_block long, _first long, _offset long")
    numbered = (lines.join(F.broadcast(table), on="_block")
                .withColumn(LINE, F.col("_mid") - F.col("_first") + F.col("_offset") + F.lit(1))
                .drop("_block", "_mid", "_first", "_offset"))
    return numbered, total


def parse_chunk(spark, spec, chunk, path: Path):
    """One chunk file as (LINE, OK_<index>, its typed feature columns); OK is false on a bad row."""
    from pyspark.sql import functions as F

    lines, count = numbered_lines(spark, path)
    # Lines end at '\n' (tasks.byo.contract.stray_returns): a CRLF's '\r' is cut off; any other '\r' (or a
    # terminator Java's `$` would match before) refuses the row, as the validation and the arrow engine refuse it.
    raw = F.col("value")
    value = F.when(raw.endswith("\r"), raw.substr(F.lit(1), F.length(raw) - F.lit(1))).otherwise(raw)
    parts = F.split(value, DELIMITER, -1)
    # A line over MAX_LINE_BYTES (counted before its '\n') is bad however its fields read, as in the other two.
    ok = ((F.size(parts) == F.lit(len(chunk.features))) & (F.octet_length(raw) <= F.lit(MAX_LINE_BYTES))
          & ~value.rlike(LINE_TERMINATORS))
    columns = []
    for index, (feature, channel) in enumerate(zip(chunk.features, chunk.channels)):
        text = F.get(parts, index)  # null past the end (a short line), never an error
        valid = F.coalesce(text.rlike(PATTERNS[channel]), F.lit(False))
        if channel == NUMERICAL_CHANNEL:
            number = text.try_cast("double")
            valid = valid & F.coalesce(F.abs(number) <= F.lit(FLOAT16_MAX), F.lit(False))
            # NVIDIA's rule: torch.tensor(float64).to(torch.float16) rounds twice, double -> float32 -> float16
            # (c10::Half is built from a float); the writer rounds this float32 to float16.
            value = F.when(valid, number.cast("float"))
        elif channel == CATEGORICAL_CHANNEL:
            value = F.when(valid, F.regexp_extract(text, r"^([0-9]+)", 1).try_cast("long"))
        else:
            value = F.when(valid, F.substring(text, 1, 1).try_cast("int"))
        ok = ok & valid
        columns.append(value.alias(spark_name(spec, feature)))
    return lines.select(F.col(LINE), ok.alias(f"{OK}{chunk.index}"), *columns), count


def mapping_frame(spark, spec, source_dir: Path, mapping: str, expected_lines: str | None = None):
    """Every chunk of a mapping joined on the line number, with OK = the row is good in every file.
    `expected_lines`: --expected-lines (the validation's lines per mapping), checked against every file's count."""
    from pyspark.sql import functions as F

    frame, counts = None, {}
    for chunk in csv_chunks(spec, mapping):
        path = source_dir / chunk.file
        if not path.is_file():
            raise FileNotFoundError(f"{chunk.file}: file is missing ({path}); source_spec.{mapping} names it")
        part, counts[chunk.file] = parse_chunk(spark, spec, chunk, path)
        frame = part if frame is None else frame.join(part, on=LINE, how="inner")
    counted_by = "the validation counted"
    if expected_lines is None:
        # Run by hand, without the validation's counts: the files' own, so that a line the reader skipped (which
        # would shift every row after it, in one file or in all alike) is found all the same. One more read of each.
        compressed = any(name.endswith(COMPRESSED_SUFFIXES) for name in counts)
        progress = ProgressLog(f"source_spec.{mapping}: counting lines (--expected-lines not given)", unit="bytes",
                               total=None if compressed else sum((source_dir / n).stat().st_size for n in counts),
                               every_s=PROGRESS_SECONDS, logger=log)
        on_disk = {name: count_lines(source_dir / name, name, progress=progress) for name in counts}
        progress.report(progress.done, force=True)
        if len(set(on_disk.values())) != 1:
            raise ValueError(f"source_spec.{mapping}: the files hold different numbers of lines {on_disk}; line k "
                             "of every file is row k")
        expected_lines, counted_by = json.dumps({mapping: next(iter(on_disk.values()))}), "the file holds"
    check_lines(expected_lines, mapping, counts, skipped_over=READ_CAP_BYTES, counted_by=counted_by)
    if len(set(counts.values())) != 1:  # the counts above held: only if a file changed while it was read
        raise ValueError(f"source_spec.{mapping}: the files have different numbers of lines {counts}; line k of "
                         "every file is row k")
    oks = [F.col(f"{OK}{chunk.index}") for chunk in csv_chunks(spec, mapping)]
    ok = oks[0]
    for other in oks[1:]:
        ok = ok & other
    return frame.withColumn(OK, ok).drop(*[f"{OK}{chunk.index}" for chunk in csv_chunks(spec, mapping)]), \
        next(iter(counts.values()))


def found_ids(frame, categorical: list[str]) -> tuple[int, dict[str, int]]:
    """(bad rows, {spark column: max id + 1 over good rows}): one aggregate row collected."""
    from pyspark.sql import functions as F

    aggregates = [F.sum(F.when(~F.col(OK), 1).otherwise(0)).alias("_bad")]
    aggregates += [F.max(F.when(F.col(OK), F.col(c))).alias(c) for c in categorical]
    row = frame.agg(*aggregates).collect()[0]
    return int(row["_bad"] or 0), {c: (int(row[c]) + 1 if row[c] is not None else 0) for c in categorical}


def part_files(directory: Path) -> list[Path]:
    """Spark's part files in partition order (part-00000, part-00001, ...; numeric order)."""
    return sorted(directory.glob("part-*.parquet"), key=lambda p: int(p.name.split("-")[1]))


class MappingStream:
    """Spark writes one mapping's good rows as parquet in line order (when iteration starts); yields split-binary
    batches in that order."""

    def __init__(self, name: str, df, parquet_dir: Path, label: str, numerical: list[str],
                 categorical: list[str]) -> None:
        self.name, self.df, self.parquet_dir, self.rows = name, df, parquet_dir, 0
        self.label, self.numerical, self.categorical = label, numerical, categorical

    def __iter__(self) -> Iterator[tuple]:
        import numpy as np
        import pyarrow.parquet as pq
        from pyspark.sql import functions as F

        started = time.monotonic()
        columns = [F.col(self.label).cast("tinyint").alias(self.label), *[F.col(c) for c in self.numerical],
                   *[F.col(c).cast("int").alias(c) for c in self.categorical]]
        self.df.where(F.col(OK)).orderBy(LINE).select(*columns).write.parquet(str(self.parquet_dir))
        files = part_files(self.parquet_dir)
        total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        log.info("%s: %d good rows parsed and ordered by Spark in %.1f s; writing split binary", self.name, total,
                 time.monotonic() - started)
        progress = ProgressLog(f"{self.name}: writing split binary", total=total, every_s=PROGRESS_SECONDS,
                               logger=log)
        names = [self.label, *self.numerical, *self.categorical]
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=names):
                label = batch.column(self.label).to_numpy(zero_copy_only=False)
                numerical = (np.column_stack([batch.column(c).to_numpy(zero_copy_only=False)
                                              for c in self.numerical])
                             if self.numerical else np.zeros((batch.num_rows, 0), np.float32))
                categorical = [batch.column(c).to_numpy(zero_copy_only=False) for c in self.categorical]
                yield label, numerical, categorical
                self.rows += batch.num_rows
                progress.report(self.rows)
        shutil.rmtree(self.parquet_dir)


def main(argv: Sequence[str]) -> TranscodeResult:
    from tasks.formats.split_binary import CHECKED_AT_WRITE, write_dataset

    args = parse_args(argv)
    configure_logging("byo transcode")
    started = time.monotonic()
    spec = load_csv_spec(args.spec)
    source_dir = (args.source_dir or args.spec.parent).resolve()
    spark = spark_session("recflow byo transcode")
    label, numerical, categorical = column_names(spec)
    frames, lines, dropped, found = {}, {}, {}, {c: 0 for c in categorical}
    for mapping in MAPPINGS:
        frame, lines[mapping] = mapping_frame(spark, spec, source_dir, mapping, args.expected_lines)
        # Parsed and joined once: the aggregate below and the write read the same rows (spilled to disk as needed).
        frames[mapping] = frame.persist(reuse_level(spark))
        dropped[mapping], ids = found_ids(frames[mapping], categorical)
        found = {c: max(found[c], ids[c]) for c in categorical}
        if lines[mapping] - dropped[mapping] == 0:
            raise ValueError(f"source_spec.{mapping}: no good row in {lines[mapping]} lines")
    log.info("lines %s, bad rows dropped %s", lines, dropped)
    check_bad_rows(args.expected_bad_rows, dropped)
    names = spec.channel_spec[CATEGORICAL_CHANNEL]
    cardinalities = resolve_cardinalities(spec, {name: found[c] for name, c in zip(names, categorical)})
    log.info("cardinalities: %s", dict(zip(names, cardinalities)))
    with atomic_directory(args.output) as tmp:
        streams = {m: MappingStream(m, frames[m], tmp / PARQUET_TMP / m, label, numerical, categorical)
                   for m in MAPPINGS}
        write_dataset(tmp, streams, cardinalities, len(numerical))
        shutil.rmtree(tmp / PARQUET_TMP, ignore_errors=True)
        for frame in frames.values():
            frame.unpersist()
        rows = {m: stream.rows for m, stream in streams.items()}
        expected_rows = {m: lines[m] - dropped[m] for m in MAPPINGS}
        if rows != expected_rows:
            raise RuntimeError(f"wrote {rows} rows but the CSVs hold {expected_rows} good rows")
        manifest = Manifest(kind="byo_transcode", inputs=json.loads(args.inputs_json), rows=rows,
                            extra={"cardinalities": cardinalities, "dropped": dropped, "lines": lines,
                                   "features": renamed_features(spec), CHECKED_AT_WRITE: list(cardinalities)})
        write_manifest(tmp, manifest, checksum=False)  # sizes only: docs/ARCHITECTURE.md "Manifests"
    seconds = time.monotonic() - started
    total = sum(lines.values())
    log.info("dataset %s: %s rows in %.1f s (%.0f CSV rows/s)", args.output, rows, seconds, total / max(seconds, 1e-9))
    return TranscodeResult(str(args.output), rows, dropped, cardinalities, seconds, renamed_features(spec))


if __name__ == "__main__":
    result = run_job(main, sys.argv[1:])
    print(json.dumps(asdict(result)))
