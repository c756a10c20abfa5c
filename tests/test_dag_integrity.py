"""DAG integrity: every DAG file imports cleanly, parses fast without heavy imports or connections, and follows
the house rules (tags, retries >= 2, documented params)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# boto3 is left out: importing airflow.sdk already loads it (the amazon provider), not something a DAG file does.
# Our own model and Spark packages are as heavy at parse time: DAG files reach them only inside task bodies.
HEAVY_MODULES = ("torch", "tensorflow", "keras", "pyspark", "great_expectations", "sklearn", "pyarrow", "matplotlib",
                 "models", "spark_jobs")

# Runs in a fresh interpreter so that modules imported by other tests don't hide a heavy import at parse time.
_PARSE_PROBE = r"""
import json, sys, time
from airflow.sdk import BaseHook
def _no_connections(*a, **k):
    raise AssertionError("a DAG file opened a connection at parse time")
BaseHook.get_connection = classmethod(_no_connections)
from airflow.dag_processing.dagbag import DagBag
start = time.monotonic()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.monotonic() - start
dags = {}
for dag_id, dag in bag.dags.items():
    dags[dag_id] = {
        "tags": sorted(dag.tags),
        "doc": bool(dag.doc_md),
        "tasks": {t.task_id: {"retries": t.retries, "pool": t.pool, "queue": t.queue,
                              "on_failure": bool(t.on_failure_callback), "upstream": sorted(t.upstream_task_ids),
                              "timeout_s": t.execution_timeout.total_seconds() if t.execution_timeout else None}
                  for t in dag.tasks},
        "params": {k: dag.params.get_param(k).description for k in dag.params.keys()},
        "schemas": {k: {"type": dag.params.get_param(k).schema.get("type"), "default": dag.params.get_param(k).value}
                    for k in dag.params.keys()},
    }
heavy = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[2].split(","))
print(json.dumps({"errors": {k: str(v)[-400:] for k, v in bag.import_errors.items()}, "dags": dags,
                  "heavy": heavy, "seconds": seconds}))
"""


def _parse(tmp_path_factory, **extra_env: str) -> dict:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow_home")),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO), **extra_env}
    for name in ("RECFLOW_TRAIN_QUEUE", "RECFLOW_SPARK_QUEUE"):
        if name not in extra_env:
            env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", _PARSE_PROBE, str(REPO / "dags"), ",".join(HEAVY_MODULES)],
                         env=env, capture_output=True, text=True, timeout=180, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    return _parse(tmp_path_factory)


def test_pools_and_queues_route_spark_and_training(parsed, tmp_path_factory):
    spark = {("criteo_ingest", "day_stats"), ("criteo_dlrm", "build_dictionary"), ("criteo_dlrm", "transform"),
             ("movielens_ncf", "preprocess"), ("outbrain_wide_deep", "features"), ("byo_dlrm", "transcode")}
    for dag_id, dag in parsed["dags"].items():
        for task_id, task in dag["tasks"].items():
            pool = "spark" if (dag_id, task_id) in spark else "train" if task_id == "train" else "default_pool"
            assert (task_id, task["pool"], task["queue"]) == (task_id, pool, "default")
    # Under Celery, the queues come from the environment at parse time: training, the tasks that load its model
    # (outside the train pool) and Spark on the GPU workers.
    gpu = _parse(tmp_path_factory, RECFLOW_TRAIN_QUEUE="gpu", RECFLOW_SPARK_QUEUE="gpu")
    queues = {(d, t): task["queue"] for d, dag in gpu["dags"].items() for t, task in dag["tasks"].items()}
    training = {"criteo_dlrm", "movielens_ncf", "outbrain_wide_deep", "byo_dlrm"}
    model_tasks = {(d, t) for d in training for t in ("train", "evaluate", "gate")} | {("criteo_dlrm", "export")}
    assert {key for key, queue in queues.items() if queue == "gpu"} == spark | model_tasks


def test_every_dag_file_imports_without_errors(parsed):
    assert parsed["errors"] == {}
    dag_files = [p for p in (REPO / "dags").glob("*.py")]
    assert len(parsed["dags"]) >= len(dag_files) >= 1


def test_parsing_imports_no_heavy_library(parsed):
    assert parsed["heavy"] == []


def test_parsing_is_fast(parsed):
    assert parsed["seconds"] < 10.0


def test_every_dag_has_tags_and_docs(parsed):
    for dag_id, dag in parsed["dags"].items():
        assert "recflow" in dag["tags"], dag_id
        assert dag["doc"], f"{dag_id} has no doc_md"


def test_every_task_retries_at_least_twice(parsed):
    for dag_id, dag in parsed["dags"].items():
        for task_id, task in dag["tasks"].items():
            assert task["retries"] >= 2, f"{dag_id}.{task_id} retries {task['retries']}"


def test_every_task_has_an_execution_timeout_by_kind(parsed):
    """No task may run forever (a trickling source, a hung Spark job or training holds its pool slot): every task
    of every DAG has an execution_timeout, the deployment's for its kind (tasks.core.config.Settings)."""
    from tasks.core.config import Settings

    limits = Settings()
    downloads = {("criteo_ingest", "download"), ("movielens_ingest", "download"), ("outbrain_ingest", "download"),
                 ("byo_dlrm", "fetch")}
    for dag_id, dag in parsed["dags"].items():
        for task_id, task in dag["tasks"].items():
            expected = (limits.download_task_timeout_s if (dag_id, task_id) in downloads
                        else limits.spark_task_timeout_s if task["pool"] == "spark"
                        else limits.train_task_timeout_s if task["pool"] == "train" else limits.task_timeout_s)
            assert task["timeout_s"] == expected, f"{dag_id}.{task_id} execution_timeout {task['timeout_s']}"


