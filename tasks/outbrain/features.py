"""outbrain_wide_deep's features dataset: validated tables -> NVIDIA's Wide & Deep features (Spark SQL by
spark-submit, or NVIDIA's NVTabular Workflow in NVTabular's own environment) -> parquet + prebatched TFRecords, each
with its FeatureSpec; its check; and the features of new rows for `predict`.

Engines (`engine=`, else RECFLOW_OUTBRAIN_FEATURES_ENGINE, else spark): `spark` runs spark_jobs/outbrain/features.py
(the SQL in sql/outbrain/); `nvtabular` runs nvt_jobs/outbrain.py through tasks.core.nvtabular (CPU here, GPU where
cudf imports). Both write the same columns, dtypes, split and row order; their hashed ids differ (xxhash64 vs
pandas / cudf hashing), so the engine is part of an nvtabular dataset's cache key and of its manifest (extra.engine).
The fitted statistics travel in stats/: Spark's tables, or NVTabular's saved Workflow (stats/nvt_workflow/); the
transform for `predict` runs the engine whose statistics it is given. docs/OUTBRAIN.md, "NVTabular engine".

Plain functions; the DAG only wires them. `build_features` fingerprints its inputs (the validated tables' file
checksums, the knobs, FEATURES_RULES_VERSION), is a no-op when `out_dir` already holds a complete dataset for them,
and returns a small JSON-able dict for XCom. The recipe, and where it differs from NVIDIA's, is in
spark_jobs/outbrain/features.py and sql/outbrain/; the layout is docs/OUTBRAIN.md's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.core.storage import (MANIFEST_NAME, Manifest, atomic_directory, completed_manifest, file_sha256,
                                fingerprint, read_manifest, write_manifest)
from tasks.outbrain.contract import (CTR_THRESHOLDS, DISPLAY_ID, EMBEDDING_DIMENSIONS, HASH_BUCKET_SIZES,  # noqa: F401
                                     LABEL, MULTIHOT_COLUMNS, MULTIHOT_PADDING, NUMERIC_COLUMNS, ONEHOT_COLUMNS,
                                     PREBATCH_SIZE, RAW_AD_ID, STATS_FILE, TRAIN_MAX_DAY, VALID_FRACTION)

log = logging.getLogger(__name__)

# Bump when the features' semantics change (SQL, split, layout): cached datasets are rebuilt.
FEATURES_RULES_VERSION = 1
JOB = "outbrain/features.py"
NVT_JOB = "nvt_jobs.outbrain"
NVT_WORKFLOW_DIR = "nvt_workflow"  # stats/<this>: the fitted NVTabular Workflow (nvt_jobs/outbrain.py WORKFLOW_DIR)
ENGINES = ("spark", "nvtabular")
ENGINE_ENV = "RECFLOW_OUTBRAIN_FEATURES_ENGINE"
KIND = "outbrain_features"
INPUT_TABLES = ("clicks_train", "events", "promoted_content", "documents_meta", "documents_topics",
                "documents_entities", "documents_categories")
MAPPING_DIRS = {"train": "train", "test": "valid"}  # FeatureSpec mapping -> parquet/<dir>, tfrecords/<dir>
PARQUET_DIR, TFRECORDS_DIR, STATS_DIR = "parquet", "tfrecords", "stats"
FEATURE_SPEC_FILE = "feature_spec.yaml"
ONEHOT_CHANNEL, MULTIHOT_CHANNEL = "onehot_categorical", "multihot_categorical"
NUMERICAL_CHANNEL, LABEL_CHANNEL, MAP_CHANNEL = "numerical", "label", "map"
CHANNELS = (ONEHOT_CHANNEL, MULTIHOT_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL, MAP_CHANNEL)


class DatasetInvalid(ValueError):
    """A written features dataset that NVIDIA's W&D loader or our trainer would misread; one line naming the file."""


class StepInputMissing(FileNotFoundError):
    """The validated tables this step reads are not there; one line naming what to run first."""


# ---- inputs -----------------------------------------------------------------------------------------------------

