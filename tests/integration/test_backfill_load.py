"""Load: a 24-day criteo_ingest backfill under a real scheduler (LocalExecutor on PostgreSQL) with the configured
pools, the whole Airflow process tree's memory sampled throughout.

What it proves: every one of the 24 runs succeeds on its first try (no task starved, none failed or retried), the
`spark` pool is never oversubscribed (at most its slots of day_stats run at once), no more task processes run than
`parallelism`, and peak memory stays bounded and does not grow with the number of days processed (the second half
of the backfill peaks no higher than the first, within a margin). As an operator would, the test unpauses the DAG
(Airflow 3 starts no backfill run of a paused DAG) and backfills the history: the epoch is set 24 days back, so the
scheduled run that unpausing creates (catchup=False: the latest interval only) is day 23 and the backfill creates
days 0-22 around it (it skips dates that already have a run). Days are tiny (ROWS rows): at this size each
day costs one spark-submit (~15-30 s of JVM start-up on 2 cores), so the test is ~10-15 min of wall time and is
marked `integration` (CI runs it) and `reliability` (issue #5, item 5). The measured figures are printed as one
`LOAD TEST` JSON line (run with `-s` to see it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest
from airflow_client.client import PoolApi

from bench.proc import process_tree, rss_by_name
from scripts.airflow_api import AirflowApi
from tasks.criteo import layout as criteo_layout
from tasks.core.storage import read_manifest
from tasks.criteo.synthetic import CriteoDayGenerator, write_criteo_day
from tests.integration.airflow_cluster import AirflowCluster, airflow_cluster

pytestmark = [pytest.mark.integration, pytest.mark.reliability, pytest.mark.slow]

INGEST = "criteo_ingest"
DAYS, ROWS = 24, 1000
# Day 0 is 24 days before today (UTC), so yesterday's interval, the one unpausing schedules, is day 23.
EPOCH = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None) - timedelta(DAYS)
SPARE_DAYS = 2  # source days past 23, in case midnight passes during the test and a new interval is scheduled
PEAK_BOUND_MB = 6144  # the machine has 24 GiB; a backfill on the default pools must stay far below it
GROWTH_MARGIN = 1.3   # second-half peak vs first-half peak


class TreeMemory:
    """Sums the RSS of every process under the given roots every `interval` seconds, in a thread."""

    def __init__(self, roots: list[int], interval: float = 0.5) -> None:
        self.roots, self.interval = roots, interval
        self.samples: list[tuple[float, float, int]] = []  # (monotonic time, MB, processes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def sample(self) -> tuple[float, int]:
        """(MB, processes) now, measured as the benchmarks measure a tree (bench.proc: a child caught between
        vfork and exec, which shares its parent's memory, is not counted twice)."""
        total, count = 0, 0
        for root in self.roots:
            try:
                tree = process_tree(psutil.Process(root))
            except psutil.NoSuchProcess:
                continue
            total += sum(rss_by_name(tree).values())
            count += len(tree)
        return total / 2**20, count

    def _run(self) -> None:
        while not self._stop.is_set():
            mb, count = self.sample()
            self.samples.append((time.monotonic(), mb, count))
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        return max((mb for t, mb, _ in self.samples if start <= t <= end), default=0.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[AirflowCluster]:
    work = tmp_path_factory.mktemp("airflow_load")
    data, source = work / "data", work / "data" / "source"
    generator = CriteoDayGenerator(seed=23)
    for day in range(DAYS + SPARE_DAYS):
        write_criteo_day(source / f"day_{day}", day, ROWS, generator=generator)
    env = {"RECFLOW_DATA_ROOT": str(data), "RECFLOW_CRITEO_SOURCE": source.as_uri() + "/day_{day}",
           "RECFLOW_CRITEO_EPOCH": EPOCH.date().isoformat(),
           "RECFLOW_RETRY_DELAY_S": "1", "RECFLOW_RETRAIN_CRON": "0 6 1 1 *"}
    # Only criteo_ingest is waited for; criteo_dlrm stays paused (as created), so asset events start no training.
    with airflow_cluster(work, env, dag_ids=(INGEST,)) as running:
        yield running


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_backfill_of_24_days_completes_within_pools_and_bounded_memory(cluster: AirflowCluster) -> None:
    api: AirflowApi = cluster.api()
    slots = PoolApi(api.client).get_pool("spark").slots
    parallelism = int(cluster.env["AIRFLOW__CORE__PARALLELISM"])
    last = EPOCH + timedelta(days=DAYS - 1)
    roots = [proc.pid for proc in cluster.processes.values()]
    with TreeMemory(roots) as memory:
        time.sleep(2)
        idle_mb = memory.peak()
        started = time.monotonic()
        api.set_paused(INGEST, False)
        cluster.wait_until(lambda: api.runs(INGEST, run_type="scheduled"), 120, "the scheduled run of the latest day")
        cluster.airflow("backfill", "create", "--dag-id", INGEST, "--from-date", EPOCH.date().isoformat(),
                        "--to-date", last.date().isoformat())

        def completed() -> list[dict] | None:
            backfills = api.backfills(INGEST)
            runs = api.runs(INGEST)
            done = backfills and backfills[-1]["completed_at"] and all(
                r["state"] in ("success", "failed") for r in runs)
            return runs if done else None

        runs = cluster.wait_until(completed, 45 * 60, f"the {DAYS}-day backfill of {INGEST} to complete", poll=5.0)
        finished = time.monotonic()
        wall = finished - started
    runs = sorted(runs, key=lambda r: r["logical_date"])
    days = [(_ts(r["logical_date"]).replace(tzinfo=None) - EPOCH).days for r in runs]
    assert days[:DAYS] == list(range(DAYS)), days
    assert {r["run_type"] for r in runs} == {"backfill", "scheduled"}
    tis = [ti for run in runs for ti in api.task_instances(INGEST, run["dag_run_id"])]
    # retrain_gate (a teardown) skips in every run but the last to finish, which triggers the one retrain.
    ok_states = {"success", "skipped"}
    not_ok = [(ti["dag_run_id"], ti["task_id"], ti["state"], ti["try_number"]) for ti in tis
              if ti["state"] not in (ok_states if ti["task_id"] == "retrain_gate" else {"success"})
              or ti["try_number"] != 1]
    assert not_ok == [], f"failed, retried or unfinished tasks: {not_ok}\n{cluster.service_log_tails(20)}"
    assert len(tis) == 4 * len(runs)
    retrains = api.runs("criteo_dlrm")
    assert [r["dag_run_id"] for r in retrains] == [f"retrain__test_{DAYS - 1}__train_{DAYS - 3}-{DAYS - 2}"], retrains
    root = Path(cluster.env["RECFLOW_DATA_ROOT"])
    for day in range(DAYS):
        assert read_manifest(criteo_layout.stats_day(root, day))["rows"]["good"] == ROWS, f"day {day}"

    spark = [(_ts(ti["start_date"]), _ts(ti["end_date"])) for ti in tis if ti["task_id"] == "day_stats"]
    every = [(_ts(ti["start_date"]), _ts(ti["end_date"])) for ti in tis]
    spark_overlap, task_overlap = _max_overlap(spark), _max_overlap(every)
    assert spark_overlap <= slots, f"{spark_overlap} day_stats ran at once; the spark pool has {slots} slot(s)"
    assert task_overlap <= parallelism, f"{task_overlap} tasks ran at once; parallelism is {parallelism}"
    waits = [(_ts(ti["start_date"]) - _ts(ti["queued_when"])).total_seconds() for ti in tis if ti["queued_when"]]

    # Runs go through in date order at a steady pace, so the halves of the wall time are ~12 days each.
    middle = started + wall / 2
    peak, first_half, second_half = memory.peak(), memory.peak(started, middle), memory.peak(middle, finished)
    report = {
        "days": DAYS, "rows_per_day": ROWS, "wall_s": round(wall, 1), "per_day_s": round(wall / DAYS, 1),
        "spark_pool_slots": slots, "parallelism": parallelism,
        "max_concurrent_day_stats": spark_overlap, "max_concurrent_tasks": task_overlap,
        "queue_wait_s": {"median": round(sorted(waits)[len(waits) // 2], 1), "max": round(max(waits), 1)},
        "day_stats_s": {"median": round(sorted((e - s).total_seconds() for s, e in spark)[len(spark) // 2], 1),
                        "max": round(max((e - s).total_seconds() for s, e in spark), 1)},
        "rss_mb": {"idle_services": round(idle_mb), "peak": round(peak), "peak_first_half": round(first_half),
                   "peak_second_half": round(second_half),
                   "max_processes": max(n for _, _, n in memory.samples)},
        "samples": len(memory.samples),
    }
    print(f"\nLOAD TEST {json.dumps(report)}")
    assert peak < PEAK_BOUND_MB, report
    assert second_half <= first_half * GROWTH_MARGIN, f"memory grew with the days processed: {report}"
