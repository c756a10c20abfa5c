"""The criteo_dlrm steps that are not preprocessing: the run's window (tasks/criteo/window.py, retrain.py) and knobs,
train, evaluate, export, and what the shared gate / lineage / publish need of this pipeline (`SPEC`, a
tasks.release.pipeline.TrainingPipeline). Plain functions; the DAG only wires them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tasks.core.dlrm_knobs import dlrm_model_config
from tasks.criteo import layout
from tasks.core.config import Settings
from tasks.core.storage import file_sha256, is_temporary, read_manifest, write_text_atomic
from tasks.release import runs
from tasks.release.pipeline import TrainingPipeline, require_files, score_with_predict

log = logging.getLogger(__name__)

PIPELINE = "criteo_dlrm"
DATASET = "criteo"
TRAIN_MODULE = "models.dlrm.train"
EVALUATE_MODULE = "models.dlrm.evaluate"
EXPORT_MODULE = "models.dlrm.export"
# framework -> (trainer, evaluator, serving export, the weights files a version holds); the trainers share flags.
FRAMEWORKS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "pytorch": (TRAIN_MODULE, EVALUATE_MODULE, EXPORT_MODULE, ("model.pt",)),
    "tensorflow": ("models.dlrm_tf.train", "models.dlrm_tf.evaluate", "models.dlrm_tf.export",
                   ("model.weights.h5", "model_config.json")),
}
PREDICT_MODULE = "tasks.criteo.predict"


def resolve_run(settings: Settings, params: dict[str, Any], run_type: str = "manual", *,
                spark_master: str | None = "local[*]") -> dict[str, Any] | None:
    """What this run trains on and with, or None when there is nothing new to train (the DAG then skips every
    later task): the window and why (tasks.criteo.retrain.plan_run), the profile and every knob's value (the
    profile's, overridden by the params that are set), and the device / process count (params, else the
    deployment's RECFLOW_TRAIN_DEVICE / RECFLOW_TRAIN_NPROC), and the preprocessing engine (the param, else the
    deployment's, else arrow on a local `spark_master`, spark on a cluster). Returned to XCom so every later step
    uses the same."""
    from tasks.core.profiles import resolve_knobs
    from tasks.criteo.profiles import KNOBS, PROFILES
    from tasks.criteo.preprocess import preprocess_engine
    from tasks.criteo.retrain import plan_run

    profile = params.get("profile") or settings.profile
    knobs = resolve_knobs(KNOBS, PROFILES, profile, params)
    model_config(knobs, device="cpu")  # refuse bad MLP sizes before any Spark work
    window, why = plan_run(settings, params, knobs["window_days"], run_type)
    log.info("window: %s (%s)", window, why)
    if window is None:
        return None
    nproc = int(params.get("nproc") or settings.train_nproc)
    device = params.get("device") or settings.train_device
    framework = params.get("framework") or "pytorch"
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {sorted(FRAMEWORKS)}, got {framework!r}")
    engine = preprocess_engine(params.get("engine"), spark_master, settings.spark_profile)
    log.info("profile %s, preprocessing by %s, %s on %s x %d: %s", profile, engine, framework, device, nproc,
             ", ".join(f"{k}={v}" for k, v in knobs.items()))
    return {**window, "why": why, "profile": profile, "knobs": knobs, "nproc": nproc, "device": device,
            "framework": framework, "engine": engine}


def framework_of(run: dict[str, Any]) -> str:
    """The run's framework (runs resolved before the param existed trained PyTorch)."""
    return run.get("framework") or "pytorch"


def _framework_record(run: dict[str, Any]) -> dict[str, Any]:
    """What lineage and the config hash add for a TensorFlow run; nothing for PyTorch (its records stay as they
    were, so published PyTorch versions compare equal to earlier ones)."""
    framework = framework_of(run)
    return {} if framework == "pytorch" else {"framework": framework}


class RunPaths(runs.RunPaths):
    """A criteo_dlrm run's folders: the generic training ones (train, eval, gate) plus its dictionary, dataset and
    serving export."""

    @property
    def dictionary(self) -> Path:
        return self.root / "dictionary"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    rebuilt_by = "transform"

    @property
    def rebuildable(self) -> tuple[Path, ...]:
        return (self.dataset,)

    @property
    def export(self) -> Path:
        """The serving export: a Triton model repository (models.dlrm.export)."""
        return self.root / "export"


def model_config(knobs: dict[str, Any], device: str) -> dict[str, Any]:
    """DlrmConfig fields from the resolved knobs (tasks.core.dlrm_knobs.dlrm_model_config)."""
    from tasks.criteo.profiles import MODEL_KNOBS

    return dlrm_model_config(knobs, MODEL_KNOBS, device)


