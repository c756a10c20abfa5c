"""The byo_dlrm steps: a user's CSV FeatureSpec and its CSV files (file / http(s) / s3 URIs) fetched, validated,
transcoded to split-binary (arrow engine on one machine, Spark with a cluster master: the same bytes), checked, and trained / evaluated / gated / published through the same
machinery as every DLRM pipeline (tasks.core.launch, tasks.release.steps). Plain functions; the DAG only wires them.

Each step keys its output by the DAG run (tasks.core.layout.run_dir) and by a manifest of its inputs, so a retry
replaces its own output only and a finished step is not redone.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from tasks.core.config import NotAllowed, Settings
from tasks.core.download_sources import DownloadError
from tasks.core.settings_registry import read
from tasks.core.dlrm_knobs import dlrm_model_config
from tasks.core.storage import completed_manifest, fingerprint, read_manifest
from tasks.release import runs
from tasks.release.pipeline import TrainingPipeline

log = logging.getLogger(__name__)

PIPELINE = "byo_dlrm"
DATASET = "byo"
SPEC_FILE = "feature_spec.yaml"
TRAIN_MODULE = "models.dlrm.train"
EVALUATE_MODULE = "models.dlrm.evaluate"
SPEC_URI_ENV = "RECFLOW_BYO_SPEC_URI"
TRANSCODE_ENGINES = ("arrow", "spark")
ENGINE_ENV = "RECFLOW_BYO_TRANSCODE_ENGINE"  # arrow | spark; unset: arrow on one machine, spark on a cluster master
# Bump when a step's semantics change: cached outputs are then rebuilt.
VALIDATION_VERSION = 1
TRANSCODE_VERSION = 2  # 2: numericals rounded float64 -> float32 -> float16, as NVIDIA's transcode.py


class StepInputMissing(FileNotFoundError):
    """A step ran before the step it depends on finished; the message names what to run first."""


class RunPaths(runs.RunPaths):
    """A byo_dlrm run's folders: the generic training ones (train, eval, gate) plus its inputs and dataset."""

    @property
    def source(self) -> Path:
        """The fetched spec (feature_spec.yaml) and CSV files, at the spec's relative paths."""
        return self.root / "source"

    @property
    def validated(self) -> Path:
        return self.root / "validated"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    rebuilt_by = "fetch"

    @property
    def rebuildable(self) -> tuple[Path, ...]:
        return (self.source, self.validated, self.dataset)


def model_config(knobs: dict[str, Any], device: str) -> dict[str, Any]:
    """DlrmConfig fields from the resolved knobs (tasks.core.dlrm_knobs.dlrm_model_config)."""
    from tasks.byo.profiles import MODEL_KNOBS

    return dlrm_model_config(knobs, MODEL_KNOBS, device)


def data_base_uri(spec_uri: str, data_uri: str | None) -> str:
    """Where the spec's relative file paths are resolved: data_uri, else the spec's own folder."""
    base = data_uri or spec_uri.rsplit("/", 1)[0]
    return base.rstrip("/")


def allow_lists(settings: Settings) -> dict[str, tuple]:
    """What a user-named URI may point at: the deployment's file roots (RECFLOW_FILE_SOURCE_ROOTS, else the data
    root) and URL prefixes (RECFLOW_SOURCE_ALLOWED_PREFIXES; none when unset, so http(s)/s3 must be allowed)."""
    return {"allowed_file_roots": settings.allowed_file_roots(),
            "allowed_prefixes": settings.allowed_source_prefixes()}


def resolve_run(settings: Settings, params: dict[str, Any], run_type: str = "manual", *,
                spark_master: str | None = None) -> dict[str, Any]:
    """What this run reads and trains with: the spec URI and data base URI (checked against the allow-lists before
    any I/O), the profile and every knob's value, device and process count. Returned to XCom."""
    from tasks.byo.profiles import KNOBS, PROFILES
    from tasks.core.download import check_source_allowed
    from tasks.core.profiles import resolve_knobs

    spec_uri = params.get("spec_uri") or read(SPEC_URI_ENV)
    if not spec_uri:
        raise ValueError(f"no spec_uri: name the FeatureSpec yaml (file://, http(s):// or s3://) in the trigger "
                         f"form or set {SPEC_URI_ENV}")
    base = data_base_uri(spec_uri, params.get("data_uri"))
    check_source_allowed(spec_uri, **allow_lists(settings))
    check_source_allowed(f"{base}/{SPEC_FILE}", **allow_lists(settings))  # the folder the data files come from
    profile = params.get("profile") or settings.profile
    knobs = resolve_knobs(KNOBS, PROFILES, profile, params)
    model_config(knobs, device="cpu")  # refuse bad MLP sizes before any work
    nproc = int(params.get("nproc") or settings.train_nproc)
    device = params.get("device") or settings.train_device
    log.info("spec %s, data under %s; profile %s on %s x %d", spec_uri, base, profile, device, nproc)
    return {"spec_uri": spec_uri, "data_uri": base, "profile": profile, "knobs": knobs, "nproc": nproc,
            "device": device}


