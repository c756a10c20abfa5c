"""byo_dlrm on this machine, through Airflow itself (`make demo`): writes a CSV FeatureSpec in NVIDIA's
small_csv.yaml layout (four CSV chunks per mapping, two cardinalities left `auto`) and generated CSV files with a
planted signal under the data root, runs byo_dlrm on the demo profile with `dag.test()`, and prints per-task
timings, the cardinalities the transcode found, the test AUC and the published version.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml

from tasks.core.config import load_settings
from tasks.dagkit.local_run import describe_click_metrics, print_run_outcome, print_tasks, run_dag

DEMO_SPEC: dict = {  # NVIDIA's tests/transcoding/small_csv.yaml, with cat_1 and cat_2 left to the transcode
    "channel_spec": {"categorical": [f"cat_{i}.bin" for i in range(6)], "label": ["label"],
                     "numerical": ["num_0", "num_1", "num_2"]},
    "feature_spec": {"cat_0.bin": {"cardinality": 10}, "cat_1.bin": {"cardinality": "auto"},
                     "cat_2.bin": {"cardinality": "auto"}, "cat_3.bin": {"cardinality": 100},
                     "cat_4.bin": {"cardinality": 50}, "cat_5.bin": {"cardinality": 127},
                     "label": {}, "num_0": {}, "num_1": {}, "num_2": {}},
    "metadata": {},
    "source_spec": {
        mapping: [{"features": ["num_0", "num_1", "num_2"], "files": [f"{mapping}/numerical.csv"], "type": "csv"},
                  {"features": ["label"], "files": [f"{mapping}/label.csv"], "type": "csv"},
                  {"features": ["cat_0.bin", "cat_1.bin", "cat_2.bin"], "files": [f"{mapping}/catpart0.csv"],
                   "type": "csv"},
                  {"features": ["cat_3.bin", "cat_4.bin", "cat_5.bin"], "files": [f"{mapping}/catpart1.csv"],
                   "type": "csv"}]
        for mapping in ("train", "test")},
}


def source_dir(data_root: Path) -> Path:
    return data_root / "byo" / "source"


def write_demo_source(folder: Path, train_rows: int, test_rows: int, seed: int) -> Path:
    """The demo spec and its generated CSV files in `folder`; returns the spec's path."""
    from tasks.byo.spec import load_csv_spec
    from tasks.byo.synthetic import write_csvs
    from tasks.core.storage import write_text_atomic

    spec_path = folder / "feature_spec.yaml"
    write_text_atomic(spec_path, yaml.dump(DEMO_SPEC))
    write_csvs(load_csv_spec(spec_path), folder, {"train": train_rows, "test": test_rows}, seed=seed)
    return spec_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("byo_dlrm")
    group.add_argument("--byo-train-rows", type=int, default=40_000, help="rows of the generated train CSVs")
    group.add_argument("--byo-test-rows", type=int, default=10_000, help="rows of the generated test CSVs")
    group.add_argument("--byo-seed", type=int, default=3)
    group.add_argument("--byo-dlrm-conf", type=json.loads, default={},
                       help="extra byo_dlrm params as JSON, e.g. '{\"nproc\": 2}' (profile: demo unless set)")


def run_demo(args: argparse.Namespace) -> bool:
    settings = load_settings()
    folder = source_dir(settings.data_root)
    print(f"writing a CSV FeatureSpec and {args.byo_train_rows} + {args.byo_test_rows} generated rows to {folder}")
    spec_path = write_demo_source(folder, args.byo_train_rows, args.byo_test_rows, args.byo_seed)
    start = time.monotonic()
    run = run_dag("byo_dlrm", None, {"profile": "demo", "spec_uri": spec_path.as_uri(), **args.byo_dlrm_conf})
    print(f"\n=== byo_dlrm ({run['run_id']}): {run['state']} in {run['wall_seconds']:.1f} s ===")
    print_tasks(run["tasks"])
    print_outcome(settings, run)
    print(f"\nbyo_dlrm total {time.monotonic() - start:.1f} s")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return run["state"] == "success"


def print_outcome(settings, run: dict) -> None:
    from tasks.byo.pipeline import run_paths
    from tasks.core.storage import read_manifest
    from tasks.release.publish import latest_version

    paths = run_paths(settings, run["run_id"])
    dataset = read_manifest(paths.dataset)
    if dataset:
        print(f"transcoded rows {dataset['rows']}, cardinalities {dataset['extra']['cardinalities']} "
              f"(cat_1, cat_2 were 'auto'), bad rows dropped {dataset['extra']['dropped']}")
    print_run_outcome(paths, describe_click_metrics, "source/, validated/, dataset/, train/, eval/, gate/")
    latest = latest_version(settings.publish_store, "byo_dlrm")
    if run["tasks"].get("publish", {}).get("state") == "success" and latest:
        print(f"published: {latest['uri']} (version {latest['version']})")
    else:
        print(f"not published (see the gate task log); store {settings.publish_store}")
