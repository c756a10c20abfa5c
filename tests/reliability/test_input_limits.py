"""Limits on what an input can make a worker do (issue #24, items 6-11): each case is refused with one line, and nothing
partial is left marked complete.

- downloads and decompression: a gzip / zip bomb stops at RECFLOW_EXPANDED_MAX_BYTES, a source larger than
  RECFLOW_DOWNLOAD_MAX_BYTES is refused, a server that trickles bytes fails by RECFLOW_DOWNLOAD_DEADLINE_S (the
  execution_timeout of every task is checked in tests/test_dag_integrity.py);
- an HTTP redirect to a URL outside the allow-list is refused before it is requested (servers on 127.0.0.1 only);
- a day range like 0-300000000 is refused before it is expanded;
- a resumed download never glues two versions of a source (If-Range), nor a .part from another URL;
- a raw line longer than RECFLOW_MAX_LINE_BYTES is a bad row for validation and never reaches Spark's reader whole;
- a model far larger than the worker's memory is refused before training is launched.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from tasks.core.config import NotAllowed
from tests.http_range_server import start_range_server

pytestmark = pytest.mark.reliability


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _one_line(exc: BaseException, *named: str) -> str:
    message = str(exc)
    assert "\n" not in message, message
    for word in named:
        assert word in message, f"{word!r} not in {message!r}"
    return message


@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[tuple[object, str, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    server, base = start_range_server(root)
    try:
        yield server, base, root
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


# ---- item 6: caps on compressed and expanded bytes, an overall deadline -------------------------------------------


def test_gzip_bomb_is_refused_at_the_expanded_cap_and_leaves_nothing(tmp_path: Path, out: Path, monkeypatch) -> None:
    from tasks.core.download import download

    bomb = tmp_path / "src" / "day_0.gz"
    bomb.parent.mkdir()
    bomb.write_bytes(gzip.compress(bytes(8 << 20), compresslevel=9))  # 8 MiB of zeros in ~8 KB
    assert bomb.stat().st_size < 64 << 10
    monkeypatch.setenv("RECFLOW_EXPANDED_MAX_BYTES", str(1 << 20))
    with pytest.raises(NotAllowed) as caught:
        download(bomb.as_uri(), out / "day_0", allowed_file_roots=[tmp_path])
    _one_line(caught.value, "day_0.gz", str(1 << 20), "RECFLOW_EXPANDED_MAX_BYTES")
    assert sorted(p.name for p in out.iterdir()) == []  # no destination, no sidecar, no temporary, no .part


def test_zip_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from tasks.core.archive import extract_zip

    archive = tmp_path / "ratings.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ml/ratings.csv", bytes(4 << 20))
    folder = tmp_path / "extracted"
    folder.mkdir()
    with pytest.raises(NotAllowed) as caught:
        extract_zip(archive, folder, max_bytes=1 << 20)
    _one_line(caught.value, "ratings.zip", "RECFLOW_EXPANDED_MAX_BYTES")
    assert list(folder.iterdir()) == []


def test_zip_member_lying_about_its_size_is_stopped_at_the_cap(tmp_path: Path) -> None:
    """The declared sizes are only a first check: the bytes actually written are counted too."""
    from tasks.core.archive import ExpansionLimitExceeded, copy_capped

    sink = io.BytesIO()
    with pytest.raises(ExpansionLimitExceeded) as caught:
        copy_capped(io.BytesIO(bytes(3 << 20)), sink, limit=1 << 20, what="x.zip (at member 'a')", chunk_bytes=1 << 16)
    _one_line(caught.value, "x.zip", "RECFLOW_EXPANDED_MAX_BYTES")
    assert len(sink.getvalue()) <= 1 << 20  # never written past the cap


def test_source_over_the_download_cap_is_refused(range_server, out: Path, monkeypatch) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    (root / "day_0").write_bytes(bytes(300_000))
    monkeypatch.setenv("RECFLOW_DOWNLOAD_MAX_BYTES", "100000")
    with pytest.raises(NotAllowed) as caught:
        download(f"{base}/day_0", out / "day_0", allowed_prefixes=[base])
    _one_line(caught.value, f"{base}/day_0", "100000", "RECFLOW_DOWNLOAD_MAX_BYTES")
    assert list(out.iterdir()) == []


class _TrickleServer(ThreadingHTTPServer):
    """Announces `size` bytes and sends one every `every_s` seconds (or none at all when every_s is None)."""

    daemon_threads = True

    def __init__(self, size: int, every_s: float | None) -> None:
        self.size, self.every_s = size, every_s
        self.stop = threading.Event()
        super().__init__(("127.0.0.1", 0), _TrickleHandler)


class _TrickleHandler(BaseHTTPRequestHandler):
    server: _TrickleServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(self.server.size))
        self.send_header("ETag", '"trickle"')
        self.end_headers()
        self.wfile.flush()
        try:
            for _ in range(self.server.size):
                if self.server.stop.wait(self.server.every_s if self.server.every_s is not None else 60):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def trickle(request) -> Iterator[tuple[_TrickleServer, str]]:
    size, every_s = request.param
    server = _TrickleServer(size, every_s)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("trickle", [(40, 0.1), (40, None)], indirect=True, ids=["a-byte-every-0.1s", "stalled"])
def test_slow_server_fails_by_the_deadline_not_between_reads(trickle, out: Path, monkeypatch) -> None:
    """A byte every 0.1 s never trips a read timeout; a stalled one would only after 60 s: the whole download has a
    deadline (1 s here), and the .part stays for the retry to resume."""
    from tasks.core.download import DeadlineExceeded, download

    server, base = trickle
    monkeypatch.setenv("RECFLOW_DOWNLOAD_DEADLINE_S", "1")
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as caught:
        download(f"{base}/day_0", out / "day_0", allowed_prefixes=[base], timeout_s=60)
    seconds = time.monotonic() - started
    _one_line(caught.value, f"{base}/day_0", "deadline of 1 s", "RECFLOW_DOWNLOAD_DEADLINE_S")
    assert seconds < 3.0, f"took {seconds:.1f} s for a 1 s deadline"
    assert not (out / "day_0").exists() and not (out / "day_0.download.json").exists()


# ---- item 7: every redirect hop is checked against the allow-list -------------------------------------------------


@pytest.mark.parametrize("elsewhere", ["path", "port"])
def test_redirect_outside_the_allowed_prefixes_is_refused_before_it_is_followed(range_server, tmp_path: Path,
                                                                                out: Path, elsewhere: str) -> None:
    from tasks.core.download import SourceNotAllowed, download

    server, base, root = range_server
    (root / "private").mkdir()
    (root / "private" / "secret").write_bytes(b"not for this pipeline\n")
    other_root = tmp_path / "other"
    other_root.mkdir()
    (other_root / "secret").write_bytes(b"not for this pipeline\n")
    other, other_base = start_range_server(other_root)
    try:
        target = f"{base}/private/secret" if elsewhere == "path" else f"{other_base}/secret"
        server.redirects["/raw/day_0"] = target
        with pytest.raises(SourceNotAllowed) as caught:
            download(f"{base}/raw/day_0", out / "day_0", allowed_prefixes=[f"{base}/raw"])
        _one_line(caught.value, f"{base}/raw/day_0", "HTTP 302", target, "RECFLOW_SOURCE_ALLOWED_PREFIXES")
        assert server.requests == [("/raw/day_0", None)]  # the disallowed hop was never requested
        assert other.requests == []
        assert list(out.iterdir()) == []
    finally:
        other.shutdown()
        other.server_close()


def test_redirect_inside_the_allowed_prefixes_is_followed(range_server, out: Path) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    (root / "raw").mkdir()
    (root / "raw" / "day_0.v2").write_bytes(b"payload\n")
    server.redirects["/raw/day_0"] = "/raw/day_0.v2"  # a relative Location, resolved against the hop's URL
    result = download(f"{base}/raw/day_0", out / "day_0", allowed_prefixes=[f"{base}/raw"])
    assert (out / "day_0").read_bytes() == b"payload\n" and result.source == f"{base}/raw/day_0"
    assert [path for path, _ in server.requests] == ["/raw/day_0", "/raw/day_0.v2"]


# ---- item 8: day ranges are bounded before they are expanded -------------------------------------------------------


@pytest.mark.parametrize(("text", "named"), [
    ("0-300000000", ["0-300000000", "RECFLOW_MAX_DAY_INDEX"]),
    ("0-3000", ["0-3000", "3001 days", "366", "RECFLOW_MAX_WINDOW_DAYS"]),
    ("0-200,300-500", ["0-200,300-500", "402 days", "RECFLOW_MAX_WINDOW_DAYS"]),
    ("5,20000", ["day 20000", "10000", "RECFLOW_MAX_DAY_INDEX"]),
])
def test_day_ranges_are_bounded_before_they_are_expanded(text: str, named: list[str]) -> None:
    from tasks.criteo.window import parse_days

    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        parse_days(text)
    _one_line(caught.value, *named)
    assert time.monotonic() - started < 0.5


def test_day_range_limits_are_settings(monkeypatch) -> None:
    from tasks.criteo.window import parse_days

    assert parse_days("0-365") == list(range(366))
    monkeypatch.setenv("RECFLOW_MAX_WINDOW_DAYS", "30")
    monkeypatch.setenv("RECFLOW_MAX_DAY_INDEX", "99")
    assert parse_days("70-99") == list(range(70, 100))
    with pytest.raises(ValueError, match="RECFLOW_MAX_WINDOW_DAYS"):
        parse_days("0-30")
    with pytest.raises(ValueError, match="RECFLOW_MAX_DAY_INDEX"):
        parse_days("100")


# ---- item 9: a resume never glues two files ---------------------------------------------------------------------


def _interrupted(server, url: str, destination: Path) -> bytes:
    """Leave a .part as a dropped transfer does; returns its bytes."""
    from tasks.core.download import DownloadError, download

    server.drop_after_bytes = 100_000
    with pytest.raises(DownloadError, match="interrupted"):
        download(url, destination, chunk_bytes=64 << 10, max_resume_attempts=0,
                 allowed_prefixes=[url.rsplit("/", 1)[0]])
    kept = destination.with_name(destination.name + ".part").read_bytes()
    assert 0 < len(kept) <= 100_000
    server.requests.clear()
    return kept


def test_source_changed_since_the_part_is_fetched_whole_not_glued(range_server, out: Path) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    old, new = bytes(range(256)) * 1200, bytes(reversed(range(256))) * 1200  # same size, other bytes
    (root / "day_0").write_bytes(old)
    _interrupted(server, f"{base}/day_0", out / "day_0")
    time.sleep(0.01)
    (root / "day_0").write_bytes(new)  # the upstream publishes a new version at the same URL
    result = download(f"{base}/day_0", out / "day_0", allowed_prefixes=[base], chunk_bytes=64 << 10)
    assert (out / "day_0").read_bytes() == new, "the .part of the old version was glued to the new one's tail"
    assert result.sha256 == _sha(new) and result.resumed_from == 0
    assert len(server.requests) == 1 and server.requests[0][1] is not None  # one ranged request, answered whole


def test_part_from_another_url_is_not_resumed(range_server, out: Path) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    (root / "day_0").write_bytes(bytes(range(256)) * 1200)
    (root / "day_1").write_bytes(bytes(reversed(range(256))) * 1200)
    _interrupted(server, f"{base}/day_0", out / "day")
    result = download(f"{base}/day_1", out / "day", allowed_prefixes=[base])
    assert (out / "day").read_bytes() == (root / "day_1").read_bytes() and result.resumed_from == 0
    assert server.requests == [("/day_1", None)]


def test_source_without_a_version_is_never_resumed(range_server, out: Path) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    server.send_validators = False
    data = bytes(range(256)) * 1200
    (root / "day_0").write_bytes(data)
    _interrupted(server, f"{base}/day_0", out / "day_0")
    result = download(f"{base}/day_0", out / "day_0", allowed_prefixes=[base])
    assert (out / "day_0").read_bytes() == data and result.resumed_from == 0
    assert server.requests == [("/day_0", None)]


def test_unchanged_source_still_resumes_with_if_range(range_server, out: Path) -> None:
    from tasks.core.download import download

    server, base, root = range_server
    data = bytes(range(256)) * 1200
    (root / "day_0").write_bytes(data)
    kept = _interrupted(server, f"{base}/day_0", out / "day_0")
    record = json.loads((out / "day_0.part.json").read_text())
    assert record["source"] == f"{base}/day_0" and record["validator"]
    result = download(f"{base}/day_0", out / "day_0", allowed_prefixes=[base])
    assert result.resumed_from == len(kept) and (out / "day_0").read_bytes() == data
    assert sorted(p.name for p in out.iterdir()) == ["day_0", "day_0.download.json"]


# ---- item 10: over-long lines never reach Spark's text reader whole ----------------------------------------------


def _criteo_row(i: int) -> bytes:
    return b"\t".join([b"1", *[str(i).encode()] * 13, *[b"%08x" % (i * 7 + c) for c in range(26)]])


@pytest.mark.spark
def test_spark_day_reader_skips_lines_over_the_cap_without_holding_them(spark, tmp_path: Path) -> None:
    """Validation counts a line over RECFLOW_MAX_LINE_BYTES as a bad row; within the bad-row budget the day still
    goes to Spark, whose line reader must skip it as it reads (a 2 GB "line" would be one Java string: an OOM)."""
    from pyspark.sql import functions as F

    from spark_jobs.criteo.day_stats import raw_lines, typed_rows

    cap = 4096
    lines = [b"a" * cap, b"b" * (cap + 1), _criteo_row(1), b"c" * 300_000, _criteo_row(2), b"d" * 2 * cap]
    day = tmp_path / "day_0"
    day.write_bytes(b"\n".join(lines))  # the last line has no '\n': it is skipped all the same
    read = raw_lines(spark, str(day), cap).select(F.length("value").alias("n")).collect()
    assert [row.n for row in read] == [cap, len(_criteo_row(1)), len(_criteo_row(2))]
    assert typed_rows(spark, str(day), cap).count() == 2


def test_validation_refuses_lines_over_the_line_cap_setting_as_bad_rows(tmp_path: Path, monkeypatch) -> None:
    from tasks.criteo.raw_rows import iter_line_blocks

    monkeypatch.setenv("RECFLOW_MAX_LINE_BYTES", "2000")
    day = tmp_path / "day_0"
    day.write_bytes(_criteo_row(1) + b"\n" + b"x" * 5000 + b"\n" + _criteo_row(2) + b"\n")
    blocks = list(iter_line_blocks(day, 1024))
    skipped = [bad for _, _, bads in blocks for bad in bads]
    assert [(bad.line, bad.field) for bad in skipped] == [(2, 0)]
    assert "5000 bytes, longer than 2000" in skipped[0].describe()
    assert b"".join(block for _, block, _ in blocks) == _criteo_row(1) + b"\n" + _criteo_row(2) + b"\n"


# ---- item 11: a model far above the machine is refused before training is launched -------------------------------


def _dataset(directory: Path, cardinalities: list[int]) -> Path:
    from tasks.core.storage import Manifest, write_manifest
    from tasks.formats.feature_spec import FEATURE_SPEC_FILE, FeatureSpec

    directory.mkdir(parents=True)
    FeatureSpec.get_default_feature_spec(13, cardinalities).to_yaml(directory / FEATURE_SPEC_FILE)
    write_manifest(directory, Manifest(kind="test_dataset", inputs={"cardinalities": cardinalities}))
    return directory


def _criteo_run(nproc: int = 1) -> dict:
    from tasks.criteo.profiles import PROFILES

    return {"knobs": dict(PROFILES["demo"]), "device": "cpu", "nproc": nproc, "framework": "pytorch",
            "train_days": [0], "test_day": 1}


@pytest.fixture
def launches(monkeypatch) -> list:
    """Every child the launcher would start (none may start for a refused model)."""
    import tasks.core.launch as launch

    started: list = []

    def refuse_to_start(argv, **kwargs):
        started.append(argv)
        raise AssertionError("training was launched")

    monkeypatch.setattr(launch, "run_streaming", refuse_to_start)
    monkeypatch.setattr(launch, "run_streaming_group", refuse_to_start)
    return started


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_model_far_above_the_machine_is_refused_before_training_starts(tmp_path: Path, monkeypatch, launches,
                                                                       framework: str) -> None:
    from tasks.core.config import load_settings
    from tasks.core.launch import ModelTooLarge
    from tasks.criteo.dlrm import run_paths, train

    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("RECFLOW_TRAIN_MEMORY_BYTES", str(16 << 30))
    settings = load_settings()
    _dataset(run_paths(settings, "run1").dataset, [300_000_000] * 26)  # 7.8e9 rows x 128 x 4 B: ~3.6 TiB
    with pytest.raises(ModelTooLarge) as caught:
        train(settings, "run1", {**_criteo_run(), "framework": framework})
    _one_line(caught.value, "26 embedding tables", "7,800,000,000 rows", "16.0 GiB", "RECFLOW_TRAIN_MEMORY_BYTES",
              "max_table_size", "nproc")
    assert launches == []


def test_memory_need_counts_processes_and_sharding(tmp_path: Path) -> None:
    from tasks.core.launch import ModelTooLarge, check_memory
    from tasks.core.dlrm_knobs import dlrm_memory_need
    from tasks.criteo.dlrm import model_config
    from tasks.criteo.profiles import PROFILES

    dataset = _dataset(tmp_path / "dataset", [1_000_000] * 4)  # 4e6 rows x dim
    config = model_config(dict(PROFILES["demo"]), "cpu")
    dim = config["bottom_mlp_sizes"][-1]
    need = dlrm_memory_need(dataset, config)
    assert need.replicated >= 4_000_000 * dim * 4 and need.sharded == 0
    check_memory(need, 1, available=need.per_node(1), source="test")  # exactly enough: allowed
    with pytest.raises(ModelTooLarge, match="4 process"):
        check_memory(need, 4, available=need.per_node(1) * 2, source="test")  # every process holds a replica
    sharded = dlrm_memory_need(dataset, {**config, "sharding": "table_wise"})
    assert sharded.sharded == 4_000_000 * dim * 4 and sharded.per_node(4) < need.per_node(4)


def test_tf_host_tables_are_nvidias_offloading_rule_and_not_counted_against_the_gpu(tmp_path: Path) -> None:
    """The TF2 DLRM keeps the smallest tables on the GPU while their total is within the threshold and puts the
    largest in host memory (NVIDIA's DualEmbeddingGroup), so a table set larger than the GPU trains: the preflight
    counts only the GPU's tables against the GPU's memory, and all of them when training on the CPU."""
    import dataclasses

    from tasks.core.dlrm_knobs import dlrm_memory_need, host_table_indices
    from tasks.core.launch import ModelTooLarge, check_memory
    from tasks.criteo.dlrm import model_config
    from tasks.criteo.profiles import PROFILES

    assert host_table_indices([10, 50, 30, 5], 45) == [1]  # 5 + 10 + 30 = 45 stay; 50 goes
    assert host_table_indices([10, 50, 30, 5], 44) == [1, 2]
    assert host_table_indices([10, 50, 30, 5], 95) == [] and host_table_indices([], 0) == []
    assert host_table_indices([20, 20, 20], 30) == [1, 2]  # equal sizes: the earlier table stays
    # Many tables each under the threshold but together over it: NVIDIA's rule offloads some (a per-table rule none)
    assert host_table_indices([40] * 4, 100) == [2, 3]

    dataset = _dataset(tmp_path / "dataset", [1_000_000] * 4)
    config = model_config(dict(PROFILES["demo"]), "cuda")
    table = 1_000_000 * config["bottom_mlp_sizes"][-1] * 4
    everything = dlrm_memory_need(dataset, config)
    on_gpu = dlrm_memory_need(dataset, config, host_table_threshold=2 * table)
    assert everything.replicated - on_gpu.replicated == 2 * table
    assert "(2 of them, " in on_gpu.what and "in host memory)" in on_gpu.what
    on_cpu = dlrm_memory_need(dataset, {**config, "device": "cpu"}, host_table_threshold=2 * table)
    assert on_cpu.replicated == everything.replicated and on_cpu.host == 0
    # The host tables count against the host, one copy per process (each TF worker holds its own)
    assert on_gpu.host == 2 * table
    check_memory(on_gpu, 2, device="cuda", available=on_gpu.per_node(2), source="test")  # this host: ~24 GB
    huge = dataclasses.replace(on_gpu, host=1 << 50)
    with pytest.raises(ModelTooLarge) as caught:
        check_memory(huge, 2, device="cuda", available=huge.per_node(2), source="test")
    _one_line(caught.value, "of host memory on this node (2 process(es) x 1048576.0 GiB)", "MemAvailable")
    # The TF2 trainer replicates every table whatever the sharding knob says
    assert dlrm_memory_need(dataset, {**config, "sharding": "table_wise"}, host_table_threshold=1 << 50).sharded == 0


def _fake_nvidia_smi(directory: Path, output: str, exit_code: int = 0) -> str:
    """A PATH holding an `nvidia-smi` that prints `output` (this machine has no GPU: the query is what is mocked) and
    counts its calls, one line each in `directory`/calls."""
    directory.mkdir()
    smi = directory / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho called >> '{directory / 'calls'}'\ncat <<'EOF'\n{output}EOF\nexit {exit_code}\n")
    smi.chmod(0o755)
    return str(directory)


def test_gpu_training_is_checked_against_the_gpus_its_processes_get(tmp_path: Path, monkeypatch) -> None:
    """Process i of a node trains on GPU i mod the GPUs it sees (torchrun's ranks; TF workers get one each), so
    each GPU's memory.total is shared by its processes; what is free now is logged, not refused on."""
    from tasks.core.dlrm_knobs import dlrm_memory_need
    from tasks.core.launch import ModelTooLarge, check_memory, gpu_memory_bytes
    from tasks.criteo.dlrm import model_config
    from tasks.criteo.profiles import PROFILES

    mib = 1 << 20
    path = _fake_nvidia_smi(tmp_path / "bin", "0, GPU-aaaa1111, 81559, 81000, Disabled\n"
                                              "1, GPU-bbbb2222, 40960, 100, Disabled\n"
                                              "2, GPU-cccc3333, 81559, 500, [N/A]\n")
    pci = {"PATH": path, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpu_memory_bytes(1, pci)[0] == 81559 * mib
    available, source = gpu_memory_bytes(2, pci)
    assert available == 2 * 40960 * mib and "on GPU(s) 0, 1, 40.0 GiB each; free now 79.1 GiB, 0.1 GiB" in source
    assert gpu_memory_bytes(4, pci)[0] == 4 * (81559 * mib // 2)  # GPU 0 holds processes 0 and 3
    assert gpu_memory_bytes(1, {**pci, "CUDA_VISIBLE_DEVICES": "1"})[0] == 40960 * mib
    assert gpu_memory_bytes(2, {**pci, "CUDA_VISIBLE_DEVICES": "GPU-cccc,0"})[0] == 2 * 81559 * mib
    # CUDA reads CUDA_VISIBLE_DEVICES up to its first entry that names no GPU: "0,-1,1" is GPU 0 alone
    assert gpu_memory_bytes(2, {**pci, "CUDA_VISIBLE_DEVICES": "0,-1,1"})[0] == 2 * (81559 * mib // 2)
    # Unlike GPUs in CUDA's default (fastest first) order: index 0 may be the small one, so the smallest counts
    assert gpu_memory_bytes(1, {"PATH": path})[0] == 40960 * mib
    assert gpu_memory_bytes(1, {"PATH": path, "CUDA_VISIBLE_DEVICES": "0"})[0] == 40960 * mib
    assert gpu_memory_bytes(1, {"PATH": path, "CUDA_VISIBLE_DEVICES": "GPU-aaaa1111"})[0] == 81559 * mib
    lenient = _fake_nvidia_smi(tmp_path / "nofree", "0, GPU-a, 81559, [N/A], Disabled\n")
    assert gpu_memory_bytes(1, {"PATH": lenient}) == (81559 * mib, "nvidia-smi memory.total: 1 process(es) on "
                                                                   "GPU(s) 0, 79.6 GiB each; free now ?")
    for environ, why in [({**pci, "CUDA_VISIBLE_DEVICES": ""}, "no GPU visible"),
                         ({**pci, "CUDA_VISIBLE_DEVICES": "MIG-1234"}, "MIG instances"),
                         ({"PATH": _fake_nvidia_smi(tmp_path / "mig", "0, GPU-a, 81559, 81000, Enabled\n")},
                          "MIG instances"),
                         ({"PATH": _fake_nvidia_smi(tmp_path / "broken", "NVIDIA-SMI has failed\n", exit_code=9)},
                          "nvidia-smi exited 9: NVIDIA-SMI has failed"),
                         ({"PATH": _fake_nvidia_smi(tmp_path / "na", "0, GPU-a, [N/A], [N/A], Disabled\n")},
                          "nvidia-smi answered"),
                         ({"PATH": str(tmp_path / "empty")}, "no nvidia-smi")]:
        available, source = gpu_memory_bytes(1, environ)
        assert available is None and why in source and "set RECFLOW_TRAIN_MEMORY_BYTES" in source, source

    # A cuda run's preflight reads them with no setting: 100M rows x 128 fit GPU 0, not a replica on GPU 1 too.
    monkeypatch.setenv("PATH", f"{path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.delenv("RECFLOW_TRAIN_MEMORY_BYTES", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dataset = _dataset(tmp_path / "dataset", [25_000_000] * 4)
    need = dlrm_memory_need(dataset, model_config(dict(PROFILES["demo"]), "cuda"))
    check_memory(need, 1, device="cuda")  # GPU 0: 81,559 MiB, though little of GPU 1 is free now
    with pytest.raises(ModelTooLarge) as caught:
        check_memory(need, 2, device="cuda")
    _one_line(caught.value, "nvidia-smi memory.total: 2 process(es) on GPU(s) 0, 1", "RECFLOW_TRAIN_MEMORY_BYTES")


def test_tensorflow_workers_all_reduce_by_nccl_only_on_gpus_of_their_own(monkeypatch) -> None:
    """The worker's side of TF_WORKER_COLLECTIVE: NCCL when the launcher says so and TensorFlow may use a GPU (the
    GPU is mocked: this TensorFlow is a CPU build), TF's AUTO (its ring) otherwise, e.g. under device cpu."""
    import tensorflow as tf

    from models.tfkit.cluster import collective_implementation
    from tasks.core.gpus import TF_COLLECTIVE_ENV

    implementation = tf.distribute.experimental.CommunicationImplementation
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [gpu] if kind == "GPU" else [])
    assert collective_implementation({TF_COLLECTIVE_ENV: "nccl"}) == implementation.NCCL
    assert collective_implementation({TF_COLLECTIVE_ENV: "ring"}) == implementation.AUTO
    assert collective_implementation({}) == implementation.AUTO
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])  # device cpu hid the GPU
    assert collective_implementation({TF_COLLECTIVE_ENV: "nccl"}) == implementation.AUTO


def test_tensorflow_workers_get_one_gpu_each(tmp_path: Path, monkeypatch) -> None:
    from tasks.core import gpus
    from tasks.core.gpus import TF_COLLECTIVE_ENV
    from tasks.core.launch import tf_worker_envs

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.worker_devices(2) is None or gpus.has_gpu()  # this machine: no GPU, nothing set
    envs = tf_worker_envs(3, ports=[4001, 4002, 4003], cores=6, devices=["0", "1"])
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0", "1", "0"]
    assert all(env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for env in envs)  # two workers on GPU 0
    own = tf_worker_envs(2, ports=[4001, 4002], devices=["0", "1"])
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in own[0]
    # Their all-reduce: NCCL where each has a GPU of its own; NCCL refuses two ranks on one GPU, so sharing is RING
    assert [env[TF_COLLECTIVE_ENV] for env in own] == ["nccl", "nccl"]
    assert {env[TF_COLLECTIVE_ENV] for env in envs} == {"ring"}
    assert TF_COLLECTIVE_ENV not in tf_worker_envs(2, ports=[4001, 4002], devices=[])[0]  # no GPU
    none = str(tmp_path / "none")  # a PATH without nvidia-smi: the entries as given, up to CUDA's first invalid one
    assert gpus.worker_devices(3, {"PATH": none, "CUDA_VISIBLE_DEVICES": "GPU-b, 3"}) == ["GPU-b", "3", "GPU-b"]
    assert gpus.worker_devices(2, {"PATH": none, "CUDA_VISIBLE_DEVICES": "0,-1,1"}) == ["0", "0"]
    assert gpus.worker_devices(2, {"PATH": none, "CUDA_VISIBLE_DEVICES": "-1"}) is None
    path = _fake_nvidia_smi(tmp_path / "bin", "0, GPU-a, 81559, 81000, Disabled\n1, GPU-b, 81559, 81000, Disabled\n")
    assert gpus.worker_devices(2, {"PATH": path, "CUDA_VISIBLE_DEVICES": "1,5,0"}) == ["1", "1"]  # no GPU 5
    # As the launcher gets them (one entry per worker, GPUs repeated): 4 workers on 2 GPUs share, 2 do not
    shared = tf_worker_envs(4, ports=[4001, 4002, 4003, 4004],
                            devices=gpus.worker_devices(4, {"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1"}))
    assert [env["CUDA_VISIBLE_DEVICES"] for env in shared] == ["0", "1", "0", "1"]
    assert {(env[TF_COLLECTIVE_ENV], env["TF_FORCE_GPU_ALLOW_GROWTH"]) for env in shared} == {("ring", "true")}
    alone = tf_worker_envs(2, ports=[4001, 4002],
                           devices=gpus.worker_devices(2, {"PATH": path, "CUDA_VISIBLE_DEVICES": "0,1"}))
    assert [env[TF_COLLECTIVE_ENV] for env in alone] == ["nccl", "nccl"]
    monkeypatch.setattr(gpus, "_PROC_GPUS", Path("/nonexistent"))
    assert gpus.worker_devices(2, {}) is None and "CUDA_VISIBLE_DEVICES" not in tf_worker_envs(2, cores=2)[0]


def _fake_gpu_node(monkeypatch, tmp_path: Path, count: int) -> None:
    """The driver's /proc listing of `count` GPUs and its device nodes (this machine has no GPU: plain files)."""
    from tasks.core import gpus

    proc, dev = tmp_path / "proc-gpus", tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    for i in range(count):
        (proc / f"0000:{0x17 + i:02x}:00.0").mkdir(parents=True)
        (dev / f"nvidia{i}").touch()
    monkeypatch.setattr(gpus, "_PROC_GPUS", proc)
    monkeypatch.setattr(gpus, "_DEV", dev)


def test_auto_device_refuses_a_gpu_node_whose_gpus_the_framework_cannot_use(tmp_path: Path, monkeypatch) -> None:
    """device auto on a node whose driver lists GPUs (mocked: this machine has none) but whose torch or TensorFlow
    is a CPU build is one line, not a GPU-sized model trained on the CPU, and not retried; a CUDA build that cannot
    start CUDA is retried. The launcher's preflight counts the GPUs then, and the host's memory where
    CUDA_VISIBLE_DEVICES hides them (the way to choose the CPU) or this process may not open them."""
    import tensorflow as tf

    from models.tfkit.cluster import use_device
    from models.torchkit.distributed import select_device
    from tasks.core import gpus
    from tasks.core.launch import node_memory_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # CPU builds (as here, or on a GPU machine)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: False)
    _fake_gpu_node(monkeypatch, tmp_path, 2)
    monkeypatch.delenv("RECFLOW_TRAIN_MEMORY_BYTES", raising=False)
    system_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "no-nvidia-smi"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(RuntimeError) as caught:
        select_device("auto")
    _one_line(caught.value, "cannot run here: device auto: the NVIDIA driver lists 2 GPU(s)",
              f"torch {torch.__version__} is a CPU build", "device cpu", "CUDA_VISIBLE_DEVICES=")
    with pytest.raises(RuntimeError, match="cannot run here: .*driver lists 2 GPU.s. on this node but TensorFlow"):
        use_device("auto")
    with pytest.raises(RuntimeError, match="cannot run here: device 'cuda' requested but TensorFlow .* CPU build; "
                                           r"install tensorflow\[and-cuda\]"):
        use_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # a CUDA build that cannot start CUDA: may recover, retried
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: True)
    with pytest.raises(RuntimeError) as caught:
        select_device("auto")
    assert "cannot start CUDA" in str(caught.value) and "cannot run here" not in str(caught.value)
    for choose in (lambda: select_device("cuda"), lambda: use_device("cuda")):  # device cuda likewise
        with pytest.raises(RuntimeError) as caught:
            choose()
        _one_line(caught.value, "device 'cuda' requested but", "GPUs not ready")
        assert "cannot run here" not in str(caught.value)
    monkeypatch.setattr(tf.test, "is_built_with_cuda", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert select_device("cpu") == torch.device("cpu")
    assert node_memory_bytes("auto")[1].startswith("GPU memory (no nvidia-smi")
    for hidden in ("", "-1", "none", " "):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert gpus.hidden_by_environment() and select_device("auto") == torch.device("cpu")
        use_device("auto")
        assert node_memory_bytes("auto")[1] == "MemAvailable in /proc/meminfo"
    for visible in ("0", "1,0", "GPU-8b3c", "MIG-GPU-8b3c/1/0"):
        assert not gpus.hidden_by_environment({"CUDA_VISIBLE_DEVICES": visible})
    # An index past the node's GPUs hides them all from CUDA too (nvidia-smi tells)
    smi = _fake_nvidia_smi(tmp_path / "bin", "0, GPU-a, 81559, 81000, Disabled\n1, GPU-b, 81559, 81000, Disabled\n")
    monkeypatch.setenv("PATH", f"{smi}:{system_path}")  # the fake runs `cat`
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with pytest.raises(RuntimeError) as caught:
        select_device("auto")
    _one_line(caught.value, "cannot run here: device auto: CUDA_VISIBLE_DEVICES='4' names none of the 2 GPU(s) "
              "nvidia-smi lists (0, 1)")
    assert (tmp_path / "bin" / "calls").read_text().count("called") == 1  # asked once, on the refusal path too
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # A job whose cgroup refuses to open the GPU nodes (Slurm without GPUs; a directory stands for one here): the CPU
    for node in ("nvidia0", "nvidia1"):
        (tmp_path / "dev" / node).unlink()
        (tmp_path / "dev" / node).mkdir()
    assert not gpus.has_gpu() and select_device("auto") == torch.device("cpu")
    use_device("auto")
    assert node_memory_bytes("auto")[1] == "MemAvailable in /proc/meminfo"
    # A container given no GPU sees the driver's /proc entries but not its device nodes: the CPU, as on a GPU-less node
    monkeypatch.setattr(gpus, "_DEV", tmp_path / "container-dev")
    assert not gpus.has_gpu() and select_device("auto") == torch.device("cpu")
    monkeypatch.setattr(gpus, "_PROC_GPUS", tmp_path / "none")
    assert select_device("auto") == torch.device("cpu")


def test_more_torchrun_processes_than_gpus_are_refused_before_launch(tmp_path: Path, monkeypatch, launches) -> None:
    """NCCL runs one process per GPU (two ranks on one GPU stop with "Duplicate GPU detected" after the launch), so
    the launcher refuses nproc above the GPUs nvidia-smi shows the processes (mocked: this machine has none), and
    the train task does not retry that."""
    from tasks.core import gpus
    from tasks.core.config import load_settings
    from tasks.core.launch import CannotRunHere, check_one_gpu_each
    from tasks.criteo.dlrm import run_paths, train

    path = _fake_nvidia_smi(tmp_path / "bin", "0, GPU-a, 81559, 81000, Disabled\n1, GPU-b, 81559, 81000, Disabled\n")
    check_one_gpu_each(2, "cuda", {"PATH": path})
    check_one_gpu_each(3, "cpu", {"PATH": path})
    check_one_gpu_each(3, "cuda", {"PATH": str(tmp_path / "none")})  # unknown: the trainer checks
    with pytest.raises(CannotRunHere) as caught:
        check_one_gpu_each(2, "cuda", {"PATH": path, "CUDA_VISIBLE_DEVICES": "1"})
    _one_line(caught.value, "nproc 2", "see 1 GPU(s) (1)", "lower nproc to 1", "device cpu")
    _fake_gpu_node(monkeypatch, tmp_path, 1)  # a node whose driver lists GPUs: auto means them
    with pytest.raises(CannotRunHere):
        check_one_gpu_each(3, "auto", {"PATH": path})
    check_one_gpu_each(3, "auto", {"PATH": path, "CUDA_VISIBLE_DEVICES": ""})  # hidden: the CPU

    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("PATH", f"{path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    settings = load_settings()
    _dataset(run_paths(settings, "run1").dataset, [1000] * 26)
    with pytest.raises(CannotRunHere):
        train(settings, "run1", {**_criteo_run(nproc=4), "device": "cuda"})
    assert launches == []


@pytest.mark.skipif(torch.cuda.is_available() or torch.version.cuda is not None,
                    reason="needs a CPU build of torch, whose device cuda is a refusal (this machine's)")
def test_a_trainer_that_cannot_run_on_its_node_fails_the_task_without_retry(tmp_path: Path, monkeypatch) -> None:
    """A refusal inside the trainer (here device cuda on this machine's CPU torch, launched by torchrun for real)
    reaches the task as CannotRunHere, which the train task does not retry, with the trainer's one line; the
    evaluator's (a child process too) likewise, which the evaluate and gate tasks do not retry."""
    from tasks.core.config import load_settings
    from tasks.core.launch import CannotRunHere
    from tasks.criteo.dlrm import evaluate, run_paths, train

    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", f"{tmp_path / 'no-nvidia-smi'}:{os.environ['PATH']}")
    monkeypatch.delenv("RECFLOW_TRAIN_MEMORY_BYTES", raising=False)
    settings = load_settings()
    _dataset(run_paths(settings, "run1").dataset, [1000] * 26)
    with pytest.raises(CannotRunHere) as caught:
        train(settings, "run1", {**_criteo_run(), "device": "cuda"})
    _one_line(caught.value, "cannot run here: device 'cuda' requested but torch", "it is a CPU build",
              "choose device cpu or auto")
    with pytest.raises(CannotRunHere) as caught:
        evaluate(settings, "run1", {**_criteo_run(), "device": "cuda"})
    _one_line(caught.value, "cannot run here: device 'cuda' requested but torch", "it is a CPU build")


def test_demo_model_passes_the_preflight_against_this_machine(tmp_path: Path) -> None:
    from tasks.core.launch import check_memory, node_memory_bytes
    from tasks.core.dlrm_knobs import dlrm_memory_need
    from tasks.criteo.dlrm import model_config
    from tasks.criteo.profiles import PROFILES

    available, source = node_memory_bytes("cpu")
    assert available and source == "MemAvailable in /proc/meminfo"
    dataset = _dataset(tmp_path / "dataset", [10_000] * 26)
    check_memory(dlrm_memory_need(dataset, model_config(dict(PROFILES["demo"]), "cpu")), 2)


def test_outbrain_zip_bomb_is_refused_at_the_cap(tmp_path: Path, monkeypatch) -> None:
    from tasks.outbrain.ingest import _unzip_member

    archive = tmp_path / "clicks_train.csv.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("clicks_train.csv", bytes(4 << 20))
    monkeypatch.setenv("RECFLOW_EXPANDED_MAX_BYTES", str(1 << 20))
    destination = tmp_path / "clicks_train.csv"
    with pytest.raises(NotAllowed) as caught:
        _unzip_member(archive, destination, "clicks_train.csv", "0" * 64)
    _one_line(caught.value, "clicks_train.csv.zip", "RECFLOW_EXPANDED_MAX_BYTES")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clicks_train.csv.zip"]
