"""Issue #24, items 2, 3 and 12-14: what a published model or a trigger form can make a worker do.

- A published version is loaded only as it was published: the registry records its manifest's sha256 at publish
  time, and the gate's fetch refuses (one line) a version whose manifest changed in the store since, before any of
  its files is fetched or loaded. The tampered artifact here is a pickle that would write a marker file when loaded
  (what `nvt.Workflow.load` of a planted `stats/nvt_workflow/` would run), so the test proves nothing was loaded.
- A child process gets no secret of the task's environment.
- A model name belongs to the pipeline that published it first; another pipeline's gate or publish under it is
  refused with one line. Release thresholds are the deployment's: a form may tighten them, never loosen them.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tasks.core.config import NotAllowed, Settings
from tasks.core.process import run_streaming
from tasks.core.storage import file_sha256
from tasks.release import steps
from tasks.release.publish import TamperedVersion, UnverifiedVersion, fetch_published_file, parse_model_uri

pytestmark = pytest.mark.reliability

CRITEO, BYO = "criteo_dlrm", "byo_dlrm"  # tasks.criteo.dlrm.PIPELINE, tasks.byo.pipeline.PIPELINE
WHEN = datetime(2026, 1, 5, 6, tzinfo=timezone.utc)
WORKFLOW = "stats/nvt_workflow/workflow.pkl"


class _WritesMarker:
    """Unpickling this calls Path.touch(marker): the stand-in for code a planted workflow pickle would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _publish(settings: Settings, tmp_path: Path, pipeline: str, run_id: str, model_name: str, **kw) -> dict:
    files = tmp_path / f"files-{run_id}"
    (files / "stats").mkdir(parents=True, exist_ok=True)
    (files / "model.pt").write_bytes(b"weights of " + run_id.encode())
    (files / "stats" / "workflow.pkl").write_bytes(pickle.dumps({"harmless": run_id}))
    with steps.open_registry(settings, "") as registry:  # what the gate does before a publish
        registry.register_run(pipeline, model_name, run_id, dataset="criteo", window={"days": [0]},
                              config_hash="cfg")
    return steps.publish_run(settings, pipeline=pipeline, run_id=run_id, when=WHEN, metrics={"auc": 0.8},
                             lineage_doc={"run_id": run_id}, model_name=model_name, registry_conn_id="",
                             files=lambda: {"model.pt": files / "model.pt", WORKFLOW: files / "stats" / "workflow.pkl"},
                             **kw)


def _gate(settings: Settings, tmp_path: Path, pipeline: str, run_id: str, model_name: str, scorer) -> dict:
    return steps.gate_run(settings, pipeline=pipeline, dataset="criteo", run_id=run_id, model_name=model_name,
                          metrics={"auc": 0.8}, metric="auc", min_value=0.5, max_regression=0.01,
                          window={"days": [0]}, config_hash="cfg", gate_dir=tmp_path / "gate" / run_id,
                          score_production=scorer, registry_conn_id="")


def _loading_scorer(settings: Settings, tmp_path: Path):
    """What a pipeline's score_published does: fetch the production version, then load its workflow (unpickle)."""
    def score(version_uri: str) -> dict:
        local = steps.fetch_production(settings, version_uri, tmp_path / "cache", aws_conn_id=None,
                                       required=lambda names: [], registry_conn_id="")
        pickle.loads((local / WORKFLOW).read_bytes())  # noqa: S301 - the point: only verified bytes get here
        return {"auc": 0.8}
    return score


def _version_folder(version_uri: str) -> Path:
    return Path(urlsplit(version_uri).path)


def _tamper(version_uri: str, marker: Path) -> None:
    """Replace the version's workflow pickle by a hostile one AND rewrite the manifest to match it: what anyone who
    can write to the bucket can do (the store's own manifest is no defence on its own)."""
    folder = _version_folder(version_uri)
    hostile = folder / WORKFLOW
    hostile.write_bytes(pickle.dumps(_WritesMarker(marker)))
    manifest_path = folder / "_MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][WORKFLOW] = {"bytes": hostile.stat().st_size, "sha256": file_sha256(hostile)}
    manifest_path.write_text(json.dumps(manifest))


