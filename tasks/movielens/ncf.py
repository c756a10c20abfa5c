"""The movielens_ncf steps after ingest: the run's snapshot and knobs, preprocessing keyed by what it depends on,
train (tf.distribute workers), evaluate (HR@10 / NDCG@10), gate against the published model on the same test rows,
and publish with lineage. Plain functions; the DAG only wires them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.layout import dataset_stage_dir
from tasks.core.profiles import layer_sizes
from tasks.core.storage import fingerprint, read_manifest
from tasks.movielens import layout
from tasks.release.pipeline import TrainingPipeline, score_with_predict
from tasks.release.runs import SnapshotMissing, validated_snapshot

log = logging.getLogger(__name__)

PIPELINE = "movielens_ncf"
DATASET = layout.DATASET
TRAIN_MODULE = "models.ncf.train"
EVALUATE_MODULE = "models.ncf.evaluate"
PREDICT_MODULE = "tasks.movielens.predict"


def snapshot_identity(settings: Settings, name: str) -> dict[str, Any]:
    """{dataset, snapshot fingerprint} of a validated MovieLens snapshot, or SnapshotMissing (one line)."""
    return validated_snapshot(layout.validated_dir(settings.data_root, name), name, label="MovieLens",
                              ingest_hint=f"run movielens_ingest with dataset={name} first")


def resolve_run(settings: Settings, params: dict[str, Any], run_type: str = "manual", *,
                spark_master: str | None = None) -> dict[str, Any] | None:
    """What this run trains on and with, or None when there is nothing new (an asset-triggered or scheduled run
    whose snapshot and profile were trained already: the DAG then skips every later task); see
    tasks.release.runs.plan_snapshot_run. Bad MLP sizes are refused before any Spark work."""
    from tasks.core.profiles import resolve_knobs
    from tasks.movielens.profiles import KNOBS, PROFILES
    from tasks.movielens.settings import load_movielens_settings
    from tasks.release.runs import plan_snapshot_run

    def knobs_of(profile: str) -> dict[str, Any]:
        knobs = resolve_knobs(KNOBS, PROFILES, profile, params)
        trainer_config(knobs, 1)
        return knobs

    name = params.get("dataset") or load_movielens_settings().dataset
    return plan_snapshot_run(settings, pipeline=PIPELINE, knobs_of=knobs_of, params=params, run_type=run_type,
                             snapshot=lambda: snapshot_identity(settings, name))


def trainer_config(knobs: dict[str, Any], workers: int) -> dict[str, Any]:
    """The flags of models.ncf.train from the run's knobs."""
    return {
        "factors": knobs["factors"], "mlp_sizes": layer_sizes(knobs["mlp"], even_first=True),
        "dropout": knobs["dropout"], "epochs": knobs["epochs"], "batch_size": knobs["batch_size"], "learning_rate": knobs["lr"],
        "beta1": knobs["beta1"], "beta2": knobs["beta2"], "eps": knobs["eps"], "negatives": knobs["negatives"],
        "seed": knobs["seed"], "precision": knobs["precision"], "xla": bool(knobs["xla"]),
        "limit_train_batches": knobs["limit_train_batches"],
        "checkpoint_every_steps": knobs["checkpoint_every_steps"],
    }


def dataset_dir(settings: Settings, run: dict[str, Any]) -> Path:
    """The preprocessed dataset of a run, keyed by what it depends on (the snapshot and the preprocessing knobs):
    runs that change only model knobs share it, and a retry finds it complete."""
    from tasks.movielens.preprocess import PREPROCESS_RULES_VERSION
    from tasks.movielens.profiles import PREPROCESS_KNOBS

    window, knobs = run["window"], run["knobs"]
    key = fingerprint({"snapshot": window["snapshot"], "rules": PREPROCESS_RULES_VERSION,
                       **{name: knobs[name] for name in PREPROCESS_KNOBS}})
    return dataset_stage_dir(settings.data_root, DATASET, "preprocessed") / f"{window['dataset']}-{key[:16]}"