def test_task_timeouts_come_from_the_deployment_settings(tmp_path_factory):
    custom = _parse(tmp_path_factory, RECFLOW_TASK_TIMEOUT_S="60", RECFLOW_TRAIN_TASK_TIMEOUT_S="7200")
    timeouts = {(d, t): task["timeout_s"] for d, dag in custom["dags"].items() for t, task in dag["tasks"].items()}
    assert timeouts[("criteo_dlrm", "train")] == 7200 and timeouts[("criteo_dlrm", "evaluate")] == 60


def test_every_param_is_described_for_the_trigger_form(parsed):
    for dag_id, dag in parsed["dags"].items():
        for name, description in dag["params"].items():
            assert description, f"{dag_id} param {name} has no description"


def test_every_param_left_empty_is_nullable_so_the_form_can_trigger(parsed):
    # The UI marks a param whose schema type lacks "null" as required, and "" does not satisfy it: an optional
    # param defaulting to empty would keep the Trigger button disabled.
    for dag_id, dag in parsed["dags"].items():
        for name, schema in dag["schemas"].items():
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if schema["default"] in (None, ""):
                assert "null" in types and schema["default"] is None, f"{dag_id}.{name}: {schema}"


def test_criteo_ingest_wiring(parsed):
    dag = parsed["dags"]["criteo_ingest"]
    assert list(dag["tasks"]) == ["download", "validate_raw", "day_stats", "retrain_gate"]


@pytest.mark.parametrize("dag_id, beside_the_gate", [("criteo_dlrm", {"export"}), ("movielens_ncf", set()),
                                                      ("outbrain_wide_deep", set()), ("byo_dlrm", set())])
def test_training_dags_mark_a_registered_run_failed_when_gate_or_publish_fails(parsed, dag_id, beside_the_gate):
    # gate registers the run; if it, publish or criteo's export (cleared after the gate ran) fails for good, the
    # callback sets the registry status `failed`.
    tasks = parsed["dags"][dag_id]["tasks"]
    assert {name for name, task in tasks.items() if task["on_failure"]} == {"gate", "publish", *beside_the_gate}
    # A task beside the gate runs before it: failing first, it would find no registered run to mark, and the gate,
    # run after it, would leave the run `trained` with its publish upstream_failed (no callback runs for that).
    assert all(name in tasks["gate"]["upstream"] for name in beside_the_gate)


def test_movielens_wiring(parsed):
    assert list(parsed["dags"]["movielens_ingest"]["tasks"]) == ["download", "validate", "announce", "train_gate"]
    assert list(parsed["dags"]["movielens_ncf"]["tasks"]) == ["resolve_run", "preprocess", "validate_dataset", "train",
                                                             "evaluate", "gate", "publish"]


def test_outbrain_wiring(parsed):
    assert list(parsed["dags"]["outbrain_ingest"]["tasks"]) == ["download", "validate", "announce", "train_gate"]
    assert list(parsed["dags"]["outbrain_wide_deep"]["tasks"]) == ["resolve_run", "features", "validate_dataset",
                                                                  "train", "evaluate", "gate", "publish"]