def fetch_sources(settings: Settings, run_id: str, run: dict[str, Any], *, aws_conn_id: str | None = None,
                  s3_client: Any = None) -> dict[str, Any]:
    """Download the spec, check it, then download every CSV file it names (tasks.core.download: resumable,
    checksummed, each file complete or absent; a retry re-uses what is already verified)."""
    from tasks.byo.spec import load_csv_spec, source_files
    from tasks.core.download import download, s3_client_from_connection

    paths = run_paths(settings, run_id)
    uris = [run["spec_uri"], run["data_uri"]]
    if s3_client is None and any(uri.startswith("s3://") for uri in uris):
        s3_client = s3_client_from_connection(aws_conn_id, settings.allowed_conn_ids)
    allowed = allow_lists(settings)
    spec_result = download(run["spec_uri"], paths.source / SPEC_FILE, decompress=False, s3_client=s3_client,
                           **allowed)
    spec = load_csv_spec(paths.source / SPEC_FILE)
    files = {}
    for rel in source_files(spec):
        result = download(data_file_url(run["data_uri"], rel), paths.source / rel, decompress=False,
                          s3_client=s3_client, **allowed)
        files[rel] = result.sha256
    log.info("fetched the spec and %d CSV files into %s", len(files), paths.source)
    return {"path": str(paths.source), "spec_sha256": spec_result.sha256, "files": files}


def data_file_url(base: str, rel: str) -> str:
    """The URL of the data file the spec names `rel`, under `base`: percent-encoded where the scheme's path is
    decoded (http(s), file://), verbatim where it is not (an S3 key, which may hold '=' or spaces: Hive-style
    folders; a plain path)."""
    scheme = urlsplit(base).scheme.lower()
    return f"{base}/{quote(rel) if scheme in ('http', 'https', 'file') else rel}"


def validate(settings: Settings, run_id: str, fetched: dict[str, Any]) -> dict[str, Any]:
    """Every row of every CSV against the spec (tasks/byo/validation.py); a no-op when done for the same files."""
    from tasks.byo.spec import load_csv_spec
    from tasks.byo.validation import validate_csvs

    paths = run_paths(settings, run_id)
    inputs = {"version": VALIDATION_VERSION, "spec": fetched["spec_sha256"], "files": fetched["files"],
              "budget": settings.bad_row_budget}
    done = completed_manifest(paths.validated, inputs)
    if done is not None:
        log.info("CSV files already validated for these inputs (%s): nothing to do", paths.validated)
        return {"path": str(paths.validated), "rows": done["rows"], "bad_rows": done["extra"]["bad_rows"],
                "max_ids": done["extra"]["max_ids"], "cached": True}
    spec = load_csv_spec(paths.source / SPEC_FILE)
    return validate_csvs(spec, paths.source, paths.validated, inputs=inputs, budget=settings.bad_row_budget,
                         block_bytes=settings.validation_block_bytes) | {"cached": False}


def transcode_engine(engine: str | None, spark_master: str | None, spark_profile: str) -> str:
    """The engine given, else RECFLOW_BYO_TRANSCODE_ENGINE, else arrow on one machine (no Spark master or a
    local[...] one, local profile) and spark otherwise; logged with its reason."""
    from tasks.core.spark_submit import choose_engine_for_master

    return choose_engine_for_master("byo transcode", engine, ENGINE_ENV, TRANSCODE_ENGINES, spark_master,
                                    spark_profile)


