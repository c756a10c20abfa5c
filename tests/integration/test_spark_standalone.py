"""Scale-out is configuration, shown: the Criteo Spark jobs on a real Spark standalone cluster equal their local[*] run.

A master and one worker (2 cores, 2 GiB) run on 127.0.0.1 (tests/spark_cluster.py). Two synthetic days (1 train,
1 test) are downloaded and validated into two data roots; then day_stats (the Spark engine), build_dictionary and
transform_dataset run into each, once with the master the `spark_default` connection names (AIRFLOW_CONN_SPARK_DEFAULT
pointed at the cluster, read by tasks.dagkit.spark_master as a DAG task does) and the deployment's `cluster`
profile, once with the connection naming local[*] and the `local` profile. Nothing else differs: the outputs must be
equal (parquet as row sets, the split-binary files and feature_spec.yaml byte for byte), and the master must have
run every cluster job and none of the local ones, each executor holding the shipped code archive and told to reach
the driver at RECFLOW_SPARK_DRIVER_HOST. A last test starts a cluster whose worker cannot start: it fails at once
with the worker's log, and the master is stopped.

Each Spark job costs ~10-30 s of start-up on 2 cores: the module is ~2-3 min. One train day: a second one only adds
a day_stats job on each side (2 of the 10 jobs) and a union that tests/test_criteo_preprocess_spark.py covers. Run
with -s to see each job's time on either side (one `SPARK CLUSTER` JSON line); bench/cluster.py measures the fixed
cost per job properly.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.core.config import Settings
from tasks.core.storage import MANIFEST_NAME, read_manifest
from tasks.criteo import dlrm as criteo_dlrm, ingest as criteo_ingest, layout as criteo_layout
from tasks.criteo import preprocess as criteo_preprocess
from tasks.criteo.settings import CriteoSettings
from tasks.criteo.synthetic import write_criteo_day
from tests.spark_cluster import SparkStandalone, spark_standalone, wait_for_completed

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

TRAIN_DAYS, TEST_DAY = [0], 1
DAYS = [*TRAIN_DAYS, TEST_DAY]
ROWS = 3000
THRESHOLD = 3  # low enough that a 3,000-row window keeps values in most columns, high enough to drop some
SEED = 4321
RUN_ID = "manual__spark_standalone"
SIDES = {"cluster": "cluster", "local": "local"}  # side -> Spark profile (RECFLOW_SPARK_PROFILE) it runs with
# What each cluster job calls its application (the jobs' spark_session names), in submission order.
CLUSTER_APPS = [*(f"recflow day_stats day={day}" for day in DAYS), f"recflow dictionary ({len(TRAIN_DAYS)} days)",
                f"recflow transform ({len(TRAIN_DAYS)} train days)"]


def run_pipeline(root: Path, source_dir: Path, profile: str, connection: dict[str, Any],
                 monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Download + validate the days into `root`, then day_stats, dictionary and transform on the master the
    spark_default connection names. Returns the steps' results and each Spark step's seconds."""
    from tasks.dagkit import spark_master

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
    master = spark_master()
    settings = Settings(data_root=root, spark_profile=profile)
    criteo = CriteoSettings(source=source_dir.as_uri() + "/day_{day}")
    for day in DAYS:
        criteo_ingest.download_day(settings, day, criteo=criteo)
        # The spark engine: validation writes no stats, so day_stats runs the Spark job (not the arrow pass).
        criteo_ingest.validate_day(settings, day, engine="spark")
    seconds: dict[str, float] = {}

    def timed(name: str, call):
        start = time.monotonic()
        result = call()
        seconds[name] = round(time.monotonic() - start, 2)
        return result

    stats = [timed(f"day_stats {day}", lambda day=day: criteo_ingest.day_stats(
        settings, day, engine="spark", spark_master=master)) for day in DAYS]
    paths = criteo_dlrm.run_paths(settings, RUN_ID)
    dictionary = timed("dictionary", lambda: criteo_preprocess.build_dictionary(
        settings, paths.dictionary, TRAIN_DAYS, TEST_DAY, frequency_threshold=THRESHOLD, spark_master=master,
        engine="spark"))  # pinned: on the local master the default would be arrow
    dataset = timed("transform", lambda: criteo_preprocess.transform_dataset(
        settings, paths.dataset, paths.dictionary, TRAIN_DAYS, TEST_DAY, seed=SEED, spark_master=master,
        engine="spark"))
    return {"master": master, "root": root, "stats": stats, "dictionary": dictionary, "dataset": dataset,
            "seconds": seconds}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with spark_standalone(tmp_path_factory.mktemp("spark_standalone"), cores=2, memory="2g") as running:
        yield running


