"""Publishing model versions to a local directory and to S3 (moto's server): layout, write order, multipart,
idempotency, immutability, invisibility of uncommitted versions, racing publishers and pointer compare-and-swap."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.core.storage import file_sha256
from tasks.release import publish as publish_module
from tasks.release.artifact_store import ArtifactStore, open_store
from tasks.release.publish import (
    VersionConflict,
    fetch_published_file,
    fetch_published_version,
    latest_version,
    load_published_metrics,
    make_version,
    publish_model,
)

MODEL = "criteo_dlrm"
V1 = make_version(datetime(2026, 1, 5, tzinfo=timezone.utc), "scheduled__2026-01-05T00:00:00+00:00")
V2 = make_version(datetime(2026, 1, 6, tzinfo=timezone.utc), "scheduled__2026-01-06T00:00:00+00:00")
METRICS = {"auc": 0.8021, "logloss": 0.4412}
LINEAGE = {"dag_id": "criteo_dlrm", "train_days": [0, 1], "test_day": 2}


@dataclass
class Backend:
    kind: str
    uri: str
    client: object | None
    endpoint_url: str | None = None

    def store(self, **kwargs) -> ArtifactStore:
        return open_store(self.uri, self.client, **kwargs)

    def delete(self, key: str) -> None:
        store = self.store()
        if self.kind == "local":
            os.remove(store.root / key)
        else:
            store.client.delete_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}")


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path: Path) -> Backend:
    if request.param == "local":
        return Backend("local", (tmp_path / "store").as_uri(), None)
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return Backend("s3", f"s3://{bucket}/published", server.client(), server.endpoint_url)


@pytest.fixture(autouse=True)
def allow_this_tests_stores(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """publish_model refuses a store outside RECFLOW_PUBLISH_ALLOWED (default: the configured store): allow this
    test's directory and bucket (tests/reliability/test_bad_artifacts.py proves the refusal)."""
    allowed = [str(tmp_path)]
    if "backend" in request.fixturenames:
        allowed.append(request.getfixturevalue("backend").uri)
    monkeypatch.setenv("RECFLOW_PUBLISH_ALLOWED", " ".join(allowed))


def model_files(directory: Path, seed: int = 0) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    contents = {
        "checkpoint.pt": os.urandom(64 << 10) if seed < 0 else bytes((i * 7 + seed) % 251 for i in range(64 << 10)),
        "feature_spec.yaml": f"feature_spec: {{}}\nmetadata: {{seed: {seed}}}\n".encode(),
        "dictionary/summary.json": json.dumps({"cat_0": 1000 + seed}).encode(),
    }
    files = {}
    for name, data in contents.items():
        path = directory / name.replace("/", "__")
        path.write_bytes(data)
        files[name] = path
    return files


class RecordingStore:
    """Delegates to a real store and records each completed write, in completion order."""

    def __init__(self, inner: ArtifactStore, writes: list[tuple[str, str]]) -> None:
        self.inner, self.writes = inner, writes

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_file(self, local_path, key):
        uploaded = self.inner.put_file(local_path, key)
        self.writes.append(("put_file", key))
        return uploaded

    def put_bytes(self, key, data):
        self.inner.put_bytes(key, data)
        self.writes.append(("put_bytes", key))

    def compare_and_swap(self, key, data, expected):
        swapped = self.inner.compare_and_swap(key, data, expected)
        self.writes.append(("cas" if swapped else "cas-lost", key))
        return swapped


@pytest.fixture
def recorded_writes(monkeypatch) -> list[tuple[str, str]]:
    writes: list[tuple[str, str]] = []
    real_open = publish_module.open_store
    monkeypatch.setattr(publish_module, "open_store", lambda *a, **k: RecordingStore(real_open(*a, **k), writes))
    return writes


