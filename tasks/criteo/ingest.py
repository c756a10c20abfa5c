"""The criteo_ingest steps for one day: download, validate_raw, day_stats. Plain functions; the DAG only wires them.

Each returns a small JSON-able dict (paths, counts, checksums) for XCom, and each is a no-op when its output
already carries a manifest for the same inputs.

Day stats engines (an `engine` argument, else RECFLOW_CRITEO_DAY_STATS_ENGINE, else arrow when the Spark master is
local and the Spark profile the local one, spark with a cluster master or profile: day_stats_engine):
  arrow            validate_day writes the stats in its own pass over the rows (the day is parsed once);
                   day_stats then finds them complete. A day validated without them (by the spark engine, or
                   before this engine existed) gets them from day_stats by a second pyarrow pass.
  spark            validate_day writes no stats; day_stats spark-submits spark_jobs/criteo/day_stats.py.
Both write the same dataset (tests/test_day_stats_spark.py compares them), so a complete output is reused whichever
engine wrote it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from tasks.core.config import Settings
from tasks.criteo import layout
from tasks.core.spark_submit import choose_engine_for_master
from tasks.criteo.settings import DAY_STATS_ENGINES, CriteoSettings, load_criteo_settings
from tasks.core.storage import completed_manifest, fingerprint, partition_lock, read_manifest

log = logging.getLogger(__name__)

RULES_VERSION = 1  # bump when tasks.criteo.schema's raw-format rules change: cached validations are then redone
# Bump when criteo_day_stats' dataset changes: cached stats are then redone. 2: row_order is the good row's dense index
# in file order (version 1's Spark ids counted the bad rows too, leaving gaps).
DAY_STATS_VERSION = 2


class StepInputMissing(RuntimeError):
    """An upstream output this step needs is absent or incomplete."""


def day_lock(settings: Settings, day: int):
    """The day's exclusive lock: two runs of one day (the `day` param, max_active_runs=3) never write the same
    files; the second waits, then finds the first one's output through its sidecar or manifest."""
    return partition_lock(settings.data_root, layout.DATASET, f"day={day}", label=f"day {day}",
                          timeout_s=settings.partition_lock_timeout_s)


def download_day(settings: Settings, day: int, *, expected_sha256: str | None = None,
                 aws_conn_id: str | None = None, source: str | None = None,
                 criteo: CriteoSettings | None = None) -> dict[str, Any]:
    """Fetch day_N from its source (file, http(s), s3) into the raw area; cached when a verified copy exists.
    `source` overrides the configured template (criteo.source, RECFLOW_CRITEO_SOURCE) for this day."""
    from tasks.core.download import check_source_allowed, download, s3_client_from_connection

    criteo = criteo or load_criteo_settings()
    url = source or criteo.source_url(settings.data_root, day)
    allowed = criteo.allow_lists(settings)
    check_source_allowed(url, **allowed)  # a refused input leaves nothing under the data root, not even a lock
    s3_client = s3_client_from_connection(aws_conn_id, settings.allowed_conn_ids) if url.startswith("s3://") else None
    with day_lock(settings, day):
        result = download(url, layout.raw_day(settings.data_root, day), expected_sha256=expected_sha256,
                          s3_client=s3_client, link_local=True, **allowed)
    log.info("day %d: %s (%d bytes, sha256 %s)%s", day, result.path, result.bytes, result.sha256[:12],
             " [cached]" if result.cached else "")
    return {"day": day, "path": result.path, "bytes": result.bytes, "sha256": result.sha256,
            "cached": result.cached, "seconds": round(result.seconds, 3)}


def raw_identity(path: Path) -> dict[str, Any]:
    """What identifies a raw day: the checksum the download recorded (no re-hash of a 50 GB file) while it still
    vouches for the file, else one hashed once and recorded beside it while the file is unchanged (a hard-linked day
    whose source was written since is hashed again: tasks.core.download.recorded_sha256)."""
    from tasks.core.download import recorded_sha256

    if not path.is_file():
        raise StepInputMissing(f"raw day file {path} is missing: run download first")
    return {"file": path.name, "sha256": recorded_sha256(path), "bytes": path.stat().st_size}


def day_stats_engine(engine: str | None, spark_master: str | None = "local[*]", spark_profile: str = "local") -> str:
    """The engine asked for, else RECFLOW_CRITEO_DAY_STATS_ENGINE, else arrow on one machine (a local Spark master
    and profile) and spark otherwise; logged with its reason."""
    load_criteo_settings()  # refuses a bad RECFLOW_CRITEO_DAY_STATS_ENGINE with the settings' own message
    return choose_engine_for_master("criteo day stats", engine, "RECFLOW_CRITEO_DAY_STATS_ENGINE", DAY_STATS_ENGINES,
                                    spark_master, spark_profile)


def stats_inputs(validation_fingerprint: str, raw: Path | dict[str, Any]) -> dict[str, Any]:
    """What identifies a day's stats (either engine): the validation they follow and the raw file they were read from
    (its path, or its raw_identity when the caller has it: a raw day no sidecar vouches for is hashed whole)."""
    identity = raw if isinstance(raw, dict) else raw_identity(raw)
    return {"validated": validation_fingerprint, "raw": identity, "version": DAY_STATS_VERSION}


