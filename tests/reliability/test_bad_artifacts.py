"""Bad-input corpus, artifacts: checkpoint / model files (the weights_only loader), artifact-store keys, publishing,
and Spark jobs that crash or are misconfigured. Same contract as test_bad_inputs.py (tests/reliability/contract.py).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from tasks.criteo import layout as criteo_layout
from tasks.core.config import Settings
from tests.reliability.contract import DAY, ROWS, good_day_lines, nothing_complete, one_line, snapshot

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def good_lines() -> list[bytes]:
    return list(good_day_lines())


# ---- checkpoints and model files: the safe loader ------------------------------------------------------------------


class _Exploit:
    """Unpickling this calls open(marker, "w"): the marker file exists if and only if the payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def planted_file(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """(file, marker) of a file that is not a loadable recflow checkpoint; the marker appears if its payload runs."""
    import torch

    marker, path = tmp_path / "pwned", tmp_path / "step_00000001.pt"
    if kind == "text":
        path.write_text("label\tint_0\n1\t5\n")
    elif kind == "foreign-torch":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    elif kind == "malicious-zip":
        torch.save({"kind": "recflow.checkpoint", "version": 1, "step": 1, "payload": _Exploit(marker)}, path)
    else:  # malicious-legacy: a bare pickle, as torch.save wrote before its zip format
        path.write_bytes(pickle.dumps({"kind": "recflow.model", "version": 1, "payload": _Exploit(marker)}, 2))
    return path, marker


def checkpoint_failure(path: Path, *named: str, plain: bool = True) -> str:
    from models.torchkit.checkpoint import CheckpointError, load_checkpoint

    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    return one_line(caught.value, str(path), *named, plain=plain)


def test_file_that_is_not_a_checkpoint(tmp_path):
    path, _ = planted_file(tmp_path, "text")
    checkpoint_failure(path, "not a recflow.checkpoint file (safe loader refused it")


def test_torch_file_that_is_not_ours(tmp_path):
    path, _ = planted_file(tmp_path, "foreign-torch")
    checkpoint_failure(path, "not a recflow.checkpoint file (kind is None)")


def test_malicious_pickle_checkpoint_is_refused_without_running(tmp_path):
    path, marker = planted_file(tmp_path, "malicious-zip")
    checkpoint_failure(path, "safe loader refused it")
    assert not marker.exists()


def test_malicious_legacy_pickle_model_is_refused_by_evaluate_without_running(tmp_path):
    from models.torchkit.checkpoint import CheckpointError
    from models.dlrm.evaluate import main

    path, marker = planted_file(tmp_path, "malicious-legacy")
    with pytest.raises(CheckpointError) as caught:
        main(["--model_path", str(path), "--output_dir", str(tmp_path / "eval"), "--device", "cpu"])
    one_line(caught.value, f"{path}: not a recflow.model file (safe loader refused it")
    assert not marker.exists() and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("kind", ["text", "malicious-zip", "malicious-legacy"])
def test_safe_loader_refusal_says_why_in_plain_text(tmp_path, kind):
    """The refusal names torch's reason, in plain text, and never repeats its advice to disable weights_only."""
    from models.torchkit.checkpoint import CheckpointError, safe_load

    path, marker = planted_file(tmp_path, kind)
    with pytest.raises(CheckpointError) as caught:
        safe_load(path, "recflow.checkpoint")
    line = one_line(caught.value, str(path), "safe loader refused it")
    assert "weights_only" not in line and "\x1b" not in line
    reason = line.split("safe loader refused it: ", 1)[1]
    assert len(reason.split(": ", 1)[1].strip(" )")) > 3
    assert not marker.exists()


def test_latest_pointer_naming_a_file_outside_its_directory_is_not_followed(tmp_path):
    import torch

    from models.torchkit.checkpoint import latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path / "other_run" / "checkpoints", 99, {"w": torch.zeros(1)})
    ours = save_checkpoint(tmp_path / "run" / "checkpoints", 5, {"w": torch.ones(1)})
    (ours.parent / "latest").write_text("../../other_run/checkpoints/step_00000099.pt\n")
    assert latest_checkpoint(ours.parent) == ours


# ---- artifact store and publish ------------------------------------------------------------------------------------

STORE_OPS = {
    "put_bytes": lambda store, key, tmp: store.put_bytes(key, b"x"),
    "put_file": lambda store, key, tmp: store.put_file(tmp / "local.bin", key),
    "get_bytes": lambda store, key, tmp: store.get_bytes(key),
    "download_file": lambda store, key, tmp: store.download_file(key, tmp / "got.bin"),
    "compare_and_swap": lambda store, key, tmp: store.compare_and_swap(key, b"x", None),
    "list": lambda store, key, tmp: store.list(key + "/"),
}
DOTDOT_KEY = "models/../../escape"


