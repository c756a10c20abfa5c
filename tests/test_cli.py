"""recflow's command line (tasks/cli.py): argument parsing and day ranges, the --json report and exit status of
expected errors and bugs (in process, no Spark), what the command line imports, and the Criteo steps end to end as
a subprocess: ingest three tiny synthetic days, preprocess a window into a valid split-binary dataset, run both
again as no-ops, and a day with too many bad rows failing with one line."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.preprocessing import measured_steps, preprocess_args
from tasks import cli
from tasks.pipelines import COMMANDS
from tasks.byo import cli as byo_cli
from tasks.criteo import cli as criteo_cli
from tasks.movielens import cli as movielens_cli
from tasks.outbrain import cli as outbrain_cli
from tasks.core.storage import read_manifest
from tests.conftest import REPO

ROWS = 2000  # rows per synthetic day: the end-to-end run is Spark's start-up, not data


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def report(path: Path) -> dict:
    return json.loads(path.read_text())


def step_results(doc: dict, step: str) -> list:
    return [record["result"] for record in doc["steps"] if record["step"] == step]


# ---- parsing --------------------------------------------------------------------------------------------------

def test_day_lists_take_days_ranges_and_lists():
    assert criteo_cli.day_list("3") == [3]
    assert criteo_cli.day_list("0-2,5") == [0, 1, 2, 5]
    assert criteo_cli.day_list("0-23") == list(range(24))
    assert criteo_cli.day_list("4,1-2,2") == [1, 2, 4]
    for bad in ("3-1", "a", "", "-1", "0-", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a day"):
            criteo_cli.day_list(bad)


def test_global_options_go_before_or_after_the_command():
    before = cli.parse_args(["--data-root", "/d", "--json", "r.json", "-q", "criteo", "ingest", "--days", "0-1,5"])
    after = cli.parse_args(["criteo", "ingest", "--days", "0-1,5", "--data-root", "/d", "--json", "r.json", "-q"])
    for args in (before, after):
        assert (args.data_root, args.json, args.quiet, args.verbose) == (Path("/d"), Path("r.json"), True, False)
        assert (args.pipeline, args.command, args.days, args.day) == ("criteo", "ingest", [0, 1, 5], None)
        assert args.handler is criteo_cli.criteo_ingest
    plain = cli.parse_args(["criteo", "ingest", "--day", "3"])
    assert (plain.data_root, plain.json, plain.quiet, plain.day, plain.days) == (None, None, False, 3, None)
    assert (plain.source, plain.bad_row_budget, plain.day_stats_engine, plain.spark_master) == (
        None, None, None, "local[*]")


@pytest.mark.parametrize("argv", [
    ["criteo", "ingest"],                                   # neither --day nor --days
    ["criteo", "ingest", "--day", "1", "--days", "0-2"],    # both
    ["criteo", "ingest", "--day", "-1"],
    ["criteo", "ingest", "--days", "2-0"],
    ["criteo", "ingest", "--day", "1", "--bad-row-budget", "1.5"],
    ["criteo", "ingest", "--day", "1", "--day-stats-engine", "pandas"],
    ["criteo", "preprocess", "--train-days", "0-1"],        # no test day
    ["criteo", "preprocess", "--test-day", "2", "--out", "x", "--run-id", "r"],
    ["criteo", "preprocess", "--test-day", "2", "--profile", "huge"],
    ["criteo", "ingest", "--day", "1", "-v", "-q"],
    ["movielens", "ingest", "--dataset", "ml-100k"],
    ["outbrain", "features", "--tfrecord-shards", "0"],
    ["criteo"],
    [],
])
def test_bad_command_lines_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage: recflow" in capsys.readouterr().err


def test_every_pipeline_command_parses_with_its_knobs():
    prep = cli.parse_args(["criteo", "preprocess", "--train-days", "0-22", "--test-day", "23", "--profile", "demo",
                           "--frequency-threshold", "0", "--threshold-overrides", "cat_3:2", "--dictionary-days",
                           "all", "--seed", "7", "--spark-profile", "cluster", "--run-id", "manual__1"])
    assert (prep.train_days, prep.test_day, prep.profile, prep.frequency_threshold, prep.threshold_overrides,
            prep.dictionary_days, prep.seed, prep.spark_profile, prep.run_id, prep.out) == (
        list(range(23)), 23, "demo", 0, "cat_3:2", "all", 7, "cluster", "manual__1", None)
    movielens = cli.parse_args(["movielens", "preprocess", "--dataset", "ml-1m", "--min-ratings", "0"])
    assert (movielens.handler, movielens.dataset, movielens.min_ratings, movielens.test_negatives) == (
        movielens_cli.movielens_preprocess, "ml-1m", 0, None)
    outbrain = cli.parse_args(["outbrain", "ingest", "--snapshot", "s1", "--source", "s3://b/{file}.csv.gz"])
    assert (outbrain.handler, outbrain.snapshot, outbrain.source) == (outbrain_cli.outbrain_ingest, "s1", "s3://b/{file}.csv.gz")
    byo = cli.parse_args(["byo", "transcode", "--spec-uri", "s3://b/spec.yaml", "--engine", "spark"])
    assert (byo.handler, byo.spec_uri, byo.engine, byo.data_uri) == (byo_cli.byo_transcode, "s3://b/spec.yaml", "spark",
                                                                     None)
    for pipeline in ("criteo", "movielens", "outbrain", "byo"):
        assert cli.parse_args([pipeline, "demo-data"]).command == "demo-data"


def test_the_command_groups_are_the_registrys():
    """tasks/pipelines.py's COMMANDS is the one list: each group's module adds its commands and its step errors."""
    groups = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    assert list(groups.choices) == list(COMMANDS) == ["criteo", "movielens", "outbrain", "byo"]
    for module in COMMANDS.values():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_commands) and loaded.EXPECTED_ERRORS, module
        for error_module, name in loaded.EXPECTED_ERRORS:
            assert issubclass(getattr(importlib.import_module(error_module), name), Exception)
    from tasks.criteo.ingest import StepInputMissing

    assert cli.is_expected(StepInputMissing("day 3 has not been ingested"))
    assert not cli.is_expected(KeyError("a bug"))


def test_the_console_script_runs_the_same_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["recflow"].partition(":")
    assert (module, function) == ("tasks.cli", "main")
    assert "from tasks.cli import main" in (REPO / "tasks" / "__main__.py").read_text()


def test_the_benchmark_runs_a_valid_preprocess_command(tmp_path):
    args = cli.parse_args(preprocess_args(tmp_path / "data", 2, 4, tmp_path / "out", tmp_path / "r.json"))
    assert (args.handler, args.train_days, args.test_day, args.out, args.json) == (
        criteo_cli.criteo_preprocess, [0, 1], 4, tmp_path / "out", tmp_path / "r.json")
    assert (args.profile, args.spark_profile, args.data_root) == ("full", "local", tmp_path / "data")


# ---- running commands in process (no Spark) ---------------------------------------------------------------------

def test_demo_data_writes_days_and_the_json_report(tmp_path):
    import logging
    import os

    out = tmp_path / "report.json"
    root, environment = logging.getLogger(), dict(os.environ)
    handlers, level = list(root.handlers), root.level
    assert cli.main(["--data-root", str(tmp_path / "data"), "criteo", "demo-data", "--days", "0-1", "--rows", "50",
                     "--json", str(out), "-v"]) == 0
    # an in-process caller gets its logging and environment back
    assert (root.handlers, root.level, logging.getLogger("tasks").level) == (handlers, level, logging.NOTSET)
    assert dict(os.environ) == environment
    source = tmp_path / "data" / "criteo" / "source"
    assert [len(source.joinpath(f"day_{d}").read_text().splitlines()) for d in (0, 1)] == [50, 50]
    doc = report(out)
    assert (doc["ok"], doc["error"], doc["command"], doc["data_root"]) == (
        True, None, "criteo demo-data", str(tmp_path / "data"))
    [record] = doc["steps"]
    assert record["step"] == "write_days" and record["result"]["days"] == [0, 1] and record["error"] is None
    assert record["start"] <= record["end"] and record["seconds"] == round(record["end"] - record["start"], 3)


def test_byo_demo_data_then_transcode_in_process_then_cached(tmp_path):
    """byo's commands: a CSV FeatureSpec with generated files, then resolve_run -> fetch -> validate -> transcode
    (arrow, no Spark) -> validate_dataset into the run's folder; the second run finds every step done."""
    root, out = tmp_path / "data", tmp_path / "report.json"
    assert cli.main(["--data-root", str(root), "-q", "byo", "demo-data", "--train-rows", "300",
                     "--test-rows", "100"]) == 0
    spec = root / "byo" / "source" / "feature_spec.yaml"
    argv = ["--data-root", str(root), "-q", "--json", str(out), "byo", "transcode", "--spec-uri", spec.as_uri(),
            "--profile", "demo", "--engine", "arrow", "--run-id", "cli_1"]
    assert cli.main(argv) == 0
    doc = report(out)
    assert [r["step"] for r in doc["steps"]] == ["resolve_run", "fetch", "validate", "transcode", "validate_dataset"]
    [dataset] = step_results(doc, "validate_dataset")
    assert dataset["path"] == str(root / "runs" / "byo_dlrm" / "cli_1" / "dataset")
    assert dataset["rows"] == {"train": 300, "test": 100}
    assert cli.main(argv) == 0
    assert step_results(report(out), "transcode")[0]["cached"] is True
    assert step_results(report(out), "validate")[0]["cached"] is True


