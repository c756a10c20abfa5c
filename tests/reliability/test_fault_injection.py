"""SIGKILL fault injection (issue #5, item 1): every task type of the two DAGs is killed at a random point, with its
whole process tree (spark-submit's JVM and Python workers, torchrun and its ranks) frozen and killed at once as a
machine or container death would, then retried as Airflow would (a new process, same inputs, same output paths).

After each kill: no reader sees a partial output marked complete (faults.assert_nothing_partial_marked_complete).
After each retry: the retry succeeded and its outputs equal a clean, uninterrupted run's (byte-identical where the
code is deterministic; Spark's parquet as sorted rows; training resumed from the last checkpoint, lost less than one
checkpoint interval of steps, and ended with bit-identical weights).

The clean run of each step is measured first (in the module fixture, which also builds every step's inputs once);
seed k of n kills at a uniform random time inside the k-th of n equal slices of a window of that duration, so the
seeds of a step spread over the step (start-up, work, the final renames) instead of bunching.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.core import layout

from tasks.criteo import layout as criteo_layout
from tasks.criteo.settings import CriteoSettings
from tasks.core.config import Settings
from tasks.core.storage import MANIFEST_NAME
from tests.reliability.fault_child import READY, resolved_run
from tests.reliability.faults import (
    Attempt, StepProcess, assert_manifest_verifies, assert_nothing_partial_marked_complete, env_for, file_digests,
    leftover_temporaries, manifest_content, parquet_rows, run_clean,
)

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

ROWS = 5_000  # rows of each day that goes through Spark
BIG_DAY, BIG_ROWS, BAD_EVERY = 7, 100_000, 9_973  # the downloaded + validated day: 22 MB, three 8 MiB chunks
# One train day: every Spark job costs ~15-25 s of JVM start-up here, and a second train day would add one more
# day_stats run without exercising anything the kill tests look at.
TRAIN_DAYS, TEST_DAY = [0], 1
RUN_ID = "manual__fault_injection"
SPARK = "local[2]"
WHEN = datetime(2026, 1, 12, 6, tzinfo=timezone.utc)  # the publishing run's run_after
PREVIOUS_WHEN = datetime(2026, 1, 5, 6, tzinfo=timezone.utc)
CHECKPOINT_EVERY = 10
# The criteo_dlrm DAG's params (defaults) with a tiny model: 4 epochs x 19 steps of 256 rows, a checkpoint every
# 10 steps, a progress line every step (so the test knows which step a kill interrupted).
PARAMS = {
    "train_days": "0", "test_day": TEST_DAY, "window_days": 2, "frequency_threshold": 3, "threshold_overrides": "",
    "dictionary_days": "train", "bottom_mlp": "64,32", "top_mlp": "128,64,1", "batch_size": 256, "lr": 0.5,
    "epochs": 4, "warmup_steps": 5, "decay_start_step": 50, "decay_steps": 20, "limit_train_batches": None,
    "checkpoint_every_steps": CHECKPOINT_EVERY, "log_every_steps": 1, "seed": 12345, "nproc": 1, "device": "cpu",
    "amp": False, "min_auc": 0.6, "max_regression": 0.005, "model_name": "criteo_dlrm", "publish_uri": None,
    "aws_conn_id": "aws_default",
}
# Two seeds for each step that costs seconds a try (a process start, a JVM, torch), three where a try is nearly free.
SEEDS = {"download": (1, 2, 3), "validate": (1, 2), "day_stats": (1, 2), "dictionary": (1, 2),
         "transform": (1, 2), "train": (1, 2), "evaluate": (1, 2), "publish": (1, 2, 3), "publish_s3": (1, 2)}
# Kill window as fractions of the clean duration, measured from the anchor line. Spark jobs are anchored at the
# job's first log line and training at the trainer's (JVM / torch start-up would otherwise take most kills, and
# nothing is written then); everything else at READY (the step function's call).
WINDOW = {"train": (0.02, 0.9), "day_stats": (0.02, 0.9), "dictionary": (0.02, 0.9), "transform": (0.02, 0.9)}
DEFAULT_WINDOW = (0.02, 0.85)
ANCHOR = {"train": r"\[rank 0\] training \d+ steps", "day_stats": r" INFO \[day_stats day=",
          "dictionary": r" INFO \[dictionary days=", "transform": r" INFO \[transform train_days="}
# A kill that comes after the attempt finished is retried (kill_step): CI failed once when a 1 s S3 publish got
# faster on each of three attempts (4.0 -> 2.6 -> 1.6 -> 1.0 s) and outran every kill.
KILL_TRIES, MISS_SHRINK = 5, 0.7
STEP_LINE = re.compile(r"\[rank 0\] step (\d+)/(\d+) ")
CHECKPOINT_LINE = re.compile(r"\[rank 0\] checkpoint step (\d+) ")
RESUMED_LINE = re.compile(r"\[rank 0\] resumed from step (\d+) ")


@dataclass
class Golden:
    """The clean pipeline: each step's inputs (a copy of the data root taken before it) and its clean attempt."""

    base: Path
    source_template: str
    before: dict[str, Path] = field(default_factory=dict)  # step -> data root snapshot taken before the step ran
    clean: dict[str, Attempt] = field(default_factory=dict)
    root: Path | None = None  # the pipeline's data root after every step (day 0/1, run RUN_ID)
    ingest_root: Path | None = None  # the big day's data root after download + validate

    def spec(self, step: str) -> dict:
        if step in ("download", "validate"):
            return {"day": BIG_DAY}
        if step == "day_stats":
            return {"day": TRAIN_DAYS[0], "spark_master": SPARK}
        spec = {"run_id": RUN_ID, "train_days": TRAIN_DAYS, "test_day": TEST_DAY, "params": PARAMS,
                "spark_master": SPARK}
        if step == "publish":
            spec |= {"when": WHEN.isoformat(), "metrics": self.clean["evaluate"].result}
        return spec