@pytest.mark.parametrize("op", sorted(STORE_OPS))
def test_local_store_key_with_dotdot(tmp_path, op):
    from tasks.release.artifact_store import open_store

    (tmp_path / "local.bin").write_bytes(b"x")
    with pytest.raises(ValueError) as caught:
        STORE_OPS[op](open_store(str(tmp_path / "store")), DOTDOT_KEY, tmp_path)
    one_line(caught.value, f"artifact key {DOTDOT_KEY!r} has a '..' segment")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.bin"]


@pytest.mark.parametrize("op", ["put_bytes", "put_file", "compare_and_swap", "get_bytes"])
def test_s3_store_key_with_dotdot(tmp_path, s3_server, s3_bucket, op):
    from tasks.release.artifact_store import open_store

    (tmp_path / "local.bin").write_bytes(b"x")
    client = s3_server.client()
    with pytest.raises(ValueError) as caught:
        STORE_OPS[op](open_store(f"s3://{s3_bucket}/published", client), DOTDOT_KEY, tmp_path)
    one_line(caught.value, f"artifact key {DOTDOT_KEY!r} has a '..' segment")
    assert client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


def test_s3_store_uri_with_dotdot_prefix(s3_server, s3_bucket):
    from tasks.release.artifact_store import open_store

    with pytest.raises(ValueError) as caught:
        open_store(f"s3://{s3_bucket}/published/../other", s3_server.client())
    one_line(caught.value, "artifact key 'published/../other' has a '..' segment")


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "model.pt"
    path.parent.mkdir()
    path.write_bytes(b"weights")
    return path


def publish_failure(tmp_path: Path, error: type, *named: str, model: str = "criteo_dlrm", version: str = "v1",
                    files: dict | None = None) -> None:
    from tasks.release.publish import publish_model

    store = tmp_path / "store"
    with pytest.raises(error) as caught:
        publish_model(str(store), model, version, files or {}, {"auc": 0.8}, {"run_id": "r1"},
                      allowed_stores=[str(store)])  # an allowed store (refused stores: test_bad_inputs.py)
    one_line(caught.value, *named)
    assert not store.exists() or snapshot(store) == {}  # nothing uploaded, no manifest, no latest.json


def test_publish_with_a_missing_file(tmp_path, model_file):
    missing = model_file.parent / "feature_spec.yaml"
    publish_failure(tmp_path, FileNotFoundError, f"file 'feature_spec.yaml' to publish does not exist: {missing}",
                    files={"model.pt": model_file, "feature_spec.yaml": missing})


@pytest.mark.parametrize("name", ["team/criteo", "../criteo", "..", "criteo\\dlrm", "/criteo", ""])
def test_publish_model_name_with_path_separators(tmp_path, model_file, name):
    publish_failure(tmp_path, ValueError, f"model name {name!r} is not safe", model=name,
                    files={"model.pt": model_file})


def test_publish_version_with_path_separators(tmp_path, model_file):
    publish_failure(tmp_path, ValueError, "version 'v1/../../v0' is not safe", version="v1/../../v0",
                    files={"model.pt": model_file})


def test_published_file_name_with_dotdot(tmp_path, model_file):
    publish_failure(tmp_path, ValueError, "artifact key 'criteo_dlrm/versions/v1/../../latest.json' has a '..'",
                    files={"../../latest.json": model_file})



def _store(kind: str, tmp_path: Path, s3_server, s3_bucket):
    from tasks.release.artifact_store import open_store

    return (open_store(str(tmp_path / "store")) if kind == "local"
            else open_store(f"s3://{s3_bucket}/published", s3_server.client()))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_an_object_larger_than_expected_is_refused_before_it_is_read(tmp_path, s3_server, s3_bucket, kind):
    """A small object (manifest, latest.json) over its cap is never read into memory; a version's file larger than
    its manifest says never lands on disk (a bucket writer could otherwise fill a gate worker's memory or disk)."""
    from tasks.release.artifact_store import ObjectTooLarge

    store = _store(kind, tmp_path, s3_server, s3_bucket)
    store.put_bytes("m/latest.json", b"0123456789")
    assert store.get_bytes("m/latest.json", max_bytes=10) == b"0123456789"
    with pytest.raises(ObjectTooLarge) as caught:
        store.get_bytes("m/latest.json", max_bytes=9)
    one_line(caught.value, "m/latest.json holds 10 bytes, more than the 9 expected: not read")
    with pytest.raises(ObjectTooLarge):
        store.download_file("m/latest.json", tmp_path / "got" / "model.pt", max_bytes=9)
    assert not (tmp_path / "got").exists() or list((tmp_path / "got").iterdir()) == []
    assert store.download_file("m/latest.json", tmp_path / "ok.bin", max_bytes=10).read_bytes() == b"0123456789"


