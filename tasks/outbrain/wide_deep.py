"""The outbrain_wide_deep steps after ingest: the run's snapshot and knobs, the features keyed by what they depend
on, train (tf.distribute workers), evaluate (MAP@k, AUC, logloss over the whole validation set), gate against the
published model on the same validation displays, and publish with lineage. Plain functions; the DAG only wires
them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.layout import dataset_stage_dir
from tasks.core.profiles import layer_sizes
from tasks.core.storage import fingerprint, read_manifest
from tasks.outbrain import layout
from tasks.release.pipeline import TrainingPipeline, score_with_predict
from tasks.release.runs import SnapshotMissing, validated_snapshot

log = logging.getLogger(__name__)

PIPELINE = "outbrain_wide_deep"
DATASET = layout.DATASET
TRAIN_MODULE = "models.wide_deep.train"
EVALUATE_MODULE = "models.wide_deep.evaluate"
PREDICT_MODULE = "tasks.outbrain.predict"


def snapshot_identity(settings: Settings, name: str) -> dict[str, Any]:
    """{dataset, snapshot fingerprint} of a validated Outbrain snapshot, or SnapshotMissing (one line)."""
    return validated_snapshot(layout.validated_dir(settings.data_root, name), name, label="Outbrain",
                              ingest_hint=f"run outbrain_ingest with snapshot={name} first")


def resolve_run(settings: Settings, params: dict[str, Any], run_type: str = "manual", *,
                spark_master: str | None = None) -> dict[str, Any] | None:
    """What this run trains on and with, or None when there is nothing new (an asset-triggered run whose snapshot
    and profile were trained already: the DAG then skips every later task); see
    tasks.release.runs.plan_snapshot_run. Bad layer sizes are refused before any Spark work."""
    from tasks.core.profiles import resolve_knobs
    from tasks.outbrain.profiles import KNOBS, PROFILES
    from tasks.outbrain.settings import load_outbrain_settings
    from tasks.release.runs import plan_snapshot_run

    def knobs_of(profile: str) -> dict[str, Any]:
        knobs = resolve_knobs(KNOBS, PROFILES, profile, params)
        trainer_config(knobs)
        return knobs

    from tasks.outbrain.features import features_engine

    engine = features_engine(params.get("engine"))  # a bad engine is refused before any work
    name = params.get("snapshot") or load_outbrain_settings().snapshot
    run = plan_snapshot_run(settings, pipeline=PIPELINE, knobs_of=knobs_of, params=params, run_type=run_type,
                            snapshot=lambda: snapshot_identity(settings, name))
    return None if run is None else {**run, "engine": engine}


def trainer_config(knobs: dict[str, Any]) -> dict[str, Any]:
    """The flags of models.wide_deep.train from the run's knobs."""
    return {
        "epochs": knobs["epochs"], "global_batch_size": knobs["batch_size"],
        "eval_batch_size": knobs["eval_batch_size"], "linear_learning_rate": knobs["linear_lr"],
        "deep_learning_rate": knobs["deep_lr"], "deep_warmup_epochs": knobs["deep_warmup_epochs"],
        "deep_hidden_units": layer_sizes(knobs["deep_hidden_units"], what="deep hidden units"),
        "deep_dropout": knobs["deep_dropout"], "embedding_dim": knobs["embedding_dim"],
        "precision": knobs["precision"], "xla": bool(knobs["xla"]), "seed": knobs["seed"],
        "checkpoint_every_steps": knobs["checkpoint_every_steps"], "map_k": knobs["map_k"],
    }


def features_dir(settings: Settings, run: dict[str, Any]) -> Path:
    """The features dataset of a run, keyed by what it depends on (the snapshot, the feature code's rules version,
    the engine and the feature knobs): runs that change only model knobs share it, and a retry finds it complete."""
    from tasks.outbrain.features import FEATURES_RULES_VERSION
    from tasks.outbrain.profiles import FEATURE_KNOBS

    window, knobs = run["window"], run["knobs"]
    key = fingerprint({"snapshot": window["snapshot"], "rules": FEATURES_RULES_VERSION,
                       "engine": run.get("engine", "spark"), **{name: knobs[name] for name in FEATURE_KNOBS}})
    return dataset_stage_dir(settings.data_root, DATASET, "features") / f"{window['dataset']}-{key[:16]}"


def tfrecords_dir(settings: Settings, run: dict[str, Any]) -> Path:
    return features_dir(settings, run) / "tfrecords"