@pytest.fixture(scope="module")
def runs(cluster: SparkStandalone, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    source_dir = tmp_path_factory.mktemp("source")
    for day in DAYS:
        write_criteo_day(source_dir / f"day_{day}", day, ROWS, seed=SEED)
    host, port = cluster.master_url.removeprefix("spark://").rsplit(":", 1)
    connections = {"cluster": {"conn_type": "spark", "host": f"spark://{host}", "port": int(port)},
                   "local": {"conn_type": "spark", "host": "local[*]"}}  # what scripts/airflow_init.sh sets
    results: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        # Executors reach the driver here; a deployment sets the Airflow worker's address the same way.
        monkeypatch.setenv("RECFLOW_SPARK_DRIVER_HOST", "127.0.0.1")
        for side, profile in SIDES.items():
            results[side] = run_pipeline(tmp_path_factory.mktemp(f"root_{side}"), source_dir, profile,
                                         connections[side], monkeypatch)
            if side == "cluster":
                results["apps_after_cluster"] = wait_for_completed(cluster, set(CLUSTER_APPS))
    results["apps_after_local"] = cluster.applications()
    print("SPARK CLUSTER", json.dumps({side: results[side]["seconds"] for side in SIDES}))
    return results


def parquet_rows(directory: Path):
    """A parquet directory's rows sorted by every column (Spark names and fills part files per run)."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table()
    return table.sort_by([(name, "ascending") for name in table.column_names])


def file_digests(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}


def test_the_connection_named_each_master(runs: dict[str, Any], cluster: SparkStandalone) -> None:
    assert runs["cluster"]["master"] == cluster.master_url
    assert runs["local"]["master"] == "local[*]"


def test_every_cluster_job_ran_on_the_cluster_and_no_local_one(runs: dict[str, Any],
                                                               cluster: SparkStandalone) -> None:
    for side in SIDES:  # each step really ran its Spark job (none found its output complete already)
        assert [s["cached"] for s in runs[side]["stats"]] == [False] * len(DAYS), side
        assert runs[side]["dictionary"]["cached"] is False and runs[side]["dataset"]["cached"] is False, side
    apps = runs["apps_after_cluster"]
    names = sorted(app["name"] for app in apps)
    assert names == sorted(CLUSTER_APPS), f"completed applications: {names}\n{cluster.log_tails()}"
    assert {app["state"] for app in apps} == {"FINISHED"}
    assert all(app["cores"] == 2 for app in apps), apps  # the worker's cores, granted to each job
    # The local run submitted nothing to the master.
    assert sorted(app["id"] for app in runs["apps_after_local"]) == sorted(app["id"] for app in apps)
    for app in apps:
        executors = sorted((cluster.worker_dir / app["id"]).iterdir())
        assert executors, f"{app['name']} ({app['id']}): no executor ran on the worker"
        for executor in executors:
            # It fetched the code archive the driver shipped (--py-files) ...
            assert list(executor.glob("recflow_spark_code-*.zip")), f"{app['name']}: no code archive in {executor}"
            # ... and reached the driver at RECFLOW_SPARK_DRIVER_HOST (here the hostname's own address is eth0's).
            assert "CoarseGrainedScheduler@127.0.0.1:" in (executor / "stderr").read_text(errors="replace"), \
                f"{app['name']}: the executor in {executor} was not told to reach the driver at 127.0.0.1"


def test_day_stats_equal(runs: dict[str, Any]) -> None:
    def without_path(results: list[dict]) -> list[dict]:
        return [{k: v for k, v in result.items() if k != "path"} for result in results]

    assert without_path(runs["cluster"]["stats"]) == without_path(runs["local"]["stats"])
    for day in DAYS:
        cluster_dir, local_dir = (criteo_layout.stats_day(runs[side]["root"], day) for side in ("cluster", "local"))
        for part in ("columnar", "counts"):
            cluster_rows, local_rows = parquet_rows(cluster_dir / part), parquet_rows(local_dir / part)
            assert cluster_rows.num_rows > 0, f"day {day} {part}"
            assert cluster_rows.equals(local_rows), f"day {day} {part}"
        cluster_manifest, local_manifest = read_manifest(cluster_dir), read_manifest(local_dir)
        assert cluster_manifest["rows"] == local_manifest["rows"] and cluster_manifest["rows"]["good"] == ROWS
        assert cluster_manifest["extra"] == local_manifest["extra"]
        assert cluster_manifest["inputs_fingerprint"] == local_manifest["inputs_fingerprint"]


def test_dictionary_equal(runs: dict[str, Any]) -> None:
    cluster_dir, local_dir = (Path(runs[side]["dictionary"]["path"]) for side in ("cluster", "local"))
    assert runs["cluster"]["dictionary"]["cardinalities"] == runs["local"]["dictionary"]["cardinalities"]
    assert runs["cluster"]["dictionary"]["values"] == runs["local"]["dictionary"]["values"] > 0
    for name in ("cardinalities.json", "model_size.json"):
        assert (cluster_dir / name).read_bytes() == (local_dir / name).read_bytes(), name
    assert parquet_rows(cluster_dir / "dictionary").equals(parquet_rows(local_dir / "dictionary"))


def test_split_binary_dataset_byte_identical(runs: dict[str, Any]) -> None:
    cluster_dir, local_dir = (Path(runs[side]["dataset"]["path"]) for side in ("cluster", "local"))
    assert runs["cluster"]["dataset"]["rows"] == runs["local"]["dataset"]["rows"]
    assert sum(runs["cluster"]["dataset"]["rows"].values()) == ROWS * len(DAYS)
    cluster_files, local_files = file_digests(cluster_dir), file_digests(local_dir)
    assert {"feature_spec.yaml", "train/label.bin", "test/cat_25.bin", "validation/numerical.bin"} <= set(cluster_files)
    assert (cluster_dir / "feature_spec.yaml").read_text() == (local_dir / "feature_spec.yaml").read_text()
    assert cluster_files == local_files


def test_a_worker_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    from tests.spark_cluster import ClusterStartError

    started = time.monotonic()
    with pytest.raises(ClusterStartError, match=r"Spark worker exited while waiting for a worker with 2 cores ALIVE") \
            as failed:
        with spark_standalone(tmp_path, memory="lots"):
            pytest.fail("the cluster came up with a worker that has no memory size")
    assert time.monotonic() - started < 120  # the dead daemon is noticed, not waited out to the deadline
    message = str(failed.value)
    assert "----- worker.log" in message and "Usage: Worker" in message  # the worker's own complaint, shown
    # The master that did start was stopped too: no process is left running in the cluster's folder.
    left = [cwd.parent.name for cwd in Path("/proc").glob("[0-9]*/cwd") if _resolves_to(cwd, tmp_path)]
    assert left == [], f"processes still running in {tmp_path}: {left}"


def _resolves_to(link: Path, target: Path) -> bool:
    try:
        return link.resolve() == target.resolve()
    except OSError:  # exited while we looked, or another user's
        return False
