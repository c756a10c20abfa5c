"""movielens_ncf on this machine, through Airflow itself (`make demo`): writes a synthetic snapshot in GroupLens's
format (the public archive cannot be downloaded here) to the source folder, runs movielens_ingest and then
movielens_ncf on the demo profile, each with `dag.test()`, and prints per-task timings, HR@10 / NDCG@10 against
random ranking, the published version and a recommendation from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from tasks.core.config import Settings, load_settings
from tasks.dagkit.local_run import print_publish_outcome, print_run_outcome, run_ingest_then_training
from tasks.movielens import layout
from tasks.movielens.settings import load_movielens_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("movielens_ncf")
    group.add_argument("--movielens-users", type=int, default=3000, help="users in the synthetic snapshot")
    group.add_argument("--movielens-items", type=int, default=1000, help="movies in the synthetic snapshot")
    group.add_argument("--movielens-ratings-per-user", type=int, default=40, help="mean ratings per user (>= 20)")
    group.add_argument("--movielens-seed", type=int, default=7)
    group.add_argument("--movielens-ncf-conf", type=json.loads, default={},
                       help="extra movielens_ncf params as JSON, e.g. '{\"workers\": 2}' (profile: demo unless set)")


def run_demo(args: argparse.Namespace) -> bool:
    from tasks.movielens.synthetic import write_archive

    settings, movielens = load_settings(), load_movielens_settings()
    name = movielens.dataset
    if movielens.source:
        print(f"using configured source {movielens.source}")
    else:
        print(f"writing a synthetic {name} snapshot ({args.movielens_users} users, {args.movielens_items} movies) "
              f"to {layout.source_dir(settings.data_root)}")
        write_archive(layout.source_dir(settings.data_root), name, users=args.movielens_users,
                      items=args.movielens_items, ratings_per_user=args.movielens_ratings_per_user,
                      seed=args.movielens_seed)
    ingest, training = run_ingest_then_training(
        "movielens_ingest", {"dataset": name}, name,
        "movielens_ncf", {"profile": "demo", "dataset": name, **args.movielens_ncf_conf},
        lambda run: print_training_outcome(settings, run))
    print(f"outputs: {layout.extracted_dir(settings.data_root, name)} (unzipped), "
          f"{layout.validated_dir(settings.data_root, name)} (ratings/, report.json, quarantine)")
    print(f"Airflow metadata DB and logs: {os.environ.get('AIRFLOW_HOME', '~/airflow')}")
    return ingest["state"] == "success" and training is not None and training["state"] == "success"


def print_training_outcome(settings: Settings, training: dict) -> None:
    from tasks.movielens.ncf import run_paths
    from tasks.release.steps import fetch_model

    print_run_outcome(run_paths(settings, training["run_id"]),
                      lambda m: f"test HR@10 {m['hr@10']:.4f} (random ranking {m['random_hr@10']:.4f}), NDCG@10 "
                                f"{m['ndcg@10']:.4f} (random {m['random_ndcg@10']:.4f}) over {m['users']} users",
                      "train/ with training_curves.png, eval/, gate/")
    latest = print_publish_outcome(settings.publish_store, "movielens_ncf", training)
    if not latest:
        return
    # The model's URI in the deployment's store: the registry names its latest version and the digest it must have
    # (latest.json's own "uri" is whatever was last written to the store, and could point anywhere).
    local = fetch_model(f"{settings.publish_store.rstrip('/')}/movielens_ncf", layout.models_cache(settings.data_root))
    command = [sys.executable, "-m", "tasks.movielens.predict", "recommend", "--model-dir", str(local),
               "--user", "1", "--k", "5"]
    print("$ python -m tasks.movielens.predict recommend --model-dir <version> --user 1 --k 5")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    print((result.stdout or result.stderr).strip().splitlines()[-1] if (result.stdout or result.stderr) else "")