def test_a_missing_upstream_step_is_one_line_and_exit_1(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = cli.main(["criteo", "preprocess", "--train-days", "0-1", "--test-day", "2", "--data-root",
                     str(tmp_path / "empty"), "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == ("recflow criteo preprocess: ValueError: days [0, 1, 2] are not ingested (no day_stats "
                    "manifest): run criteo_ingest for them")
    doc = report(out)
    assert (doc["ok"], doc["error"]) == (False, last.removeprefix("recflow criteo preprocess: "))
    assert [(r["step"], r["result"], r["error"]) for r in doc["steps"]] == [("resolve_run", None, doc["error"])]


def test_a_command_lines_profile_is_the_deployments_so_demo_runs_gate_at_the_demos_thresholds(tmp_path, capsys,
                                                                                              monkeypatch):
    # No release limits set: a trigger form asking for profile demo on a full deployment is refused (its min_auc is
    # looser), but the operator's own `--profile demo` sets the deployment's profile and gets past resolve_run.
    monkeypatch.delenv("RECFLOW_RELEASE_MIN_VALUE", raising=False)
    monkeypatch.delenv("RECFLOW_RELEASE_MAX_REGRESSION", raising=False)
    monkeypatch.setenv("RECFLOW_PROFILE", "")  # restored after the test, whatever the command line set
    from tasks.core.profiles import ReleaseThresholdLoosened, resolve_knobs
    from tasks.criteo.profiles import KNOBS, PROFILES

    with pytest.raises(ReleaseThresholdLoosened):
        resolve_knobs(KNOBS, PROFILES, "demo", {})
    code = cli.main(["criteo", "preprocess", "--profile", "demo", "--train-days", "0-1", "--test-day", "2",
                     "--data-root", str(tmp_path / "empty")])
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("run criteo_ingest for them")


def test_an_absent_source_is_one_line_and_exit_1(tmp_path, capsys):
    code = cli.main(["--data-root", str(tmp_path), "criteo", "ingest", "--days", "0-1"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"recflow criteo ingest: SourceNotFound: source file not found: "
                                            f"{tmp_path}/criteo/source/day_0")
    assert not (tmp_path / "criteo" / "raw" / "day_0").exists()


def test_one_source_file_for_many_days_is_refused_before_any_work(tmp_path, capsys):
    code = cli.main(["--data-root", str(tmp_path), "criteo", "ingest", "--days", "0-1",
                     "--source", f"file://{tmp_path}/day_0"])
    assert code == 1
    assert "put {day} where the day number goes" in capsys.readouterr().err
    assert not (tmp_path / "criteo").exists()


def test_a_bug_shows_its_traceback_and_is_reported(tmp_path, monkeypatch):
    import tasks.criteo.synthetic

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(tasks.criteo.synthetic, "ensure_days", broken)
    out = tmp_path / "report.json"
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["--data-root", str(tmp_path), "--json", str(out), "criteo", "demo-data"])
    doc = report(out)
    assert (doc["ok"], doc["error"]) == (False, "KeyError: 'a bug'")
    assert doc["steps"][0]["error"] == "KeyError: 'a bug'"


def test_the_command_line_imports_no_airflow_or_engine(tmp_path):
    """Import time matters: a failing ingest (it has loaded the ingest steps and the downloader) and a demo-data
    run load neither Airflow nor Spark, torch or TensorFlow."""
    code = f"""
import json, sys
from tasks.cli import main
codes = [main(["--data-root", {str(tmp_path)!r}, "-q", "criteo", "ingest", "--day", "0"]),
         main(["--data-root", {str(tmp_path)!r}, "-q", "criteo", "demo-data", "--rows", "10", "--days", "0"])]
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"airflow", "pyspark", "torch", "tensorflow", "keras"}})
print(json.dumps({{"codes": codes, "heavy": heavy, "ingest": "tasks.criteo.ingest" in sys.modules}}))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"codes": [1, 0], "heavy": [], "ingest": True}


# ---- end to end through the command line --------------------------------------------------------------------------

def test_a_day_with_too_many_bad_rows_exits_1_with_one_line(tmp_path):
    data = tmp_path / "data"
    assert run_cli("--data-root", str(data), "criteo", "demo-data", "--days", "5", "--rows", str(ROWS)).returncode == 0
    day = data / "criteo" / "source" / "day_5"
    lines = day.read_text().splitlines(keepends=True)
    for line_number in (11, 500, 1500):  # 3 of 2000 = 0.15% > the default budget of 0.1%
        lines[line_number - 1] = "2" + lines[line_number - 1][1:]
    day.write_text("".join(lines))
    out = tmp_path / "report.json"
    result = run_cli("--data-root", str(data), "criteo", "ingest", "--day", "5", "--json", str(out))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("recflow criteo ingest: DataQualityError: day_5: 3 bad rows of 2000"), last
    assert "first: day_5 line 11, field 1 (label), column 1: '2' label must be 0 or 1" in last
    doc = report(out)
    assert [(r["step"], r["error"] is None) for r in doc["steps"]] == [("download_day", True), ("validate_day", False)]
    assert not (data / "criteo" / "validated" / "day=5" / "_MANIFEST.json").exists()


def test_parallel_ingest_writes_what_a_serial_one_does_and_fails_with_one_line(tmp_path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    for data in (serial, parallel):
        made = run_cli("--data-root", str(data), "criteo", "demo-data", "--days", "0-2", "--rows", "500")
        assert made.returncode == 0, made.stderr
    out = tmp_path / "parallel.json"
    assert run_cli("--data-root", str(serial), "criteo", "ingest", "--days", "0-2").returncode == 0
    result = run_cli("--data-root", str(parallel), "criteo", "ingest", "--days", "0-2", "--jobs", "2",
                     "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ingesting 3 days, 2 at a time" in result.stderr and "day_2" in result.stderr  # workers' lines too
    doc = report(out)
    assert [r["step"] for r in doc["steps"]] == ["download_day", "validate_day", "day_stats"] * 3  # by day
    assert [r["day"] for r in step_results(doc, "validate_day")] == [0, 1, 2]
    for day in range(3):  # the same stats, whichever process wrote them
        stats = [read_manifest(root / "criteo" / "stats" / f"day={day}") for root in (serial, parallel)]
        assert stats[0]["inputs_fingerprint"] == stats[1]["inputs_fingerprint"]
        assert stats[0]["rows"] == stats[1]["rows"] and stats[0]["rows"]["good"] == 500
    # A day whose source is missing fails the command with its one line; the other days' steps are reported.
    (parallel / "criteo" / "source" / "day_4").unlink(missing_ok=True)
    failed = run_cli("--data-root", str(parallel), "criteo", "ingest", "--days", "2-4", "--jobs", "2",
                     "--json", str(out))
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("recflow criteo ingest: SourceNotFound: source file not found: ") and "day_3" in last
    doc = report(out)
    assert doc["ok"] is False and ("download_day", doc["error"]) in [(r["step"], r["error"]) for r in doc["steps"]]
    assert step_results(doc, "day_stats")[0]["cached"] is True  # day 2, already ingested


@pytest.mark.slow
def test_criteo_ingest_and_preprocess_end_to_end_then_cached(tmp_path):
    data, out = tmp_path / "data", tmp_path / "window"
    ingest_json, prep_json = tmp_path / "ingest.json", tmp_path / "preprocess.json"
    created = run_cli("--data-root", str(data), "criteo", "demo-data", "--days", "0-2", "--rows", str(ROWS))
    assert created.returncode == 0, created.stderr
    ingest = ["--data-root", str(data), "criteo", "ingest", "--days", "0-2", "--json", str(ingest_json)]
    preprocess = ["criteo", "preprocess", "--train-days", "0-1", "--test-day", "2", "--out", str(out),
                  "--profile", "demo", "--data-root", str(data), "--json", str(prep_json)]

    first = run_cli(*ingest)
    assert first.returncode == 0, first.stderr[-3000:]
    doc = report(ingest_json)
    assert [r["step"] for r in doc["steps"]] == ["download_day", "validate_day", "day_stats"] * 3
    assert [(r["day"], r["good"], r["bad"]) for r in step_results(doc, "validate_day")] == [
        (0, ROWS, 0), (1, ROWS, 0), (2, ROWS, 0)]
    assert [r["rows"] for r in step_results(doc, "day_stats")] == [ROWS] * 3
    assert "downloaded" in first.stderr and "day_2" in first.stderr  # the steps' progress lines, on stderr
    assert first.stdout == ""

    built = run_cli(*preprocess)
    assert built.returncode == 0, built.stderr[-3000:]
    doc = report(prep_json)
    assert [r["step"] for r in doc["steps"]] == ["resolve_run", "build_dictionary", "transform_dataset",
                                                 "validate_dataset"]
    [validated] = step_results(doc, "validate_dataset")
    assert validated["rows"] == {"train": 2 * ROWS, "test": ROWS // 2, "validation": ROWS // 2}
    assert validated["path"] == str(out / "dataset")
    dictionary, transform = measured_steps(doc, out)  # what the benchmark reads from the same report
    assert dictionary["result"]["path"] == str(out / "dictionary") and transform["result"]["rows"] == validated["rows"]

    from tasks.formats.feature_spec import FeatureSpec
    from tasks.formats.split_binary import check_dataset

    spec = FeatureSpec.from_yaml(out / "dataset" / "feature_spec.yaml")
    assert check_dataset(spec, ["train", "test", "validation"]).rows == validated["rows"]
    assert spec.get_categorical_sizes() == dictionary["result"]["cardinalities"]

    # Again: every step finds its manifest; nothing is rewritten.
    dataset_files = {p: p.stat().st_mtime_ns for p in (out / "dataset").rglob("*") if p.is_file()}
    again = run_cli(*ingest)
    assert again.returncode == 0, again.stderr[-3000:]
    assert all(r["result"]["cached"] for r in report(ingest_json)["steps"])
    again = run_cli(*preprocess)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = report(prep_json)
    assert [r["result"]["cached"] for r in doc["steps"] if r["step"] in ("build_dictionary", "transform_dataset")] \
        == [True, True]
    assert "spark-submit" not in again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "dataset").rglob("*") if p.is_file()} == dataset_files
    with pytest.raises(SystemExit, match="cached"):
        measured_steps(doc, out)


class _StopBeforeSpark(Exception):
    pass


def test_engines_follow_the_spark_master_and_parallel_ingest_runs_spark_one_day_at_a_time(tmp_path, monkeypatch,
                                                                                          capsys):
    """No engine flag: a cluster --spark-master gets Spark for day stats and preprocessing; with --jobs 2 the
    workers validate and this process runs the Spark day_stats steps one at a time (two local JVMs would fight
    over the cores). A local master gets arrow for both."""
    import os
    import time

    from tasks.criteo import ingest, preprocess

    for name in ("RECFLOW_CRITEO_DAY_STATS_ENGINE", "RECFLOW_CRITEO_PREPROCESS_ENGINE", "RECFLOW_SPARK_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    data, cluster = tmp_path / "data", "spark://nowhere.invalid:7077"
    assert cli.main(["--data-root", str(data), "-q", "criteo", "demo-data", "--days", "0-2", "--rows", "300"]) == 0
    real_day_stats, calls = ingest.day_stats, []

    def day_stats_here(settings, day, *, engine=None, **kwargs):  # Spark's stand-in: the same stats, by arrow
        calls.append({"day": day, "engine": engine, "pid": os.getpid(), "start": time.monotonic()})
        result = real_day_stats(settings, day, engine="arrow")
        calls[-1]["end"] = time.monotonic()
        return result

    monkeypatch.setattr(ingest, "day_stats", day_stats_here)
    out = tmp_path / "ingest.json"
    assert cli.main(["--data-root", str(data), "--json", str(out), "criteo", "ingest", "--days", "0-2", "--jobs", "2",
                     "--spark-master", cluster]) == 0
    assert "criteo day stats engine: spark (default with Spark master spark://" in capsys.readouterr().err
    assert [(c["day"], c["engine"], c["pid"]) for c in calls] == [(d, "spark", os.getpid()) for d in range(3)]
    assert all(a["end"] <= b["start"] for a, b in zip(calls, calls[1:]))  # one at a time
    assert [r["step"] for r in report(out)["steps"]] == ["download_day", "validate_day", "day_stats"] * 3
    monkeypatch.setattr(ingest, "day_stats", real_day_stats)

    def spark_dictionary(*args, engine=None, **kwargs):
        assert engine == "spark"
        raise _StopBeforeSpark

    with monkeypatch.context() as patch:
        patch.setattr(preprocess, "build_dictionary", spark_dictionary)
        with pytest.raises(_StopBeforeSpark):
            cli.main(["--data-root", str(data), "criteo", "preprocess", "--train-days", "0-1", "--test-day", "2",
                      "--profile", "demo", "--spark-master", cluster])
    out = tmp_path / "preprocess.json"
    assert cli.main(["--data-root", str(data), "--json", str(out), "criteo", "preprocess", "--train-days", "0-1",
                     "--test-day", "2", "--profile", "demo", "--out", str(tmp_path / "window")]) == 0
    assert "criteo preprocess engine: arrow (default on one machine: Spark master local[*]" in capsys.readouterr().err
    doc = report(out)
    assert [r["engine"] for r in step_results(doc, "build_dictionary") + step_results(doc, "transform_dataset")] == [
        "arrow", "arrow"]
