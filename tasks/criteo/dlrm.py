"""The criteo_dlrm steps that are not preprocessing: the run's window and knobs, run paths, train, evaluate, gate
against the published model, and publish with lineage. Plain functions; the DAG only wires them."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tasks.core.layout import run_dir
from tasks.core.profiles import dlrm_model_config
from tasks.criteo import layout
from tasks.core.config import Settings, code_version
from tasks.core.storage import file_sha256, fingerprint, read_manifest, write_text_atomic

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
_DAY_RANGES = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")


def parse_days(text: str, *, max_days: int | None = None, max_day: int | None = None) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]. Raises ValueError with the offending text. Bounded before anything is expanded: at
    most `max_days` days in all and no day above `max_day` (None: the deployment's RECFLOW_MAX_WINDOW_DAYS /
    RECFLOW_MAX_DAY_INDEX), so '0-300000000' is one line, not a list of 300 million days."""
    if not _DAY_RANGES.match(text or ""):
        raise ValueError(f"train days {text!r} are not a list of days or ranges like '0-22' or '0-3,5'")
    if max_days is None or max_day is None:
        from tasks.core.config import load_settings

        settings = load_settings()
        max_days = settings.max_window_days if max_days is None else max_days
        max_day = settings.max_day_index if max_day is None else max_day
    ranges = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"day range {part.strip()!r} runs backwards")
        if hi > max_day:
            raise ValueError(f"train days {_clipped(text)}: day {hi} is past the last day a run may name, {max_day} "
                             "(RECFLOW_MAX_DAY_INDEX)")
        ranges.append((lo, hi))
    named = sum(hi - lo + 1 for lo, hi in ranges)  # an upper bound of the distinct days, computed without them
    if named > max_days:
        raise ValueError(f"train days {_clipped(text)} name {named} days, more than the {max_days} a window may hold "
                         "(RECFLOW_MAX_WINDOW_DAYS)")
    return sorted({day for lo, hi in ranges for day in range(lo, hi + 1)})


