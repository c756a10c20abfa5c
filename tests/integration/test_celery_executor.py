"""The deployment's executor: CeleryExecutor with the machine's Redis as broker (results in the PostgreSQL metadata
database), tasks run by an `airflow celery worker` on queue `default`, as docker-compose.yml runs them.

The epoch is yesterday, so unpausing criteo_ingest schedules day 0 (catchup is off: the latest interval only): a
scheduled run; then day 1 is triggered through the REST API. Both must succeed through the Celery worker (the
task instances name the Celery executor's queue and the worker's host, and the worker's log shows it received
them), and a task log reads back through the API. Tiny days: ~3-5 min, mostly Airflow start-up and two
spark-submits.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from scripts.airflow_api import AirflowApi
from tasks.criteo import layout as criteo_layout
from tasks.core.storage import read_manifest
from tasks.criteo.synthetic import CriteoDayGenerator, write_criteo_day
from tests.integration.airflow_cluster import AirflowCluster, airflow_cluster

pytestmark = pytest.mark.integration

INGEST = "criteo_ingest"
ROWS = 1500
# Day 0 is yesterday (UTC): the interval unpausing schedules.
EPOCH = (datetime.now(timezone.utc) - timedelta(days=1)).date()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[AirflowCluster]:
    work = tmp_path_factory.mktemp("airflow_celery")
    data, source = work / "data", work / "data" / "source"
    generator = CriteoDayGenerator(seed=31)
    for day in range(3):  # day 2 in case midnight passes and a new interval is scheduled
        write_criteo_day(source / f"day_{day}", day, ROWS, generator=generator)
    env = {"RECFLOW_DATA_ROOT": str(data), "RECFLOW_CRITEO_SOURCE": source.as_uri() + "/day_{day}",
           "RECFLOW_CRITEO_EPOCH": EPOCH.isoformat(), "RECFLOW_RETRY_DELAY_S": "1",
           "RECFLOW_RETRAIN_CRON": "0 6 1 1 *"}
    with airflow_cluster(work, env, dag_ids=(INGEST,), executor="CeleryExecutor") as running:
        yield running


def test_scheduled_and_triggered_runs_go_through_the_celery_worker(cluster: AirflowCluster) -> None:
    api: AirflowApi = cluster.api()
    assert cluster.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    api.set_paused(INGEST, False)
    scheduled = cluster.wait_until(lambda: api.runs(INGEST, run_type="scheduled"), 120, "the scheduled run")[0]
    manual = api.trigger(INGEST, {"day": 1})
    for run in (scheduled, manual):
        done = api.wait_for_run(INGEST, run["dag_run_id"], timeout=600)
        assert done["state"] == "success", cluster.service_log_tails(30)
    assert scheduled["logical_date"][:10] == EPOCH.isoformat()  # day 0

    root = Path(cluster.env["RECFLOW_DATA_ROOT"])
    hosts = set()
    for day, run in ((0, scheduled), (1, manual)):
        assert read_manifest(criteo_layout.stats_day(root, day))["rows"]["good"] == ROWS
        tis = api.task_instances(INGEST, run["dag_run_id"])
        states = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in tis}
        assert states.pop("retrain_gate")[0] in ("success", "skipped")  # the teardown that may start a retrain
        assert states == dict.fromkeys(("download", "validate_raw", "day_stats"), ("success", 1))
        assert {ti["queue"] for ti in tis} == {"default"}
        hosts |= {ti["hostname"] for ti in tis}
    assert hosts == {socket.getfqdn()} or hosts == {socket.gethostname()}, hosts

    # The Celery worker, not the scheduler, executed them: it logged receiving each of the task workloads.
    worker_log = (cluster.log_dir / "celery-worker.log").read_text(errors="replace")
    received = re.findall(r"Task execute_workload\[[0-9a-f-]+\] received", worker_log)
    assert len(received) >= 6, worker_log[-3000:]
    log_text = api.task_log(INGEST, manual["dag_run_id"], "validate_raw")
    assert re.search(rf"day_1: {ROWS} rows, 0 bad", log_text), log_text[-2000:]
