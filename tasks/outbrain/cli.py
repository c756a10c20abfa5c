"""`recflow outbrain ...`: demo-data, ingest (download_snapshot -> validate_snapshot) and features (Wide & Deep
parquet + TFRecords and their check), through the DAG's task functions. Registered in tasks/pipelines.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from tasks.cli import (Steps, ingest_snapshot, non_negative, pipeline_commands, positive, profile_option,
                       source_options, spark_options)
from tasks.core.config import Settings

# Errors of this pipeline's steps that mean a step ran out of order (exit status 1, one line), as tasks.cli's.
EXPECTED_ERRORS: tuple[tuple[str, str], ...] = (("tasks.outbrain.ingest", "StepInputMissing"),
                                               ("tasks.outbrain.features", "StepInputMissing"))


def outbrain_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain import layout
    from tasks.outbrain.synthetic import write_snapshot

    out = args.out or layout.source_dir(settings.data_root)
    steps.run("write_snapshot", write_snapshot, out, displays=args.displays, seed=args.seed)


def outbrain_ingest(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain.ingest import download_snapshot, validate_snapshot
    from tasks.outbrain.settings import load_outbrain_settings

    ingest_snapshot(args, settings, steps,
                    args.snapshot or load_outbrain_settings().snapshot, download_snapshot, validate_snapshot)


def outbrain_features(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.outbrain import wide_deep

    params = {"profile": args.profile, "snapshot": args.snapshot, "split_seed": args.split_seed,
              "prebatch_size": args.prebatch_size, "tfrecord_shards": args.tfrecord_shards,
              "engine": args.engine}
    run = steps.run("resolve_run", wide_deep.resolve_run, settings, params)
    steps.run("build_features", wide_deep.build_features, settings, run, spark_master=args.spark_master)
    steps.run("validate_dataset", wide_deep.validate_dataset, settings, run)


def add_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.outbrain.profiles import PROFILES

    commands = pipeline_commands(pipelines, "outbrain", {
        "demo-data": (outbrain_demo_data, "write a synthetic Outbrain snapshot (default: into the source folder)"),
        "ingest": (outbrain_ingest, "download and validate an Outbrain snapshot"),
        "features": (outbrain_features, "Wide & Deep features (parquet + TFRecords) of a validated snapshot"),
    })
    p = commands["demo-data"]
    p.add_argument("--displays", type=positive, default=20_000)
    p.add_argument("--seed", type=non_negative, default=11)
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder (default: <data root>/outbrain/source)")
    for name in ("ingest", "features"):
        commands[name].add_argument("--snapshot", default=None,
                                    help="snapshot name (default: RECFLOW_OUTBRAIN_SNAPSHOT, else kaggle)")
    source_options(commands["ingest"], "URL template of the files, with {file}")
    p = commands["features"]
    profile_option(p, PROFILES)
    p.add_argument("--split-seed", type=non_negative, default=None)
    p.add_argument("--prebatch-size", type=positive, default=None)
    p.add_argument("--tfrecord-shards", type=positive, default=None)
    p.add_argument("--engine", choices=("spark", "nvtabular"), default=None,
                   help="features engine (default: RECFLOW_OUTBRAIN_FEATURES_ENGINE, else spark; nvtabular: NVIDIA's "
                        "NVTabular workflow in .venv-nvtabular)")
    spark_options(p)