def _clipped(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def ingested_days(settings: Settings) -> list[int]:
    """Days whose day_stats output is complete (has a manifest), ascending."""
    stats_root = layout.stats_root(settings.data_root)
    days = []
    for path in stats_root.glob("day=*"):
        suffix = path.name.removeprefix("day=")
        if suffix.isdigit() and read_manifest(path) is not None:
            days.append(int(suffix))
    return sorted(days)


def resolve_window(settings: Settings, train_days: str, test_day: int | None, window_days: int) -> dict[str, Any]:
    """The run's training window. Explicit params win; otherwise the newest ingested day is the test day and the
    `window_days` days before it are the train days (scheduled and asset-triggered retraining use this)."""
    if test_day is None:
        available = ingested_days(settings)
        if not available:
            raise ValueError(f"no ingested Criteo day under {settings.data_root}: run criteo_ingest first")
        test_day = available[-1]
    days = parse_days(train_days) if train_days else list(range(max(0, test_day - window_days), test_day))
    if not days:
        raise ValueError(f"no train days before test day {test_day} (window of {window_days} days)")
    if test_day in days:
        raise ValueError(f"test day {test_day} is also a train day ({train_days})")
    missing = [d for d in [*days, test_day] if read_manifest(layout.stats_day(settings.data_root, d)) is None]
    if missing:
        raise ValueError(f"days {missing} are not ingested (no day_stats manifest): run criteo_ingest for them")
    log.info("training window: train days %s, test day %d", days, test_day)
    return {"train_days": days, "test_day": test_day}


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


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def dictionary(self) -> Path:
        return self.root / "dictionary"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def evaluation(self) -> Path:
        return self.root / "eval"

    @property
    def export(self) -> Path:
        """The serving export: a Triton model repository (models.dlrm.export)."""
        return self.root / "export"

    @property
    def gate(self) -> Path:
        """The gate's record: gate.json, and the production model's scores on this run's test rows."""
        return self.root / "gate"


def run_paths(settings: Settings, run_id: str) -> RunPaths:
    return RunPaths(run_dir(settings.data_root, PIPELINE, run_id))


def model_config(knobs: dict[str, Any], device: str) -> dict[str, Any]:
    """DlrmConfig fields from the resolved knobs (tasks.core.profiles.dlrm_model_config)."""
    from tasks.criteo.profiles import MODEL_KNOBS

    return dlrm_model_config(knobs, MODEL_KNOBS, device)


def train(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    """torchrun on nproc processes (PyTorch), or nproc TensorFlow workers (MultiWorkerMirroredStrategy)."""
    from tasks.core.launch import train_with_tf_workers, train_with_torchrun
    from tasks.core.profiles import dlrm_memory_need

    paths = run_paths(settings, run_id)
    config = model_config(run["knobs"], run["device"])
    memory = dlrm_memory_need(paths.dataset, config)  # checked against the node before anything is launched
    if framework_of(run) == "tensorflow":
        return train_with_tf_workers(FRAMEWORKS["tensorflow"][0], paths.dataset, paths.train, config,
                                     workers=run["nproc"], label=f"train {run_id}", memory=memory)
    return train_with_torchrun(TRAIN_MODULE, paths.dataset, paths.train, config, nproc=run["nproc"],
                               label=f"train {run_id}", memory=memory)


def evaluate(settings: Settings, run_id: str, mapping: str = "test", framework: str = "pytorch") -> dict[str, Any]:
    from tasks.core.launch import evaluate_in_child

    paths = run_paths(settings, run_id)
    _, module, _, weights = FRAMEWORKS[framework]
    metrics = evaluate_in_child(module, paths.train / weights[0], paths.dataset, paths.evaluation,
                                mapping=mapping, label=f"evaluate {run_id}")
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
    if not (done.is_file() and json.loads(done.read_text()).get("source_sha256") == file_sha256(model)):
        run_module(module, ["--model_path", str(model), "--output_dir", str(paths.export)],
                   label=f"export {run_id}", what="export")
        record = json.loads(done.read_text()) | {"source_sha256": file_sha256(model)}
        write_text_atomic(done, json.dumps(record, indent=2, sort_keys=True))
    write_text_atomic(paths.export / PREPROCESSING_FILE, json.dumps(spec, indent=2, sort_keys=True))
    return json.loads(done.read_text())


def open_registry(settings: Settings, conn_id: str | None = None):
    """The deployment's model registry (tasks.release.steps.open_registry)."""
    from tasks.release.steps import open_registry as open_deployment_registry

    return open_deployment_registry(settings, conn_id)


def score_published(settings: Settings, run_id: str, version_uri: str, run: dict[str, Any], rows: int,
                    *, aws_conn_id: str | None = None) -> dict[str, Any]:
    """AUC / logloss of a published version on this run's test rows: the first `rows` good rows of the test day's
    raw file (exactly the rows of the run's `test` mapping), scored through the version's own dictionary by
    `predict` in a child process (the production model may be large; the Airflow worker never loads torch)."""
    from tasks.core.launch import run_module
    from tasks.criteo.predict import missing_for_scoring
    from tasks.release.steps import fetch_production

    # Fetched here, with the task's connection; the child only reads the local copy.
    local = fetch_production(settings, version_uri, layout.models_cache(settings.data_root),
                             aws_conn_id=aws_conn_id, required=missing_for_scoring)
    out = run_paths(settings, run_id).gate / "production_metrics.json"
    args = ["--model-dir", str(local), "--input", str(layout.raw_day(settings.data_root, run["test_day"])),
            "--limit-rows", str(rows), "--bad-row-budget", "1.0", "--metrics-out", str(out)]
    run_module(PREDICT_MODULE, args, label=f"gate {run_id}", what=f"scoring production {version_uri}")
    return json.loads(out.read_text())["metrics"]


def gate(settings: Settings, run_id: str, metrics: dict[str, Any], run: dict[str, Any], *, model_name: str,
         registry_conn_id: str | None = None, aws_conn_id: str | None = None) -> dict[str, Any]:
    """Decide whether this model may be published (tasks.release.steps.gate_run): AUC >= min_auc, and not worse
    than the production model by more than max_regression on the same rows, the production model scored on this
    run's test rows through its own published dictionary."""
    from tasks.release.steps import gate_run

    knobs = run["knobs"]
    return gate_run(settings, pipeline=PIPELINE, dataset=DATASET, run_id=run_id, model_name=model_name,
                    metrics=metrics, metric="auc", min_value=knobs["min_auc"],
                    max_regression=knobs["max_regression"],
                    window={"train_days": run["train_days"], "test_day": run["test_day"]},
                    config_hash=fingerprint({**model_config(knobs, run["device"]), **_framework_record(run)}),
                    gate_dir=run_paths(settings, run_id).gate, registry_conn_id=registry_conn_id,
                    score_production=lambda uri: score_published(settings, run_id, uri, run, int(metrics["rows"]),
                                                                 aws_conn_id=aws_conn_id))


def lineage(settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Where the model came from: days, their stats checksums, dictionary and dataset fingerprints, profile and
    knobs, the params as triggered, code."""
    paths = run_paths(settings, run_id)
    train_days, test_day = run["train_days"], run["test_day"]
    day_inputs = {}
    for day in sorted({*train_days, test_day}):
        manifest = read_manifest(layout.stats_day(settings.data_root, day)) or {}
        day_inputs[str(day)] = {"stats_fingerprint": manifest.get("inputs_fingerprint"),
                                "raw": manifest.get("inputs", {}).get("raw")}
    return {
        "pipeline": PIPELINE, "run_id": run_id, "train_days": train_days, "test_day": test_day,
        "profile": run["profile"], "knobs": run["knobs"], "params": params,
        "model_config": model_config(run["knobs"], run["device"]), "nproc": run["nproc"],
        "code_version": code_version(), "days": day_inputs, **_framework_record(run),
        "dictionary": (read_manifest(paths.dictionary) or {}).get("inputs_fingerprint"),
        "dataset": (read_manifest(paths.dataset) or {}).get("inputs_fingerprint"),
        "gate": json.loads((paths.gate / "gate.json").read_text()) if (paths.gate / "gate.json").is_file() else None,
    }


def publishable_files(settings: Settings, run_id: str, framework: str = "pytorch") -> dict[str, Path]:
    """Everything a version needs to score raw rows on its own (tasks/criteo/predict.py) and to be served: weights
    (model.pt, or model.weights.h5 + model_config.json for TensorFlow), the dictionary (parquet),
    preprocessing.json, the FeatureSpec, the Triton repository (TorchScript or SavedModel), plus the training
    curves, log and the gate's record. Raises FileNotFoundError naming what is missing."""
    from tasks.criteo.contract import DICTIONARY
    from tasks.criteo.predict import DICTIONARY_PREFIX, PREPROCESSING_FILE

    paths = run_paths(settings, run_id)
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
    files |= {f"dictionary/nvt_workflow/{path.relative_to(workflow).as_posix()}": path
              for path in sorted(workflow.rglob("*")) if path.is_file()}
    files |= {f"triton/{path.relative_to(paths.export).as_posix()}": path
              for path in sorted(paths.export.rglob("*"))
              if path.is_file() and path.name not in ("export.json", PREPROCESSING_FILE)}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if not values:
        missing.append(str(paths.dictionary / DICTIONARY / "*.parquet"))
    if not (paths.export / "dlrm" / "config.pbtxt").is_file():
        missing.append(str(paths.export / "dlrm" / "config.pbtxt"))
    if missing:
        raise FileNotFoundError(f"cannot publish {run_id}: missing {', '.join(missing)}")
    return files


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


def publish(settings: Settings, run_id: str, when: datetime, metrics: dict[str, Any], lineage_doc: dict[str, Any],
            *, run: dict[str, Any], model_name: str, store_uri: str | None = None, aws_conn_id: str | None = None,
            registry_conn_id: str | None = None) -> dict[str, Any]:
    """Upload a self-contained version (publishable_files, metrics, lineage); then move latest
    (tasks.release.steps.publish_run)."""
    from tasks.release.steps import publish_run

    framework = framework_of(run)
    return publish_run(settings, pipeline=PIPELINE, run_id=run_id, when=when, metrics=metrics, lineage_doc=lineage_doc,
                       files=lambda: check_scorable(publishable_files(settings, run_id, framework), run_id, framework),
                       model_name=model_name, store_uri=store_uri, aws_conn_id=aws_conn_id,
                       registry_conn_id=registry_conn_id)


def record_failure(settings: Settings, run_id: str, *, reason: str = "", registry_conn_id: str | None = None) -> bool:
    """Mark a registered run of criteo_dlrm `failed` (tasks.release.steps.record_failure); never raises."""
    from tasks.release.steps import record_failure as record

    return record(settings, PIPELINE, run_id, reason=reason, registry_conn_id=registry_conn_id)
