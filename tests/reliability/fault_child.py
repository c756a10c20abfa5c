"""One criteo pipeline step in a fresh process, as an Airflow worker runs a task try:
`python -m tests.reliability.fault_child <step> <spec json>`.

Settings come from the RECFLOW_* environment (tasks.core.config.load_settings), the arguments from the spec, exactly
as the DAG task bodies pass them. Two marked lines go to stdout for the fault-injection driver (faults.py):
READY when imports are done and the step function is about to be called (the clock of the kill starts there),
RESULT with the step's return value. The task's own log lines (and its children's, streamed by tasks.core.process)
go to stdout too, so the driver can also time a kill from a line of the step's progress.

Connection lookups are replaced by their documented fallbacks (no Airflow metadata DB here): the registry is the
SQLite file under the data root, S3 credentials come from boto3's default chain (the test's moto server env).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any

READY = "FAULT-CHILD-READY"
RESULT = "FAULT-CHILD-RESULT "
STEPS = ("download", "validate", "day_stats", "dictionary", "transform", "train", "evaluate", "publish")


def run_step(step: str, spec: dict[str, Any]) -> dict[str, Any]:
    from tasks.criteo import dlrm as criteo_dlrm
    from tasks.criteo import ingest as criteo_ingest
    from tasks.criteo import preprocess as criteo_preprocess
    from tasks.core.config import load_settings

    settings = load_settings()
    paths = criteo_dlrm.run_paths(settings, spec.get("run_id", "fault"))
    params = spec.get("params", {})
    run = resolved_run(spec) if params else {}
    calls = {
        "download": lambda: criteo_ingest.download_day(settings, spec["day"]),
        "validate": lambda: criteo_ingest.validate_day(settings, spec["day"], bad_row_budget=spec.get("budget")),
        "day_stats": lambda: criteo_ingest.day_stats(settings, spec["day"], spark_master=spec["spark_master"]),
        "dictionary": lambda: criteo_preprocess.build_dictionary(
            settings, paths.dictionary, spec["train_days"], spec["test_day"],
            frequency_threshold=params["frequency_threshold"], spark_master=spec["spark_master"]),
        "transform": lambda: criteo_preprocess.transform_dataset(
            settings, paths.dataset, paths.dictionary, spec["train_days"], spec["test_day"], seed=params["seed"],
            spark_master=spec["spark_master"]),
        "train": lambda: criteo_dlrm.train(settings, spec["run_id"], run),
        "evaluate": lambda: criteo_dlrm.evaluate(settings, spec["run_id"], run),
        "publish": lambda: publish(settings, spec),
    }
    print(READY, flush=True)
    return calls[step]()


def resolved_run(spec: dict[str, Any]) -> dict[str, Any]:
    """What the DAG's resolve_run task hands every later task, for the spec's window and params (demo profile)."""
    from tasks.core.profiles import resolve_knobs
    from tasks.criteo.profiles import KNOBS, PROFILES

    params = spec["params"]
    return {"train_days": spec["train_days"], "test_day": spec["test_day"], "profile": "demo",
            "knobs": resolve_knobs(KNOBS, PROFILES, "demo", params), "nproc": params["nproc"],
            "device": params["device"]}


def publish(settings, spec: dict[str, Any]) -> dict[str, Any]:
    """The DAG's publish task body: lineage, then publish to the store (registry: the SQLite fallback)."""
    from tasks.criteo.dlrm import SPEC

    params, run = spec["params"], resolved_run(spec)
    doc = SPEC.lineage(settings, spec["run_id"], run, params)
    return SPEC.publish(settings, spec["run_id"], datetime.fromisoformat(spec["when"]), spec["metrics"], doc, run=run,
                model_name=params["model_name"], store_uri=spec.get("publish_uri") or None, aws_conn_id=None,
                registry_conn_id=None)


def main(argv: list[str]) -> int:
    step, spec = argv[0], json.loads(argv[1])
    if step not in STEPS:
        raise SystemExit(f"unknown step {step!r}; expected one of {STEPS}")
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(message)s")
    result = run_step(step, spec)
    print(RESULT + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