def test_tampered_published_workflow_is_refused_before_it_is_loaded(tmp_path: Path):
    settings = Settings(data_root=tmp_path / "data")
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    assert _gate(settings, tmp_path, CRITEO, "run-2", CRITEO, _loading_scorer(settings, tmp_path))["passed"]

    marker = tmp_path / "payload-ran"
    _tamper(published["uri"], marker)
    with pytest.raises(TamperedVersion) as refused:
        _gate(settings, tmp_path, CRITEO, "run-3", CRITEO, _loading_scorer(settings, tmp_path / "fresh"))
    message = str(refused.value)
    assert "\n" not in message and "registry recorded when it was published" in message
    assert f"{CRITEO} version {published['version']}" in message
    assert not marker.exists(), "the tampered pickle was loaded"
    assert not (tmp_path / "fresh" / "cache").exists()  # nothing of the version was even fetched


def test_version_without_a_recorded_digest_is_never_loaded(tmp_path: Path):
    """A version recorded without a digest (before migration 003, or by hand) is compared by its recorded metric."""
    settings = Settings(data_root=tmp_path / "data")
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    with steps.open_registry(settings, "") as registry:  # what a version from before the digests looks like
        registry._engine.dispose()
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{settings.data_root / 'registry.db'}")
    with engine.begin() as conn:
        conn.execute(text("UPDATE model_versions SET manifest_sha256 = NULL"))
    engine.dispose()
    marker = tmp_path / "payload-ran"
    _tamper(published["uri"], marker)
    with pytest.raises(UnverifiedVersion, match="recorded no manifest digest"):
        steps.fetch_production(settings, published["uri"], tmp_path / "cache", aws_conn_id=None,
                               required=lambda names: [], registry_conn_id="")
    record = _gate(settings, tmp_path, CRITEO, "run-2", CRITEO, _loading_scorer(settings, tmp_path))
    assert "recorded auc" in record["baseline_basis"] and "no manifest digest" in record["baseline_basis"]
    assert not marker.exists()


def test_manifest_names_are_checked_before_any_folder_is_made(tmp_path: Path):
    """Item 13: a manifest naming '../escape/x' is refused before a folder is created for it."""
    settings = Settings(data_root=tmp_path / "data")
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    store, model, version = parse_model_uri(published["uri"])
    manifest_path = _version_folder(published["uri"]) / "_MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["../../escape/payload"] = manifest["files"]["model.pt"]
    manifest_path.write_text(json.dumps(manifest))
    target = tmp_path / "out" / "deep" / "here"
    for name in ("model.pt", "../../escape/payload"):
        with pytest.raises(ValueError, match="'..' segment") as refused:
            fetch_published_file(store, model, version, name, target / name)
        assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()


def test_children_get_no_secrets(tmp_path: Path, monkeypatch):
    """Item 2/4: the environment of every child (nvt jobs, spark-submit, torchrun, evaluation) lacks the secrets."""
    secrets = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:pw@postgres/airflow",  # pragma: allowlist secret
               "AIRFLOW__API_AUTH__JWT_SECRET": "jwt", "AIRFLOW__API__SECRET_KEY": "k",  # pragma: allowlist secret
               "AIRFLOW__CORE__FERNET_KEY": "f", "AIRFLOW__CELERY__BROKER_URL": "redis://:pw@redis:6379/0",
               "AIRFLOW_CONN_AWS_DEFAULT": '{"password": "x"}', "MINIO_ROOT_PASSWORD": "m", "MINIO_ROOT_USER": "u",
               "AWS_SECRET_ACCESS_KEY": "s", "AIRFLOW_VAR_TOKEN": "t"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    seen: list[str] = []
    result = run_streaming([sys.executable, "-c", "import os; print(*sorted(os.environ), sep='\\n')"],
                           label="env", on_line=seen.append)
    assert result.returncode == 0
    assert not set(secrets) & set(seen), f"secrets reached the child: {sorted(set(secrets) & set(seen))}"
    assert "RECFLOW_DATA_ROOT" in seen and "PATH" in seen  # what children need still arrives
    given: list[str] = []
    run_streaming([sys.executable, "-c", "import os; print(*sorted(os.environ), sep='\\n')"], label="env",
                  env={"PATH": "/usr/bin:/bin", "AIRFLOW_CONN_X": "postgres://u:p@h/d"}, on_line=given.append)
    assert "AIRFLOW_CONN_X" not in given and "PATH" in given


