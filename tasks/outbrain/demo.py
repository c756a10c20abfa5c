"""outbrain_wide_deep on this machine, through Airflow itself (`make demo`): writes a synthetic snapshot in
Kaggle's Outbrain format (the public dataset cannot be downloaded here) to the source folder, runs outbrain_ingest
and then outbrain_wide_deep on the demo profile, each with `dag.test()`, and prints per-task timings, MAP@12 and
AUC against a random ranking of the same displays, the published version and a prediction from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from tasks.core.config import Settings, load_settings
from tasks.dagkit.local_run import print_tasks, run_dag
from tasks.outbrain import layout
from tasks.outbrain.settings import load_outbrain_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("outbrain_wide_deep")
    group.add_argument("--outbrain-displays", type=int, default=20_000, help="displays in the synthetic snapshot")
    group.add_argument("--outbrain-seed", type=int, default=11)
    group.add_argument("--outbrain-wide-deep-conf", type=json.loads, default={},
                       help="extra outbrain_wide_deep params as JSON, e.g. '{\"workers\": 2}' (profile: demo unless "
                            "set)")


def run_demo(args: argparse.Namespace) -> bool:
    from tasks.outbrain.synthetic import write_snapshot

    settings, outbrain = load_settings(), load_outbrain_settings()
    snapshot = outbrain.snapshot
    if outbrain.source:
        print(f"using configured source {outbrain.source}")
    else:
        print(f"writing a synthetic Outbrain snapshot ({args.outbrain_displays} displays) to "
              f"{layout.source_dir(settings.data_root)}")
        write_snapshot(layout.source_dir(settings.data_root), displays=args.outbrain_displays,
                       seed=args.outbrain_seed)
    start = time.monotonic()
    ingest = run_dag("outbrain_ingest", None, {"snapshot": snapshot})
    training = None
    if ingest["state"] == "success":
        engine = getattr(args, "engine", None)  # make demo ENGINE=...: this pipeline offers spark and nvtabular
        training = run_dag("outbrain_wide_deep", None,
                           {"profile": "demo", "snapshot": snapshot,
                            **({"engine": engine} if engine in ("spark", "nvtabular") else {}),
                            **args.outbrain_wide_deep_conf})
    total = time.monotonic() - start

    print(f"\n=== outbrain_ingest ({snapshot}): {ingest['state']} in {ingest['wall_seconds']:.1f} s ===")
    print_tasks(ingest["tasks"])
    if training:
        print(f"\n=== outbrain_wide_deep ({training['run_id']}): {training['state']} in "
              f"{training['wall_seconds']:.1f} s ===")
        print_tasks(training["tasks"])
        print_training_outcome(settings, training)
    print(f"\noutbrain_wide_deep total {total:.1f} s")
    print(f"outputs: {layout.validated_dir(settings.data_root, snapshot)} (typed tables, report.json, quarantine), "
          f"{layout.features_root(settings.data_root)} (parquet, TFRecords, FeatureSpecs, feature statistics)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return ingest["state"] == "success" and training is not None and training["state"] == "success"


def print_training_outcome(settings: Settings, training: dict) -> None:
    from tasks.outbrain.wide_deep import PIPELINE, run_paths
    from tasks.release.publish import fetch_published_version, latest_version

    paths = run_paths(settings, training["run_id"])
    metrics_file = paths.evaluation / "metrics.json"
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        print(f"validation MAP@12 {m['map@12']:.4f} (random ranking of the same displays {m['random_map@12']:.4f}), "
              f"AUC {m['auc']:.4f}, logloss {m['logloss']:.4f} over {m['displays']} displays / {m['rows']} rows")
    print(f"run outputs: {paths.root} (train/ with training_curves.png, eval/, gate/)")
    latest = latest_version(settings.publish_store, PIPELINE)
    if training["tasks"].get("publish", {}).get("state") != "success" or not latest:
        print(f"not published (gate: see the gate task log); store {settings.publish_store}")
        return
    print(f"published: {latest['uri']} (version {latest['version']}, now latest)")
    local = fetch_published_version(settings.publish_store, PIPELINE, latest["version"],
                                    layout.models_cache(settings.data_root) / PIPELINE / latest["version"])
    tables = layout.validated_dir(settings.data_root, load_outbrain_settings().snapshot)
    command = [sys.executable, "-m", "tasks.outbrain.predict", "rank", "--model-dir", str(local), "--tables",
               str(tables), "--limit", "3"]
    print("$ python -m tasks.outbrain.predict rank --model-dir <version> --tables <validated snapshot> --limit 3")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    print((result.stdout or result.stderr).strip() if (result.stdout or result.stderr) else "")