def write_big_day(path: Path) -> int:
    """BIG_ROWS synthetic rows with a malformed label every BAD_EVERY rows (quarantined, under the 0.1% budget)."""
    from tasks.criteo.synthetic import CriteoDayGenerator, write_criteo_day

    write_criteo_day(path, BIG_DAY, BIG_ROWS, generator=CriteoDayGenerator(seed=17))
    lines = path.read_bytes().split(b"\n")
    for i in range(BAD_EVERY, len(lines) - 1, BAD_EVERY):
        lines[i] = b"2" + lines[i][1:]
    path.write_bytes(b"\n".join(lines))
    return len(range(BAD_EVERY, len(lines) - 1, BAD_EVERY))


def snapshot(golden: Golden, step: str, root: Path) -> None:
    golden.before[step] = golden.base / "before" / step
    shutil.copytree(root, golden.before[step], symlinks=True)


# day_stats, dictionary and transform are killed inside their Spark jobs: the spark engine, pinned (on a local master
# the default is arrow; with it validate writes the stats, and test_validate_killed_then_retried covers killing that).
STEP_ENV = {"day_stats": {"RECFLOW_CRITEO_DAY_STATS_ENGINE": "spark"},
            "dictionary": {"RECFLOW_CRITEO_PREPROCESS_ENGINE": "spark"},
            "transform": {"RECFLOW_CRITEO_PREPROCESS_ENGINE": "spark"}}


def step_env(golden: Golden, step: str, root: Path) -> dict[str, str]:
    return env_for(root, golden.source_template, STEP_ENV.get(step))


def clean_step(golden: Golden, step: str, root: Path, spec: dict | None = None) -> Attempt:
    snapshot(golden, step, root)
    attempt = run_clean(step, spec or golden.spec(step), step_env(golden, step, root), timeout=600)
    golden.clean[step] = attempt
    print(f"[clean] {step}: {attempt.seconds:.2f} s")
    return attempt