def validate_day(settings: Settings, day: int, *, bad_row_budget: float | None = None,
                 engine: str | None = None, spark_master: str | None = "local[*]") -> dict[str, Any]:
    """Validate every row of the raw day; quarantine bad rows; fail if they exceed the budget. With the arrow
    day-stats engine (day_stats_engine: the default on a local `spark_master`) the same pass writes the day's stats
    (unless they are already complete for these inputs)."""
    engine = day_stats_engine(engine, spark_master, settings.spark_profile)
    budget = settings.bad_row_budget if bad_row_budget is None else bad_row_budget
    raw = layout.raw_day(settings.data_root, day)
    out = layout.validated_day(settings.data_root, day)
    with day_lock(settings, day):
        inputs = {"raw": raw_identity(raw), "budget": budget, "rules": RULES_VERSION}
        cached = completed_manifest(out, inputs)
        if cached:
            log.info("day %d already validated for these inputs (%s): nothing to do", day, out)
            return {"day": day, "path": str(out), **cached["rows"], "cached": True}
        from tasks.criteo.day_stats_arrow import StatsTarget
        from tasks.criteo.raw_validation import validate_raw_file

        stats = None
        if engine == "arrow":
            target = StatsTarget(layout.stats_day(settings.data_root, day), day,
                                 stats_inputs(fingerprint(inputs), inputs["raw"]))
            stats = None if completed_manifest(target.path, target.inputs) else target
        summary = validate_raw_file(raw, out, inputs=inputs, budget=budget,
                                    block_bytes=settings.validation_block_bytes, stats=stats)
    return {"day": day, "path": str(out), **summary.rows, "cached": False}


def day_stats(settings: Settings, day: int, *, engine: str | None = None, spark_master: str = "local[*]",
              spark_profile: str | None = None, spark_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Typed columnar copy + categorical value counts of a validated day (under the day's lock).

    Cached when complete for the day's inputs (validate_day writes them with the arrow engine). Otherwise computed
    by `engine` (None: day_stats_engine's choice): arrow parses the raw day again with pyarrow; spark runs
    spark_jobs/criteo/day_stats.py by spark-submit on `spark_master` with `spark_profile` + `spark_conf`.
    """
    engine = day_stats_engine(engine, spark_master, spark_profile or settings.spark_profile)
    with day_lock(settings, day):
        return _day_stats(settings, day, engine=engine, spark_master=spark_master, spark_profile=spark_profile,
                          spark_conf=spark_conf)


def _day_stats(settings: Settings, day: int, *, engine: str, spark_master: str, spark_profile: str | None,
               spark_conf: dict[str, str] | None) -> dict[str, Any]:
    validated_dir = layout.validated_day(settings.data_root, day)
    validated = read_manifest(validated_dir)
    if validated is None:
        raise StepInputMissing(f"day {day} has no completed validation in {validated_dir}: run validate_raw first")
    raw = layout.raw_day(settings.data_root, day)
    inputs = stats_inputs(validated["inputs_fingerprint"], raw)
    out = layout.stats_day(settings.data_root, day)
    manifest = completed_manifest(out, inputs)
    cached = manifest is not None
    if cached:
        log.info("day %d stats already computed for these inputs (%s, by the %s engine): nothing to do", day, out,
                 manifest["extra"].get("engine", "spark"))
    else:
        start = time.monotonic()
        if engine == "arrow":
            log.info("day %d has no stats for its validation (validated by the spark engine or an older version): "
                     "computing them with the arrow engine", day)
            manifest = _arrow_day_stats(settings, day, raw, out, inputs)
        else:
            manifest = _spark_day_stats(day, raw, out, inputs, spark_master=spark_master,
                                        spark_profile=spark_profile or settings.spark_profile, spark_conf=spark_conf)
        seconds = time.monotonic() - start
        rows = manifest["rows"]["good"]
        log.info("day %d: day_stats %d rows in %.1f s (%.0f rows/s, %s engine)", day, rows, seconds,
                 rows / max(seconds, 1e-9), engine)
    expected = validated["rows"]["good"]
    if manifest["rows"]["good"] != expected:
        raise RuntimeError(f"day {day}: day_stats kept {manifest['rows']['good']} rows but validation passed "
                           f"{expected}; the two row rules disagree")
    return {"day": day, "path": str(out), "rows": manifest["rows"]["good"],
            "distinct_values": manifest["extra"]["distinct_values"], "cached": cached}


def _arrow_day_stats(settings: Settings, day: int, raw: Path, out: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    from tasks.criteo.day_stats_arrow import StatsTarget, write_day_stats

    write_day_stats(raw, StatsTarget(out, day, inputs), block_bytes=settings.validation_block_bytes)
    return _written_manifest(out, inputs, f"day_stats (arrow) for day {day}")


def _spark_day_stats(day: int, raw: Path, out: Path, inputs: dict[str, Any], *, spark_master: str,
                     spark_profile: str, spark_conf: dict[str, str] | None) -> dict[str, Any]:
    from tasks.core.spark_submit import SparkSubmit, run_spark_job

    submit = SparkSubmit(
        "criteo/day_stats.py",
        ["--input", str(raw), "--output", str(out), "--day", str(day), "--inputs-json", json.dumps(inputs)],
        master=spark_master, profile=spark_profile, conf_overrides=spark_conf or {},
    )
    run_spark_job(submit, label=f"spark day={day}")
    return _written_manifest(out, inputs, f"day_stats for day {day}")


def _written_manifest(out: Path, inputs: dict[str, Any], what: str) -> dict[str, Any]:
    manifest = read_manifest(out)
    if manifest is None or manifest.get("inputs_fingerprint") != fingerprint(inputs):
        raise RuntimeError(f"{what} finished but wrote no manifest in {out}")
    return manifest