def transcode(settings: Settings, run_id: str, *, spark_master: str = "local[*]",
              spark_profile: str | None = None, engine: str | None = None) -> dict[str, Any]:
    """CSV -> split-binary + feature_spec.yaml: tasks/byo/transcode_arrow.py in this process, or
    spark_jobs/byo/transcode.py by spark-submit (transcode_engine); both write the same bytes, so the cache key does
    not name the engine. A no-op when the dataset already carries a manifest for the same validated inputs."""
    paths = run_paths(settings, run_id)
    validated = read_manifest(paths.validated)
    if validated is None or validated.get("kind") != "byo_validated_csv":
        raise StepInputMissing(f"no completed validation in {paths.validated}: run validate first")
    inputs = {"version": TRANSCODE_VERSION, "validated": validated["inputs_fingerprint"]}
    manifest = completed_manifest(paths.dataset, inputs)
    cached = manifest is not None
    if manifest is None:
        started = time.monotonic()
        profile = spark_profile or settings.spark_profile
        chosen = transcode_engine(engine, spark_master, profile)
        args = ["--spec", str(paths.source / SPEC_FILE), "--output", str(paths.dataset),
                "--expected-bad-rows", json.dumps(validated["extra"]["bad_rows"]),
                "--expected-lines", json.dumps(validated["rows"]), "--inputs-json", json.dumps(inputs)]
        if chosen == "arrow":
            from tasks.byo.transcode_arrow import main as transcode_here

            transcode_here(args)
        else:
            _check_spark_reads(paths.source / SPEC_FILE)
            from tasks.core.spark_submit import SparkSubmit, run_spark_job

            run_spark_job(SparkSubmit("byo/transcode.py", args, master=spark_master, profile=profile),
                          label=f"spark transcode {run_id}")
        manifest = read_manifest(paths.dataset)
        if manifest is None or manifest.get("inputs_fingerprint") != fingerprint(inputs):
            raise RuntimeError(f"the {chosen} transcode finished but wrote no manifest for these inputs in "
                               f"{paths.dataset}")
        log.info("%s transcode finished in %.1f s", chosen, time.monotonic() - started)
    else:
        log.info("dataset for these inputs already written (%s): nothing to do", paths.dataset)
    return {"path": str(paths.dataset), "rows": manifest["rows"], "cardinalities": manifest["extra"]["cardinalities"],
            "dropped": manifest["extra"]["dropped"], "fingerprint": manifest["inputs_fingerprint"], "cached": cached,
            "engine": manifest["extra"].get("engine", "spark")}


SPARK_CODECS = (".gz", ".bz2", ".zst")  # what Spark's text reader decompresses by file name (Hadoop's codecs)


def _check_spark_reads(spec_path: Path) -> None:
    """FeatureSpecError (one line, no retry) for a file the Spark engine cannot read: Hadoop's Lz4Codec reads its own
    block format, not the LZ4 frame format `lz4` and pyarrow write (Spark 4.1 failed the job on such a file)."""
    from tasks.byo.contract import COMPRESSED_SUFFIXES
    from tasks.byo.spec import load_csv_spec, source_files
    from tasks.formats.feature_spec import FeatureSpecError

    unreadable = [name for name in source_files(load_csv_spec(spec_path))
                  if name.endswith(COMPRESSED_SUFFIXES) and not name.endswith(SPARK_CODECS)]
    if unreadable:
        raise FeatureSpecError(f"{unreadable[0]}{f' (and {len(unreadable) - 1} more)' if len(unreadable) > 1 else ''}"
                               f": the spark engine reads plain, {', '.join(SPARK_CODECS)} files, not LZ4 frames "
                               "(Hadoop's Lz4Codec); transcode with engine arrow, or recompress them")


class DatasetInvalid(ValueError):
    """A written dataset that NVIDIA's loaders would reject; the message names the dataset and the file at fault."""


def validate_dataset(dataset_dir: Path) -> dict[str, Any]:
    """NVIDIA's FeatureSpec checks + the files' sizes and a full scan of train and test's values
    (tasks.formats.split_binary.check_dataset; sizes only where the manifest says the writer checked the values), and
    the rows found equal to the transcode's manifest."""
    from tasks.formats.feature_spec import FEATURE_SPEC_FILE, FeatureSpec, FeatureSpecError
    from tasks.formats.split_binary import DatasetError, check_dataset, checked_at_write

    dataset_dir = Path(dataset_dir)
    if not (dataset_dir / FEATURE_SPEC_FILE).is_file():
        raise StepInputMissing(f"{dataset_dir / FEATURE_SPEC_FILE} is missing: run transcode first")
    manifest = read_manifest(dataset_dir)
    try:
        spec = FeatureSpec.from_yaml(dataset_dir / FEATURE_SPEC_FILE)
        summary = check_dataset(spec, scan_values=not checked_at_write(manifest, spec))
    except (FeatureSpecError, DatasetError) as err:
        raise DatasetInvalid(f"dataset {dataset_dir}: {err}") from None
    recorded = (manifest or {}).get("rows", {})
    for mapping, rows in summary.rows.items():
        if recorded.get(mapping) != rows:
            raise DatasetInvalid(f"dataset {dataset_dir}: {mapping} has {rows} rows but its manifest records "
                                 f"{recorded.get(mapping)}")
    return {"path": str(dataset_dir), "rows": summary.rows, "bytes": summary.bytes,
            "cardinalities": spec.get_categorical_sizes()}


