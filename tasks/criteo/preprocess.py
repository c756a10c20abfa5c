"""The preprocessing steps of criteo_dlrm: dictionary, transform to split binary, dataset validation.

Plain functions; the DAG only wires them. Each checks that its inputs are complete, fingerprints them (upstream
manifest fingerprints + the parameters that change the output), returns a small JSON-able dict for XCom, and is a
no-op when its output already carries a complete manifest for the same inputs. `out_dir` is the step's output
directory, under the DAG run's directory (tasks.core.run_dir), so a retry replaces its own output only.

Dictionary window: by default the dictionary is built over the train days only. NVIDIA's run scripts build it over
days 0-23, the test day included, which leaks the test day's vocabulary into training: a value first seen on the
test day gets an embedding row (never trained) instead of 0. `dictionary_days="all"` reproduces NVIDIA exactly.

Engine (`engine=`, else RECFLOW_CRITEO_PREPROCESS_ENGINE, else arrow when the Spark master is local and the profile
is the local one, spark with a cluster master or profile: tasks.core.spark_submit.choose_engine_for_master): `spark`
spark-submits the jobs in spark_jobs/criteo/; `arrow` runs tasks.criteo.preprocess_arrow in this process with the
same arguments (one machine, no JVM);
`nvtabular` fits and applies NVIDIA's NVTabular workflow for DLRM (nvt_jobs/criteo.py) in NVTabular's own
environment (tasks.core.nvtabular), then orders, splits and writes its output with preprocess_arrow. Spark and arrow
write the same output, so their cache key does not name the engine; nvtabular's dictionary also holds the fitted
workflow (nvt_workflow/), so its key does. The result (and the manifest's extra.engine) says which one ran. How the
engines' ids agree: docs/nvtabular.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.criteo import layout
from tasks.core.config import Settings
from tasks.core.spark_submit import GPU_PROFILES, choose_engine_for_master
from tasks.criteo.ingest import StepInputMissing
from tasks.criteo.schema import CAT_COLUMNS
from tasks.core.storage import completed_manifest, fingerprint, read_manifest

log = logging.getLogger(__name__)

# Bump when the job's semantics change (ids, transform, split): cached outputs are then rebuilt.
DICTIONARY_VERSION = 1
# 2: each day's row_order is made its dense file-order index before the train shuffle hashes (seed, day, row_order)
# and the test day is split, so the dataset is byte-identical whichever day-stats engine (arrow, spark) wrote the
# stats; the train shuffle's order (its bytes) differs from version 1's.
TRANSFORM_VERSION = 2
DICTIONARY_DAYS = ("train", "all")
DEFAULT_SEED = 12345
PREPROCESS_ENGINES = ("spark", "arrow", "nvtabular")
ENGINE_ENV = "RECFLOW_CRITEO_PREPROCESS_ENGINE"


class DatasetInvalid(ValueError):
    """A written dataset that NVIDIA's loaders would reject; the message names the dataset and the file at fault."""


def _check_days(train_days: Sequence[int], test_day: int) -> list[int]:
    days = [int(d) for d in train_days]
    if not days:
        raise ValueError("no train days given")
    if len(set(days)) != len(days):
        raise ValueError(f"train days {days} repeat a day")
    if test_day in days:
        raise ValueError(f"test day {test_day} is also a train day ({days})")
    return days


def _stats_fingerprints(settings: Settings, days: Sequence[int]) -> dict[str, str]:
    """day -> fingerprint of its completed day_stats output; StepInputMissing naming the first day without one."""
    found = {}
    for day in days:
        stats_dir = layout.stats_day(settings.data_root, day)
        manifest = read_manifest(stats_dir)
        if manifest is None or manifest.get("kind") != "criteo_day_stats":
            raise StepInputMissing(f"day {day} has no completed day stats in {stats_dir}: "
                                   f"run criteo_ingest for day {day} first")
        found[str(day)] = manifest["inputs_fingerprint"]
    return found