@pytest.fixture(scope="module")
def http_source(tmp_path_factory):
    """The day files behind a local HTTP server with Range support (the real source is HTTP(S))."""
    from tests.http_range_server import start_range_server
    from tasks.criteo.synthetic import ensure_days

    source = tmp_path_factory.mktemp("source")
    ensure_days(source, [*TRAIN_DAYS, TEST_DAY], ROWS, seed=11)
    bad = write_big_day(source / f"day_{BIG_DAY}")
    server, base_url = start_range_server(source)
    try:
        yield source, base_url + "/day_{day}", server, bad
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def golden(tmp_path_factory, http_source) -> Golden:
    """Every step run once, cleanly, in the order of the DAGs; the data root copied before each measured step."""
    from tasks.criteo.dlrm import SPEC, export
    from tasks.criteo.ingest import day_stats, download_day, validate_day

    _, template, _, _ = http_source
    golden = Golden(base=tmp_path_factory.mktemp("golden"), source_template=template)
    golden.ingest_root = golden.base / "ingest"
    golden.ingest_root.mkdir(parents=True)
    clean_step(golden, "download", golden.ingest_root)
    clean_step(golden, "validate", golden.ingest_root)

    root = golden.root = golden.base / "pipeline"
    settings = Settings(data_root=root)
    criteo = CriteoSettings(source=template)
    for day in [*TRAIN_DAYS, TEST_DAY]:  # the unmeasured ingest steps run in-process: no interpreter start-ups
        download_day(settings, day, criteo=criteo)
        # The train day's stats come from the measured day_stats step (Spark); the test day's are written by the
        # arrow validation, which saves a spark-submit and gives the transform the same bytes
        # (tests/test_day_stats_spark.py::test_transform_is_byte_identical_from_either_engines_stats).
        validate_day(settings, day, engine="arrow" if day == TEST_DAY else "spark")
    assert day_stats(settings, TEST_DAY, engine="spark", spark_master=SPARK)["cached"]
    clean_step(golden, "day_stats", root)
    for step in ("dictionary", "transform", "train", "evaluate"):
        clean_step(golden, step, root)
    run = resolved_run({"train_days": TRAIN_DAYS, "test_day": TEST_DAY, "params": PARAMS})
    export(settings, RUN_ID, run)  # the serving export a version publishes (unmeasured: it only reads model.pt)
    # The DAG's gate registers the run; an older version is already published, so `latest` exists before the kill.
    metrics = golden.clean["evaluate"].result
    assert SPEC.gate(settings, RUN_ID, metrics, run, model_name="criteo_dlrm", registry_conn_id=None)["passed"]
    shutil.copytree(run_dir(root), layout.run_dir(root, "criteo_dlrm", "previous"))
    SPEC.gate(settings, "previous", metrics, run, model_name="criteo_dlrm", registry_conn_id=None)
    SPEC.publish(settings, "previous", PREVIOUS_WHEN, metrics, {"run_id": "previous"}, run=run, model_name="criteo_dlrm",
            registry_conn_id=None)
    clean_step(golden, "publish", root)
    return golden


def seed_root(golden: Golden, tmp_path: Path, step: str) -> Path:
    """This seed's data root: a copy of the clean pipeline's state before the step."""
    root = tmp_path / "root"
    shutil.copytree(golden.before[step], root, symlinks=True)
    return root


def kill_fraction(step: str, seed: int) -> float:
    """Seed k of n: uniform in the k-th of n equal slices of the step's kill window (seeded by step and seed)."""
    lo, hi = WINDOW.get(step, DEFAULT_WINDOW)
    seeds = SEEDS[step]
    k, n = seeds.index(seed), len(seeds)
    width = (hi - lo) / n
    return random.Random(f"{step}/{seed}").uniform(lo + k * width, lo + (k + 1) * width)


