"""`recflow movielens ...`: demo-data, ingest (download_snapshot -> validate_snapshot) and preprocess (the NCF
leave-one-out dataset and its check), through the DAG's task functions. Registered in tasks/pipelines.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from tasks.cli import (Steps, ingest_snapshot, non_negative, pipeline_commands, positive, profile_option,
                       source_options, spark_options)
from tasks.core.config import Settings

# Errors of this pipeline's steps that mean a step ran out of order (exit status 1, one line), as tasks.cli's.
EXPECTED_ERRORS: tuple[tuple[str, str], ...] = (("tasks.movielens.ingest", "StepInputMissing"),)


def movielens_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens import layout
    from tasks.movielens.settings import load_movielens_settings
    from tasks.movielens.synthetic import ensure_archive

    name = args.dataset or load_movielens_settings().dataset
    out = args.out or layout.source_dir(settings.data_root)
    steps.run("write_archive", lambda: {"path": str(ensure_archive(
        out, name, users=args.users, items=args.items, ratings_per_user=args.ratings_per_user, seed=args.seed))})


def movielens_ingest(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens.ingest import download_snapshot, validate_snapshot
    from tasks.movielens.settings import load_movielens_settings

    ingest_snapshot(args, settings, steps,
                    args.dataset or load_movielens_settings().dataset, download_snapshot, validate_snapshot)


def movielens_preprocess(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.movielens import ncf

    params = {"profile": args.profile, "dataset": args.dataset, "min_ratings": args.min_ratings,
              "test_negatives": args.test_negatives, "seed": args.seed}
    run = steps.run("resolve_run", ncf.resolve_run, settings, params)
    steps.run("preprocess", ncf.preprocess, settings, run, spark_master=args.spark_master)
    steps.run("validate_dataset", ncf.validate_dataset, settings, run)


def add_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.movielens.profiles import PROFILES
    from tasks.movielens.schema import DATASETS

    commands = pipeline_commands(pipelines, "movielens", {
        "demo-data": (movielens_demo_data, "write a synthetic MovieLens archive (default: into the source folder)"),
        "ingest": (movielens_ingest, "download and validate a MovieLens snapshot"),
        "preprocess": (movielens_preprocess, "NCF leave-one-out dataset of a validated snapshot, and its check"),
    })
    for p in commands.values():
        p.add_argument("--dataset", choices=DATASETS, default=None,
                       help="snapshot (default: RECFLOW_MOVIELENS_DATASET, else ml-20m)")
    p = commands["demo-data"]
    p.add_argument("--users", type=positive, default=3000)
    p.add_argument("--items", type=positive, default=1000)
    p.add_argument("--ratings-per-user", type=positive, default=40)
    p.add_argument("--seed", type=non_negative, default=7)
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder (default: <data root>/movielens/source)")
    source_options(commands["ingest"], "URL of the archive, {name} replaced by the snapshot")
    p = commands["preprocess"]
    profile_option(p, PROFILES)
    p.add_argument("--min-ratings", type=non_negative, default=None)
    p.add_argument("--test-negatives", type=positive, default=None)
    p.add_argument("--seed", type=non_negative, default=None)
    spark_options(p)
