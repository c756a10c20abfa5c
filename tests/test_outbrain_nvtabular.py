"""The NVTabular engine of outbrain_wide_deep's features (nvt_jobs/outbrain.py) against the Spark engine, on the same
synthetic validated snapshot: equivalence is measured, not assumed.

Both engines build the features once for the module, through the pipeline's own steps (resolve_run with the `engine`
param -> build_features -> validate_dataset), then: the same split and row order; the same columns and dtypes; the
numericals row by row to float tolerance; every hashed id a function of its raw value in both engines, within its
bucket count, and the two engines' ids in one-to-one correspondence wherever no hash collision merges two values;
a small Wide & Deep trained from each engine's TFRecords reaching the same MAP@12 within noise; and `predict score`
with the NVTabular-built model (its saved Workflow, not the fit's parquet) reproducing that model's own MAP@12.

NVTabular runs in .venv-nvtabular (`make nvt-env`): these tests FAIL, not skip, when it is missing.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.config import Settings
from tasks.outbrain import layout
from tasks.outbrain.features import (DISPLAY_ID, HASH_BUCKET_SIZES, LABEL, MULTIHOT_COLUMNS, NUMERIC_COLUMNS,
                                     ONEHOT_COLUMNS)

log = logging.getLogger(__name__)

DISPLAYS = 3000
ENGINES = ("spark", "nvtabular")
# The demo profile, smaller: each engine's model trains in seconds on one worker.
TINY = {"profile": "demo", "snapshot": "kaggle", "epochs": 3, "tfrecord_shards": 2, "checkpoint_every_steps": 0,
        "min_map": 0.0}
# float32 features (CTRs, log counts, log days) differ by float32 rounding at most; the similarities are float64
# sums in a different order.
NUMERIC_TOLERANCE = 1e-5
MAP_NOISE = 0.03  # MAP@12 of the same model on ~600 validation displays, trained on two hashings of the same rows


def heavy(test):
    """spark-submit, NVTabular and TensorFlow children: out of `make test-fast`."""
    return pytest.mark.spark(pytest.mark.slow(test))


@pytest.fixture(scope="module")
def nvt_env() -> Path:
    from tasks.core.nvtabular import nvt_python

    return nvt_python()  # NvtEnvironmentMissing (run `make nvt-env`) fails every test that needs it


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    from tasks.outbrain.synthetic import write_snapshot
    from tasks.outbrain.tables_validation import validate_tables

    root = tmp_path_factory.mktemp("data")
    raw = root / "raw"
    raw.mkdir()
    write_snapshot(raw, displays=DISPLAYS, seed=5)
    validated = layout.validated_dir(root, "kaggle")
    validate_tables(raw, validated, inputs={"displays": DISPLAYS}, budget=0.001)
    add_unseen_display(validated / "clicks_train")
    return Settings(data_root=root, registry_conn_id="")


def add_unseen_display(clicks: Path) -> None:
    """One more clicks part file: a display without an event (-> valid) showing an ad that is not promoted content
    and never seen in train, next to a known ad. The generator's small ad pool has every valid ad in train; this row
    takes the paths of an unseen key (null counts after JoinGroupby's left join) and of a missing event."""
    first = pq.ParquetFile(sorted(clicks.glob("*.parquet"))[0])
    known = first.read(columns=["display_id", "ad_id"])
    display = int(pc.max(known["display_id"]).as_py()) + 1
    ads = [int(pc.max(known["ad_id"]).as_py()) + 1000, int(known["ad_id"][0].as_py())]
    table = pa.table({"display_id": [display, display], "ad_id": ads, "clicked": [1, 0]}).cast(first.schema_arrow)
    pq.write_table(table, clicks / "part-unseen.parquet")


@pytest.fixture(scope="module")
def runs(nvt_env, settings) -> dict[str, dict]:
    """Each engine's run: resolve_run with the engine param, the features built and validated."""
    from tasks.outbrain import wide_deep

    out = {}
    for engine in ENGINES:
        run = wide_deep.resolve_run(settings, {**TINY, "engine": engine})
        built = wide_deep.build_features(settings, run)
        checked = wide_deep.validate_dataset(settings, run)
        out[engine] = {"run": run, "built": built, "checked": checked}
    return out


def mapping_frame(features: str | Path, sub: str) -> pd.DataFrame:
    files = sorted(str(p) for p in (Path(features) / "parquet" / sub).glob("*.parquet"))
    return ds.dataset(files, format="parquet").to_table().to_pandas()


@pytest.fixture(scope="module")
def frames(runs) -> dict[str, dict[str, pd.DataFrame]]:
    return {engine: {sub: mapping_frame(runs[engine]["built"]["path"], sub) for sub in ("train", "valid")}
            for engine in ENGINES}


# ---- the split and the layout -----------------------------------------------------------------------------------

@heavy
def test_the_engine_is_threaded_from_the_param_into_the_cache_key_and_the_manifest(settings, runs):
    from tasks.core.storage import read_manifest
    from tasks.outbrain.wide_deep import features_dir

    spark, nvt = runs["spark"], runs["nvtabular"]
    assert (spark["run"]["engine"], nvt["run"]["engine"]) == ENGINES
    assert features_dir(settings, spark["run"]) != features_dir(settings, nvt["run"])
    for engine in ENGINES:
        built = runs[engine]["built"]
        assert built["engine"] == engine and not built["cached"]
        assert read_manifest(Path(built["path"]))["extra"]["engine"] == engine
    assert (Path(nvt["built"]["stats_dir"]) / "nvt_workflow" / "workflow.pkl").is_file()
    assert nvt["checked"]["rows"] == spark["checked"]["rows"]  # validate_dataset passed on both


@heavy
def test_both_engines_split_the_same_displays_and_order_the_rows_alike(runs, frames):
    spark, nvt = runs["spark"]["built"], runs["nvtabular"]["built"]
    assert nvt["rows"] == spark["rows"] and nvt["displays"] == spark["displays"]
    assert nvt["positives"] == spark["positives"]
    for sub in ("train", "valid"):
        a, b = frames["spark"][sub], frames["nvtabular"][sub]
        # Identical display id sequences: the same split (Spark's xxhash64 reproduced in numpy) and the same order
        # (train: xxhash64(seed, display, ad); valid: (display, ad)), so every later comparison is row by row.
        np.testing.assert_array_equal(a[DISPLAY_ID].to_numpy(), b[DISPLAY_ID].to_numpy())
        np.testing.assert_array_equal(a[LABEL].to_numpy(), b[LABEL].to_numpy())
    assert set(frames["spark"]["train"][DISPLAY_ID]).isdisjoint(frames["spark"]["valid"][DISPLAY_ID])
    valid = frames["nvtabular"]["valid"]
    unseen = valid[valid[DISPLAY_ID] == valid[DISPLAY_ID].max()]  # add_unseen_display's: no event -> valid
    assert len(unseen) == 2 and unseen["ad_id_ctr"].iloc[-1] == 0  # its unknown ad, sorted last, has no CTR


@heavy
def test_same_columns_dtypes_and_feature_specs(runs):
    for sub in ("train", "valid"):
        schemas = {}
        for engine in ENGINES:
            first = sorted((Path(runs[engine]["built"]["path"]) / "parquet" / sub).glob("*.parquet"))[0]
            schema = pq.read_schema(first)
            schemas[engine] = [(field.name, str(field.type)) for field in schema]
        assert schemas["nvtabular"] == schemas["spark"], sub
    from tasks.formats.feature_spec import FeatureSpec

    for name in ("feature_spec.yaml", "tfrecords/feature_spec.yaml"):
        spark, nvt = (FeatureSpec.from_yaml(Path(runs[engine]["built"]["path"]) / name) for engine in ENGINES)
        assert (nvt.feature_spec, nvt.channel_spec, nvt.metadata) == (spark.feature_spec, spark.channel_spec,
                                                                       spark.metadata), name


# ---- numericals -------------------------------------------------------------------------------------------------

@heavy
def test_numericals_agree_row_by_row(frames):
    worst = {}
    for sub in ("train", "valid"):
        a, b = frames["spark"][sub], frames["nvtabular"][sub]
        for name in NUMERIC_COLUMNS:
            x, y = a[name].to_numpy(np.float64), b[name].to_numpy(np.float64)
            assert not np.isnan(x).any() and not np.isnan(y).any(), name
            worst[name] = max(worst.get(name, 0.0), float(np.abs(x - y).max()))
    log.info("max |spark - nvtabular| per numerical: %s", json.dumps(worst))
    print("max abs diff:", json.dumps(worst))  # noqa: T201 - the equivalence numbers, shown with -s
    assert all(diff <= NUMERIC_TOLERANCE for diff in worst.values()), worst
    # Not vacuous: the features vary (CTRs above their thresholds, similarities of shared terms, filled medians).
    train = frames["spark"]["train"]
    assert all(train[name].nunique() > 3 for name in NUMERIC_COLUMNS), train[NUMERIC_COLUMNS].nunique().to_dict()


# ---- hashed categoricals ----------------------------------------------------------------------------------------

def raw_valid_rows(validated: Path, valid: pd.DataFrame) -> pd.DataFrame:
    """The raw values behind each valid row's one-hot ids (joined here with pandas, independently of either engine),
    in the valid mapping's order (display_id, ad_id)."""
    def table(name):
        return ds.dataset(str(validated / name), format="parquet").to_table().to_pandas()

    clicks = table("clicks_train")
    clicks = clicks[clicks[DISPLAY_ID].isin(valid[DISPLAY_ID])]
    meta = table("documents_meta")
    meta["publisher_id"] = meta["publisher_id"].astype("float64").fillna(-1.0 - meta["document_id"])
    meta = meta[["document_id", "source_id", "publisher_id"]]
    rows = (clicks.merge(table("events"), on=DISPLAY_ID, how="left")
            .merge(table("promoted_content").rename(columns={"document_id": "document_id_promo"}), on="ad_id",
                   how="left")
            .merge(meta, on="document_id", how="left")
            .merge(meta.rename(columns=lambda c: f"{c}_promo"), on="document_id_promo", how="left")
            .sort_values([DISPLAY_ID, "ad_id"]).reset_index(drop=True))
    rows["platform"] = rows["platform"].astype("float64").fillna(1.0) - 1
    rows["geo_location_country"] = rows["geo_location"].str.slice(0, 2)
    rows["geo_location_state"] = rows["geo_location"].str.slice(0, 5)
    return rows


def hashing_report(raw: pd.Series, spark: np.ndarray, nvt: np.ndarray, buckets: int) -> dict[str, int]:
    """Asserts both engines' ids are functions of the raw value inside [0, buckets), and one-to-one with each other
    on the values no collision merges; returns the counts."""
    pairs = pd.DataFrame({"raw": raw.astype(str).to_numpy(), "spark": spark, "nvt": nvt})
    for engine in ("spark", "nvt"):
        ids = pairs[engine]
        assert ids.between(0, buckets - 1).all(), (engine, ids.min(), ids.max(), buckets)
        assert (pairs.groupby("raw")[engine].nunique() == 1).all(), f"{engine} ids are not a function of the value"
    values = pairs.drop_duplicates("raw")
    shared = {engine: values[engine].map(values[engine].value_counts()) > 1 for engine in ("spark", "nvt")}
    clean = values[~shared["spark"] & ~shared["nvt"]]
    # On the values neither engine merges, spark id <-> nvtabular id is a bijection (the same partition of rows).
    assert clean["spark"].is_unique and clean["nvt"].is_unique
    report = {"values": len(values), "spark_collided": int(shared["spark"].sum()),
              "nvt_collided": int(shared["nvt"].sum())}
    # Collisions are what uniform hashing into `buckets` gives (expected ~ values^2 / buckets values in a shared
    # bucket), not a broken hash: at most twice that plus a few.
    bound = 2 * len(values) ** 2 / buckets + 4
    assert report["spark_collided"] <= bound and report["nvt_collided"] <= bound, (report, bound)
    return report


@heavy
def test_hashed_one_hots_partition_the_rows_as_the_raw_values_do(settings, frames):
    valid = {engine: frames[engine]["valid"] for engine in ENGINES}
    raw = raw_valid_rows(layout.validated_dir(settings.data_root, "kaggle"), valid["spark"])
    np.testing.assert_array_equal(raw[DISPLAY_ID].to_numpy(), valid["spark"][DISPLAY_ID].to_numpy())
    reports = {name: hashing_report(raw[name], valid["spark"][name].to_numpy(), valid["nvtabular"][name].to_numpy(),
                                    HASH_BUCKET_SIZES[name]) for name in ONEHOT_COLUMNS}
    print("one-hot collisions:", json.dumps(reports))  # noqa: T201
    assert reports["ad_id"]["values"] > 300 and reports["geo_location"]["values"] > 300


@heavy
def test_multihot_lists_hold_the_same_terms_in_the_same_order(settings, frames):
    """Per row the same list length; per list position the same raw term (highest confidence first) in both engines,
    so the leaf ids pair up as the one-hots do."""
    validated = layout.validated_dir(settings.data_root, "kaggle")
    valid = {engine: frames[engine]["valid"] for engine in ENGINES}
    raw = raw_valid_rows(validated, valid["spark"])
    sources = {"topic_id_list": ("documents_topics", "topic_id"), "entity_id_list": ("documents_entities", "entity_id"),
               "category_id_list": ("documents_categories", "category_id")}
    for name, (table, column) in sources.items():
        terms = ds.dataset(str(validated / table), format="parquet").to_table().to_pandas()
        terms["term"] = terms[column].astype(str)
        terms = (terms.groupby(["document_id", "term"], as_index=False)["confidence_level"].max()
                 .assign(neg=lambda f: -f["confidence_level"]).sort_values(["document_id", "neg", "term"]))
        top = terms.groupby("document_id")["term"].agg(lambda t: list(t)[:MULTIHOT_COLUMNS[name]])
        raw_lists = raw["document_id"].map(top)
        raw_lists = raw_lists.apply(lambda v: v if isinstance(v, list) else [])
        spark_lists, nvt_lists = valid["spark"][name], valid["nvtabular"][name]
        lengths = [len(v) for v in raw_lists]
        assert [len(v) for v in spark_lists] == lengths == [len(v) for v in nvt_lists], name
        leaves = pd.Series([term for terms_ in raw_lists for term in terms_])
        report = hashing_report(leaves, np.concatenate([np.asarray(v) for v in spark_lists]),
                                np.concatenate([np.asarray(v) for v in nvt_lists]), HASH_BUCKET_SIZES[name])
        assert sum(lengths) > len(raw), name  # most rows have several terms
        print(name, "collisions:", json.dumps(report))  # noqa: T201


# ---- models ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def evaluated(settings, runs) -> dict[str, dict]:
    from tasks.outbrain import wide_deep

    out = {}
    for engine in ENGINES:
        run = runs[engine]["run"]
        trained = wide_deep.train(settings, f"nvt-test-{engine}", run)
        metrics = wide_deep.evaluate(settings, f"nvt-test-{engine}", run, trained)
        out[engine] = {"trained": trained, "metrics": metrics}
    return out


@heavy
def test_models_from_either_engine_reach_the_same_map(evaluated):
    maps = {engine: evaluated[engine]["metrics"]["map@12"] for engine in ENGINES}
    random = evaluated["spark"]["metrics"]["random_map@12"]
    print("MAP@12:", json.dumps(maps), "random:", random)  # noqa: T201
    assert evaluated["spark"]["metrics"]["displays"] == evaluated["nvtabular"]["metrics"]["displays"]
    assert evaluated["nvtabular"]["metrics"]["random_map@12"] == pytest.approx(random)
    for engine in ENGINES:
        assert maps[engine] >= random + 0.05, (engine, maps, random)  # both learned the planted signal
    assert abs(maps["spark"] - maps["nvtabular"]) <= MAP_NOISE, maps


@heavy
def test_predict_scores_with_the_nvtabular_models_saved_workflow(settings, runs, evaluated, tmp_path):
    """A version dir as publish writes it (the model + FeatureSpecs + stats/ with the saved Workflow) scores the
    validation displays from raw rows through `predict score` (the NVTabular transform): the same MAP@12 the
    evaluation measured on the fit's own rows."""
    from tasks.core.launch import run_module
    from tasks.outbrain.predict import model_files
    from tasks.outbrain.wide_deep import features_dir, run_paths

    run = runs["nvtabular"]["run"]
    features = features_dir(settings, run)
    version = tmp_path / "version"
    for name, path in model_files(run_paths(settings, "nvt-test-nvtabular").train, features).items():
        (version / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, version / name)
    assert any(name.startswith("stats/nvt_workflow/") for name in model_files(Path("t"), features))
    out = tmp_path / "metrics.json"
    run_module("tasks.outbrain.predict", ["score", "--model-dir", str(version), "--validated",
                                          str(layout.validated_dir(settings.data_root, "kaggle")),
                                          "--features", str(features), "--map-k", "12", "--metrics-out", str(out)],
               label="predict", what="scoring the nvtabular version")
    scored = json.loads(out.read_text())["metrics"]
    own = evaluated["nvtabular"]["metrics"]
    assert scored["displays"] == own["displays"] and scored["rows"] == own["rows"]
    assert scored["map@12"] == pytest.approx(own["map@12"], abs=1e-4)


# ---- cheap checks ------------------------------------------------------------------------------------------------

def test_the_split_hash_is_sparks_xxhash64():
    from nvt_jobs.outbrain import split_uniform

    # tests/test_outbrain_features_spark.py's R_SEED_0, read off Spark's xxhash64(0, display_id).
    expected = {1: 0.216, 2: 0.822, 3: 0.986, 4: 0.942, 5: 0.877, 6: 0.129, 7: 0.644, 9: 0.625}
    r = split_uniform(0, np.array(list(expected), dtype=np.int64))
    np.testing.assert_allclose(r, list(expected.values()), atol=5e-4)


def test_the_engine_defaults_to_the_deployment_setting_and_refuses_others(monkeypatch):
    from tasks.outbrain.features import ENGINE_ENV, features_engine, stats_engine

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert features_engine(None) == "spark"
    monkeypatch.setenv(ENGINE_ENV, "nvtabular")
    assert features_engine(None) == "nvtabular" and features_engine("spark") == "spark"
    with pytest.raises(ValueError, match="engine 'arrow'"):
        features_engine("arrow")
    assert stats_engine(Path("/nonexistent")) == "spark"