def kill_step(golden: Golden, step: str, seed: int, root: Path, *, clean_key: str | None = None,
              spec: dict | None = None, env: dict | None = None, reset=None) -> Attempt:
    """Run the step in a child and kill its whole tree at the seed's point; then check the reader's invariant.

    On this shared machine a step's duration varies a lot with the load, and short steps (publish: ~1 s) get faster
    with every attempt as caches warm: if an attempt finishes before its kill, the pre-step state is restored
    (`reset`, default: the data root from the snapshot) and the kill is tried again at the same fraction of
    MISS_SHRINK x the duration the finished attempt actually took (at most KILL_TRIES attempts in all).
    """
    clean = golden.clean[clean_key or step]
    anchor = ANCHOR.get(step, re.escape(READY))
    fraction = kill_fraction(clean_key or step, seed)
    span = clean.ended - clean.time_of(anchor)
    for tries in range(KILL_TRIES):
        child = StepProcess(step, spec or golden.spec(step), env or step_env(golden, step, root))
        started = child.wait_for_line(anchor, timeout=300)
        killed = child.kill_at(started + fraction * span)
        if killed.killed_pids:
            break
        print(f"[kill] {clean_key or step} seed {seed}: finished {killed.ended - started:.2f} s after the anchor, "
              f"before the kill at {fraction:.2f} x {span:.2f} s: again, at that fraction of {MISS_SHRINK} x "
              "its duration")
        span = MISS_SHRINK * (killed.ended - started)
        if reset is not None:
            spec, env = reset(tries)
        else:
            shutil.rmtree(root)
            shutil.copytree(golden.before[step], root, symlinks=True)
    print(f"[kill] {clean_key or step} seed {seed}: {fraction:.2f} x {span:.2f} s after the anchor, "
          f"{len(killed.killed_pids)} processes; temporaries left: {leftover_temporaries(root)}")
    assert killed.killed_pids, "every attempt finished before its kill"
    assert_nothing_partial_marked_complete(root)
    return killed


def retry(golden: Golden, step: str, root: Path, spec: dict | None = None, env: dict | None = None) -> Attempt:
    attempt = run_clean(step, spec or golden.spec(step), env or step_env(golden, step, root), timeout=600)
    assert_nothing_partial_marked_complete(root)
    return attempt


def normalised_manifest(directory: Path, root: Path) -> dict:
    """The manifest without its timestamp, with the data root's path replaced (Spark jobs record input paths)."""
    text = json.dumps(manifest_content(directory)).replace(str(root), "<root>")
    return json.loads(text)


def assert_complete_or_absent(out: Path) -> None:
    """An output directory is either absent or complete: it only ever appears by a rename, manifest included."""
    if out.exists():
        assert (out / MANIFEST_NAME).is_file(), f"{out} is visible without a manifest"
        assert_manifest_verifies(out)


def killed_then_retried(golden: Golden, tmp_path: Path, step: str, seed: int,
                        output: Callable[[Path], Path]) -> tuple[Path, Path, Path, Attempt]:
    """Kill `step` at the seed's point in a fresh root, check its output is complete or absent, retry it.
    Returns (output, the clean run's output, the root, the retry)."""
    root = seed_root(golden, tmp_path, step)
    out = output(root)
    kill_step(golden, step, seed, root)
    assert_complete_or_absent(out)
    attempt = retry(golden, step, root)
    return out, output(golden.root), root, attempt


def assert_same_manifest_but_file_list(out: Path, root: Path, clean_out: Path, clean_root: Path) -> None:
    """Manifests equal but for the file list (Spark names its part files at random)."""
    got, want = normalised_manifest(out, root), normalised_manifest(clean_out, clean_root)
    assert {k: v for k, v in got.items() if k != "files"} == {k: v for k, v in want.items() if k != "files"}


# ---- criteo_ingest ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS["download"])
def test_download_killed_then_retried(golden, http_source, tmp_path, seed):
    source, _, server, _ = http_source
    root = seed_root(golden, tmp_path, "download")
    raw = criteo_layout.raw_day(root, BIG_DAY)
    expected = (source / f"day_{BIG_DAY}").read_bytes()
    kill_step(golden, "download", seed, root)
    # The final name appears only complete (rename), and the sidecar only after it.
    if raw.exists():
        assert raw.read_bytes() == expected, "a partial download is visible under the final name"
    part = raw.with_name(raw.name + ".part")
    left = part.stat().st_size if part.exists() else 0
    assert expected.startswith(part.read_bytes() if part.exists() else b""), ".part holds bytes not from the source"

    sidecar = raw.name + ".download.json"
    finished = (raw.parent / sidecar).exists()  # the kill landed after the attempt completed
    requests_before = len(server.requests)
    attempt = retry(golden, "download", root)
    assert raw.read_bytes() == expected
    assert not part.exists()
    clean_root = golden.before["validate"]
    assert (raw.parent / sidecar).read_bytes() == (criteo_layout.raw_day(clean_root, BIG_DAY).parent / sidecar
                                                  ).read_bytes()
    # A completed attempt's retry is a verified cache hit; otherwise it downloads (or resumes) like a clean run.
    assert attempt.result["cached"] is finished
    assert {k: v for k, v in attempt.result.items() if k not in ("seconds", "cached")} == {
        k: (v.replace(str(golden.ingest_root), str(root)) if k == "path" else v)
        for k, v in golden.clean["download"].result.items() if k not in ("seconds", "cached")}
    if 0 < left < len(expected):  # the retry resumed the killed attempt's .part instead of starting over
        assert attempt.matches(rf"resuming \S+ from byte {left}\b"), attempt.tail()
        assert server.requests[requests_before:][0][1] == f"bytes={left}-"
    print(f"[retry] download seed {seed}: .part held {left} of {len(expected)} bytes after the kill")