def preprocess(settings: Settings, run: dict[str, Any], *, spark_master: str | None = None) -> dict[str, Any]:
    from tasks.movielens.preprocess import preprocess as run_preprocess

    knobs, name = run["knobs"], run["window"]["dataset"]
    snapshot_identity(settings, name)  # the snapshot may have been removed since resolve_run
    return run_preprocess(settings, layout.validated_ratings(settings.data_root, name), dataset_dir(settings, run),
                          min_ratings=knobs["min_ratings"], test_negatives=knobs["test_negatives"],
                          seed=knobs["seed"], spark_master=spark_master)


def validate_dataset(settings: Settings, run: dict[str, Any]) -> dict[str, Any]:
    from tasks.movielens.preprocess import validate_dataset as check

    return check(dataset_dir(settings, run))


def train(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    from tasks.core.launch import train_with_tf_workers

    return train_with_tf_workers(TRAIN_MODULE, dataset_dir(settings, run), run_paths(settings, run_id).train,
                                 {**trainer_config(run["knobs"], run["workers"]), "device": run["device"]},
                                 workers=run["workers"],
                                 label=f"train {run_id}")


def evaluate(settings: Settings, run_id: str, run: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
    from tasks.core.launch import evaluate_in_child

    paths = run_paths(settings, run_id)
    metrics = evaluate_in_child(EVALUATE_MODULE, Path(trained["model_path"]), dataset_dir(settings, run),
                                paths.evaluation, mapping="test", label=f"evaluate {run_id}", device=run["device"])
    log.info("test HR@10 %.4f, NDCG@10 %.4f over %d users (random ranking: HR@10 %.4f, NDCG@10 %.4f)",
             metrics["hr@10"], metrics["ndcg@10"], metrics["users"], metrics["random_hr@10"],
             metrics["random_ndcg@10"])
    return {key: metrics[key] for key in ("hr@10", "ndcg@10", "random_hr@10", "random_ndcg@10", "users")}


def score_published(settings: Settings, run_id: str, version_uri: str, run: dict[str, Any], metrics: dict[str, Any],
                    *, aws_conn_id: str | None = None) -> dict[str, Any]:
    """HR@10 / NDCG@10 of a published version on this run's test rows: the candidates are mapped to raw ids through
    this run's id mappings and back through the version's own (a user or item it never saw cannot be ranked by
    it: its score is the lowest), scored by `predict` in a child process."""
    from tasks.movielens.predict import missing_for_scoring

    return score_with_predict(settings, run_id, version_uri, paths=run_paths(settings, run_id),
                              cache_dir=layout.models_cache(settings.data_root), required=missing_for_scoring,
                              predict_module=PREDICT_MODULE, aws_conn_id=aws_conn_id,
                              args=lambda local: ["score", "--model-dir", str(local),
                                                  "--dataset", str(dataset_dir(settings, run))])


def provenance(settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The snapshot (archive md5 and validation), the preprocessed dataset, the trainer's flags."""
    name = run["window"]["dataset"]
    validated = read_manifest(layout.validated_dir(settings.data_root, name)) or {}
    return {
        "dataset": name, "snapshot": run["window"]["snapshot"], "snapshot_inputs": validated.get("inputs"),
        "trainer_config": trainer_config(run["knobs"], run["workers"]), "workers": run["workers"],
        "preprocessed": (read_manifest(dataset_dir(settings, run)) or {}).get("inputs_fingerprint"),
    }


def version_files(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Path]:
    """Everything a version needs to recommend on its own (tasks/movielens/predict.py): the weights and model
    config, the id mappings (raw MovieLens ids <-> model indices), the items each user rated in training (so a
    recommendation leaves them out), the FeatureSpec, plus the training curves, log and the gate's record."""
    from tasks.movielens.predict import model_files

    paths = run_paths(settings, run_id)
    return {**model_files(paths.train, dataset_dir(settings, run)),
            "training_curves.png": paths.train / "training_curves.png",
            "train_log.jsonl": paths.train / "train_log.jsonl",
            "gate.json": paths.gate / "gate.json"}


SPEC = TrainingPipeline(
    name=PIPELINE, dataset=DATASET, metric="hr@10", floor_knob="min_hr", resolve_run=resolve_run, train=train,
    evaluate=evaluate, score_published=score_published, window=lambda run: run["window"],
    trainer_config=lambda run: trainer_config(run["knobs"], run["workers"]), files=version_files,
    provenance=provenance, bad_input=(SnapshotMissing, ValueError))
run_paths = SPEC.run_paths
