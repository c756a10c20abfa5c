"""`recflow byo ...`: demo-data and transcode (resolve_run -> fetch -> validate -> transcode -> validate_dataset),
through the DAG's task functions. Registered in tasks/pipelines.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from tasks.cli import Steps, non_negative, pipeline_commands, positive, profile_option, spark_options
from tasks.core.config import Settings

# Errors of this pipeline's steps that mean a step ran out of order (exit status 1, one line), as tasks.cli's.
EXPECTED_ERRORS: tuple[tuple[str, str], ...] = (("tasks.byo.pipeline", "StepInputMissing"),)


def byo_demo_data(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.byo.demo import source_dir, write_demo_source

    out = args.out or source_dir(settings.data_root)
    steps.run("write_source", lambda: {"spec": str(write_demo_source(out, args.train_rows, args.test_rows,
                                                                     args.seed))})


def byo_transcode(args: argparse.Namespace, settings: Settings, steps: Steps) -> None:
    from tasks.byo import pipeline

    params = {"profile": args.profile, "spec_uri": args.spec_uri, "data_uri": args.data_uri}
    run = steps.run("resolve_run", pipeline.resolve_run, settings, params)
    run_id = args.run_id or "cli__transcode"
    fetched = steps.run("fetch", pipeline.fetch_sources, settings, run_id, run, aws_conn_id=args.aws_conn_id)
    steps.run("validate", pipeline.validate, settings, run_id, fetched)
    steps.run("transcode", pipeline.transcode, settings, run_id, spark_master=args.spark_master,
              spark_profile=args.spark_profile, engine=args.engine)
    steps.run("validate_dataset", pipeline.validate_dataset, pipeline.run_paths(settings, run_id).dataset)


def add_commands(pipelines: argparse._SubParsersAction) -> None:
    from tasks.byo.pipeline import SPEC_URI_ENV, TRANSCODE_ENGINES
    from tasks.byo.profiles import PROFILES

    commands = pipeline_commands(pipelines, "byo", {
        "demo-data": (byo_demo_data, "write a CSV FeatureSpec and generated CSV files (default: into the source "
                                     "folder)"),
        "transcode": (byo_transcode, "fetch, validate and transcode a CSV FeatureSpec's files to split-binary, and "
                                     "check the dataset"),
    })
    p = commands["demo-data"]
    p.add_argument("--train-rows", type=positive, default=40_000)
    p.add_argument("--test-rows", type=positive, default=10_000)
    p.add_argument("--seed", type=non_negative, default=3)
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="folder (default: <data root>/byo/source)")
    p = commands["transcode"]
    p.add_argument("--spec-uri", default=None, metavar="URI",
                   help=f"the CSV FeatureSpec yaml: file://, http(s):// or s3:// (default: {SPEC_URI_ENV})")
    p.add_argument("--data-uri", default=None, metavar="URI",
                   help="folder the spec's relative file paths are resolved against (default: the spec's own)")
    p.add_argument("--run-id", default=None,
                   help="write into this byo_dlrm run's folder, <data root>/runs/byo_dlrm/<run id> "
                        "(default: cli__transcode)")
    p.add_argument("--aws-conn-id", default=None,
                   help="Airflow connection with S3 credentials (default: boto3's own chain)")
    p.add_argument("--engine", choices=TRANSCODE_ENGINES, default=None,
                   help="arrow: in this process; spark: spark-submit (default: RECFLOW_BYO_TRANSCODE_ENGINE, else "
                        "arrow with a local --spark-master, spark with a cluster one; same bytes)")
    profile_option(p, PROFILES)
    spark_options(p)