def test_publish_writes_every_object_and_the_manifest_before_the_pointer(backend, tmp_path, recorded_writes):
    files = model_files(tmp_path / "model")
    result = publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    assert result.became_latest and not result.cached
    assert result.uri == f"{backend.uri}/{MODEL}/versions/{V1}"
    assert result.files["checkpoint.pt"] == 64 << 10
    assert set(result.files) == set(files) | {"metrics.json", "lineage.json"}

    prefix = f"{MODEL}/versions/{V1}/"
    expected_keys = {prefix + name for name in result.files} | {prefix + "_MANIFEST.json", f"{MODEL}/latest.json"}
    assert set(backend.store().list(f"{MODEL}/")) == expected_keys  # no temporaries or lock files visible

    keys_in_order = [key for op, key in recorded_writes if op != "cas-lost"]
    manifest_at = keys_in_order.index(prefix + "_MANIFEST.json")
    assert set(keys_in_order[:manifest_at]) == {prefix + name for name in result.files}
    assert keys_in_order[manifest_at + 1 :] == [f"{MODEL}/latest.json"]
    assert ("put_file", prefix + "checkpoint.pt") in recorded_writes

    manifest = json.loads(backend.store().get_bytes(prefix + "_MANIFEST.json"))
    assert manifest["files"]["checkpoint.pt"] == {"bytes": 64 << 10, "sha256": file_sha256(files["checkpoint.pt"])}
    pointer = latest_version(backend.uri, MODEL, s3_client=backend.client)
    assert pointer["version"] == V1 and pointer["metrics"] == METRICS and pointer["uri"] == result.uri
    assert load_published_metrics(backend.uri, MODEL, V1, s3_client=backend.client) == METRICS

    fetched = fetch_published_file(backend.uri, MODEL, V1, "dictionary/summary.json", tmp_path / "out" / "summary.json",
                                   s3_client=backend.client)
    assert fetched.read_bytes() == files["dictionary/summary.json"].read_bytes()


def test_a_new_version_reads_each_file_once_hashing_it_as_it_is_uploaded(backend, tmp_path, monkeypatch):
    """A model of many GB is read once to publish it, not hashed and then read again to upload; a retry after the
    commit hashes the files (uploads nothing) to check they are the committed ones."""
    files = model_files(tmp_path / "model", seed=-1)

    hashed: list[Path] = []

    def counting_sha256(path):
        hashed.append(Path(path))
        return file_sha256(path)

    monkeypatch.setattr(publish_module, "file_sha256", counting_sha256)
    publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    assert hashed == []  # no pass over the files apart from their upload
    manifest = json.loads(backend.store().get_bytes(f"{MODEL}/versions/{V1}/_MANIFEST.json"))
    assert {name: manifest["files"][name] for name in files} == {
        name: {"bytes": path.stat().st_size, "sha256": file_sha256(path)} for name, path in files.items()}

    again = publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    assert again.cached and sorted(hashed) == sorted(files.values())


def test_republishing_the_same_version_is_a_cached_no_op(backend, tmp_path, recorded_writes):
    files = model_files(tmp_path / "model")
    publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    recorded_writes.clear()
    again = publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE | {"try_number": 2}, s3_client=backend.client)
    assert again.cached and again.became_latest
    assert recorded_writes == []


def test_versions_are_immutable(backend, tmp_path):
    files = model_files(tmp_path / "model")
    original = files["checkpoint.pt"].read_bytes()
    publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)

    changed = model_files(tmp_path / "changed", seed=1)
    with pytest.raises(VersionConflict, match=r"already published with different content \(checkpoint.pt, "):
        publish_model(backend.uri, MODEL, V1, changed, METRICS, LINEAGE, s3_client=backend.client)
    with pytest.raises(VersionConflict, match=r"\(metrics.json\)"):
        publish_model(backend.uri, MODEL, V1, files, {"auc": 0.9}, LINEAGE, s3_client=backend.client)

    fetched = fetch_published_file(backend.uri, MODEL, V1, "checkpoint.pt", tmp_path / "ckpt", s3_client=backend.client)
    assert fetched.read_bytes() == original
    assert latest_version(backend.uri, MODEL, s3_client=backend.client)["metrics"] == METRICS


