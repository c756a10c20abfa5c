"""A scheduler crash in the middle of a DAG run (issue #5): SIGKILL the scheduler's process group while day_stats'
spark-submit is running, start a new scheduler, and check that the run finishes by itself with outputs identical
to a clean run's, and that nothing of the killed attempt keeps running.

Real Airflow (scheduler + dag-processor + api-server, LocalExecutor, PostgreSQL; tests/integration/airflow_cluster.py).
Two Criteo days with byte-identical source files: day 0 is ingested cleanly, day 1 with the crash, so the two
outputs must hold the same rows and counts.

How the new scheduler finds the dead attempt (Airflow 3.3, checked in scheduler_job_runner.py): the LocalExecutor
cannot adopt tasks (BaseExecutor.try_adopt_task_instances returns them all), so `adopt_or_reset_orphaned_tasks`
resets every running/queued TI whose `queued_by_job` is a SchedulerJob no longer RUNNING; a SchedulerJob is marked
failed when its heartbeat is older than `[scheduler] scheduler_health_check_threshold` (default 30 s), and the check
runs at start and every `orphaned_tasks_check_interval` (default 300 s). The reset TI (state None, its try recorded
in the TI history) is scheduled again as try 2. `task_instance_heartbeat_timeout` plays no part: that check only
looks at TIs queued by the checking scheduler's own job, and the killed scheduler's TIs are not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from scripts.airflow_api import AirflowApi
from tasks.criteo import layout as criteo_layout
from tasks.core.storage import MANIFEST_NAME, file_sha256, read_manifest
from tasks.criteo.synthetic import write_criteo_day
from tests.integration.airflow_cluster import AirflowCluster, airflow_cluster, processes_mentioning

pytestmark = pytest.mark.integration

INGEST = "criteo_ingest"
ROWS = 3000
CLEAN_DAY, CRASH_DAY = 0, 1
ORPHAN_CHECK_S = 5        # [scheduler] orphaned_tasks_check_interval
DEAD_SCHEDULER_S = 15     # [scheduler] scheduler_health_check_threshold (the live scheduler heartbeats every 2 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[AirflowCluster]:
    work = tmp_path_factory.mktemp("airflow_restart")
    data, source = work / "data", work / "data" / "source"
    write_criteo_day(source / f"day_{CLEAN_DAY}", CLEAN_DAY, ROWS, seed=5)
    shutil.copyfile(source / f"day_{CLEAN_DAY}", source / f"day_{CRASH_DAY}")  # same bytes: same outputs
    env = {"RECFLOW_DATA_ROOT": str(data), "RECFLOW_CRITEO_SOURCE": source.as_uri() + "/day_{day}",
           "RECFLOW_RETRY_DELAY_S": "1",
           # The crash lands in day_stats' Spark job: the spark engine (the default arrow one writes the stats in
           # validate_raw, and day_stats would only find them).
           "RECFLOW_CRITEO_DAY_STATS_ENGINE": "spark",
           # Epoch = today (UTC): no data interval has ended yet, so unpausing creates no scheduled run for a day
           # without a source file; the only runs are the two this test triggers.
           "RECFLOW_CRITEO_EPOCH": datetime.now(timezone.utc).date().isoformat(),
           "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(DEAD_SCHEDULER_S),
           "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(ORPHAN_CHECK_S)}
    with airflow_cluster(work, env, dag_ids=(INGEST,)) as running:
        yield running


def wait_for_success(cluster: AirflowCluster, api: AirflowApi, run_id: str, timeout: float) -> dict:
    def finished() -> dict | None:
        run = api.run(INGEST, run_id)
        return run if run["state"] in ("success", "failed") else None

    run = cluster.wait_until(finished, timeout, f"{INGEST} run {run_id} to finish", poll=1.0)
    states = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in api.task_instances(INGEST, run_id)}
    assert run["state"] == "success", f"{run_id}: {run['state']} {states}\n{cluster.service_log_tails(60)}"
    return run


def ti_state(api: AirflowApi, run_id: str, task_id: str) -> str | None:
    return {ti["task_id"]: ti["state"] for ti in api.task_instances(INGEST, run_id)}.get(task_id)


def task_tries(api: AirflowApi, run_id: str, task_id: str) -> list[dict]:
    """Every try of a TI, oldest first (GET .../taskInstances/{task_id}/tries: the TI history plus the TI)."""
    return api.task_tries(INGEST, run_id, task_id)


def verify_manifest(directory: Path) -> dict:
    """The manifest lists exactly the files present, each with its size and, where the manifest lists one, its
    sha256 (a full check, not the cache's size-only one; the day stats list sizes only, docs/ARCHITECTURE.md
    "Manifests", and their content is compared as tables below). Returns the manifest."""
    manifest = read_manifest(directory)
    assert manifest is not None, f"no {MANIFEST_NAME} in {directory}"
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    assert present == set(manifest["files"]), f"{directory}: files differ from the manifest's"
    for rel, entry in manifest["files"].items():
        path = directory / rel
        assert path.stat().st_size == entry["bytes"], f"{path} changed size"
        assert "sha256" not in entry or file_sha256(path) == entry["sha256"], f"{path} changed"
    return manifest


def stats_tables(directory: Path) -> dict:
    """The content of a day_stats output, in an order that does not depend on Spark's file names."""
    import pyarrow.parquet as pq

    return {"columnar": pq.read_table(directory / "columnar").sort_by("row_order").to_pylist(),
            "counts": pq.read_table(directory / "counts").sort_by([("column", "ascending"),
                                                                   ("value", "ascending")]).to_pylist()}