@pytest.mark.parametrize("seed", SEEDS["validate"])
def test_validate_killed_then_retried(golden, http_source, tmp_path, seed):
    *_, bad_rows = http_source
    root = seed_root(golden, tmp_path, "validate")
    out = criteo_layout.validated_day(root, BIG_DAY)
    kill_step(golden, "validate", seed, root)
    assert_complete_or_absent(out)

    attempt = retry(golden, "validate", root)
    clean_out = criteo_layout.validated_day(golden.ingest_root, BIG_DAY)
    assert attempt.result["bad"] == bad_rows and attempt.result["good"] == BIG_ROWS - bad_rows
    assert (out / "quarantine.jsonl").read_bytes() == (clean_out / "quarantine.jsonl").read_bytes()
    assert report_content(out) == report_content(clean_out)
    got, want = normalised_manifest(out, root), normalised_manifest(clean_out, golden.ingest_root)
    got["files"].pop("report.json"), want["files"].pop("report.json")
    assert got == want
    # The day stats validate wrote in the same pass (arrow engine): complete, and byte for byte the clean run's.
    stats, clean_stats = criteo_layout.stats_day(root, BIG_DAY), criteo_layout.stats_day(golden.ingest_root, BIG_DAY)
    assert manifest_content(stats)["rows"] == {"good": BIG_ROWS - bad_rows}
    assert normalised_manifest(stats, root) == normalised_manifest(clean_stats, golden.ingest_root)
    # (its manifest lists sizes only, docs/ARCHITECTURE.md "Manifests": the bytes are compared here)
    assert file_digests(stats, exclude=(MANIFEST_NAME,)) == file_digests(clean_stats, exclude=(MANIFEST_NAME,))