def test_an_older_version_does_not_move_the_pointer(backend, tmp_path):
    publish_model(backend.uri, MODEL, V2, model_files(tmp_path / "a"), METRICS, LINEAGE, s3_client=backend.client)
    older = publish_model(backend.uri, MODEL, V1, model_files(tmp_path / "b", 1), {"auc": 0.9}, LINEAGE,
                          s3_client=backend.client)
    assert not older.became_latest and not older.cached
    assert latest_version(backend.uri, MODEL, s3_client=backend.client)["version"] == V2
    assert load_published_metrics(backend.uri, MODEL, V1, s3_client=backend.client) == {"auc": 0.9}


def test_a_version_without_manifest_is_invisible(backend, tmp_path):
    publish_model(backend.uri, MODEL, V1, model_files(tmp_path / "a"), METRICS, LINEAGE, s3_client=backend.client)
    store = backend.store()
    # A publisher that died after its data objects: everything but the manifest, and even a pointer naming it.
    prefix = f"{MODEL}/versions/{V2}/"
    store.put_bytes(prefix + "checkpoint.pt", b"half")
    store.put_bytes(prefix + "metrics.json", json.dumps({"auc": 0.99}).encode())
    store.put_bytes(f"{MODEL}/latest.json", json.dumps({"version": V2, "metrics": {"auc": 0.99}}).encode())

    pointer = latest_version(backend.uri, MODEL, s3_client=backend.client)
    assert pointer["version"] == V1 and pointer["metrics"] == METRICS
    with pytest.raises(FileNotFoundError, match=f"{V2} is not published"):
        load_published_metrics(backend.uri, MODEL, V2, s3_client=backend.client)
    with pytest.raises(FileNotFoundError, match="is not published"):
        fetch_published_file(backend.uri, MODEL, V2, "checkpoint.pt", tmp_path / "x", s3_client=backend.client)

    backend.delete(f"{MODEL}/latest.json")  # pointer lost entirely: the newest committed version still answers
    assert latest_version(backend.uri, MODEL, s3_client=backend.client)["version"] == V1
    assert latest_version(backend.uri, "never_published", s3_client=backend.client) is None

    # Its retry uploads again and commits; then it becomes visible and latest.
    result = publish_model(backend.uri, MODEL, V2, model_files(tmp_path / "b", 1), {"auc": 0.85}, LINEAGE,
                           s3_client=backend.client)
    assert result.became_latest and not result.cached
    assert latest_version(backend.uri, MODEL, s3_client=backend.client)["metrics"] == {"auc": 0.85}


def test_fetch_detects_a_corrupted_object(backend, tmp_path):
    files = model_files(tmp_path / "a")
    publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    same_size = b"x" * files["feature_spec.yaml"].stat().st_size
    backend.store().put_bytes(f"{MODEL}/versions/{V1}/feature_spec.yaml", same_size)
    target = tmp_path / "out" / "feature_spec.yaml"
    with pytest.raises(ValueError, match="does not match its manifest"):
        fetch_published_file(backend.uri, MODEL, V1, "feature_spec.yaml", target, s3_client=backend.client)
    assert not target.exists() and os.listdir(target.parent) == []