def _check_knobs(seed: int, prebatch_size: int, shards: int) -> None:
    for name, value, low in (("seed", seed, 0), ("prebatch_size", prebatch_size, 1), ("shards", shards, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} {value!r}: must be an integer >= {low}")


def tables_identity(tables_dir: Path, tables: tuple[str, ...]) -> dict[str, str]:
    """{table/file: sha256} of the parquet files of `tables` under tables_dir. Checksums come from the manifest the
    validation wrote (tables_dir/_MANIFEST.json or the table's own) when it lists the file with the same size;
    otherwise they are computed."""
    tables_dir = Path(tables_dir)
    recorded: dict[Path, dict[str, Any]] = {}
    holders = [tables_dir, *(tables_dir / table for table in tables)]
    for holder in holders:
        for rel, entry in ((read_manifest(holder) or {}).get("files", {})).items():
            recorded[(holder / rel).resolve()] = entry
    identity = {}
    for table in tables:
        files = sorted(p for p in (tables_dir / table).glob("*.parquet") if not p.name.startswith(("_", ".")))
        if not files:
            raise StepInputMissing(f"no parquet files for table {table!r} in {tables_dir}: validate the snapshot "
                                   "first (outbrain_ingest)")
        for path in files:
            entry = recorded.get(path.resolve(), {})
            known = entry.get("sha256") if entry.get("bytes") == path.stat().st_size else None
            identity[f"{table}/{path.name}"] = known or file_sha256(path)
    return identity


# ---- FeatureSpecs -----------------------------------------------------------------------------------------------

def mapping_features(mapping: str) -> list[str]:
    """NVIDIA's chunk features: [label] + one-hot + multi-hot + numeric, and display_id in the test mapping."""
    features = [LABEL, *ONEHOT_COLUMNS, *MULTIHOT_COLUMNS, *NUMERIC_COLUMNS]
    return features + [DISPLAY_ID] if mapping == "test" else features


def outbrain_feature_spec(files: dict[str, list[str]], chunk_type: str, metadata: dict[str, Any]):
    """NVIDIA's get_outbrain_feature_spec with the given files per mapping (relative to the yaml's directory)."""
    from tasks.formats.feature_spec import FeatureSpec

    features: dict[str, dict[str, Any]] = {
        name: {"cardinality": HASH_BUCKET_SIZES[name], "max_hotness": hotness}
        for name, hotness in MULTIHOT_COLUMNS.items()}
    features.update({name: {"cardinality": HASH_BUCKET_SIZES[name]} for name in ONEHOT_COLUMNS})
    features.update({name: {} for name in (*NUMERIC_COLUMNS, DISPLAY_ID, LABEL)})
    source = {mapping: [{"type": chunk_type, "features": mapping_features(mapping), "files": files[mapping]}]
              for mapping in MAPPING_DIRS}
    channels = {MULTIHOT_CHANNEL: list(MULTIHOT_COLUMNS), ONEHOT_CHANNEL: list(ONEHOT_COLUMNS),
                LABEL_CHANNEL: [LABEL], NUMERICAL_CHANNEL: list(NUMERIC_COLUMNS), MAP_CHANNEL: [DISPLAY_ID]}
    return FeatureSpec(feature_spec=features, source_spec=source, channel_spec=channels, metadata=metadata)


def record_layout(mapping: str):
    """How a mapping's parquet columns become TFRecord features (docs/OUTBRAIN.md, "Prebatched TFRecords")."""
    from tasks.formats.tfrecord import RecordLayout

    int64 = [*ONEHOT_COLUMNS, DISPLAY_ID] if mapping == "test" else list(ONEHOT_COLUMNS)
    return RecordLayout(int64=int64, multihot=dict(MULTIHOT_COLUMNS), float32=[LABEL, *NUMERIC_COLUMNS])


def _write_tfrecords(parquet_dir: Path, out_dir: Path, mapping: str, *, seed: int, prebatch_size: int,
                     shards: int) -> dict[str, Any]:
    """The TFRecord writer in a child process (it imports TensorFlow); train rows shuffled with the seed."""
    from tasks.core.launch import run_module

    layout = record_layout(mapping)
    summary = out_dir.parent / f"_{out_dir.name}.json"
    args = ["--parquet-dir", str(parquet_dir), "--output", str(out_dir), "--prebatch-size", str(prebatch_size),
            "--shards", str(shards), "--summary", str(summary), "--int64", *layout.int64,
            "--multihot", *[f"{name}={hot}" for name, hot in layout.multihot.items()], "--float32", *layout.float32]
    if mapping == "train":
        args += ["--shuffle-seed", str(seed)]
    run_module("tasks.formats.tfrecord", args, label=f"tfrecords {mapping}", what=f"the {mapping} TFRecord writer")
    result = json.loads(summary.read_text())
    summary.unlink()
    return result


# ---- the dataset ------------------------------------------------------------------------------------------------

def features_engine(engine: str | None) -> str:
    """The engine given, else RECFLOW_OUTBRAIN_FEATURES_ENGINE, else spark; a bad one is a one-line ValueError."""
    from tasks.core.config import choose_engine

    return choose_engine(engine, ENGINE_ENV, ENGINES)


def stats_engine(stats_dir: Path) -> str:
    """The engine that fitted a stats/ directory (a features dataset's or a published version's): nvtabular when it
    holds a saved Workflow, else spark."""
    return "nvtabular" if (Path(stats_dir) / NVT_WORKFLOW_DIR).is_dir() else "spark"


def _fit(engine: str, snapshot: Path, tmp: Path, *, seed: int, settings: Settings, spark_master: str | None,
         spark_profile: str | None, spark_conf: dict[str, str] | None) -> None:
    """The engine's fit job: parquet/{train,valid}, stats/ and stats.json in tmp."""
    args = ["fit", "--tables", str(snapshot), "--output", str(tmp), "--seed", str(seed)]
    if engine == "nvtabular":
        from tasks.core.nvtabular import run_nvt_job

        run_nvt_job(NVT_JOB, args, label="nvtabular outbrain features")
        return
    from tasks.core.spark_submit import SparkSubmit, run_spark_job

    submit = SparkSubmit(JOB, args, master=spark_master or "local[*]", profile=spark_profile or settings.spark_profile,
                         conf_overrides=dict(spark_conf or {}))
    run_spark_job(submit, label="spark outbrain features")


def build_features(settings: Settings, snapshot: Path, out_dir: Path, *, seed: int,
                   prebatch_size: int = PREBATCH_SIZE, shards: int, engine: str | None = None,
                   spark_master: str | None = None, spark_profile: str | None = None,
                   spark_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """The features dataset of a validated snapshot (snapshot = its validated/<snapshot>/ directory) in out_dir,
    replaced atomically; cached when out_dir already holds it for the same inputs.

    seed: of the split and of the train rows' order; prebatch_size: rows per TFRecord Example; shards: TFRecord files
    per mapping; engine: spark | nvtabular (None: features_engine's default). spark_master None = local[*];
    spark_profile None = settings.spark_profile.
    """
    from tasks.formats.tfrecord import SHARD_NAME

    _check_knobs(seed, prebatch_size, shards)
    engine = features_engine(engine)
    snapshot, out_dir = Path(snapshot), Path(out_dir)
    inputs = {"version": FEATURES_RULES_VERSION, "tables": fingerprint(tables_identity(snapshot, INPUT_TABLES)),
              "seed": seed, "prebatch_size": prebatch_size, "shards": shards}
    if engine != "spark":  # the Spark datasets written before engines existed keep their key
        inputs["engine"] = engine
    manifest = completed_manifest(out_dir, inputs)
    cached = manifest is not None
    if manifest is None:
        started = time.monotonic()
        with atomic_directory(out_dir) as tmp:
            _fit(engine, snapshot, tmp, seed=seed, settings=settings, spark_master=spark_master,
                 spark_profile=spark_profile, spark_conf=spark_conf)
            fitted_s = time.monotonic() - started
            stats = json.loads((tmp / STATS_FILE).read_text())
            records = {mapping: _write_tfrecords(tmp / PARQUET_DIR / sub, tmp / TFRECORDS_DIR / sub, mapping,
                                                 seed=seed, prebatch_size=prebatch_size, shards=shards)
                       for mapping, sub in MAPPING_DIRS.items()}
            parquet_files = {mapping: sorted(p.relative_to(tmp).as_posix()
                                             for p in (tmp / PARQUET_DIR / sub).glob("*.parquet"))
                             for mapping, sub in MAPPING_DIRS.items()}
            outbrain_feature_spec(parquet_files, "parquet", {}).to_yaml(tmp / FEATURE_SPEC_FILE)
            record_files = {mapping: [f"{sub}/{SHARD_NAME.format(k)}" for k in range(shards)]
                            for mapping, sub in MAPPING_DIRS.items()}
            outbrain_feature_spec(record_files, "tfrecord", {"prebatch_size": prebatch_size,
                                                             "multihot_padding": MULTIHOT_PADDING}
                                  ).to_yaml(tmp / TFRECORDS_DIR / FEATURE_SPEC_FILE)
            stats["tfrecords"] = records
            stats["engine"] = engine
            stats["seconds_total"] = round(time.monotonic() - started, 3)
            (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
            rows = {mapping: stats[mapping]["rows"] for mapping in MAPPING_DIRS}
            for mapping, result in records.items():
                if result["rows"] != rows[mapping]:
                    raise RuntimeError(f"{mapping}: {result['rows']} rows in TFRecords, {rows[mapping]} in parquet")
            write_manifest(tmp, Manifest(kind=KIND, inputs=inputs, rows=rows,
                                         extra={"seed": seed, "prebatch_size": prebatch_size, "shards": shards,
                                                "engine": engine}))
        manifest = read_manifest(out_dir)
        total = sum(manifest["rows"].values())
        log.info("features built by %s in %.1f s (%s; features %.1f s, %.0f rows/s)", engine,
                 time.monotonic() - started, manifest["rows"], fitted_s, total / max(fitted_s, 1e-9))
    else:
        log.info("features for these inputs already written (%s, by %s): nothing to do", out_dir,
                 manifest.get("extra", {}).get("engine", "spark"))
    stats = json.loads((out_dir / STATS_FILE).read_text())
    return {"path": str(out_dir), "feature_spec": str(out_dir / FEATURE_SPEC_FILE),
            "tfrecords": str(out_dir / TFRECORDS_DIR), "stats_dir": str(out_dir / STATS_DIR),
            "rows": manifest["rows"], "displays": {m: stats[m]["displays"] for m in MAPPING_DIRS},
            "positives": {m: stats[m]["positives"] for m in MAPPING_DIRS}, "engine": engine,
            "fingerprint": manifest["inputs_fingerprint"], "cached": cached}


def transform_rows(settings: Settings, raw_tables_dir: Path, stats_dir: Path, out_dir: Path, *,
                   clicks_table: str = "clicks_test", spark_master: str | None = None,
                   spark_profile: str | None = None) -> dict[str, Any]:
    """The features of new rows (raw_tables_dir/<clicks_table>: display_id, ad_id; the other tables as validated)
    with a fitted dataset's stats/, as parquet in out_dir (replaced atomically; cached): NVIDIA's columns plus
    ad_id_raw, sorted by (display_id, ad_id_raw). Run by the engine that fitted stats/ (stats_engine): the same
    SQL, or the same saved Workflow, as the training rows', so the two always agree."""
    from tasks.core.storage import describe_files
    from tasks.formats.tfrecord import count_rows, parquet_files

    raw_tables_dir, stats_dir, out_dir = Path(raw_tables_dir), Path(stats_dir), Path(out_dir)
    if not stats_dir.is_dir():
        raise StepInputMissing(f"no feature statistics in {stats_dir}: build the features dataset first")
    engine = stats_engine(stats_dir)
    tables = (clicks_table, *INPUT_TABLES[1:])
    inputs = {"version": FEATURES_RULES_VERSION, "tables": fingerprint(tables_identity(raw_tables_dir, tables)),
              "stats": fingerprint(describe_files(stats_dir))}
    manifest = completed_manifest(out_dir, inputs)
    if manifest is None:
        with atomic_directory(out_dir) as tmp:
            args = ["transform", "--tables", str(raw_tables_dir), "--clicks-table", clicks_table,
                    "--stats", str(stats_dir), "--output", str(tmp), "--parquet-files", "1"]
            if engine == "nvtabular":
                from tasks.core.nvtabular import run_nvt_job

                run_nvt_job(NVT_JOB, args, label="nvtabular outbrain transform")
            else:
                from tasks.core.spark_submit import SparkSubmit, run_spark_job

                run_spark_job(SparkSubmit(JOB, args, master=spark_master or "local[*]",
                                          profile=spark_profile or settings.spark_profile),
                              label="spark outbrain transform")
            write_manifest(tmp, Manifest(kind=f"{KIND}_transform", inputs=inputs,
                                         rows={"rows": count_rows(parquet_files(tmp))}, extra={"engine": engine}))
        manifest = read_manifest(out_dir)
    return {"path": str(out_dir), "rows": manifest["rows"]["rows"], "fingerprint": manifest["inputs_fingerprint"],
            "engine": engine}


# ---- the check --------------------------------------------------------------------------------------------------

def check_wide_deep_spec(spec, chunk_type: str, world_size: int = 1) -> None:
    """NVIDIA's W&D FeatureSpec rules (WideAndDeep data/feature_spec.py, reference/nvidia-formats.md §4.1), with
    `chunk_type` where NVIDIA requires parquet; DatasetInvalid names the rule broken."""
    if sorted(spec.source_spec) != sorted(MAPPING_DIRS):
        raise DatasetInvalid(f"source_spec: mappings {sorted(spec.source_spec)}, expected ['test', 'train']")
    if sorted(spec.channel_spec) != sorted(CHANNELS):
        raise DatasetInvalid(f"channel_spec: channels {sorted(spec.channel_spec)}, expected {sorted(CHANNELS)}")
    if len(spec.channel_spec[LABEL_CHANNEL]) != 1 or len(spec.channel_spec[MAP_CHANNEL]) > 1:
        raise DatasetInvalid("channel_spec: exactly one label feature and at most one map feature are allowed")
    for channel in (ONEHOT_CHANNEL, MULTIHOT_CHANNEL):
        for name in spec.channel_spec[channel]:
            props = spec.feature_spec.get(name, {})
            card = props.get("cardinality")
            if not isinstance(card, int) or isinstance(card, bool) or card < 1:
                raise DatasetInvalid(f"feature_spec.{name}: cardinality {card!r} is not a positive integer")
            if "dtype" in props and props["dtype"] not in ("int32", "int64"):
                raise DatasetInvalid(f"feature_spec.{name}: categorical dtype {props['dtype']!r} not int32/int64")
            hotness = props.get("max_hotness")
            if channel == MULTIHOT_CHANNEL and (not isinstance(hotness, int) or hotness < 1):
                raise DatasetInvalid(f"feature_spec.{name}: multi-hot feature without an integer max_hotness")
    for name in spec.channel_spec[NUMERICAL_CHANNEL]:
        dtype = spec.feature_spec.get(name, {}).get("dtype")
        if dtype is not None and dtype not in ("float32", "float64"):
            raise DatasetInvalid(f"feature_spec.{name}: numerical dtype {dtype!r} not float32/float64")
    for mapping, chunks in spec.source_spec.items():
        if len(chunks) != 1:
            raise DatasetInvalid(f"source_spec.{mapping}: {len(chunks)} chunks, exactly one is allowed")
        chunk = chunks[0]
        if chunk.get("type") != chunk_type:
            raise DatasetInvalid(f"source_spec.{mapping}: chunk type {chunk.get('type')!r}, expected {chunk_type!r}")
        if sorted(chunk["features"]) != sorted(mapping_features(mapping)):
            raise DatasetInvalid(f"source_spec.{mapping}: features differ from {mapping_features(mapping)}")
        if len(chunk["files"]) < world_size:
            raise DatasetInvalid(f"source_spec.{mapping}: {len(chunk['files'])} files for {world_size} workers")


def _parquet_rows_and_bounds(spec) -> dict[str, int]:
    """Rows per mapping from the parquet footers, and every categorical's ids inside [0, cardinality) and the label
    in {0, 1} by the files' column statistics (no data page is read)."""
    import pyarrow.parquet as pq

    bounds = {name: (0, spec.feature_spec[name]["cardinality"] - 1)
              for name in (*ONEHOT_COLUMNS, *MULTIHOT_COLUMNS)}
    bounds[LABEL] = (0, 1)
    rows = dict.fromkeys(spec.source_spec, 0)
    for mapping, _, rel, path in _spec_files(spec, shown_as=""):
        metadata = pq.ParquetFile(path).metadata
        rows[mapping] += metadata.num_rows
        for group in range(metadata.num_row_groups):
            for index in range(metadata.num_columns):
                column = metadata.row_group(group).column(index)
                name = column.path_in_schema.split(".")[0]
                stats = column.statistics
                if name in bounds and stats is not None and stats.has_min_max:
                    low, high = bounds[name]
                    if stats.min < low or stats.max > high:
                        raise DatasetInvalid(f"{rel}: {name} spans {stats.min}..{stats.max}, outside "
                                             f"[{low}, {high}]")
    return rows


def _spec_files(spec, shown_as: str) -> Iterator[tuple[str, dict[str, Any], str, Path]]:
    """(mapping, its chunk, file as the spec names it, path) of every file of a one-chunk-per-mapping spec;
    DatasetInvalid for a missing one (named `shown_as` + its name)."""
    for mapping, (chunk,) in spec.source_spec.items():
        for rel in chunk["files"]:
            path = Path(spec.base_directory) / rel
            if not path.is_file():
                raise DatasetInvalid(f"{shown_as}{rel}: missing")
            yield mapping, chunk, rel, path


def _tfrecord_rows(spec, prebatch_size: int) -> dict[str, int]:
    """Rows per mapping: every shard's records are counted from their framing, its first and last record decoded
    (all features present, B or fewer rows, multi-hot B x hotness)."""
    from tasks.formats.tfrecord import decode_example, read_records

    rows = dict.fromkeys(spec.source_spec, 0)
    for mapping, chunk, rel, path in _spec_files(spec, shown_as="tfrecords/"):
        records = 0
        first = last = None
        for record in read_records(path):
            records += 1
            first = first if first is not None else record
            last = record
        for position, record in (("first", first), ("last", last)):
            if record is None:
                continue
            example = decode_example(record)
            missing = sorted(set(chunk["features"]) - set(example))
            if missing:
                raise DatasetInvalid(f"tfrecords/{rel}: {position} record lacks {missing}")
            block = len(example[LABEL])
            if block > prebatch_size or (position == "first" and records > 1 and block != prebatch_size):
                raise DatasetInvalid(f"tfrecords/{rel}: {position} record holds {block} rows (prebatch size "
                                     f"{prebatch_size})")
            for name, hotness in MULTIHOT_COLUMNS.items():
                if len(example[name]) != block * hotness:
                    raise DatasetInvalid(f"tfrecords/{rel}: {name} has {len(example[name])} values for {block} "
                                         f"rows x hotness {hotness}")
        if records:
            rows[mapping] += (records - 1) * prebatch_size + len(decode_example(last)[LABEL])
    return rows


def validate_dataset(out_dir: Path) -> dict[str, Any]:
    """The written features dataset against its contract (both FeatureSpecs by NVIDIA's W&D rules, the same
    features in both, row counts equal to the manifest's in parquet and TFRecords, ids inside the cardinalities);
    DatasetInvalid with one line naming the file when it does not hold."""
    from tasks.formats.feature_spec import FeatureSpec, FeatureSpecError

    out_dir = Path(out_dir)
    started = time.monotonic()
    recorded = (read_manifest(out_dir) or {}).get("rows")
    try:
        if recorded is None:
            raise DatasetInvalid(f"no {MANIFEST_NAME}: the dataset was not completely written")
        try:
            parquet_spec = FeatureSpec.from_yaml(out_dir / FEATURE_SPEC_FILE)
            record_spec = FeatureSpec.from_yaml(out_dir / TFRECORDS_DIR / FEATURE_SPEC_FILE)
        except (OSError, FeatureSpecError) as err:
            raise DatasetInvalid(f"feature spec unreadable: {err}") from None
        check_wide_deep_spec(parquet_spec, "parquet")
        check_wide_deep_spec(record_spec, "tfrecord")
        if (parquet_spec.feature_spec, parquet_spec.channel_spec) != (record_spec.feature_spec,
                                                                       record_spec.channel_spec):
            raise DatasetInvalid("tfrecords/feature_spec.yaml: features or channels differ from feature_spec.yaml")
        prebatch_size = record_spec.metadata.get("prebatch_size")
        if not isinstance(prebatch_size, int) or prebatch_size < 1:
            raise DatasetInvalid(f"tfrecords/feature_spec.yaml: metadata.prebatch_size {prebatch_size!r}")
        for what, rows in (("parquet", _parquet_rows_and_bounds(parquet_spec)),
                           ("tfrecords", _tfrecord_rows(record_spec, prebatch_size))):
            if rows != recorded:
                raise DatasetInvalid(f"{what}: rows {rows} differ from the manifest's {recorded}")
    except DatasetInvalid as err:
        raise DatasetInvalid(f"features {out_dir}: {err}") from None
    log.info("features dataset %s is valid: %s rows, checked in %.1f s", out_dir, recorded, time.monotonic() - started)
    return {"path": str(out_dir), "rows": recorded, "prebatch_size": prebatch_size}