def report_content(directory: Path) -> dict:
    """report.json without what differs run to run: duration, absolute path, GX's expectation ids and load time."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("seconds", "file", "id", "ge_load_time")}
        return [strip(v) for v in value] if isinstance(value, list) else value

    return strip(json.loads((directory / "report.json").read_text()))


@pytest.mark.spark
@pytest.mark.parametrize("seed", SEEDS["day_stats"])
def test_day_stats_killed_then_retried(golden, tmp_path, seed):
    out, clean_out, root, attempt = killed_then_retried(
        golden, tmp_path, "day_stats", seed, lambda root: criteo_layout.stats_day(root, TRAIN_DAYS[0]))
    assert attempt.result["rows"] == ROWS
    for part in ("columnar", "counts"):
        assert parquet_rows(out / part).equals(parquet_rows(clean_out / part)), part
    assert_same_manifest_but_file_list(out, root, clean_out, golden.root)


# ---- criteo_dlrm: preprocessing -----------------------------------------------------------------------------------


def run_dir(root: Path) -> Path:
    return layout.run_dir(root, "criteo_dlrm", RUN_ID)


@pytest.mark.spark
@pytest.mark.parametrize("seed", SEEDS["dictionary"])
def test_dictionary_killed_then_retried(golden, tmp_path, seed):
    out, clean_out, root, _ = killed_then_retried(golden, tmp_path, "dictionary", seed,
                                                  lambda root: run_dir(root) / "dictionary")
    for name in ("cardinalities.json", "model_size.json"):
        assert (out / name).read_bytes() == (clean_out / name).read_bytes(), name
    # Ids are assigned by (count desc, value): the same rows whatever the partitioning; files are Spark-named.
    assert parquet_rows(out / "dictionary").equals(parquet_rows(clean_out / "dictionary"))
    assert_same_manifest_but_file_list(out, root, clean_out, golden.root)


@pytest.mark.spark
@pytest.mark.parametrize("seed", SEEDS["transform"])
def test_transform_killed_then_retried(golden, tmp_path, seed):
    out, clean_out, root, _ = killed_then_retried(golden, tmp_path, "transform", seed,
                                                  lambda root: run_dir(root) / "dataset")
    # The split-binary files and the FeatureSpec are written in order by the driver: byte-identical.
    digests = file_digests(out, exclude=(re.escape(MANIFEST_NAME),))
    assert digests == file_digests(clean_out, exclude=(re.escape(MANIFEST_NAME),))
    assert {"feature_spec.yaml", "train/label.bin", "test/cat_25.bin", "validation/numerical.bin"} <= set(digests)
    assert normalised_manifest(out, root) == normalised_manifest(clean_out, golden.root)


# ---- criteo_dlrm: training, evaluation, publishing ----------------------------------------------------------------


def checkpoint_steps(train_dir: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in (train_dir / "checkpoints").glob("step_*.pt"))


def train_records(train_dir: Path) -> list[dict]:
    """train_log.jsonl without throughput (timing); losses, lrs and eval metrics must be reproduced exactly."""
    lines = (train_dir / "train_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "samples_per_second"} for line in lines]


@pytest.mark.parametrize("seed", SEEDS["train"])
def test_train_killed_resumes_from_last_checkpoint(golden, tmp_path, seed):
    from models.torchkit.checkpoint import latest_checkpoint

    root = seed_root(golden, tmp_path, "train")
    train_dir = run_dir(root) / "train"
    killed = kill_step(golden, "train", seed, root)
    seen = max((int(m.group(1)) for m in killed.matches(STEP_LINE.pattern)), default=0)
    saved = max((int(m.group(1)) for m in killed.matches(CHECKPOINT_LINE.pattern)), default=0)
    latest = latest_checkpoint(train_dir / "checkpoints")
    on_disk = int(latest.stem.removeprefix("step_")) if latest else 0
    # Every checkpoint the trainer announced is on disk, and the newest one is at most one interval behind the
    # newest step the trainer reported before it died (step N's line is printed before checkpoint N is written).
    assert on_disk >= saved and on_disk >= max(seen - 1, 0) // CHECKPOINT_EVERY * CHECKPOINT_EVERY, (
        seen, saved, on_disk)
    finished = (train_dir / MANIFEST_NAME).is_file()

    attempt = retry(golden, "train", root)
    clean = golden.clean["train"].result["metrics"]
    metrics = attempt.result["metrics"]
    resumed = [int(m.group(1)) for m in attempt.matches(RESUMED_LINE.pattern)]
    if finished:
        assert "already finished" in attempt.text and not resumed
    elif on_disk:
        assert resumed == [on_disk], attempt.tail()
        assert metrics["resumed_from_step"] == on_disk
        lost = max(seen - on_disk, 0)
        assert lost <= CHECKPOINT_EVERY, f"the retry redid {lost} steps"
        # The first step the retry trains is the one after the checkpoint.
        first = min(int(m.group(1)) for m in attempt.matches(STEP_LINE.pattern)) if on_disk < clean["steps"] else None
        assert first in (None, on_disk + 1)
    else:
        assert not resumed and metrics["resumed_from_step"] is None
        assert seen <= CHECKPOINT_EVERY
    print(f"[retry] train seed {seed}: killed after step {seen} (checkpoint {on_disk} on disk), "
          f"retry resumed from {resumed or 'scratch'}{' (already finished)' if finished else ''}")
    # RNG states, optimizer and scheduler are in the checkpoint and the batch order is a function of (seed, epoch):
    # a resumed run is bit-identical to an uninterrupted one.
    for key in ("steps", "weights_sha256", "final_train_loss"):  # the test rows are scored by evaluate (below)
        assert metrics[key] == clean[key], key
    assert train_records(train_dir) == train_records(run_dir(golden.root) / "train")
    assert checkpoint_steps(train_dir) == checkpoint_steps(run_dir(golden.root) / "train")


@pytest.mark.parametrize("seed", SEEDS["evaluate"])
def test_evaluate_killed_then_retried(golden, tmp_path, seed):
    root = seed_root(golden, tmp_path, "evaluate")
    metrics_path = run_dir(root) / "eval" / "metrics.json"
    clean = json.loads((run_dir(golden.root) / "eval" / "metrics.json").read_text())
    volatile = ("seconds", "read_batches_per_second", "read_megabytes_per_second", "model_path")

    def content(path: Path) -> dict:
        return {k: v for k, v in json.loads(path.read_text()).items() if k not in volatile}

    kill_step(golden, "evaluate", seed, root)
    if metrics_path.exists():  # written by rename: complete, and the same as the clean run's
        assert content(metrics_path) == {k: v for k, v in clean.items() if k not in volatile}

    attempt = retry(golden, "evaluate", root)
    assert attempt.result == golden.clean["evaluate"].result
    assert content(metrics_path) == {k: v for k, v in clean.items() if k not in volatile}


def store_state(store_uri: str, s3_client=None) -> dict:
    """What a consumer sees: latest (the pointer or the newest committed version) and every committed version,
    each verified file by file against its manifest through the consumer API."""
    from tasks.release.artifact_store import open_store
    from tasks.release.publish import _committed_versions, _read_manifest, fetch_published_file, latest_version

    store = open_store(store_uri, s3_client)
    latest = latest_version(store_uri, "criteo_dlrm", s3_client)
    committed = _committed_versions(store, "criteo_dlrm")
    files = {}
    with tempfile.TemporaryDirectory() as scratch:
        for version in committed:
            manifest = _read_manifest(store, "criteo_dlrm", version)
            files[version] = manifest["files"]
            for name in manifest["files"]:  # raises unless the object matches its manifest entry
                fetch_published_file(store_uri, "criteo_dlrm", version, name, Path(scratch) / version / name,
                                     s3_client)
    assert latest is None or latest["version"] in committed
    lineage = store.get_bytes(f"criteo_dlrm/versions/{committed[-1]}/lineage.json") if committed else None
    return {"latest": latest and latest["version"], "committed": committed, "files": files, "lineage": lineage}


def registry_latest(root: Path) -> str | None:
    from tasks.release.registry import Registry

    with Registry("sqlite:///" + str(root / "registry.db")) as registry:
        alias = registry.alias("criteo_dlrm")
    return alias and alias["version"]


def check_killed_latest(root: Path, killed_state: dict) -> None:
    """After a kill, the registry names the previous version or one the store holds complete: it records and
    promotes a version before the store's latest.json moves to it (tasks.release.steps.publish), so a kill between
    the two leaves the registry one ahead, never the store's pointer."""
    registry = registry_latest(root)
    assert registry in (make_previous(), *killed_state["committed"]), (registry, killed_state)
    if killed_state["latest"] != make_previous():
        assert registry == killed_state["latest"], (registry, killed_state)