def test_an_s3_object_replaced_by_a_larger_one_after_its_size_check_is_not_kept(tmp_path, s3_server, s3_bucket,
                                                                               monkeypatch):
    """The size check (HEAD) and the transfer are two requests: an object replaced in between by a larger one is
    stopped by its byte count, and nothing of it is left on disk."""
    from tasks.release.artifact_store import ObjectTooLarge

    store = _store("s3", tmp_path, s3_server, s3_bucket)
    store.put_bytes("m/versions/v1/model.pt", b"0123456789")
    head = store.client.head_object
    monkeypatch.setattr(store.client, "head_object", lambda **kwargs: {
        **head(**kwargs), "ContentLength": 4})  # the object as it was when the manifest said 4 bytes
    with pytest.raises(ObjectTooLarge) as caught:
        store.download_file("m/versions/v1/model.pt", tmp_path / "got" / "model.pt", max_bytes=4)
    one_line(caught.value, "m/versions/v1/model.pt sent more than the 4 bytes expected (it changed after its size "
                           "was checked): not kept")
    assert list((tmp_path / "got").iterdir()) == []


def test_a_manifest_replaced_by_garbage_is_tampered_not_parsed(tmp_path, model_file):
    """With the registry's digest the bytes are compared before they are parsed: not JSON is TamperedVersion too."""
    from tasks.release.publish import TamperedVersion, fetch_published_version, publish_model

    store = tmp_path / "store"
    result = publish_model(str(store), "criteo_dlrm", "v1", {"model.pt": model_file}, {"auc": 0.8}, {},
                           allowed_stores=[str(store)])
    (store / "criteo_dlrm" / "versions" / "v1" / "_MANIFEST.json").write_bytes(b"[" * 100_000)
    with pytest.raises(TamperedVersion):
        fetch_published_version(str(store), "criteo_dlrm", "v1", tmp_path / "got", None, result.manifest_sha256)
    assert not (tmp_path / "got").exists()

# ---- Spark jobs: a crashing child and a bad profile -------------------------------------------------------------


def validated_day(tmp_path: Path, good_lines: list[bytes]) -> None:
    """A raw day with a passed validation (its manifest written directly: GX would add ~1 s per test)."""
    from tasks.core.storage import Manifest, write_manifest

    raw = criteo_layout.raw_day(tmp_path, DAY)
    raw.parent.mkdir(parents=True)
    raw.write_bytes(b"\n".join(good_lines) + b"\n")
    out = criteo_layout.validated_day(tmp_path, DAY)
    out.mkdir(parents=True)
    write_manifest(out, Manifest(kind="criteo_validated_day", inputs={}, rows={"total": ROWS, "good": ROWS}))


def fake_spark_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    script = tmp_path / "bin" / "spark-submit"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr("tasks.core.spark_submit.spark_submit_binary", lambda: str(script))
    return script


def test_spark_job_crash_is_one_line_and_leaves_no_stats(tmp_path, good_lines, monkeypatch):
    from tasks.criteo.ingest import day_stats
    from tasks.core.spark_submit import SparkJobFailed

    validated_day(tmp_path, good_lines)
    fake_spark_submit(tmp_path, monkeypatch, "\n".join([
        "print('Traceback (most recent call last):')", "print('  File \"criteo_day_stats.py\", line 9, in main')",
        "print('RECFLOW-ERROR: ValueError: day_0 has no column int_13')", "print('ValueError: day_0 ...')",
        "sys.exit(3)"]))
    with pytest.raises(SparkJobFailed) as caught:
        day_stats(Settings(data_root=tmp_path), DAY, engine="spark")
    one_line(caught.value, "criteo/day_stats.py failed (exit 3): ValueError: day_0 has no column int_13")
    nothing_complete(criteo_layout.stats_day(tmp_path, DAY))


def test_unknown_spark_profile_starts_nothing(tmp_path, good_lines, monkeypatch):
    from tasks.criteo.ingest import day_stats

    validated_day(tmp_path, good_lines)
    marker = tmp_path / "spark-ran"
    fake_spark_submit(tmp_path, monkeypatch, f"open({str(marker)!r}, 'w')")
    with pytest.raises(ValueError) as caught:
        day_stats(Settings(data_root=tmp_path), DAY, engine="spark", spark_profile="turbo")
    one_line(caught.value, "unknown Spark profile 'turbo'; expected one of local, cluster, gpu")
    assert not marker.exists()
    nothing_complete(criteo_layout.stats_day(tmp_path, DAY))
