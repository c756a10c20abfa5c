"""BYO transcode: NVIDIA's numerical rounding (float64 -> float32 -> float16) and the arrow engine
(tasks/byo/transcode_arrow.py) writing the Spark job's bytes.

Parity fixtures plant numerical values where rounding once and rounding twice give different float16s (just above
or below a float16 midpoint, landing on it in float32, where ties-to-even decides); the expected numerical.bin is
computed by the rule, so a transcode that rounds once fails. The engine tests run the validation, the Spark job
(session local[2] Spark) and the arrow engine on the same specs and compare every output file byte for byte: NVIDIA's
small_csv layout with `auto` cardinalities and a bad row, a many-file spec with odd feature names, and mixed chunks
(ids, numbers and the label in one file, gen_csv's "4.0" ids, exponents, bad rows of every rule, a valid row one
byte over the line cap) with gzip files.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.byo import transcode_arrow
from tasks.byo.contract import MAX_LINE_BYTES, count_lines, stray_returns
from tasks.byo.spec import csv_chunks, load_csv_spec
from tasks.byo.synthetic import write_csvs
from tasks.byo.transcode_arrow import LineReader, _exact_parse, _fast_parse
from tasks.byo.validation import validate_csvs
from tasks.core.storage import read_manifest
from tasks.formats.feature_spec import FeatureSpec
from tasks.formats.split_binary import CHECKED_AT_WRITE, checked_at_write
from tasks.core.validation import line_bounds
from tests.test_byo import small_csv_spec

ROWS = {"train": 1500, "test": 700}
STEP = 256  # the arrow engine's lines per step in these tests: several steps, a short last one


def planted_values(n: int, seed: int) -> np.ndarray:
    """float64 values where double rounding (via float32) and single rounding to float16 disagree: each lies a
    quarter float32 ulp off a float16 midpoint, on the side ties-to-even does not pick. Includes the issue's
    0.8801269672224602 (small_csv train row 4112, column 2, of NVIDIA's run)."""
    rng = np.random.default_rng(seed)
    halves = rng.uniform(-60000, 60000, size=4 * n).astype(np.float16)
    halves = halves[np.isfinite(halves) & (np.abs(halves) < 65000)]
    up = np.nextafter(halves, np.float16(np.inf) * np.sign(halves + np.float16(0.5)))
    mid = (halves.astype(np.float64) + up.astype(np.float64)) / 2  # exact in float32 too
    ulp32 = np.spacing(np.abs(mid).astype(np.float32)).astype(np.float64)
    # ties-to-even at `mid` picks the even neighbour; step away from it so single rounding picks the odd one
    even = np.where((halves.view(np.uint16) & 1) == 0, halves, up).astype(np.float64)
    values = mid + np.sign(mid - even) * ulp32 / 4
    values = np.concatenate(([0.8801269672224602], values))
    differs = values.astype(np.float16) != values.astype(np.float32).astype(np.float16)
    return values[differs][:n]


def expected_float16(values: np.ndarray) -> np.ndarray:
    """NVIDIA's rule: torch.tensor(float64).to(torch.float16) goes through float32."""
    return values.astype(np.float32).astype(np.float16)


def _copy_tree(source: Path, target: Path) -> None:
    for path in source.rglob("*"):
        if path.is_file():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).write_bytes(path.read_bytes())


def _plant_numericals(folder: Path, spec, mapping: str, seed: int) -> np.ndarray:
    """Overwrite the mapping's numerical-only chunk with planted values (repr: exact float64); returns them."""
    chunk = next(c for c in csv_chunks(spec, mapping) if c.channels == ("numerical",) * len(c.features))
    lines = (folder / chunk.file).read_text().splitlines()
    values = planted_values(len(lines) * len(chunk.features), seed).reshape(len(lines), len(chunk.features))
    (folder / chunk.file).write_text("".join(",".join(repr(float(v)) for v in row) + "\n" for row in values))
    return values