def test_another_pipeline_cannot_publish_under_a_claimed_model_name(tmp_path: Path):
    """Item 3: byo_dlrm with model_name=criteo_dlrm is refused (gate and publish) and criteo's latest stays."""
    settings = Settings(data_root=tmp_path / "data")
    first = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    with pytest.raises(NotAllowed) as gated:
        _gate(settings, tmp_path, BYO, "byo-1", CRITEO, None)
    assert "\n" not in str(gated.value)
    assert f"'{CRITEO}' belongs to pipeline '{CRITEO}'" in str(gated.value) and f"'{BYO}'" in str(gated.value)
    with steps.open_registry(settings, "") as registry:
        assert registry.get_run(BYO, "byo-1") is None  # refused before anything was recorded
    with pytest.raises(NotAllowed, match=f"belongs to pipeline '{CRITEO}'"):
        _publish(settings, tmp_path, BYO, "byo-1", CRITEO)  # a publish that skipped the gate: refused too
    with steps.open_registry(settings, "") as registry:
        assert registry.alias(CRITEO)["version"] == first["version"]
        assert registry.model_owner(CRITEO) == CRITEO
    assert sorted(p.name for p in _version_folder(first["uri"]).parent.iterdir()) == [first["version"]]
    # The same pipeline keeps publishing under its name; byo_dlrm under its own.
    assert _publish(settings, tmp_path, BYO, "byo-2", "byo_model")["became_latest"]


def test_the_stores_pointer_moves_only_once_the_registry_recorded_the_version(tmp_path: Path, monkeypatch):
    """A publish the registry refuses (the loser of a race for a new model name) or cannot reach leaves latest.json
    where it was; the retry that records the version moves it."""
    from tasks.release.publish import latest_version
    from tasks.release.registry import ModelOwnedElsewhere, Registry

    settings = Settings(data_root=tmp_path / "data")
    first = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    store, _, _ = parse_model_uri(first["uri"])
    record_version = Registry.record_version

    def claimed_in_between(self, model_name, *args, **kwargs):  # another pipeline won the name after check_owner
        raise ModelOwnedElsewhere(f"model name {model_name!r} belongs to pipeline 'rival'")

    monkeypatch.setattr(Registry, "record_version", claimed_in_between)
    with pytest.raises(ModelOwnedElsewhere):
        _publish(settings, tmp_path, CRITEO, "run-2", CRITEO)
    assert latest_version(store, CRITEO)["version"] == first["version"]
    monkeypatch.setattr(Registry, "record_version", record_version)
    retried = _publish(settings, tmp_path, CRITEO, "run-2", CRITEO)
    assert retried["cached"] and retried["became_latest"]
    assert latest_version(store, CRITEO)["version"] == retried["version"] != first["version"]