def _check_overrides(overrides: Mapping[str, int] | None) -> dict[str, int]:
    checked = {}
    for name, value in sorted((overrides or {}).items()):
        if name not in CAT_COLUMNS:
            raise ValueError(f"threshold override for {name!r}: not a categorical column (cat_0..cat_25)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"threshold override {name}={value!r}: must be an integer >= 0")
        checked[name] = value
    return checked


def preprocess_engine(engine: str | None, spark_master: str | None = "local[*]",
                      spark_profile: str = "local") -> str:
    """The engine given, else RECFLOW_CRITEO_PREPROCESS_ENGINE, else arrow on one machine (a local Spark master and
    profile) and spark otherwise; logged with its reason. A bad one is a ValueError naming its origin."""
    return choose_engine_for_master("criteo preprocess", engine, ENGINE_ENV, PREPROCESS_ENGINES, spark_master,
                                    spark_profile)


def _written_manifest(out_dir: Path, inputs: dict[str, Any], what: str) -> dict[str, Any]:
    """The manifest a finished job wrote in out_dir for exactly these inputs; RuntimeError when there is none."""
    manifest = read_manifest(out_dir)
    if manifest is None or manifest.get("inputs_fingerprint") != fingerprint(inputs):
        raise RuntimeError(f"{what} finished but wrote no manifest for these inputs in {out_dir}")
    return manifest


def _run_arrow(job: str, args: list[str], out_dir: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """tasks.criteo.preprocess_arrow's `job` in this process with the Spark job's argv; the manifest it wrote."""
    from tasks.criteo import preprocess_arrow

    started = time.monotonic()
    main = {"dictionary": preprocess_arrow.dictionary_main, "transform": preprocess_arrow.transform_main}[job]
    main([*args, "--output", str(out_dir), "--inputs-json", json.dumps(inputs)])
    log.info("arrow %s finished in %.1f s", job, time.monotonic() - started)
    return _written_manifest(out_dir, inputs, f"arrow {job}")


def _run_nvt(job: str, args: list[str], out_dir: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """nvt_jobs/criteo.py's `job` in NVTabular's environment; the manifest it wrote for exactly these inputs."""
    from tasks.core.nvtabular import run_nvt_job

    run_nvt_job("nvt_jobs.criteo", [job, *args, "--output", str(out_dir), "--inputs-json", json.dumps(inputs)],
                label=f"nvtabular {job}")
    return _written_manifest(out_dir, inputs, f"nvtabular {job}")


def _engine_of(manifest: dict[str, Any]) -> str:
    return manifest.get("extra", {}).get("engine", "spark")


def _submit(job: str, args: list[str], out_dir: Path, inputs: dict[str, Any], label: str, spark_master: str,
            profile: str, spark_conf: Mapping[str, str] | None) -> dict[str, Any]:
    """spark-submit a job and return the manifest it wrote for exactly these inputs."""
    from tasks.core.spark_submit import SparkSubmit, run_spark_job

    started = time.monotonic()
    submit = SparkSubmit(job, [*args, "--output", str(out_dir), "--inputs-json", json.dumps(inputs)],
                         master=spark_master, profile=profile, conf_overrides=dict(spark_conf or {}))
    run_spark_job(submit, label=label)
    log.info("%s finished in %.1f s", job, time.monotonic() - started)
    return _written_manifest(out_dir, inputs, job)


def build_dictionary(settings: Settings, out_dir: Path, train_days: Sequence[int], test_day: int,
                     frequency_threshold: int = 15, threshold_overrides: Mapping[str, int] | None = None,
                     dictionary_days: str = "train", spark_master: str = "local[*]", spark_profile: str | None = None,
                     spark_conf: Mapping[str, str] | None = None, engine: str | None = None) -> dict[str, Any]:
    """Dictionary of the window from the per-day value counts (spark_jobs/criteo/dictionary.py, by spark-submit).

    dictionary_days: "train" (default) sums the train days' counts; "all" adds the test day, as NVIDIA does.
    threshold_overrides: per-column thresholds, e.g. {"cat_3": 2}; 0 keeps every value.
    engine: spark | arrow | nvtabular (None: RECFLOW_CRITEO_PREPROCESS_ENGINE, else arrow on a local Spark master,
    spark on a cluster: preprocess_engine); part of the cache key only for nvtabular (its output also holds the
    fitted workflow).
    """
    engine = preprocess_engine(engine, spark_master, spark_profile or settings.spark_profile)
    days = _check_days(train_days, test_day)
    if dictionary_days not in DICTIONARY_DAYS:
        raise ValueError(f"dictionary_days {dictionary_days!r}: expected one of {DICTIONARY_DAYS}")
    if isinstance(frequency_threshold, bool) or not isinstance(frequency_threshold, int) or frequency_threshold < 0:
        raise ValueError(f"frequency_threshold {frequency_threshold!r}: must be an integer >= 0")
    overrides = _check_overrides(threshold_overrides)
    window = days + [test_day] if dictionary_days == "all" else days
    inputs = {"version": DICTIONARY_VERSION, "days": _stats_fingerprints(settings, window),
              "frequency_threshold": frequency_threshold, "threshold_overrides": overrides,
              "dictionary_days": dictionary_days}
    if engine == "nvtabular":
        inputs["engine"] = engine
    out_dir = Path(out_dir)
    manifest = completed_manifest(out_dir, inputs)
    cached = manifest is not None
    if manifest is None:
        thresholds = ["--frequency-threshold", str(frequency_threshold)]
        if overrides:
            thresholds += ["--threshold-overrides", ",".join(f"{name}:{value}" for name, value in overrides.items())]
        args = ["--counts", *(str(layout.stats_day(settings.data_root, day) / "counts") for day in window),
                *thresholds]
        if engine == "nvtabular":  # the workflow is fitted on the window's rows (NVIDIA's update_stats)
            manifest = _run_nvt("fit", ["--days", *(str(layout.stats_day(settings.data_root, day) / "columnar")
                                                    for day in window), *thresholds], out_dir, inputs)
        elif engine == "arrow":
            manifest = _run_arrow("dictionary", args, out_dir, inputs)
        else:
            manifest = _submit("criteo/dictionary.py", args, out_dir, inputs, f"spark dictionary days={window}",
                               spark_master, spark_profile or settings.spark_profile, spark_conf)
    else:
        log.info("dictionary over days %s already built for these inputs (%s): nothing to do", window, out_dir)
    cardinalities = manifest["extra"]["cardinalities"]
    return {"path": str(out_dir), "days": window, "values": manifest["rows"]["values"],
            "cardinalities": [cardinalities[name] for name in CAT_COLUMNS],
            "fingerprint": manifest["inputs_fingerprint"], "cached": cached, "engine": _engine_of(manifest)}


def _transform_nvt(days: list[str], options: list[str], dictionary_dir: Path, out_dir: Path,
                   inputs: dict[str, Any]) -> dict[str, Any]:
    """The fitted workflow applied to every day in NVTabular's environment (into `<out_dir>.nvt-encoded`, kept until
    the dataset is complete so a retry does not encode again), then ordered, split and written by preprocess_arrow
    exactly as for its own engine."""
    import shutil

    from tasks.criteo import preprocess_arrow

    encoded = out_dir.with_name(out_dir.name + ".nvt-encoded")
    encode_inputs = {"workflow": inputs["dictionary"], "days": inputs["train_days"] | inputs["test_day"]}
    if completed_manifest(encoded, encode_inputs) is None:
        workflow = dictionary_dir / (read_manifest(dictionary_dir) or {}).get("extra", {}).get("workflow",
                                                                                                "nvt_workflow")
        _run_nvt("transform", ["--workflow", str(workflow), "--inputs", *days], encoded, encode_inputs)
    else:
        log.info("days already encoded by the workflow (%s): ordering and writing only", encoded)
    parts = [str(encoded / str(i)) for i in range(len(days))]
    started = time.monotonic()
    preprocess_arrow.transform_main(["--train-days", *parts[:-1], "--test-day", parts[-1], *options, "--output",
                                     str(out_dir), "--inputs-json", json.dumps(inputs)], encoded_by="nvtabular")
    manifest = _written_manifest(out_dir, inputs, "nvtabular transform")
    shutil.rmtree(encoded, ignore_errors=True)
    log.info("nvtabular dataset ordered and written in %.1f s", time.monotonic() - started)
    return manifest


def transform_dataset(settings: Settings, out_dir: Path, dictionary_dir: Path, train_days: Sequence[int],
                      test_day: int, seed: int = DEFAULT_SEED, broadcast_max_values: int = 1_000_000,
                      skew_cutoff_pct: float = 1.0, spark_master: str = "local[*]", spark_profile: str | None = None,
                      spark_conf: Mapping[str, str] | None = None, engine: str | None = None) -> dict[str, Any]:
    """Split-binary train/test/validation + feature_spec.yaml (spark_jobs/criteo/transform.py, by spark-submit).

    broadcast_max_values and skew_cutoff_pct choose join strategies only (as does the profile: the GPU profile joins
    per column, CPU profiles look up in one Arrow pass); they do not change the output, so they are not part of the
    cache key. engine: spark | arrow | nvtabular (None: preprocess_engine's default by the Spark master); nvtabular
    needs a dictionary built by nvtabular (its workflow encodes the days) and is part of the key.
    """
    engine = preprocess_engine(engine, spark_master, spark_profile or settings.spark_profile)
    days = _check_days(train_days, test_day)
    dictionary_dir = Path(dictionary_dir)
    dictionary = read_manifest(dictionary_dir)
    if dictionary is None or dictionary.get("kind") != "criteo_dictionary":
        raise StepInputMissing(f"no completed dictionary in {dictionary_dir}: run build_dictionary first")
    stats = _stats_fingerprints(settings, [*days, test_day])
    inputs = {"version": TRANSFORM_VERSION, "dictionary": dictionary["inputs_fingerprint"],
              "train_days": {str(d): stats[str(d)] for d in days}, "test_day": {str(test_day): stats[str(test_day)]},
              "seed": seed}
    if engine == "nvtabular":
        inputs["engine"] = engine
        if _engine_of(dictionary) != "nvtabular":
            raise StepInputMissing(f"the dictionary in {dictionary_dir} was built by the {_engine_of(dictionary)} "
                                   "engine and holds no NVTabular workflow: build it with engine nvtabular")
    window = dictionary.get("inputs", {}).get("days", {})
    if window and not set(map(str, days)) <= set(window):
        log.warning("dictionary %s was built over days %s, which do not cover the train days %s", dictionary_dir,
                    sorted(window, key=int), days)
    out_dir = Path(out_dir)
    manifest = completed_manifest(out_dir, inputs)
    cached = manifest is not None
    if manifest is None:
        def columnar(day: int) -> str:
            return str(layout.stats_day(settings.data_root, day) / "columnar")

        profile = spark_profile or settings.spark_profile
        # The RAPIDS Accelerator runs NVIDIA's join per column on the GPU (gpu-explain explains that plan); CPU
        # profiles look up in one Arrow pass.
        lookup = "join" if profile in GPU_PROFILES else "arrow"
        options = ["--dictionary", str(dictionary_dir), "--seed", str(seed),
                   "--broadcast-max-values", str(broadcast_max_values), "--skew-cutoff-pct", str(skew_cutoff_pct),
                   "--dictionary-lookup", lookup]
        args = ["--train-days", *map(columnar, days), "--test-day", columnar(test_day), *options]
        if engine == "nvtabular":
            manifest = _transform_nvt([*map(columnar, days), columnar(test_day)], options, dictionary_dir, out_dir,
                                      inputs)
        elif engine == "arrow":
            manifest = _run_arrow("transform", args, out_dir, inputs)
        else:
            manifest = _submit("criteo/transform.py", args, out_dir, inputs,
                               f"spark transform days={days}+{test_day}", spark_master, profile, spark_conf)
    else:
        log.info("dataset for these inputs already written (%s): nothing to do", out_dir)
    return {"path": str(out_dir), "rows": manifest["rows"], "cardinalities": manifest["extra"]["cardinalities"],
            "fingerprint": manifest["inputs_fingerprint"], "cached": cached, "engine": _engine_of(manifest)}


def validate_dataset(dataset_dir: Path) -> dict[str, Any]:
    """NVIDIA's FeatureSpec checks + the files' sizes and a full scan of every mapping's values
    (tasks.formats.split_binary.check_dataset); sizes only where the manifest says the writer checked the values.

    Also compares the rows found with the rows the transform's manifest recorded, when there is one.
    """
    from tasks.formats.feature_spec import FEATURE_SPEC_FILE, FeatureSpec, FeatureSpecError
    from tasks.formats.split_binary import DatasetError, check_dataset, checked_at_write

    dataset_dir = Path(dataset_dir)
    yaml_path = dataset_dir / FEATURE_SPEC_FILE
    if not yaml_path.is_file():
        raise StepInputMissing(f"{yaml_path} is missing: run transform_dataset first")
    mappings = [m for m in ("train", "test", "validation") if (dataset_dir / m).is_dir()]
    started = time.monotonic()
    manifest = read_manifest(dataset_dir)
    try:
        spec = FeatureSpec.from_yaml(yaml_path)
        spec.check_feature_spec()
        summary = check_dataset(spec, mappings, scan_values=not checked_at_write(manifest, spec))
    except (FeatureSpecError, DatasetError) as err:
        raise DatasetInvalid(f"dataset {dataset_dir}: {err}") from None
    recorded = (manifest or {}).get("rows", {})
    for mapping, rows in summary.rows.items():
        if mapping in recorded and recorded[mapping] != rows:
            raise DatasetInvalid(f"dataset {dataset_dir}: {mapping} has {rows} rows but its manifest records "
                                 f"{recorded[mapping]}")
    log.info("dataset %s is valid: %s rows in %.1f s", dataset_dir, summary.rows, time.monotonic() - started)
    return {"path": str(dataset_dir), "rows": summary.rows, "bytes": summary.bytes,
            "cardinalities": spec.get_categorical_sizes()}
