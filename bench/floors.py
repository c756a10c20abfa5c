"""The floors: the least work that reading the same bytes can take on this machine.

parse floor   pyarrow.csv.read_csv of a raw Criteo TSV, all 40 columns as binary (what validation hands pyarrow,
              without any check), with pyarrow's threads (all cores) and, for reference, on one thread.
read floor    np.fromfile of every file of a split-binary mapping, one sequential pass (no decoding).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tasks.criteo.schema import RAW_COLUMNS


# pyarrow's CSV block for the parse floor: its fastest here. Blocks of 2-4 MiB parse ~1.7x faster than the 16 MiB
# the floor used until issue #27 round 6 (3 x 1M rows, all cores: 2.21M against 1.28M rows/s, medians of 4 runs
# interleaved), so figures measured before then compare with a floor that was too slow.
PARSE_BLOCK_BYTES = 4 << 20


def parse_seconds(path: Path, threads: bool = True) -> tuple[int, float]:
    """(rows, seconds) of parsing a raw day with pyarrow's CSV reader."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    start = time.perf_counter()
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(RAW_COLUMNS), use_threads=threads,
                                       block_size=PARSE_BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in RAW_COLUMNS}),
    )
    seconds = time.perf_counter() - start
    return table.num_rows, seconds


def mapping_files(mapping_dir: Path) -> list[Path]:
    return sorted(p for p in mapping_dir.iterdir() if p.suffix == ".bin")


def read_seconds(mapping_dir: Path) -> tuple[int, float]:
    """(bytes, seconds) of np.fromfile over every .bin file of a mapping, one after the other."""
    total = 0
    start = time.perf_counter()
    for path in mapping_files(mapping_dir):
        total += np.fromfile(path, dtype=np.uint8).nbytes
    return total, time.perf_counter() - start