def test_a_scorer_fetches_only_the_files_it_reads_and_a_full_copy_serves_it(backend, tmp_path, monkeypatch):
    # The gate scores the production version eagerly: a Triton export as large as the weights stays in the store.
    files = model_files(tmp_path / "a") | {"triton/dlrm/1/model.pt": tmp_path / "a" / "serving.pt"}
    files["triton/dlrm/1/model.pt"].write_bytes(b"torchscript")
    publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    fetched: list[str] = []
    real_fetch = publish_module._fetch_file
    monkeypatch.setattr(publish_module, "_fetch_file",
                        lambda store, model, version, manifest, name, path: fetched.append(name) or
                        real_fetch(store, model, version, manifest, name, path))
    local = tmp_path / "cache" / V1
    scoring = {"wanted": lambda name: not name.startswith("triton/"), "s3_client": backend.client}

    assert fetch_published_version(backend.uri, MODEL, V1, local, **scoring) == local
    held = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    assert held == {"checkpoint.pt", "feature_spec.yaml", "dictionary/summary.json", "metrics.json",
                    "lineage.json", "_MANIFEST.json"}
    assert sorted(json.loads((local / "_MANIFEST.json").read_text())["files"]) == sorted(held - {"_MANIFEST.json"})
    assert (local / "checkpoint.pt").read_bytes() == files["checkpoint.pt"].read_bytes()
    fetch_published_version(backend.uri, MODEL, V1, local, **scoring)  # cached: nothing fetched again
    assert sorted(fetched) == sorted(held - {"_MANIFEST.json"})

    fetched.clear()  # every file (the predict CLI's fetch_model): the whole version again, which then serves both
    fetch_published_version(backend.uri, MODEL, V1, local, s3_client=backend.client)
    assert (local / "triton/dlrm/1/model.pt").read_bytes() == b"torchscript" and len(fetched) == 6
    fetch_published_version(backend.uri, MODEL, V1, local, **scoring)
    fetch_published_version(backend.uri, MODEL, V1, local, s3_client=backend.client)
    assert len(fetched) == 6


def _publish_in_child(uri: str, endpoint_url: str | None, version: str, directory: str, seed: int, start,
                      client=None) -> bool:
    """One racing publisher; builds its own S3 client when it runs in a fresh process."""
    if endpoint_url and client is None:
        from tests.servers import S3Server

        client = S3Server(endpoint_url).client()
    files = model_files(Path(directory), seed)
    start.wait()
    return publish_model(uri, MODEL, version, files, {"auc": 0.8 + seed / 100}, LINEAGE, s3_client=client).became_latest