def _many_files_spec(folder: Path) -> Path:
    """different_feature_names' shape: one chunk per categorical, odd names (dots, digits first), CSV chunks, every
    cardinality declared (the other specs have `auto` ones: the arrow engine spills those)."""
    numerical = ["gadsfgsdfg", "5yrthf", "45ryhtf.x", "u5j6yrhtfd"]
    categorical = ["65ytfg.bin", "dgtwrg.bin", "hmfgd.bin", "6tyjgh.bin", "67yu.bin", "l6rtd.bin"]
    cards = [100000, 1000, 7, 128, 5000, 32768]  # all declared: the arrow engine's one-pass path
    spec = {"channel_spec": {"categorical": categorical, "numerical": numerical, "label": ["qwer"]},
            "feature_spec": {**{n: {} for n in numerical}, "qwer": {},
                             **{c: {"cardinality": k} for c, k in zip(categorical, cards)}},
            "metadata": {}, "source_spec": {}}
    for mapping in ("train", "test"):
        chunks = [{"type": "csv", "features": numerical, "files": [f"{mapping}/numerical.csv"]},
                  {"type": "csv", "features": ["qwer"], "files": [f"{mapping}/label.csv"]}]
        chunks += [{"type": "csv", "features": [c], "files": [f"{mapping}/{c}.csv"]} for c in categorical]
        spec["source_spec"][mapping] = chunks
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "feature_spec.yaml").write_text(yaml.dump(spec))
    return folder / "feature_spec.yaml"


MIXED_BAD = {  # train line -> (chunk's column, value): every row rule, plus values the typed parser would accept
    3: (0, "nan"), 5: (0, "1e0001"), 8: (1, "-0"), 13: (1, "1234567890123456789"), 21: (2, "01"),
    34: (0, "65505"), 55: (0, ""), 89: (3, "4.5"), 144: (0, "+-1"), 233: (0, "."), 377: (1, "+3"),
    700: (1, "4\r2"),  # a carriage return inside a line: pyarrow's CSV parser and Hadoop's default reader split there
    702: (3, "\udcff7"),  # byte 0xff (written with surrogateescape): invalid UTF-8, which stops pyarrow's CSV parser
    703: (1, "\u0663"),  # ARABIC-INDIC DIGIT THREE: valid UTF-8, a digit to Python's \d, not to [0-9]
}
MIXED_GOOD = {4: (0, "+1.5e+3"), 6: (0, "-0"), 9: (1, "007"), 10: (2, "1.0"), 12: (0, "65504"), 14: (0, "1.e2"),
              15: (1, "12.000"), 16: (0, "-.5"), 17: (0, "5."), 18: (0, "6.1E-005")}
# train line -> its length in bytes: a valid row padded to the line cap (good) and one byte past it (bad, in the
# validation and both engines, though every field matches its rule: no reader holds such a line).
MIXED_LONG = {610: MAX_LINE_BYTES + 1, 987: MAX_LINE_BYTES}
# train/part1.csv has CRLF line ends (its last line a lone '\r', no '\n'); this line of it one '\r' more (bad).
MIXED_EXTRA_CR = 800


def _mixed_spec(folder: Path) -> Path:
    """Chunks mixing channels (NVIDIA's gen_csv then writes ids as "4.0"); the test mapping gzip-compressed."""
    spec = {"channel_spec": {"categorical": ["a", "b", "c"], "numerical": ["x", "y"], "label": ["l"]},
            "feature_spec": {"a": {"cardinality": "auto"}, "b": {"cardinality": 1000}, "c": {"cardinality": "auto"},
                             "x": {}, "y": {}, "l": {}},
            "metadata": {}, "source_spec": {}}
    for mapping, suffix in (("train", ".csv"), ("test", ".csv.gz")):
        spec["source_spec"][mapping] = [
            {"type": "csv", "features": ["x", "a", "l", "c"], "files": [f"{mapping}/part0{suffix}"]},
            {"type": "csv", "features": ["b", "y"], "files": [f"{mapping}/part1{suffix}"]}]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "feature_spec.yaml").write_text(yaml.dump(spec))
    return folder / "feature_spec.yaml"


