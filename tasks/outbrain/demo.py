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

from tasks.core.config import Settings, load_settings
from tasks.dagkit.local_run import print_publish_outcome, print_run_outcome, run_ingest_then_training
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
    engine = getattr(args, "engine", None)  # make demo ENGINE=...: this pipeline offers spark and nvtabular
    ingest, training = run_ingest_then_training(
        "outbrain_ingest", {"snapshot": snapshot}, snapshot,
        "outbrain_wide_deep", {"profile": "demo", "snapshot": snapshot,
                               **({"engine": engine} if engine in ("spark", "nvtabular") else {}),
                               **args.outbrain_wide_deep_conf},
        lambda run: print_training_outcome(settings, run))
    print(f"outputs: {layout.validated_dir(settings.data_root, snapshot)} (typed tables, report.json, quarantine), "
          f"{layout.features_root(settings.data_root)} (parquet, TFRecords, FeatureSpecs, feature statistics)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return ingest["state"] == "success" and training is not None and training["state"] == "success"


def print_training_outcome(settings: Settings, training: dict) -> None:
    from tasks.outbrain.wide_deep import PIPELINE, run_paths
    from tasks.release.steps import fetch_model

    print_run_outcome(run_paths(settings, training["run_id"]),
                      lambda m: f"validation MAP@12 {m['map@12']:.4f} (random ranking of the same displays "
                                f"{m['random_map@12']:.4f}), AUC {m['auc']:.4f}, logloss {m['logloss']:.4f} over "
                                f"{m['displays']} displays / {m['rows']} rows",
                      "train/ with training_curves.png, eval/, gate/")
    latest = print_publish_outcome(settings.publish_store, PIPELINE, training)
    if not latest:
        return
    # The model's URI in the deployment's store: the registry names its latest version and the digest it must have
    # (latest.json's own "uri" is whatever was last written to the store, and could point anywhere).
    local = fetch_model(f"{settings.publish_store.rstrip('/')}/{PIPELINE}", layout.models_cache(settings.data_root))
    tables = layout.validated_dir(settings.data_root, load_outbrain_settings().snapshot)
    command = [sys.executable, "-m", "tasks.outbrain.predict", "rank", "--model-dir", str(local), "--tables",
               str(tables), "--limit", "3"]
    print("$ python -m tasks.outbrain.predict rank --model-dir <version> --tables <validated snapshot> --limit 3")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    print((result.stdout or result.stderr).strip() if (result.stdout or result.stderr) else "")