def check_publish(golden: Golden, root: Path, store_uri: str, killed_state: dict, final_state: dict) -> None:
    from tasks.release.publish import make_version

    version, previous = make_version(WHEN, RUN_ID), make_version(PREVIOUS_WHEN, "previous")
    # After the kill: latest is the previous version, or the new one only if the new one is complete.
    assert killed_state["latest"] in (previous, version)
    assert set(killed_state["committed"]) <= {previous, version}
    clean_version = golden.root / "published" / "criteo_dlrm" / "versions" / version
    clean_files = without_lineage(json.loads((clean_version / MANIFEST_NAME).read_text())["files"])
    if version in killed_state["committed"]:
        assert without_lineage(killed_state["files"][version]) == clean_files
    # After the retry: the new version is latest in the store and in the registry, with the clean publish's files.
    assert final_state["latest"] == version and final_state["committed"] == [previous, version]
    assert without_lineage(final_state["files"][version]) == clean_files
    assert lineage_content(final_state["lineage"]) == lineage_content((clean_version / "lineage.json").read_bytes())
    assert registry_latest(root) == version


def without_lineage(files: dict) -> dict:
    return {name: entry for name, entry in files.items() if name != "lineage.json"}


def lineage_content(raw: bytes) -> dict:
    """lineage.json without the git commit: this checkout is shared, a commit between two publishes changes it (the
    publisher leaves lineage out of its same-content check for the same reason)."""
    return {k: v for k, v in json.loads(raw).items() if k != "code_version"}