def test_a_form_cannot_loosen_the_release_thresholds(monkeypatch, tmp_path: Path):
    """Item 3: max_regression=1 / min_auc=0 from a trigger form is refused; a tighter value is taken."""
    from tasks.core.profiles import ReleaseThresholdLoosened, resolve_knobs
    from tasks.criteo.profiles import KNOBS, PROFILES

    monkeypatch.delenv("RECFLOW_RELEASE_MIN_VALUE", raising=False)
    monkeypatch.delenv("RECFLOW_RELEASE_MAX_REGRESSION", raising=False)
    monkeypatch.setenv("RECFLOW_PROFILE", "demo")
    for loose in ({"max_regression": 1.0}, {"min_auc": 0.0}):
        with pytest.raises(ReleaseThresholdLoosened) as refused:
            resolve_knobs(KNOBS, PROFILES, "demo", loose)
        assert "\n" not in str(refused.value) and "may only tighten" in str(refused.value)
        assert isinstance(refused.value, NotAllowed)
    assert resolve_knobs(KNOBS, PROFILES, "demo", {"max_regression": 0.001, "min_auc": 0.75})["max_regression"] == 0.001
    # A deployment that runs the full profile: a form choosing the demo profile does not loosen it either.
    monkeypatch.setenv("RECFLOW_PROFILE", "full")
    with pytest.raises(ReleaseThresholdLoosened, match="min_auc=0.7 .* 0.79 from profile 'full'"):
        resolve_knobs(KNOBS, PROFILES, "demo", {})
    # The deployment setting decides, both ways.
    monkeypatch.setenv("RECFLOW_RELEASE_MAX_REGRESSION", "0.05")
    monkeypatch.setenv("RECFLOW_RELEASE_MIN_VALUE", "0.6")
    assert resolve_knobs(KNOBS, PROFILES, "demo", {"max_regression": 0.05})["max_regression"] == 0.05
    with pytest.raises(ReleaseThresholdLoosened, match="RECFLOW_RELEASE_MAX_REGRESSION"):
        resolve_knobs(KNOBS, PROFILES, "demo", {"max_regression": 1.0})


def test_the_dag_plan_refuses_a_loosened_gate_before_any_work(monkeypatch, tmp_path: Path):
    """Through a pipeline's own resolve step (MovieLens: knobs are resolved before the snapshot is looked up)."""
    from tasks.core.profiles import ReleaseThresholdLoosened
    from tasks.movielens.ncf import resolve_run

    monkeypatch.delenv("RECFLOW_RELEASE_MIN_VALUE", raising=False)
    monkeypatch.delenv("RECFLOW_RELEASE_MAX_REGRESSION", raising=False)
    monkeypatch.setenv("RECFLOW_PROFILE", "demo")
    with pytest.raises(ReleaseThresholdLoosened, match="max_regression=1"):
        resolve_run(Settings(data_root=tmp_path, profile="demo"), {"profile": "demo", "max_regression": 1})


def test_published_digest_is_what_the_registry_recorded(tmp_path: Path):
    settings = Settings(data_root=tmp_path / "data")
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    version = published["version"]
    digest = hashlib.sha256((_version_folder(published["uri"]) / "_MANIFEST.json").read_bytes()).hexdigest()
    with steps.open_registry(settings, "") as registry:
        assert registry.version(CRITEO, version)["manifest_sha256"] == digest
    again = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)  # a retry: cached, same digest recorded
    assert again["cached"] and again["version"] == version


PRESIGNED = ("https://data.example/byo/feature_spec.yaml?X-Amz-Algorithm=AWS4-HMAC-SHA256"
             "&X-Amz-Credential=AKIDEXAMPLE%2F20260105&X-Amz-Signature=0123456789abcdef")