def train(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    from tasks.core.launch import train_with_torchrun
    from tasks.core.dlrm_knobs import PIPELINE_TRAINER_FLAGS, dlrm_memory_need, time_budget

    paths = run_paths(settings, run_id)
    config = model_config(run["knobs"], run["device"])
    return train_with_torchrun(TRAIN_MODULE, paths.dataset, paths.train, config, nproc=run["nproc"],
                               label=f"train {run_id}", memory=dlrm_memory_need(paths.dataset, config),
                               time_budget_s=time_budget(run), flags=PIPELINE_TRAINER_FLAGS)


def evaluate(settings: Settings, run_id: str, run: dict[str, Any], trained: dict[str, Any] | None = None,
             mapping: str = "test") -> dict[str, Any]:
    from tasks.core.launch import evaluate_in_child

    paths = run_paths(settings, run_id)
    metrics = evaluate_in_child(EVALUATE_MODULE, paths.train / "model.pt", paths.dataset, paths.evaluation,
                                mapping=mapping, label=f"evaluate {run_id}", device=run["device"])
    log.info("test AUC %.4f, logloss %.4f on %d rows", metrics["auc"], metrics["logloss"], metrics["rows"])
    return {key: metrics[key] for key in ("auc", "logloss", "rows", "mapping")}


def _scorable(files: list[str]) -> list[str]:
    return [name for name in ("model.pt", SPEC_FILE) if name not in files]


def score_published(settings: Settings, run_id: str, version_uri: str, run: dict[str, Any], metrics: dict[str, Any],
                    *, aws_conn_id: str | None = None) -> dict[str, Any]:
    """AUC / logloss of a published version on this run's test mapping (the same rows as the candidate's). Only a
    version trained on the same layout (same numerical count and cardinalities) can read these rows; any other is
    FileNotFoundError, and the gate then compares by its recorded metric and says so."""
    from tasks.core.launch import evaluate_in_child
    from tasks.formats.feature_spec import FeatureSpec
    from tasks.release.steps import fetch_production

    paths = run_paths(settings, run_id)
    local = fetch_production(settings, version_uri, settings.data_root / "byo" / "models", aws_conn_id=aws_conn_id,
                             required=_scorable)
    theirs, ours = FeatureSpec.from_yaml(local / SPEC_FILE), FeatureSpec.from_yaml(paths.dataset / SPEC_FILE)
    shape = (theirs.get_number_of_numerical_features(), theirs.get_categorical_sizes())
    if shape != (ours.get_number_of_numerical_features(), ours.get_categorical_sizes()):
        raise FileNotFoundError(f"{version_uri} was trained on another layout ({shape[0]} numericals, "
                                f"cardinalities {shape[1]}): it cannot score this dataset's rows")
    return evaluate_in_child(EVALUATE_MODULE, local / "model.pt", paths.dataset, paths.gate / "production",
                             label=f"gate {run_id}", device=run["device"])


def provenance(settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The URIs, every source file's sha256, the validation and dataset fingerprints, the model config."""
    from tasks.core.download_sources import redacted_url

    paths = run_paths(settings, run_id)
    validated = read_manifest(paths.validated) or {}
    dataset = read_manifest(paths.dataset) or {}
    return {
        # Presigned URLs sign a request: their query strings stay out of lineage and the registry (issue #24).
        "spec_uri": redacted_url(run["spec_uri"]), "data_uri": redacted_url(run["data_uri"]),
        "source_files": validated.get("inputs", {}).get("files"),
        "params": {k: redacted_url(v) if k in ("spec_uri", "data_uri") and v else v for k, v in params.items()},
        "model_config": model_config(run["knobs"], run["device"]), "nproc": run["nproc"],
        "validated": validated.get("inputs_fingerprint"), "dataset": dataset.get("inputs_fingerprint"),
        "rows": dataset.get("rows"), "features": dataset.get("extra", {}).get("features"),
    }


def window(run: dict[str, Any]) -> dict[str, Any]:
    """What the registry records of a run's inputs: its URIs, without a presigned URL's signature."""
    from tasks.core.download_sources import redacted_url

    return {"spec_uri": redacted_url(run["spec_uri"]), "data_uri": redacted_url(run["data_uri"])}


def version_files(settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Path]:
    """Weights, the dataset's split-binary FeatureSpec (what the model reads), the user's CSV spec (how its
    features were renamed), the training curves and log, and the gate's record."""
    paths = run_paths(settings, run_id)
    return {
        "model.pt": paths.train / "model.pt",
        SPEC_FILE: paths.dataset / SPEC_FILE,
        "source_feature_spec.yaml": paths.source / SPEC_FILE,
        "training_curves.png": paths.train / "training_curves.png",
        "train_log.jsonl": paths.train / "train_log.jsonl",
        "gate.json": paths.gate / "gate.json",
    }


SPEC = TrainingPipeline(
    name=PIPELINE, dataset=DATASET, metric="auc", floor_knob="min_auc", resolve_run=resolve_run, train=train,
    evaluate=evaluate, score_published=score_published, window=window,
    trainer_config=lambda run: model_config(run["knobs"], run["device"]), files=version_files,
    provenance=provenance, paths=RunPaths, bad_input=(ValueError, NotAllowed, DownloadError))
run_paths = SPEC.run_paths
