"""The benchmark harness's own logic: statistics and ratios, window arithmetic, timing wrappers, the process-tree
memory sampler, the loader and parse floors on tiny inputs, and the rendered page. No Spark, Airflow or torchrun:
those paths run in `python -m bench.run`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench import report, scaling
from bench.common import QUICK, Figure, LoadMonitor, OtherWork, Stat, paired_ratio, ratio_of
from bench.floors import parse_seconds, read_seconds
from bench.ingest import DayRecord, IngestData, IngestPass
from bench.proc import ChildFailed, ChildRun, rss_by_name, run_child
from bench.run import parse_args
from bench.worker import _timed
from tests.conftest import CRITEO_SAMPLE


def test_stat_is_median_with_spread():
    stat = Stat.of([3.0, 1.0, 2.0, 10.0])
    assert (stat.median, stat.min, stat.max, stat.n) == (2.5, 1.0, 10.0, 4)
    with pytest.raises(ValueError):
        Stat.of([])


def test_paired_ratio_pairs_samples_and_ratio_of_takes_the_widest_range():
    assert paired_ratio([2.0, 6.0, 3.0], [1.0, 2.0, 3.0]) == Stat(2.0, 1.0, 3.0, 3)
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])
    wide = ratio_of(Stat(10.0, 8.0, 12.0, 3), Stat(5.0, 4.0, 6.0, 5))
    assert wide == Stat(2.0, 8.0 / 6.0, 12.0 / 4.0, 3)


def test_load_monitor_samples_the_load_for_the_whole_block():
    with LoadMonitor(interval_s=0.01) as monitor:
        time.sleep(0.1)
    summary = monitor.summary()
    assert len(monitor.samples) >= 2
    assert summary["min_1min"] <= summary["mean_1min"] <= summary["max_1min"]


def test_quick_pass_covers_the_largest_window_plus_a_test_day():
    assert QUICK.pass_days == [0, 1, 2]
    assert QUICK.repeats == 3


def _day(day: int, start: float, seconds: float) -> DayRecord:
    return DayRecord(day=day, rows=100, start=start, end=start + seconds, wall=seconds + 1,
                     durations={"download": 0.1, "validate_raw": seconds / 2, "day_stats": seconds / 2},
                     functions={"validate_day": seconds / 4, "day_stats": seconds / 4, "download_day": 0.05,
                                "validate_raw_file": seconds / 5})


def test_ingest_windows_are_disjoint_runs_of_consecutive_days_with_their_peak_memory():
    days = [_day(i, 10.0 * i, 8.0) for i in range(5)]
    child = ChildRun(seconds=50.0, samples=[(5.0, 100), (15.0, 300), (25.0, 200), (35.0, 250), (45.0, 120)])
    data = IngestData(passes=[IngestPass(Path("."), child, days)])
    seconds, peaks = scaling.ingest_windows(data, 2)
    assert seconds == [8.0, 8.0]           # windows (0, 1) and (2, 3); day 4 is left over
    assert peaks == [300.0, 250.0]
    seconds4, peaks4 = scaling.ingest_windows(data, 4)
    assert seconds4 == [16.0] and peaks4 == [300.0]
    assert child.rss_before(10.0) == 100


def test_scaling_figures_compare_with_linear_time_and_flat_memory():
    data = IngestData(passes=[IngestPass(Path("."), ChildRun(1.0, [(t, 500) for t in range(100)]),
                                         [_day(i, 10.0 * i, 8.0) for i in range(5)])])
    mode = replace(QUICK, scaling_days=(1, 2, 4))
    series = scaling.series(mode, data, None)
    rows = scaling.figures(series)
    times = [f for f in rows if f.unit == "s"]
    assert [round(f.ratio.median, 6) for f in times] == [1.0, 1.0, 1.0]  # perfectly linear
    assert all(round(f.ratio.median, 6) == 1.0 for f in rows if f.unit == "MB")
    assert series["ingest"]["fit"]["seconds_per_day"] == pytest.approx(4.0)


def test_timing_wrapper_records_the_call_and_keeps_the_result_and_errors():
    calls: list[dict] = []
    wrapped = _timed(lambda x: {"total": x, "path": "p", "nested": {}}, "f", calls)
    assert wrapped(3) == {"total": 3, "path": "p", "nested": {}}
    assert calls[0]["name"] == "f" and calls[0]["end"] >= calls[0]["start"]
    assert calls[0]["result"] == {"total": 3, "path": "p"}

    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        _timed(boom, "boom", calls)()
    assert calls[-1]["name"] == "boom"


def test_run_child_samples_the_tree_memory_and_reports_failures(tmp_path):
    grandchild = "import time; x = bytearray(80 << 20); time.sleep(0.6)"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    run = run_child([sys.executable, "-c", code], tmp_path / "child.log")
    assert run.peak_rss() > 80 << 20     # the grandchild's 80 MB are counted
    assert run.samples and run.seconds > 0.5
    with pytest.raises(ChildFailed, match="exited 3"):
        run_child([sys.executable, "-c", "print('last words'); raise SystemExit(3)"], tmp_path / "bad.log")


def test_a_vforked_child_sharing_its_parents_memory_is_not_counted_twice():
    processes = {10: (1, 500, 900, "python"), 11: (10, 2000, 5000, "java"),
                 12: (11, 2000, 5000, "Executor task l"),  # between vfork and exec: the JVM's own pages
                 13: (11, 2000, 4000, "python"), 14: (13, 0, 0, "bash")}
    assert rss_by_name(processes) == {"python": 2500, "java": 2000, "bash": 0}


def test_floors_read_the_real_sample_and_every_binary_file(tmp_path):
    rows, seconds = parse_seconds(CRITEO_SAMPLE, threads=False)
    assert rows == 100 and seconds > 0
    (tmp_path / "label.bin").write_bytes(b"\x01" * 10)
    (tmp_path / "cat_0.bin").write_bytes(b"\x00" * 30)
    (tmp_path / "notes.txt").write_text("not data")
    assert read_seconds(tmp_path)[0] == 40


def test_only_accepts_known_names_in_either_form():
    args = parse_args(["--full", "--only", "training,loader", "--only", "ingest"])
    assert args.mode == "full" and args.only == ["ingest", "loader", "training"]
    assert parse_args([]).mode == "quick"
    with pytest.raises(SystemExit):
        parse_args(["--only", "nonsense"])


def test_page_names_the_command_machine_load_and_every_figure(tmp_path):
    figure = Figure("3 loader", "reader", "MB/s", Stat(80.0, 70.0, 90.0, 3), "np.fromfile", Stat(100.0, 95.0, 105.0, 3),
                    Stat(0.8, 0.7, 0.9, 3), "paired", ">= 0.8")
    results = json.loads(json.dumps({
        "command": ".venv/bin/python -m bench.run --quick", "mode": "quick", "only": [],
        "started_utc": "2026-01-01T00:00:00+00:00", "seconds": 120.0, "results_path": "bench/results/x.json",
        "machine": {"cores": 2, "cpu": "cpu", "ram_bytes": 2**34, "platform": "linux", "versions": {"torch": "2"},
                    "commit": "abc", "dirty": False},
        "load": {"start": [3.0, 2.0, 1.0], "end": [1.0, 1.0, 1.0], "max_1min": 3.0}, "rss_method": "psutil",
        "stages": {"loader": {"seconds": 1.0, "load_start": [3.0], "load_end": [1.0]}},
        "figures": [figure.to_dict()], "series": {}}))
    page = report.render(results, [tmp_path / "ratios.png"])
    assert ".venv/bin/python -m bench.run --quick" in page
    assert "2 cores" in page and "16.0 GiB" in page and "[3.0, 2.0, 1.0]" in page
    assert "machine was busy" in page
    assert "| 3 loader | reader | 80.0 (70.0–90.0, n=3) MB/s |" in page and "**0.80**" in page
    assert report.plot_ratios(results["figures"], tmp_path / "ratios.png").stat().st_size > 1000


def test_busy_means_other_work_not_the_runs_own_load():
    results = {"command": "bench.run", "mode": "quick", "started_utc": "2026-01-01T00:00:00+00:00", "seconds": 100.0,
               "cpu_seconds": 190.0, "results_path": "r.json",
               "machine": {"cores": 2, "cpu": "cpu", "ram_bytes": 2**34, "platform": "linux", "versions": {},
                           "commit": "abc", "dirty": False}}
    # Both cores busy with the run itself: a load of 2, yet nothing else ran.
    quiet = {"start": [0.1], "end": [2.0], "max_1min": 2.3, "mean_1min": 1.9, "own_cpu_s": 190.0,
             "other_cpu_s": 4.0, "steal_cpu_s": 0.0, "other_share": 0.02, "steal_share": 0.0}
    page = "\n".join(report._machine({**results, "load": quiet}))
    assert "machine was busy" not in page and "4.0 CPU s, 2% of its 2 cores" in page
    shared = {**quiet, "other_cpu_s": 60.0, "other_share": 0.3}
    assert "other work took 30% of the cores" in "\n".join(report._machine({**results, "load": shared}))


def test_other_work_counts_a_process_this_run_did_not_start():
    import subprocess
    import sys

    with OtherWork() as own_only:
        started = time.process_time()
        sum(i * i for i in range(3_000_000))
        spent = time.process_time() - started
    # A busy process that is not a descendant: started in its own session and never waited for by this block.
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        with OtherWork() as with_other:
            time.sleep(1.0)
    finally:
        spinner.wait()
    # This process's own work is counted as its own (not as other work, whatever else the machine runs).
    assert spent > 0.05 and own_only.own_cpu_s >= 0.9 * spent
    assert with_other.own_cpu_s < 0.1 and with_other.other_cpu_s > 0.5, with_other.summary()


def test_a_second_page_sits_beside_the_main_one(tmp_path, monkeypatch):
    figure = Figure("2 preprocessing", "rows", "rows/s", Stat(5.0, 4.0, 6.0, 1), "parse", Stat(10.0, 10.0, 10.0, 1),
                    Stat(0.5, 0.4, 0.6, 1), "medians", "")
    results = {"command": "bench.run --full --only preprocessing --page PERFORMANCE-full.md", "mode": "full",
               "only": ["preprocessing"], "started_utc": "2026-01-01T00:00:00+00:00", "seconds": 1.0,
               "results_path": "r.json", "machine": {"cores": 2, "cpu": "cpu", "ram_bytes": 2**34, "platform": "linux",
                                                     "versions": {}, "commit": "abc", "dirty": False},
               "load": {"start": [0.1], "end": [0.1], "max_1min": 0.1}, "rss_method": "psutil", "stages": {},
               "figures": [figure.to_dict()], "series": {}}
    monkeypatch.setattr(report, "DOCS_DIR", tmp_path)
    monkeypatch.setattr(report, "PERF_DIR", tmp_path / "perf")
    (tmp_path / "PERFORMANCE.md").write_text("the main page")
    page = report.write_docs(results, "PERFORMANCE-full.md")
    assert page == tmp_path / "PERFORMANCE-full.md"
    assert "![performance-full-ratios](perf/performance-full-ratios.png)" in page.read_text()
    assert (tmp_path / "perf" / "performance-full-ratios.png").is_file()
    assert not (tmp_path / "perf" / "ratios.png").exists()
    assert (tmp_path / "PERFORMANCE.md").read_text() == "the main page"
    assert parse_args(["--page", "PERFORMANCE-full.md"]).page == "PERFORMANCE-full.md"
    for bad in ("../README.md", "docs/x.md", "x.txt"):
        with pytest.raises(SystemExit):
            parse_args(["--page", bad])