def test_presigned_url_signatures_stay_out_of_lineage_and_the_registry(tmp_path: Path):
    """Item 12: a byo run's spec_uri is a presigned URL; its query string reaches neither lineage nor the registry."""
    from tasks.byo import pipeline
    from tasks.byo.profiles import KNOBS, PROFILES
    from tasks.core.profiles import resolve_knobs

    settings = Settings(data_root=tmp_path / "data")
    run = {"spec_uri": PRESIGNED, "data_uri": PRESIGNED.rsplit("/", 1)[0] + "/data?X-Amz-Signature=feedface",
           "profile": "demo", "knobs": resolve_knobs(KNOBS, PROFILES, "demo", {}), "nproc": 1, "device": "cpu"}
    record = pipeline.SPEC.gate(settings, "run-1", {"auc": 0.9, "rows": 10}, run, model_name="byo_model",
                                registry_conn_id="")
    assert record["passed"]
    doc = pipeline.SPEC.lineage(settings, "run-1", run, {"spec_uri": PRESIGNED, "epochs": 1})
    with steps.open_registry(settings, "") as registry:
        stored = registry.get_run(pipeline.PIPELINE, "run-1")
    for where, text in (("lineage", json.dumps(doc)), ("registry", json.dumps(stored.window))):
        assert "X-Amz-Signature" not in text and "feedface" not in text, where
        assert "https://data.example/byo/feature_spec.yaml?<hidden>" in text, where


def test_predict_takes_the_latest_version_from_the_registry_not_the_stores_pointer(tmp_path: Path, monkeypatch):
    """Anyone who can write to the bucket can commit a version with a manifest of its own and move latest.json to
    it; in a store of the deployment's, predict loads what the registry recorded, and refuses a version it did not."""
    from tasks.release.steps import fetch_model
    from tasks.release.publish import latest_version, make_version, publish_model

    settings = Settings(data_root=tmp_path / "data")
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(settings.data_root))
    monkeypatch.delenv("RECFLOW_REGISTRY_CONN_ID", raising=False)
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    store, _, _ = parse_model_uri(published["uri"])
    planted = tmp_path / "planted.pt"
    planted.write_bytes(b"not the registry's model")
    later = make_version(datetime(2026, 2, 1, tzinfo=timezone.utc), "planted")
    publish_model(store, CRITEO, later, {"model.pt": planted}, {"auc": 0.99}, {}, allowed_stores=[store])
    assert latest_version(store, CRITEO)["version"] == later  # the store's own pointer moved

    local = fetch_model(f"{store}/{CRITEO}", tmp_path / "cache")
    assert local.name == published["version"] and (local / "model.pt").read_bytes() == b"weights of run-1"
    with pytest.raises(UnverifiedVersion, match=rf"^{CRITEO} {later}: the registry recorded no manifest digest"):
        fetch_model(f"{store}/{CRITEO}/versions/{later}", tmp_path / "cache")
    assert not (tmp_path / "cache" / CRITEO / later).exists()


def test_s3_prefix_check_compares_the_key_the_fetch_uses():
    """Item 14: 's3://b/allow%65d/x' is the object key 'allow%65d/x' (fetched verbatim), not under 's3://b/allowed'."""
    from tasks.core.download_sources import SourceNotAllowed, check_source_prefix

    with pytest.raises(SourceNotAllowed, match="not under an allowed prefix"):
        check_source_prefix("s3://bucket/allow%65d/day_0", ["s3://bucket/allowed"])
    check_source_prefix("s3://bucket/allowed/day%200", ["s3://bucket/allowed"])  # a literal '%' key under it
    check_source_prefix("https://h.example/raw/day%5F0", ["https://h.example/raw"])  # http(s) paths are decoded


def test_predict_refuses_a_tampered_version_the_registry_knows(tmp_path: Path, monkeypatch):
    """`python -m tasks criteo predict --model <uri>` fetches through the same check (its version holds TorchScript)."""
    from tasks.release.steps import fetch_model

    settings = Settings(data_root=tmp_path / "data")
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(settings.data_root))
    monkeypatch.delenv("RECFLOW_REGISTRY_CONN_ID", raising=False)
    published = _publish(settings, tmp_path, CRITEO, "run-1", CRITEO)
    assert (fetch_model(published["uri"], tmp_path / "ok") / WORKFLOW).is_file()
    _tamper(published["uri"], tmp_path / "payload-ran")
    with pytest.raises(TamperedVersion):
        fetch_model(published["uri"], tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "payload-ran").exists()