def _race(backend: Backend, tmp_path: Path, mode: str) -> list[bool]:
    """Publish V1 and V2 at the same moment from two threads or two processes; their became_latest flags."""
    args = [(backend.uri, backend.endpoint_url, version, str(tmp_path / f"m{i}"), i)
            for i, version in enumerate([V1, V2])]
    if mode == "threads":
        start, results = threading.Barrier(2), [None, None]
        # boto3 clients are thread-safe once built, but building them is not: build them here, one per thread.
        clients = [backend.store().client if backend.kind == "s3" else None for _ in args]

        def run(i: int) -> None:
            results[i] = _publish_in_child(*args[i], start, clients[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        return results
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(2) as pool:
        start = manager.Barrier(2)
        pending = [pool.apply_async(_publish_in_child, (*a, start)) for a in args]
        return [p.get(timeout=60) for p in pending]


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_racing_publishers_leave_one_latest_and_both_versions_intact(backend, tmp_path, mode):
    became_latest = _race(backend, tmp_path, mode)
    assert became_latest[1] is True  # V2 sorts last: it ends up latest whichever finished first
    pointer = latest_version(backend.uri, MODEL, s3_client=backend.client)
    assert pointer["version"] == V2 and pointer["metrics"] == {"auc": 0.81}
    for seed, version in enumerate([V1, V2]):
        metrics = load_published_metrics(backend.uri, MODEL, version, s3_client=backend.client)
        assert metrics == {"auc": 0.8 + seed / 100}
        got = fetch_published_file(backend.uri, MODEL, version, "checkpoint.pt", tmp_path / f"got{seed}",
                                   s3_client=backend.client)
        assert got.read_bytes() == model_files(tmp_path / f"expect{seed}", seed)["checkpoint.pt"].read_bytes()


class RacingStore(RecordingStore):
    """On the first pointer CAS, another publisher moves latest.json to `rival` just before ours lands."""

    def __init__(self, inner: ArtifactStore, writes, rival: str) -> None:
        super().__init__(inner, writes)
        self.rival = rival

    def compare_and_swap(self, key, data, expected):
        if key.endswith("/latest.json") and self.rival:
            self.inner.put_bytes(key, json.dumps({"version": self.rival, "metrics": {}}).encode())
            self.rival = ""
        return super().compare_and_swap(key, data, expected)


class ManifestRacingStore(RecordingStore):
    """Just before our manifest's CAS, another publisher of the same version commits its own manifest: ours with a
    later created_at (same content), or naming a different checkpoint (`differ`)."""

    def __init__(self, inner: ArtifactStore, writes, differ: bool) -> None:
        super().__init__(inner, writes)
        self.differ = differ

    def compare_and_swap(self, key, data, expected):
        if key.endswith("/_MANIFEST.json") and expected is None:
            theirs = json.loads(data) | {"created_at": "2099-01-01T00:00:00+00:00"}
            if self.differ:
                theirs["files"]["checkpoint.pt"]["sha256"] = "0" * 64
            self.inner.compare_and_swap(key, json.dumps(theirs).encode(), None)
        return super().compare_and_swap(key, data, expected)


@pytest.mark.parametrize("differ", [False, True])
def test_a_publisher_that_loses_the_commit_compares_what_it_uploaded_with_the_winners(backend, tmp_path, monkeypatch,
                                                                                     differ):
    """The files are described by what was uploaded, hashed as it was read: the winner's manifest of the same content
    is taken as ours (cached), one of other content is a conflict."""
    real_open = publish_module.open_store
    monkeypatch.setattr(publish_module, "open_store",
                        lambda *a, **k: ManifestRacingStore(real_open(*a, **k), [], differ))
    files = model_files(tmp_path / "a")
    if differ:
        with pytest.raises(VersionConflict, match=r"different content \(checkpoint.pt\)"):
            publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
        return
    result = publish_model(backend.uri, MODEL, V1, files, METRICS, LINEAGE, s3_client=backend.client)
    committed = backend.store().get_bytes(f"{MODEL}/versions/{V1}/_MANIFEST.json")
    assert result.cached and json.loads(committed)["created_at"].startswith("2099")
    assert result.manifest_sha256 == hashlib.sha256(committed).hexdigest()


@pytest.mark.parametrize("rival, ours_wins", [("20260101T000000Z-older", True), ("20991231T000000Z-newer", False)])
def test_a_lost_pointer_race_re_reads_and_only_moves_forward(backend, tmp_path, monkeypatch, rival, ours_wins):
    writes: list[tuple[str, str]] = []
    real_open = publish_module.open_store
    monkeypatch.setattr(publish_module, "open_store", lambda *a, **k: RacingStore(real_open(*a, **k), writes, rival))
    result = publish_model(backend.uri, MODEL, V1, model_files(tmp_path / "a"), METRICS, LINEAGE,
                           s3_client=backend.client)
    pointer_writes = [op for op, key in writes if key.endswith("/latest.json")]
    assert result.became_latest is ours_wins
    assert pointer_writes == (["cas-lost", "cas"] if ours_wins else ["cas-lost"])
    pointer = json.loads(backend.store().get_bytes(f"{MODEL}/latest.json"))
    assert pointer["version"] == (V1 if ours_wins else rival)


def test_compare_and_swap_semantics(backend):
    store = backend.store()
    assert store.compare_and_swap("m/latest.json", b"one", None)
    assert not store.compare_and_swap("m/latest.json", b"two", None)  # must not exist, but does
    assert not store.compare_and_swap("m/latest.json", b"two", b"stale")  # expected mismatch
    assert store.get_bytes("m/latest.json") == b"one"
    assert store.compare_and_swap("m/latest.json", b"two", b"one")
    assert store.get_bytes("m/latest.json") == b"two"
    assert not store.compare_and_swap("m/other.json", b"x", b"anything")  # expected content, but no object
    assert not store.exists("m/other.json") and store.get_bytes("m/other.json") is None
    assert store.list("m/") == ["m/latest.json"]


def test_s3_compare_and_swap_is_enforced_by_the_server(s3_server, s3_bucket):
    """The If-Match condition, not our own re-read, rejects a write over an object replaced after we read it."""
    store = open_store(f"s3://{s3_bucket}/cas", s3_server.client())
    store.put_bytes("p", b"one")
    stale = store._get("p")
    store.put_bytes("p", b"rival")  # a racing writer moved the pointer after our read
    store._get = lambda key: stale  # our read is the stale one: it still says "one", with one's ETag
    assert store.compare_and_swap("p", b"two", b"one") is False
    assert store.client.get_object(Bucket=s3_bucket, Key="cas/p")["Body"].read() == b"rival"


def test_s3_put_file_goes_multipart_above_the_threshold(s3_server, s3_bucket, tmp_path):
    client = s3_server.client()
    store = open_store(f"s3://{s3_bucket}/mp", client, multipart_threshold=5 << 20)
    big, parts, small, empty = (tmp_path / f"{name}.bin" for name in ("big", "parts", "small", "empty"))
    big.write_bytes(os.urandom(11 << 20))
    parts.write_bytes(os.urandom(10 << 20))  # exactly two parts
    small.write_bytes(os.urandom(1 << 20))
    empty.write_bytes(b"")
    for path in (big, parts, small, empty):  # each described by what was uploaded, hashed as it was read
        assert store.put_file(path, f"v/{path.name}") == {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    assert client.head_object(Bucket=s3_bucket, Key="mp/v/big.bin")["ETag"].strip('"').endswith("-3")
    assert client.head_object(Bucket=s3_bucket, Key="mp/v/parts.bin")["ETag"].strip('"').endswith("-2")
    assert "-" not in client.head_object(Bucket=s3_bucket, Key="mp/v/small.bin")["ETag"]
    assert client.head_object(Bucket=s3_bucket, Key="mp/v/empty.bin")["ContentLength"] == 0
    assert store.download_file("v/big.bin", tmp_path / "back.bin").read_bytes() == big.read_bytes()
    # boto3 cannot size a non-seekable reader's parts: a file that 5 MiB parts would cut into more than S3's 10,000
    # gets larger ones (here 100 GiB: 10,486 parts of 5 MiB)
    assert store._transfer_config(100 << 30).multipart_chunksize * 10_000 >= 100 << 30
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store.download_file("v/none.bin", tmp_path / "none.bin")


@pytest.mark.parametrize("key", ["", "/abs/key", "a//b", "a/", "../up", "a/../b", "a/./b", "a/.tmp-x", "a\\b"])
def test_unsafe_keys_are_rejected(backend, key):
    store = backend.store()
    with pytest.raises(ValueError, match="artifact key"):
        store.put_bytes(key, b"x")
    with pytest.raises(ValueError, match="artifact key"):
        store.compare_and_swap(key, b"x", None)


@pytest.mark.parametrize("model, version, name", [("bad/name", V1, "f"), (MODEL, "../v1", "f"), (MODEL, "v 1", "f"),
                                                  (MODEL, V1, "metrics.json"), (MODEL, V1, "../escape")])
def test_unsafe_names_are_rejected_before_anything_is_written(tmp_path, model, version, name):
    (tmp_path / "f").write_bytes(b"x")
    store_dir = tmp_path / "store"
    with pytest.raises(ValueError):
        publish_model(str(store_dir), model, version, {name: tmp_path / "f"}, METRICS, LINEAGE)
    assert not store_dir.exists() or not any(store_dir.rglob("*"))


def test_plain_path_and_file_uri_open_the_same_store(tmp_path):
    publish_model(str(tmp_path / "store"), MODEL, V1, model_files(tmp_path / "a"), METRICS, LINEAGE)
    assert latest_version((tmp_path / "store").as_uri(), MODEL)["version"] == V1
    with pytest.raises(ValueError, match="unsupported scheme"):
        open_store("gs://bucket/x")


def test_make_version_sorts_in_publish_order():
    early = make_version(datetime(2026, 1, 5, 23, 0, tzinfo=timezone.utc), "manual__2026-01-05T23:00:00+00:00")
    late = make_version(datetime(2026, 1, 6, 1, 0, tzinfo=timezone.utc), "scheduled__2026-01-06T00:00:00+00:00")
    assert early < late and early.startswith("20260105T230000Z-manual__2026-01-05T23_00_00_00_00")