def _write_mixed(folder: Path, rows: dict[str, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for mapping, n in rows.items():
        x, y = planted_values(n, seed), rng.uniform(-1, 1, n)
        a, b, c = rng.integers(0, 50, n), rng.integers(0, 1000, n), rng.integers(0, 70000, n)
        label = rng.integers(0, 2, n)
        part0 = [[repr(float(x[i])), f"{a[i]}.0", str(label[i]), str(c[i])] for i in range(n)]
        part1 = [[str(b[i]), f"{y[i]:.6g}"] for i in range(n)]
        if mapping == "train":
            for line, (column, value) in {**MIXED_BAD, **MIXED_GOOD}.items():
                part0[line - 1][column] = value
            for line, length in MIXED_LONG.items():  # x = 1.000...0, as long as the line needs
                rest = len(",".join(part0[line - 1][1:])) + 1
                part0[line - 1][0] = "1." + "0" * (length - rest - 2)
            part1[40] = ["5"]  # a short line in the other file of the mapping
        text0 = "".join(",".join(r) + "\n" for r in part0)
        text1 = "".join(",".join(r) + "\n" for r in part1).rstrip("\n")  # no newline after the last line
        if mapping == "train":  # Windows line ends, read as '\n' by the validation and both engines
            part1[MIXED_EXTRA_CR - 1][-1] += "\r"
            text1 = "".join(",".join(r) + "\r\n" for r in part1)[:-1]
        # A UTF-8 byte-order mark starts part0 of train (plain) and part1 of test (gzipped): not data, for all three.
        text0, text1 = ("\ufeff" + text0, text1) if mapping == "train" else (text0, "\ufeff" + text1)
        (folder / mapping).mkdir(parents=True, exist_ok=True)
        if mapping == "train":
            (folder / "train" / "part0.csv").write_bytes(text0.encode("utf-8", "surrogateescape"))
            (folder / "train" / "part1.csv").write_text(text1)
        else:
            (folder / "test" / "part0.csv.gz").write_bytes(gzip.compress(text0.encode()))
            (folder / "test" / "part1.csv.gz").write_bytes(gzip.compress(text1.encode()))


def _source(kind: str, folder: Path) -> Path:
    if kind == "small_csv":
        spec_path = small_csv_spec(folder, cat_1__bin="auto", cat_2__bin="auto")
        spec = load_csv_spec(spec_path)
        write_csvs(spec, folder, ROWS, seed=11)
        for mapping in ROWS:
            _plant_numericals(folder, spec, mapping, seed=len(mapping))
        lines = (folder / "train" / "catpart1.bin").read_text().split("\n")
        lines[6] = "3,x7,1"
        (folder / "train" / "catpart1.bin").write_text("\n".join(lines))
        return spec_path
    if kind == "many_files":
        spec_path = _many_files_spec(folder)
        write_csvs(load_csv_spec(spec_path), folder, ROWS, seed=12)
        return spec_path
    spec_path = _mixed_spec(folder)
    _write_mixed(folder, ROWS, seed=13)
    return spec_path


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "_MANIFEST.json"}


@pytest.fixture(scope="module", params=["small_csv", "many_files", "mixed"])
def engines(request, spark, tmp_path_factory):
    """(spec path, validation result, Spark output dir, arrow output dir) for one spec."""
    from spark_jobs.byo.transcode import main as spark_main

    folder = tmp_path_factory.mktemp(f"byo-{request.param}")
    spec_path = _source(request.param, folder / "source")
    validated = validate_csvs(load_csv_spec(spec_path), spec_path.parent, folder / "validated", inputs={},
                              budget=0.02)
    args = ["--spec", str(spec_path), "--expected-bad-rows", json.dumps(validated["bad_rows"]),
            "--expected-lines", json.dumps(validated["rows"])]
    spark_main([*args, "--output", str(folder / "spark")])
    patch = pytest.MonkeyPatch()
    patch.setattr(transcode_arrow, "STEP_ROWS", STEP)
    patch.setattr(transcode_arrow, "WRITE_ROWS", 300)
    patch.setattr(transcode_arrow, "READ_BYTES", 1000)
    try:
        transcode_arrow.main([*args, "--output", str(folder / "arrow")])
    finally:
        patch.undo()
    return request.param, spec_path, validated, folder / "spark", folder / "arrow"


@pytest.mark.spark
def test_arrow_engine_writes_sparks_bytes(engines):
    kind, spec_path, validated, spark_out, arrow_out = engines
    spark_files, arrow_files = _outputs(spark_out), _outputs(arrow_out)
    assert sorted(arrow_files) == sorted(spark_files)
    assert [name for name in spark_files if arrow_files[name] != spark_files[name]] == []
    ours, theirs = read_manifest(arrow_out), read_manifest(spark_out)
    assert ours["extra"]["engine"] == "arrow"
    for key in ("cardinalities", "dropped", "lines", "features", CHECKED_AT_WRITE):
        assert ours["extra"][key] == theirs["extra"][key], key
    # both wrote through write_dataset, which checked every value against the cardinalities: not scanned again
    assert ours["extra"][CHECKED_AT_WRITE] == ours["extra"]["cardinalities"]
    assert checked_at_write(ours, FeatureSpec.from_yaml(arrow_out / "feature_spec.yaml"))
    assert ours["rows"] == theirs["rows"]
    assert ours["extra"]["dropped"] == validated["bad_rows"]
    if kind == "mixed":
        # every planted bad row, the short line and the over-long one, nothing else
        assert validated["bad_rows"] == {"train": len(MIXED_BAD) + 1 + 1 + 1, "test": 0}
        quarantined = [json.loads(line) for line in
                       (Path(validated["path"]) / "quarantine.jsonl").read_text().splitlines()]
        returns = [(b["file"], b["line"], b["column"], b["reason"]) for b in quarantined if "carriage" in b["reason"]]
        extra = (spec_path.parent / "train" / "part1.csv").read_bytes().split(b"\n")[MIXED_EXTRA_CR - 1]
        assert extra.endswith(b"\r\r")
        ends = r"holds a carriage return (\r) that does not end the line"
        y = extra.split(b",")[1][:-2].decode()
        assert returns == [("train/part0.csv", 700, 2, rf"value '4\x0d2' {ends}"),
                           ("train/part1.csv", MIXED_EXTRA_CR, 2, rf"value '{y}\x0d' {ends}")]
        outside_ascii = [(b["line"], b["column"], b["reason"]) for b in quarantined if b["line"] in (702, 703)]
        assert outside_ascii == [(702, 4, r"value '\xff7' is not a non-negative integer id"),
                                 (703, 2, "value '\u0663' is not a non-negative integer id")]
        too_long = [(b["file"], b["line"], b["reason"]) for b in quarantined if "bytes is longer" in b["reason"]]
        assert too_long == [("train/part0.csv", 610, f"line of {MAX_LINE_BYTES + 1} bytes is longer than "
                                                      f"{MAX_LINE_BYTES}")]


@pytest.mark.spark
@pytest.mark.parametrize("engines", ["mixed"], indirect=True)  # the spec with a line over the cap (train line 610)
def test_a_line_the_spark_reader_skips_stops_it_naming_the_file_and_a_changed_file_stops_both(engines, monkeypatch,
                                                                                           tmp_path):
    from spark_jobs.byo import transcode as spark_transcode

    _, spec_path, validated, _, _ = engines
    args = ["--spec", str(spec_path), "--expected-bad-rows", json.dumps(validated["bad_rows"])]
    lines = json.dumps(validated["rows"])
    # The reader's cap lowered to the line cap: line 610 (MAX_LINE_BYTES + 1 bytes) is skipped, never read whole.
    monkeypatch.setattr(spark_transcode, "READ_CAP_BYTES", MAX_LINE_BYTES)
    with pytest.raises(ValueError, match=rf"^train/part0.csv: 1 line\(s\) longer than {MAX_LINE_BYTES} bytes skipped "
                                         r"by the reader \(the validation counted 1500 lines, the reader read 1499\);"):
        spark_transcode.main([*args, "--expected-lines", lines, "--output", str(tmp_path / "spark")])
    # Run by hand without the validation's counts, the job counts the files' lines itself and stops the same way.
    with pytest.raises(ValueError, match=rf"^train/part0.csv: 1 line\(s\) longer than {MAX_LINE_BYTES} bytes skipped "
                                         r"by the reader \(the file holds 1500 lines, the reader read 1499\);"):
        spark_transcode.main([*args, "--output", str(tmp_path / "spark")])
    assert not (tmp_path / "spark").exists()
    changed = json.dumps({**validated["rows"], "test": validated["rows"]["test"] + 1})
    with pytest.raises(RuntimeError, match=r"source_spec.test: 700 lines read, but the validation counted 701: the "
                                           "file changed after it was validated"):
        transcode_arrow.main([*args, "--expected-lines", changed, "--output", str(tmp_path / "arrow")])
    assert not (tmp_path / "arrow").exists()


@pytest.mark.spark
@pytest.mark.parametrize("engines", ["small_csv"], indirect=True)  # the spec whose numericals are planted
def test_both_engines_round_numericals_twice_as_nvidia_does(engines):
    _, spec_path, _, spark_out, arrow_out = engines
    for mapping in ROWS:
        planted = np.array([[float(v) for v in line.split(",")] for line in
                            (spec_path.parent / mapping / "numerical.bin").read_text().splitlines()])
        keep = np.ones(len(planted), bool)
        if mapping == "train":
            keep[6] = False  # the bad row
        expected = expected_float16(planted[keep])
        assert (expected != planted[keep].astype(np.float16)).all()  # every value tells the two roundings apart
        for out in (spark_out, arrow_out):
            assert (out / mapping / "numerical.bin").read_bytes() == expected.tobytes(), out.name


def test_planted_values_include_the_issues_example_and_differ_under_single_rounding():
    values = planted_values(500, seed=1)
    assert values[0] == 0.8801269672224602 and len(values) == 500
    assert np.float16(values[0]) == np.float16(0.88037) and expected_float16(values[:1])[0] == np.float16(0.87988)
    assert (values.astype(np.float16) != expected_float16(values)).all()


def test_arrow_engine_alone_writes_the_double_rounded_bytes(tmp_path):
    spec_path = _source("small_csv", tmp_path / "source")
    transcode_arrow.main(["--spec", str(spec_path), "--output", str(tmp_path / "out")])
    planted = np.array([[float(v) for v in line.split(",")] for line in
                        (spec_path.parent / "test" / "numerical.bin").read_text().splitlines()])
    assert (tmp_path / "out" / "test" / "numerical.bin").read_bytes() == expected_float16(planted).tobytes()


@pytest.mark.parametrize("block, stray", [
    (b"1,2\n3,4\n", [-1, -1]),
    (b"1,2\r\n3,4\r\n", [-1, -1]),       # CRLF line ends
    (b"1,2\r\n3,4\r", [-1, -1]),         # a file's last line, its '\r' without '\n'
    (b"\r\n1\r2\n", [-1, 3]),              # an empty CRLF line; a '\r' inside a line
    (b"1,2\r\r\n\r3\n", [3, 6]),          # one '\r' before a CRLF; a line starting with '\r'
])
def test_stray_returns_are_those_that_do_not_end_a_line(block, stray):
    assert stray_returns(block, line_bounds(np.frombuffer(block, np.uint8))[1]).tolist() == stray


EDGE_VALUES = ["0", "7", "007", "-0", "+3", "-3", "1.0", "1.", ".5", "-.5", "+.5", "1e5", "1E-5", "1e+05", "1e0001",
               "1e", "e5", "-", "+", ".", "+-1", "1-2", "1.2.3", "", "nan", "inf", "65504", "65505", "-65504.0001",
               "1234567890123456789", "123456789012345678", "01", "00", "1.5", "4.0", " 1", "1 ", "0x10"]


@pytest.mark.parametrize("channels", [("numerical",), ("categorical",), ("label",), ("numerical", "categorical")])
def test_fast_parse_decides_exactly_as_the_row_rules(channels):
    from tasks.byo.spec import CsvChunk

    features = tuple(f"f{i}" for i in range(len(channels)))
    chunk = CsvChunk("train", 0, "x.csv", features, channels)
    decided = 0
    for value in EDGE_VALUES:
        block = (",".join([value] * len(channels)) + "\n").encode()
        exact = _exact_parse(chunk, block, 1)
        fast = _fast_parse(chunk, block, 1)
        if fast is None:
            continue  # the exact path decides
        decided += 1
        assert fast.ok.tolist() == exact.ok.tolist(), (channels, value)
        if exact.ok[0]:
            for name in features:
                assert fast.values[name][0] == exact.values[name][0], (channels, value)
    assert decided >= 4  # the fast path took part (it declines whatever its bytes cannot prove)


@pytest.mark.parametrize("channels, block", [
    (("label",), b"1\n0\n\n1\n10\n"),  # an empty line, then "10": as many bytes as five one-digit lines
    (("label",), b"1\n,\n0\n"),
    (("categorical",), b"1,2\n0,\n3\n,\n"),  # one id a line declared: a line of two fields is bad, not "12"
])
def test_fast_parse_decides_each_line_of_a_block_as_the_row_rules(channels, block):
    """Blocks whose shape only a multi-line view shows (the single-line cases above cannot)."""
    from tasks.byo.spec import CsvChunk

    chunk = CsvChunk("train", 0, "x.csv", ("f0",), channels)
    count = block.count(b"\n")
    exact, fast = _exact_parse(chunk, block, count), _fast_parse(chunk, block, count)
    if fast is not None:
        assert fast.ok.tolist() == exact.ok.tolist()
        assert (fast.values["f0"][exact.ok] == exact.values["f0"][exact.ok]).all()
    assert not exact.ok.all()


def test_line_reader_takes_whole_lines_and_skips_an_overlong_one(tmp_path, monkeypatch):
    monkeypatch.setattr(transcode_arrow, "READ_BYTES", 300)  # the long line spans reads: memory stays bounded
    path = tmp_path / "x.csv.gz"
    lines = [b"1,2", b"3," + b"4" * 5000, b"5,6", b"7,8"]
    path.write_bytes(gzip.compress(b"\n".join(lines)))  # no newline after the last line
    reader = LineReader(path, max_line_bytes=1000)
    taken = [reader.take(2), reader.take(2), reader.take(2)]
    reader.close()
    assert taken == [(b"1,2\n\x00\n", 2), (b"5,6\n7,8\n", 2), (b"", 0)]


@pytest.mark.parametrize("read_bytes", [7, 64, 250, 1000])
def test_line_reader_measures_a_line_exactly_wherever_the_reads_cut_it(tmp_path, monkeypatch, read_bytes):
    """A line of max_line_bytes is kept and one byte more is skipped, wherever the reads cut it, and whatever
    READ_BYTES says (a read larger than the cap is cut to it: only a line that spans reads can be over it). The
    validation's rule: both count the same bad lines."""
    monkeypatch.setattr(transcode_arrow, "READ_BYTES", read_bytes)
    cap = 100
    at_cap, over = b"1," + b"2" * (cap - 2), b"3," + b"4" * (cap - 1)
    lines = [b"5,6", at_cap, over, b"7,8", over, at_cap, b"9," * 60 + b"0", at_cap]
    path = tmp_path / "x.csv"
    path.write_bytes(b"\n".join(lines))  # the last line (at the cap) has no newline
    reader = LineReader(path, max_line_bytes=cap)
    taken, count = reader.take(100)
    reader.close()
    expected = [line if len(line) <= cap else b"\x00" for line in lines]
    assert count == len(lines) and taken == b"".join(line + b"\n" for line in expected)


# Bytes a damaged or hand-edited CSV holds: separators, quotes, control and non-ASCII bytes (invalid UTF-8, U+0085,
# U+2028, a byte-order mark), number syntax, a 19-digit run. No newline: a mutation keeps the files' line counts.
DAMAGE = [b"\r", b"\x00", b"\xff", b",", b'"', b" ", b"\t", b"e", b"E", b".", b"-", b"+", b"0", b"9", b"1" * 19,
          b"\xc2\x85", b"\xe2\x80\xa8", b"\xef\xbb\xbf", b"\x7f", b"nan", b"inf", b"1e999", b"\\"]


@pytest.mark.parametrize("seed", [1, 2])
def test_the_validation_and_the_arrow_engine_agree_on_randomly_damaged_lines(seed, tmp_path):
    """240 random insertions, deletions and cuts in the mixed spec's train files: the validation runs to its count
    (no parser error escapes it), and the arrow engine, given that count, drops exactly as many rows (it raises
    when the two disagree). The Spark engine agreed on the same damage when this was written (seeds 1, 4, 12)."""
    import random

    rng = random.Random(seed)
    spec_path = _source("mixed", tmp_path / "source")
    spec_path.write_text(spec_path.read_text().replace("cardinality: 1000", "cardinality: auto"))  # digits grow ids
    for name in ("part0.csv", "part1.csv"):
        path = tmp_path / "source" / "train" / name
        lines = path.read_bytes().split(b"\n")
        for _ in range(120):
            i = rng.randrange(len(lines) - 1)
            line, pos, damage, how = lines[i], rng.randrange(len(lines[i]) + 1), rng.choice(DAMAGE), rng.random()
            lines[i] = (line[:pos] + damage + line[pos:] if how < 0.6 else
                        line[:pos] + line[pos + 1:] if how < 0.8 else line[:pos] + damage)
        path.write_bytes(b"\n".join(lines))
    validated = validate_csvs(load_csv_spec(spec_path), spec_path.parent, tmp_path / "validated", inputs={},
                              budget=0.5)
    assert validated["bad_rows"]["train"] > 100 and validated["rows"] == ROWS
    # The report counts bad rows by rule, never by value: a few keys however varied the damage (a value with a space
    # once made a key of its own, so a file of distinct bad values grew the counter without bound).
    from tasks.byo.spec import FLOAT16_MAX, RULE_TEXT
    from tasks.byo.validation import LONG_LINE_RULE

    rules = [*RULE_TEXT.values(), f"is beyond float16's range (+-{FLOAT16_MAX:g})",
             r"holds a carriage return (\r) that does not end the line"]
    report = json.loads((tmp_path / "validated" / "report.json").read_text())
    for name, features in (("train/part0.csv", "xalc"), ("train/part1.csv", "by")):
        known = {f"{f}: {rule}" for f in features for rule in rules} | {f"fields, expected {len(features)}",
                                                                          LONG_LINE_RULE}
        reasons = report["files"][name]["reasons"]
        assert len(reasons) >= 3 and set(reasons) <= known, reasons
    result = transcode_arrow.main(["--spec", str(spec_path), "--output", str(tmp_path / "arrow"),
                                   "--expected-bad-rows", json.dumps(validated["bad_rows"]),
                                   "--expected-lines", json.dumps(validated["rows"])])
    assert result.dropped == validated["bad_rows"]
    assert result.rows == {m: ROWS[m] - validated["bad_rows"][m] for m in ROWS}


def test_files_of_different_lengths_fail_naming_the_counts(tmp_path):
    spec_path = _source("many_files", tmp_path / "source")
    label = tmp_path / "source" / "test" / "label.csv"
    label.write_text("".join(label.read_text().splitlines(keepends=True)[:-3]))
    with pytest.raises(ValueError, match=r"source_spec\.test: the files have different numbers of lines .*"
                                         r"'test/label.csv': 697"):
        transcode_arrow.main(["--spec", str(spec_path), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["truncated", "not_compressed"])
def test_a_damaged_compressed_file_fails_in_one_line_naming_it(damage, tmp_path):
    """The mixed spec's test mapping is gzipped: part1.csv.gz cut short, or plain text under a .gz name."""
    from tasks.core.validation import DataQualityError

    spec_path = _source("mixed", tmp_path / "source")
    damaged = tmp_path / "source" / "test" / "part1.csv.gz"
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2] if damage == "truncated" else gzip.decompress(data))
    reason = "Truncated compressed stream" if damage == "truncated" else "zlib inflate failed: incorrect header check"
    expected = rf"^test/part1.csv.gz: cannot be decompressed after [0-9,]+ bytes \({reason}\): the file is truncated or"
    with pytest.raises(DataQualityError, match=expected):
        validate_csvs(load_csv_spec(spec_path), spec_path.parent, tmp_path / "validated", inputs={}, budget=0.02)
    assert not (tmp_path / "validated").exists()
    with pytest.raises(DataQualityError, match=expected):
        transcode_arrow.main(["--spec", str(spec_path), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["many_files", "small_csv"])  # one pass, spilled
def test_an_under_declared_cardinality_fails_naming_the_feature_and_writes_nothing(kind, tmp_path):
    from tasks.formats.feature_spec import FeatureSpecError

    spec_path = _source(kind, tmp_path / "source")
    spec = yaml.safe_load(spec_path.read_text())
    name = spec["channel_spec"]["categorical"][3]
    spec["feature_spec"][name]["cardinality"] = 2
    spec_path.write_text(yaml.dump(spec))
    with pytest.raises(FeatureSpecError, match=rf"feature_spec\.{name}: declared cardinality 2 does not cover"):
        transcode_arrow.main(["--spec", str(spec_path), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["source"]


@pytest.mark.parametrize("engine, master, profile, env, chosen", [
    (None, "local[*]", "local", None, "arrow"),
    (None, None, "local", None, "arrow"),
    (None, "spark://10.0.0.5:7077", "local", None, "spark"),
    (None, "local[2]", "gpu", None, "spark"),
    ("spark", "local[*]", "local", None, "spark"),
    ("arrow", "spark://10.0.0.5:7077", "local", None, "arrow"),
    (None, "local[*]", "local", "spark", "spark"),
])
def test_transcode_engine_is_arrow_on_one_machine_and_spark_on_a_cluster(engine, master, profile, env, chosen,
                                                                         monkeypatch, caplog):
    from tasks.byo.pipeline import ENGINE_ENV, transcode_engine

    if env:
        monkeypatch.setenv(ENGINE_ENV, env)
    else:
        monkeypatch.delenv(ENGINE_ENV, raising=False)
    with caplog.at_level("INFO"):
        assert transcode_engine(engine, master, profile) == chosen
    assert f"byo transcode engine: {chosen}" in caplog.text


@pytest.mark.parametrize(("text", "lines"), [(b"", 0), (b"a\n", 1), (b"a", 1), (b"a\nb", 2), (b"\n\n", 2),
                                             (b"\xef\xbb\xbfa\r\nb\r\n\nc", 4)])
@pytest.mark.parametrize("compressed", [False, True])
def test_count_lines_counts_as_the_readers_number_lines(tmp_path, text, lines, compressed):
    """What the Spark engine checks its reader against when run without --expected-lines: every '\\n', and a last
    line without one; read in 2-byte pieces so that a piece ends at and between newlines."""
    path = tmp_path / ("f.csv.gz" if compressed else "f.csv")
    path.write_bytes(gzip.compress(text) if compressed else text)
    assert count_lines(path, path.name, read_bytes=2) == lines