def train(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    """torchrun on nproc processes (PyTorch), or nproc TensorFlow workers (MultiWorkerMirroredStrategy); the model's
    memory is checked against the node before anything is launched (the TF2 trainer keeps the largest tables in
    host memory on a GPU, at its default threshold)."""
    from tasks.core.launch import train_with_tf_workers, train_with_torchrun
    from tasks.core.dlrm_knobs import HOST_TABLE_THRESHOLD_BYTES, PIPELINE_TRAINER_FLAGS, dlrm_memory_need, time_budget

    paths = run_paths(settings, run_id)
    config = model_config(run["knobs"], run["device"])
    tf2 = framework_of(run) == "tensorflow"
    memory = dlrm_memory_need(paths.dataset, config, host_table_threshold=HOST_TABLE_THRESHOLD_BYTES if tf2 else None)
    if tf2:
        return train_with_tf_workers(FRAMEWORKS["tensorflow"][0], paths.dataset, paths.train, config,
                                     workers=run["nproc"], label=f"train {run_id}", memory=memory,
                                     time_budget_s=time_budget(run), flags=PIPELINE_TRAINER_FLAGS)
    return train_with_torchrun(TRAIN_MODULE, paths.dataset, paths.train, config, nproc=run["nproc"],
                               label=f"train {run_id}", memory=memory, time_budget_s=time_budget(run),
                               flags=PIPELINE_TRAINER_FLAGS)


def evaluate(settings: Settings, run_id: str, run: dict[str, Any], trained: dict[str, Any] | None = None,
             mapping: str = "test") -> dict[str, Any]:
    from tasks.core.launch import evaluate_in_child

    paths = run_paths(settings, run_id)
    _, module, _, weights = FRAMEWORKS[framework_of(run)]
    metrics = evaluate_in_child(module, paths.train / weights[0], paths.dataset, paths.evaluation,
                                mapping=mapping, label=f"evaluate {run_id}", device=run["device"])
    log.info("test AUC %.4f, logloss %.4f on %d rows", metrics["auc"], metrics["logloss"], metrics["rows"])
    return {key: metrics[key] for key in ("auc", "logloss", "rows", "mapping")}


def export(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    """Serving export of the trained model as a Triton model repository, checked against the model it came from
    (TorchScript for PyTorch, models.dlrm.export; a SavedModel for TensorFlow, models.dlrm_tf.export), and
    preprocessing.json (how raw rows become the model's inputs); publish only reads them (safe to retry)."""
    from tasks.core.launch import run_module
    from tasks.criteo.contract import parse_threshold_overrides
    from tasks.criteo.predict import PREPROCESSING_FILE, preprocessing_spec

    paths = run_paths(settings, run_id)
    cardinalities = json.loads((paths.dictionary / "cardinalities.json").read_text())
    knobs = run["knobs"]
    dictionary_days = run["train_days"] + ([run["test_day"]] if knobs["dictionary_days"] == "all" else [])
    spec = preprocessing_spec(list(cardinalities.values()), knobs["frequency_threshold"],
                              parse_threshold_overrides(knobs["threshold_overrides"] or ""), dictionary_days,
                              engine=(read_manifest(paths.dictionary) or {}).get("extra", {}).get("engine", "spark"))
    done = paths.export / "export.json"
    _, _, module, weights = FRAMEWORKS[framework_of(run)]
    model = paths.train / weights[0]
    source = file_sha256(model)  # read once: the weights are GBs at full size
    if not (done.is_file() and json.loads(done.read_text()).get("source_sha256") == source):
        run_module(module, ["--model_path", str(model), "--output_dir", str(paths.export)],
                   label=f"export {run_id}", what="export")
        record = json.loads(done.read_text()) | {"source_sha256": source}
        write_text_atomic(done, json.dumps(record, indent=2, sort_keys=True))
    write_text_atomic(paths.export / PREPROCESSING_FILE, json.dumps(spec, indent=2, sort_keys=True))
    return json.loads(done.read_text())


def score_published(settings: Settings, run_id: str, version_uri: str, run: dict[str, Any], metrics: dict[str, Any],
                    *, aws_conn_id: str | None = None) -> dict[str, Any]:
    """AUC / logloss of a published version on this run's test rows: the first metrics["rows"] good rows of the test
    day's raw file (exactly the rows of the run's `test` mapping), scored through the version's own dictionary by
    `predict` in a child process."""
    from tasks.criteo.predict import missing_for_scoring, read_by_eager_scoring

    return score_with_predict(settings, run_id, version_uri, paths=run_paths(settings, run_id),
                              cache_dir=layout.models_cache(settings.data_root), required=missing_for_scoring,
                              wanted=read_by_eager_scoring, predict_module=PREDICT_MODULE, aws_conn_id=aws_conn_id,
                              args=lambda local: ["--model-dir", str(local), "--engine", "eager", "--input",
                                                  str(layout.raw_day(settings.data_root, run["test_day"])),
                                                  "--limit-rows", str(int(metrics["rows"])),
                                                  "--bad-row-budget", "1.0", "--device", run["device"]])


def provenance(settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Days and their stats checksums, dictionary and dataset fingerprints, the model config."""
    paths = run_paths(settings, run_id)
    train_days, test_day = run["train_days"], run["test_day"]
    day_inputs = {}
    for day in sorted({*train_days, test_day}):
        manifest = read_manifest(layout.stats_day(settings.data_root, day)) or {}
        day_inputs[str(day)] = {"stats_fingerprint": manifest.get("inputs_fingerprint"),
                                "raw": manifest.get("inputs", {}).get("raw")}
    return {
        "train_days": train_days, "test_day": test_day,
        "model_config": model_config(run["knobs"], run["device"]), "nproc": run["nproc"],
        "days": day_inputs, **_framework_record(run),
        "dictionary": (read_manifest(paths.dictionary) or {}).get("inputs_fingerprint"),
        "dataset": (read_manifest(paths.dataset) or {}).get("inputs_fingerprint"),
    }


def publishable_files(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Path]:
    """Everything a version needs to score raw rows on its own (tasks/criteo/predict.py) and to be served: weights
    (model.pt, or model.weights.h5 + model_config.json for TensorFlow), the dictionary (parquet),
    preprocessing.json, the FeatureSpec, the Triton repository (TorchScript or SavedModel), plus the training
    curves, log and the gate's record. Raises FileNotFoundError naming what is missing, then NotAllowed for a
    version predict could not score (check_scorable)."""
    from tasks.criteo.contract import DICTIONARY
    from tasks.criteo.predict import DICTIONARY_PREFIX, PREPROCESSING_FILE, SERVING_PREFIX

    paths, framework = run_paths(settings, run_id), framework_of(run)
    files = {
        **{name: paths.train / name for name in FRAMEWORKS[framework][3]},
        PREPROCESSING_FILE: paths.export / PREPROCESSING_FILE,
        "feature_spec.yaml": paths.dataset / "feature_spec.yaml",
        "dictionary/cardinalities.json": paths.dictionary / "cardinalities.json",
        "dictionary/model_size.json": paths.dictionary / "model_size.json",
        "training_curves.png": paths.train / "training_curves.png",
        "train_log.jsonl": paths.train / "train_log.jsonl",
        "gate.json": paths.gate / "gate.json",
    }
    values = sorted((paths.dictionary / DICTIONARY).glob("*.parquet"))
    files |= {f"{DICTIONARY_PREFIX}{path.name}": path for path in values}
    # the nvtabular engine's fitted workflow (nvt_jobs/criteo.py), which the dictionary was read from
    workflow = paths.dictionary / "nvt_workflow"
    # (a temporary a killed writer on another worker left is not part of the version: publish would refuse its name)
    files |= {f"dictionary/nvt_workflow/{path.relative_to(workflow).as_posix()}": path
              for path in sorted(workflow.rglob("*"))
              if path.is_file() and not is_temporary(path.relative_to(workflow))}
    files |= {f"{SERVING_PREFIX}{path.relative_to(paths.export).as_posix()}": path
              for path in sorted(paths.export.rglob("*"))
              if path.is_file() and path.name not in ("export.json", PREPROCESSING_FILE)
              and not is_temporary(path.relative_to(paths.export))}
    missing = [] if values else [str(paths.dictionary / DICTIONARY / "*.parquet")]
    if not (paths.export / "dlrm" / "config.pbtxt").is_file():
        missing.append(str(paths.export / "dlrm" / "config.pbtxt"))
    return check_scorable(require_files(run_id, files, missing), run_id, framework)


def check_scorable(files: dict[str, Path], run_id: str, framework: str) -> dict[str, Path]:
    """`files` when tasks.criteo.predict can score the version they make, else NotAllowed (one line, no retry): a
    version predict cannot score would also break every later gate, which scores the production version."""
    from tasks.core.config import NotAllowed
    from tasks.criteo.predict import missing_for_scoring

    unscorable = missing_for_scoring(list(files))
    if unscorable:
        raise NotAllowed(f"cannot publish {run_id}: tasks.criteo.predict cannot score a {framework} version (it "
                         f"needs {', '.join(unscorable)}); publish a pytorch run, or teach predict to load it "
                         "(docs/dlrm_tf.md)")
    return files


SPEC = TrainingPipeline(
    name=PIPELINE, dataset=DATASET, metric="auc", floor_knob="min_auc", resolve_run=resolve_run, train=train,
    evaluate=evaluate, score_published=score_published,
    window=lambda run: {"train_days": run["train_days"], "test_day": run["test_day"]},
    trainer_config=lambda run: {**model_config(run["knobs"], run["device"]), **_framework_record(run)},
    files=publishable_files, provenance=provenance, paths=RunPaths)
run_paths = SPEC.run_paths