@pytest.mark.parametrize("seed", SEEDS["publish"])
def test_publish_killed_then_retried(golden, tmp_path, seed):
    root = seed_root(golden, tmp_path, "publish")
    store = str(root / "published")
    kill_step(golden, "publish", seed, root)
    killed_state = store_state(store)
    check_killed_latest(root, killed_state)

    attempt = retry(golden, "publish", root)
    check_publish(golden, root, store, killed_state, store_state(store))
    assert attempt.result["version"] == golden.clean["publish"].result["version"]
    clean_dir = golden.root / "published" / "criteo_dlrm" / "versions" / attempt.result["version"]
    new_dir = root / "published" / "criteo_dlrm" / "versions" / attempt.result["version"]
    unchanged = (re.escape(MANIFEST_NAME), "lineage.json")
    assert file_digests(new_dir, unchanged) == file_digests(clean_dir, unchanged)


def make_previous() -> str:
    from tasks.release.publish import make_version

    return make_version(PREVIOUS_WHEN, "previous")


S3_STORES = "s3://faults"  # the bucket the S3 publish cases use, allowed as a publish store (RECFLOW_PUBLISH_ALLOWED)


@pytest.fixture(scope="module")
def s3_publish(golden, s3_server, tmp_path_factory):
    """The publish step against moto's S3: a bucket holding the previous version, and a clean timed publish."""
    from tasks.release.publish import publish_model

    client = s3_server.client()
    client.create_bucket(Bucket="faults")
    previous_dir = golden.root / "published" / "criteo_dlrm" / "versions" / make_previous()
    files = {p.relative_to(previous_dir).as_posix(): p for p in previous_dir.rglob("*")
             if p.is_file() and p.name not in (MANIFEST_NAME, "metrics.json", "lineage.json")
             and not p.name.startswith(".lock-")}
    metrics = golden.clean["evaluate"].result

    def prepare(prefix: str) -> str:
        uri = f"s3://faults/{prefix}"
        publish_model(uri, "criteo_dlrm", make_previous(), files, metrics, {"run_id": "previous"}, s3_client=client,
                      allowed_stores=[S3_STORES])
        return uri

    clean_root = tmp_path_factory.mktemp("s3clean") / "root"
    shutil.copytree(golden.before["publish"], clean_root, symlinks=True)
    uri = prepare("clean")
    env = env_for(clean_root, golden.source_template, s3_server.env() | {"RECFLOW_PUBLISH_ALLOWED": S3_STORES})
    golden.clean["publish_s3"] = run_clean("publish", golden.spec("publish") | {"publish_uri": uri}, env)
    return prepare, client, s3_server


@pytest.mark.parametrize("seed", SEEDS["publish_s3"])
def test_publish_to_s3_killed_then_retried(golden, s3_publish, tmp_path, seed):
    prepare, client, server = s3_publish
    root = seed_root(golden, tmp_path, "publish")
    env = env_for(root, golden.source_template, server.env() | {"RECFLOW_PUBLISH_ALLOWED": S3_STORES})

    current = {}

    def fresh(tries: int = -1) -> tuple[dict, dict]:
        """A new prefix holding only the previous version, and the data root as before the step."""
        if tries >= 0:
            shutil.rmtree(root)
            shutil.copytree(golden.before["publish"], root, symlinks=True)
        current["spec"] = golden.spec("publish") | {"publish_uri": prepare(f"seed-{seed}-{tries + 1}")}
        return current["spec"], env

    kill_step(golden, "publish", seed, root, clean_key="publish_s3", spec=fresh()[0], env=env, reset=fresh)
    spec = current["spec"]
    uri = spec["publish_uri"]
    killed_state = store_state(uri, client)
    check_killed_latest(root, killed_state)

    retry(golden, "publish", root, spec=spec, env=env)
    check_publish(golden, root, uri, killed_state, store_state(uri, client))
