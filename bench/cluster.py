"""Fixed cost per Spark job on a standalone cluster, next to local[*] (issue #17 §3).

A master and one worker (2 cores, 2 GiB) start on 127.0.0.1 (tests/spark_cluster.py). Three tiny synthetic Criteo
days are validated once; then each repeat runs the three Criteo Spark jobs (day_stats of day 0, dictionary over
days 0-1, transform of days 0-1 + 2) through their task functions on each side:

  local            local[*] with the `local` profile (a developer machine, this repo's tests)
  cluster          the standalone master with the same `local` profile conf: only the master differs
  cluster_profile  the standalone master with the `cluster` profile (600 shuffle partitions, ...): what a
                   deployment runs (docker-compose.yml sets RECFLOW_SPARK_PROFILE=cluster)

On days this small a job's time is its fixed cost: spark-submit's JVM, the driver's session, on a cluster the
executor's launch on the worker (a second JVM) and its Python workers, and the job's stages. Sides are interleaved
(the side that goes first rotates each repeat) and ratios against local are paired repeat by repeat. The cluster's
own start (once per deployment, not per job) is reported apart.

    .venv/bin/python -m bench.cluster [REPEATS]    # prints the result as JSON
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Figure, OtherWork, Stat, load_average, log, paired_ratio
from tasks.core.settings_registry import read

SECTION = "7 Spark on a cluster"
ROWS = 2000
TRAIN_DAYS, TEST_DAY = [0, 1], 2
MEASURED_DAY = 0
JOBS = ("day_stats", "dictionary", "transform")
SIDES = {"local": "local", "cluster": "local", "cluster_profile": "cluster"}  # side -> Spark profile


@contextlib.contextmanager
def _driver_host(address: str) -> Iterator[None]:
    """RECFLOW_SPARK_DRIVER_HOST for the drivers this process submits (the executors reach them there)."""
    saved = read("RECFLOW_SPARK_DRIVER_HOST")
    os.environ["RECFLOW_SPARK_DRIVER_HOST"] = address
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RECFLOW_SPARK_DRIVER_HOST", None)
        else:
            os.environ["RECFLOW_SPARK_DRIVER_HOST"] = saved


def _prepare(base: Path) -> None:
    """Raw + validated days and their stats under `base` (not timed: the arrow engine writes the stats while it
    validates)."""
    from tasks.core.config import Settings
    from tasks.criteo import ingest, layout
    from tasks.criteo.synthetic import write_criteo_day

    settings = Settings(data_root=base)
    for day in [*TRAIN_DAYS, TEST_DAY]:
        write_criteo_day(layout.raw_day(base, day), day, ROWS, seed=1234)
        ingest.validate_day(settings, day, engine="arrow")


def _sample(root: Path, repeat: int, master: str, profile: str) -> dict[str, float]:
    """One run of each job on `root` (a copy of the prepared data root); seconds per job."""
    from tasks.core.config import Settings
    from tasks.criteo import ingest, layout, preprocess

    settings = Settings(data_root=root, spark_profile=profile)
    shutil.rmtree(layout.stats_day(root, MEASURED_DAY))  # day_stats must run its job, not find its output
    out = root / "bench" / f"repeat_{repeat}"
    seconds = {}
    start = time.monotonic()
    result = ingest.day_stats(settings, MEASURED_DAY, engine="spark", spark_master=master)
    seconds["day_stats"] = time.monotonic() - start
    if result["cached"]:
        raise RuntimeError("day_stats found its output instead of running the Spark job")
    start = time.monotonic()
    preprocess.build_dictionary(settings, out / "dictionary", TRAIN_DAYS, TEST_DAY, frequency_threshold=3,
                                spark_master=master)
    seconds["dictionary"] = time.monotonic() - start
    start = time.monotonic()
    preprocess.transform_dataset(settings, out / "dataset", out / "dictionary", TRAIN_DAYS, TEST_DAY,
                                 spark_master=master)
    seconds["transform"] = time.monotonic() - start
    return seconds


def measure(repeats: int, sides: tuple[str, ...] = tuple(SIDES)) -> dict[str, Any]:
    """Start a standalone cluster, run every job `repeats` times on each of `sides` (interleaved; `local` is always
    one); samples, medians and paired ratios against local[*], the cluster's start-up, and what else used the
    machine meanwhile."""
    from tests.spark_cluster import spark_standalone

    if repeats < 1:
        raise ValueError(f"repeats {repeats}: at least 1")
    if "local" not in sides or set(sides) - set(SIDES):
        raise ValueError(f"sides {sides}: 'local' and any of {sorted(SIDES)}")
    profiles = {side: SIDES[side] for side in SIDES if side in sides}
    samples: dict[str, dict[str, list[float]]] = {side: {job: [] for job in JOBS} for side in profiles}
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="recflow-bench-cluster-") as tmp, OtherWork() as other:
        work = Path(tmp)
        _prepare(work / "base")
        roots = {side: work / side for side in profiles}
        for root in roots.values():
            shutil.copytree(work / "base", root)
        started = time.monotonic()
        with spark_standalone(work / "spark", cores=2, memory="2g") as cluster, _driver_host("127.0.0.1"):
            startup_s = time.monotonic() - started
            masters = {"local": "local[*]", "cluster": cluster.master_url, "cluster_profile": cluster.master_url}
            order = list(profiles)
            for repeat in range(repeats):
                for side in order[repeat % len(order):] + order[:repeat % len(order)]:
                    seconds = _sample(roots[side], repeat, masters[side], profiles[side])
                    for job in JOBS:
                        samples[side][job].append(round(seconds[job], 3))
                    log.info("  cluster bench repeat %d %s: %s", repeat + 1, side,
                             ", ".join(f"{job} {seconds[job]:.1f} s" for job in JOBS))
            applications = len(cluster.applications())
    expected_apps = (len(profiles) - 1) * repeats * len(JOBS)  # the cluster sides' jobs, nothing from local
    if applications != expected_apps:
        raise RuntimeError(f"the master ran {applications} applications, expected {expected_apps}")
    return {"rows_per_day": ROWS, "repeats": repeats, "worker": {"cores": 2, "memory": "2g"},
            "profiles": profiles, "cluster_startup_s": round(startup_s, 2), "samples": samples,
            "medians": {side: {job: Stat.of(samples[side][job]).median for job in JOBS} for side in profiles},
            "ratios_vs_local": {side: {job: round(paired_ratio(samples[side][job], samples["local"][job]).median, 3)
                                       for job in JOBS} for side in profiles if side != "local"},
            "load_average": {"before": load_before, "after": load_average()}, "other_work": other.summary()}


def figures(raw: dict[str, Any]) -> list[Figure]:
    """Per job: the cluster's time against local[*]'s (paired), for each cluster side measured."""
    rows = []
    for side, what in (("cluster", "same conf"), ("cluster_profile", "cluster profile")):
        if side not in raw["samples"]:
            continue
        for job in JOBS:
            cluster, local = raw["samples"][side][job], raw["samples"]["local"][job]
            rows.append(Figure(SECTION, f"{job} on a standalone cluster ({what}), {raw['rows_per_day']} rows/day",
                               "s", Stat.of(cluster), "local[*]", Stat.of(local), paired_ratio(cluster, local),
                               "paired", note="fixed cost per job: tiny days"))
    return rows


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