def build_features(settings: Settings, run: dict[str, Any], *, spark_master: str | None = None) -> dict[str, Any]:
    from tasks.outbrain.features import build_features as build

    knobs, name = run["knobs"], run["window"]["dataset"]
    snapshot_identity(settings, name)  # the snapshot may have been removed since resolve_run
    return build(settings, layout.validated_dir(settings.data_root, name), features_dir(settings, run),
                 seed=knobs["split_seed"], prebatch_size=knobs["prebatch_size"], shards=knobs["tfrecord_shards"],
                 engine=run.get("engine", "spark"), spark_master=spark_master)


def validate_dataset(settings: Settings, run: dict[str, Any]) -> dict[str, Any]:
    from tasks.outbrain.features import validate_dataset as check

    return check(features_dir(settings, run))


def train(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    from tasks.core.launch import train_with_tf_workers

    return train_with_tf_workers(TRAIN_MODULE, tfrecords_dir(settings, run), run_paths(settings, run_id).train,
                                 {**trainer_config(run["knobs"]), "device": run["device"]}, workers=run["workers"],
                                 label=f"train {run_id}",
                                 manifest_dir=features_dir(settings, run))


def _summary(metrics: dict[str, Any], k: int) -> dict[str, Any]:
    return {key: metrics[key] for key in (f"map@{k}", f"random_map@{k}", "auc", "logloss", "rows", "displays")}


def evaluate(settings: Settings, run_id: str, run: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
    from tasks.core.launch import run_module

    k, paths = run["knobs"]["map_k"], run_paths(settings, run_id)
    run_module(EVALUATE_MODULE, ["--model_path", trained["model_path"], "--dataset_dir",
                                 str(tfrecords_dir(settings, run)), "--mapping", "test", "--map_k", str(k),
                                 "--output_dir", str(paths.evaluation), "--device", run["device"]],
               label=f"evaluate {run_id}", what="evaluation")
    metrics = _summary(json.loads((paths.evaluation / "metrics.json").read_text()), k)
    log.info("validation MAP@%d %.4f (random ranking of the same displays: %.4f), AUC %.4f, logloss %.4f over "
             "%d rows / %d displays", k, metrics[f"map@{k}"], metrics[f"random_map@{k}"], metrics["auc"],
             metrics["logloss"], metrics["rows"], metrics["displays"])
    return metrics


def score_published(settings: Settings, run_id: str, version_uri: str, run: dict[str, Any], metrics: dict[str, Any],
                    *, aws_conn_id: str | None = None) -> dict[str, Any]:
    """MAP@k of a published version on this run's validation displays. The version scores them through its own
    feature statistics (its CTR tables, medians, normalisation: `predict score` recomputes the features of the raw
    rows with them), so the comparison is what each model would do in production on the same displays."""
    from tasks.outbrain.predict import missing_for_scoring

    name = run["window"]["dataset"]
    return score_with_predict(settings, run_id, version_uri, paths=run_paths(settings, run_id),
                              cache_dir=layout.models_cache(settings.data_root), required=missing_for_scoring,
                              predict_module=PREDICT_MODULE, aws_conn_id=aws_conn_id,
                              args=lambda local: ["score", "--model-dir", str(local),
                                                  "--validated", str(layout.validated_dir(settings.data_root, name)),
                                                  "--features", str(features_dir(settings, run)),
                                                  "--map-k", str(run["knobs"]["map_k"])])


def provenance(settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The snapshot (file checksums and validation), the features dataset and its engine, the trainer's flags."""
    name = run["window"]["dataset"]
    validated = read_manifest(layout.validated_dir(settings.data_root, name)) or {}
    return {
        "dataset": name, "snapshot": run["window"]["snapshot"], "snapshot_inputs": validated.get("inputs"),
        "features_engine": run.get("engine", "spark"), "trainer_config": trainer_config(run["knobs"]),
        "workers": run["workers"],
        "features": (read_manifest(features_dir(settings, run)) or {}).get("inputs_fingerprint"),
    }


def version_files(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Path]:
    """Everything a version needs to score raw Outbrain rows on its own (tasks/outbrain/predict.py): the weights and
    model config, the FeatureSpec, the feature statistics fitted on the train split (Spark's tables, or NVTabular's
    saved Workflow under stats/nvt_workflow/), plus the training curves, log and the gate's record."""
    from tasks.outbrain.predict import model_files

    paths = run_paths(settings, run_id)
    return {**model_files(paths.train, features_dir(settings, run)),
            "training_curves.png": paths.train / "training_curves.png",
            "gate.json": paths.gate / "gate.json"}


SPEC = TrainingPipeline(
    name=PIPELINE, dataset=DATASET, metric="map@{map_k}", floor_knob="min_map", resolve_run=resolve_run,
    train=train, evaluate=evaluate, score_published=score_published, window=lambda run: run["window"],
    trainer_config=lambda run: trainer_config(run["knobs"]), files=version_files, provenance=provenance,
    bad_input=(SnapshotMissing, ValueError))
run_paths = SPEC.run_paths