def spark_processes(out_dir: Path) -> dict[int, str]:
    """spark-submit's processes for one output: they name the output directory on their command lines."""
    return processes_mentioning(f"--output {out_dir} ")


def running_spark_job(out_dir: Path) -> tuple[int, list[int]] | None:
    """(the SparkSubmit JVM, the job's Python drivers) once the driver runs, else None. Both are found by their
    command lines (they name the output), not by parentage: the driver is not always the JVM's direct child."""
    procs = spark_processes(out_dir)
    jvms = [pid for pid, args in procs.items() if "org.apache.spark.deploy.SparkSubmit" in args]
    drivers = [pid for pid, args in procs.items()
               if "criteo/day_stats.py" in args and "org.apache.spark.deploy.SparkSubmit" not in args]
    return (jvms[0], drivers) if len(jvms) == 1 and drivers else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ExitTimes:
    """Samples pids from `start` on, recording when each was first seen gone (seconds after start)."""

    def __init__(self, pids: list[int], start: float):
        self.start, self.gone_after = start, dict.fromkeys(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            for pid, gone in self.gone_after.items():
                if gone is None and not _alive(pid):
                    self.gone_after[pid] = round(time.monotonic() - self.start, 1)

    def stop(self) -> dict[int, float | None]:
        self._stop.set()
        self._thread.join()
        return dict(self.gone_after)


def test_scheduler_killed_during_day_stats_recovers_by_itself(cluster):
    started = time.monotonic()
    api = cluster.api()
    root = Path(cluster.env["RECFLOW_DATA_ROOT"])
    api.set_paused(INGEST, False)

    # The reference: the same bytes ingested without a crash.
    clean = api.trigger(INGEST, {"day": CLEAN_DAY})
    wait_for_success(cluster, api, clean["dag_run_id"], timeout=240)
    clean_spark_s = next(ti["duration"] for ti in api.task_instances(INGEST, clean["dag_run_id"])
                         if ti["task_id"] == "day_stats")

    run_id = api.trigger(INGEST, {"day": CRASH_DAY})["dag_run_id"]
    out = criteo_layout.stats_day(root, CRASH_DAY)
    cluster.wait_until(lambda: ti_state(api, run_id, "day_stats") == "running", 180, "day_stats to run")
    # Kill once Spark is writing, not just starting: the JVM has started the job's Python driver, and the driver
    # has opened its temporary output beside the final one (atomic_directory).
    def writing() -> tuple[int, list[int]] | None:
        job = running_spark_job(out)
        return job if job and list(out.parent.glob(f".tmp-{out.name}~*")) else None

    jvm_pid, driver_pids = cluster.wait_until(writing, 120, "day_stats' Spark job to write", poll=0.5)
    task_runner_pid = psutil.Process(jvm_pid).ppid()
    scheduler = cluster.processes["scheduler"]
    scheduler_group = [p.pid for p in psutil.Process(scheduler.pid).children(recursive=True)
                       if os.getpgid(p.pid) == scheduler.pid]
    assert task_runner_pid not in scheduler_group and os.getpgid(task_runner_pid) == task_runner_pid
    assert read_manifest(out) is None, "day_stats finished before the kill: the test caught nothing in flight"
    attempt = {task_runner_pid: "task runner (try 1)", jvm_pid: "SparkSubmit JVM",
               **dict.fromkeys(driver_pids, "Spark Python driver")}

    cluster.kill_service("scheduler", signal.SIGKILL)
    killed_at = time.monotonic()
    exits = ExitTimes([scheduler.pid, *scheduler_group, *attempt], killed_at)
    right_after = {attempt[pid]: _alive(pid) for pid in attempt}
    # What a SIGKILL of the scheduler's process group does with the LocalExecutor: the scheduler, its executor
    # workers and the task supervisors they forked share the group and die at once. The task runner (the process
    # running day_stats' code) does not: the supervisor forks it into a process group of its own (Airflow's
    # supervisor.py, new_process_group=True), and spark-submit runs in a session of its own (tasks/core/process.py), so
    # the attempt and its Spark JVM survive the scheduler, re-parented to init. Nothing tells the orphan: its logs
    # go nowhere (no error while tasks.core.process logs through stdlib logging), and before tasks/core/process.py watched
    # for it, it ran its Spark job to the end beside the retry (two jobs writing one output, on 2 cores) and died
    # only when it logged "Done" into the dead supervisor's socket (BrokenPipeError). Now it stops the JVM at once.
    assert all(right_after.values()), f"the killed attempt died with the scheduler's group: {right_after}"

    cluster.start_service("scheduler")
    wait_for_success(cluster, api, run_id, timeout=240)
    recovery_s = time.monotonic() - killed_at
    gone_after = exits.stop()
    print(f"\nSIGKILL of the scheduler's group (pgid {scheduler.pid}, {len(scheduler_group)} more members): "
          "seconds until each process was gone:")
    for pid, gone in gone_after.items():
        print(f"  {pid} {attempt.get(pid, 'scheduler group')}: {gone}")
    assert all(gone_after[pid] is not None and gone_after[pid] < 2 for pid in [scheduler.pid, *scheduler_group])
    for pid in (jvm_pid, *driver_pids):  # the orphan stopped its Spark job instead of running it beside the retry
        assert gone_after[pid] is not None and gone_after[pid] < 30, (
            f"the killed attempt's {attempt[pid]} ran on {gone_after[pid]} s after the kill")

    # Which happened, from the record rather than a guess: the LocalExecutor cannot adopt, so the new scheduler
    # reset the orphaned TI (its log names it) and ran it again as try 2; try 1 is in the TI history.
    tries = task_tries(api, run_id, "day_stats")
    assert [t["try_number"] for t in tries] == [1, 2] and tries[-1]["state"] == "success", tries
    scheduler_log = (cluster.log_dir / "scheduler.log").read_text(errors="replace")
    reset = scheduler_log.split("Reset the following 1 orphaned TaskInstances:", 1)
    assert len(reset) == 2 and f"criteo_ingest.day_stats {run_id} [running]" in reset[1][:400], \
        "the new scheduler did not log resetting day_stats"
    assert "Marked 1 SchedulerJob instances as failed" in scheduler_log
    tries_by_task = {ti["task_id"]: ti["try_number"] for ti in api.task_instances(INGEST, run_id)}
    assert tries_by_task == {"download": 1, "validate_raw": 1, "day_stats": 2, "retrain_gate": 1}, tries_by_task
    retry_log = api.task_log(INGEST, run_id, "day_stats", 2)
    assert "spark-submit criteo/day_stats.py" in retry_log and f"day 1: day_stats {ROWS} rows" in retry_log

    # Outputs complete and identical to the clean day's.
    clean_validated = verify_manifest(criteo_layout.validated_day(root, CLEAN_DAY))
    crash_validated = verify_manifest(criteo_layout.validated_day(root, CRASH_DAY))
    assert crash_validated["rows"] == clean_validated["rows"] and crash_validated["rows"]["good"] == ROWS
    report = json.loads((criteo_layout.validated_day(root, CRASH_DAY) / "report.json").read_text())
    crash_stats, clean_stats = verify_manifest(out), verify_manifest(criteo_layout.stats_day(root, CLEAN_DAY))
    assert crash_stats["rows"]["good"] == clean_stats["rows"]["good"] == ROWS
    assert crash_stats["extra"]["distinct_values"] == clean_stats["extra"]["distinct_values"]
    assert stats_tables(out) == stats_tables(criteo_layout.stats_day(root, CLEAN_DAY))
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".tmp-"))
    assert leftovers == [], f"half-written output of the killed attempt left beside {out}: {leftovers}"

    # Nothing of the killed attempt still runs.
    at_end = {attempt[pid]: _alive(pid) for pid in attempt}
    assert not any(at_end.values()), f"processes of the killed attempt still running: {at_end}"
    assert not spark_processes(out)

    print(f"RECOVERY kill -> run success: {recovery_s:.1f} s (clean day_stats {clean_spark_s:.1f} s, try 2 "
          f"{tries[-1]['duration']:.1f} s); validation report rows {report.get('rows')}; "
          f"test body {time.monotonic() - started:.1f} s")
