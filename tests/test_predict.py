"""tasks.criteo.predict and models.dlrm.export on a hand-built published version (no Spark): raw Criteo rows ->
model inputs by hand-checked rules, eager and TorchScript scores, bad rows, and fetching a version from a store.
The end-to-end equality with a training run's own evaluation scores is in tests/test_e2e_criteo_dlrm.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from models.dlrm.evaluate import save_model_file
from models.dlrm.export import export, load_serving_model
from models.dlrm.model import Dlrm
from tasks.criteo.predict import (DICTIONARY_PREFIX, PREPROCESSING_FILE, TORCHSCRIPT_FILE, CriteoFeatures,
                                  NotSelfContained, predict_file, preprocessing_spec)
from tasks.criteo.raw_validation import DataQualityError
from tasks.criteo.schema import CAT_COLUMNS
from tasks.release.steps import fetch_model
from tests.conftest import CRITEO_SAMPLE

# Kept values of two columns, in id order (ids 1..n); every other column keeps nothing (all ids 0).
KEPT = {0: ["05db9164", "68fd1e64"], 1: ["f0cf0024", "bc478804", "e5fb1af3"]}
CARDS = [len(KEPT.get(i, [])) + 1 for i in range(len(CAT_COLUMNS))]


@pytest.fixture(scope="module")
def version(tmp_path_factory) -> Path:
    """A published version's files as publish lays them out: dictionary parquet, preprocessing.json, model.pt,
    and the TorchScript export under triton/."""
    root = tmp_path_factory.mktemp("version")
    rows = [(c, v, i + 1, 100 - i) for c, values in KEPT.items() for i, v in enumerate(values)]
    table = pa.table({"column": pa.array([r[0] for r in rows], pa.int32()), "value": [r[1] for r in rows],
                      "id": pa.array([r[2] for r in rows], pa.int32()), "count": pa.array([r[3] for r in rows])})
    (root / DICTIONARY_PREFIX).mkdir(parents=True)
    pq.write_table(table, root / DICTIONARY_PREFIX / "part-00000.parquet")
    (root / PREPROCESSING_FILE).write_text(json.dumps(preprocessing_spec(CARDS, 15, {}, [0, 1])))
    torch.manual_seed(3)
    model = Dlrm(13, CARDS, (8, 4), (8, 1))
    save_model_file(root / "model.pt", model, {"test": True}, step=1)
    export(root / "model.pt", root / "export_tmp")
    shutil.copytree(root / "export_tmp", root / "triton")
    return root


def test_raw_rows_become_the_inputs_training_saw(version):
    from tasks.criteo.raw_rows import check_block

    block = CRITEO_SAMPLE.read_bytes()
    table = check_block(block, 1, keep_good=True).good_rows
    numerical, categorical, label = CriteoFeatures(version).transform(table)
    first = CRITEO_SAMPLE.read_text().splitlines()[0].split("\t")
    # int_0 is empty -> 0; int_1 = 0 -> log(3); int_3 = 4 -> log(7); stored through float16 as split-binary does.
    assert numerical.dtype == np.float32 and numerical[0, 0] == 0.0
    assert numerical[0, 1] == np.float16(math.log(3.0)) and numerical[0, 3] == np.float16(math.log(7.0))
    assert first[14] == "05db9164" and categorical[0, 0] == 1 and categorical[0, 1] == 1  # f0cf0024 -> id 1
    assert categorical[1, 0] == 2 and categorical[1, 1] == 2  # 68fd1e64, bc478804
    assert (categorical[:, 2:] == 0).all()  # columns that kept nothing: every value rare/unseen -> 0
    assert label.tolist() == [int(line.split("\t")[0]) for line in CRITEO_SAMPLE.read_text().splitlines()]


def test_negative_integers_follow_the_transform_rule(version):
    from tasks.criteo.raw_rows import check_block

    fields = ["1", "-3", "-2", "", *["1"] * 10, *[""] * 26]
    table = check_block(("\t".join(fields) + "\n").encode(), 1, keep_good=True).good_rows
    numerical, _, _ = CriteoFeatures(version).transform(table)
    # log(x + 3): x = -3 -> log(0) -> 0 (Spark's log of 0 is null, filled with 0); x = -2 -> log(1) = 0.
    assert numerical[0, :3].tolist() == [0.0, 0.0, 0.0]


def test_eager_and_torchscript_scores_agree(version, tmp_path):
    eager = predict_file(version, CRITEO_SAMPLE, tmp_path / "eager.tsv", with_metrics=True)
    scripted = predict_file(version, CRITEO_SAMPLE, tmp_path / "ts.tsv", engine="torchscript")
    assert eager.scored == scripted.scored == 100 and eager.bad == 0
    a = np.loadtxt(tmp_path / "eager.tsv")
    b = np.loadtxt(tmp_path / "ts.tsv")
    np.testing.assert_array_equal(a[:, :2], b[:, :2])  # line numbers and labels
    np.testing.assert_allclose(a[:, 2], b[:, 2], atol=1e-6)
    assert 0.0 < eager.metrics["auc"] < 1.0 and eager.metrics["rows"] == 100
    config = (version / "triton" / "dlrm" / "config.pbtxt").read_text()
    assert 'platform: "pytorch_libtorch"' in config and "dims: [ 13 ]" in config and "dims: [ 26 ]" in config
    assert load_serving_model(version / TORCHSCRIPT_FILE)(torch.zeros(3, 13), torch.zeros(3, 26, dtype=torch.long)
                                                          ).shape == (3, 1)


def test_the_torchscript_export_makes_no_tensor_on_a_device_of_its_own(tmp_path):
    """A traced forward that made a tensor on the CPU (a device constant in the graph) would fail beside a model
    moved to a GPU (Triton's default placement, predict --device cuda). Loaded onto the meta device and run on meta
    inputs, such a graph fails the same way, so this checks the export without a GPU: a padded interaction (its zero
    columns are made in forward) and hashed ids (their table sizes are a buffer)."""
    torch.manual_seed(5)
    model = Dlrm(13, CARDS, (8, 4), (8, 1), interaction_padding=True, hash_indices=True, max_table_size=40)
    assert model.interaction.padding > 0
    save_model_file(tmp_path / "model.pt", model, {"test": True}, step=1)
    exported = export(tmp_path / "model.pt", tmp_path / "export")
    module = torch.jit.load(exported.model_file, map_location="meta")
    scores = module(torch.zeros(3, 13, device="meta"), torch.zeros(3, 26, dtype=torch.long, device="meta"))
    assert scores.device.type == "meta" and scores.shape == (3, 1)
    # map_location also moves tensor constants, which `.to(device)` (predict, Triton) leaves where they were traced:
    # there must be none (a plain tensor attribute, not a buffer, would be one)
    graph = str(torch.jit.load(exported.model_file).inlined_graph).splitlines()
    # a tensor constant prints as <Tensor> (large) or "[ CPULongType{2} ]" (small); 0-dim ones ({2}) go anywhere
    constants = [line for line in graph if "prim::Constant" in line
                 and ("<Tensor>" in line or "Type{" in line or 'value="cpu"' in line)]
    assert constants == [], constants


def test_a_model_whose_tables_fit_no_gpu_is_scored_on_the_cpu(version, monkeypatch, capsys):
    """Evaluation, predict and the gate score on one device: a model whose tables were trained sharded over several
    GPUs may fit none of them alone and would fail every attempt for memory there. load_model_file builds it on the
    CPU instead, with a line that says why (the GPU's size is mocked: this machine has none)."""
    from types import SimpleNamespace

    from models.dlrm.evaluate import load_model_file, model_device

    # A 256-byte "GPU": the version's tables are 31 rows x 4 x 4 bytes = 496 B
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=256))
    model, _ = load_model_file(version / "model.pt", torch.device("cuda", 0))
    assert model_device(model) == torch.device("cpu")
    line = capsys.readouterr().out.strip()
    assert line.startswith("[scoring] the model's embedding tables (") and line.endswith(
        "do not fit one GPU (cuda:0, 0.0 GiB): scoring on the CPU"), line


def test_the_device_is_chosen_and_a_missing_gpu_is_one_line(version, tmp_path, caplog):
    caplog.set_level("INFO", logger="tasks.criteo.predict")
    auto = predict_file(version, CRITEO_SAMPLE, tmp_path / "auto.tsv", device="auto")  # this machine: the CPU
    assert auto.scored == 100 and any(m.startswith("scored 100 rows of") for m in caplog.messages)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="device 'cuda' requested but torch .* sees no CUDA device"):
            predict_file(version, CRITEO_SAMPLE, tmp_path / "cuda.tsv", device="cuda")
        assert not (tmp_path / "cuda.tsv").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["eager", "torchscript"])
def test_scores_on_the_gpu_equal_the_cpus(version, tmp_path, engine):
    cpu = predict_file(version, CRITEO_SAMPLE, tmp_path / "cpu.tsv", engine=engine, device="cpu")
    gpu = predict_file(version, CRITEO_SAMPLE, tmp_path / "gpu.tsv", engine=engine, device="cuda")
    assert cpu.scored == gpu.scored == 100
    np.testing.assert_allclose(np.loadtxt(tmp_path / "gpu.tsv"), np.loadtxt(tmp_path / "cpu.tsv"), atol=1e-5)


def test_limit_rows_scores_the_first_good_rows(version, tmp_path):
    result = predict_file(version, CRITEO_SAMPLE, tmp_path / "s.tsv", limit_rows=30)
    lines = np.loadtxt(tmp_path / "s.tsv")[:, 0]
    assert result.scored == 30 and lines.tolist() == list(range(1, 31))


def test_bad_rows_are_skipped_within_the_budget_and_fail_over_it(version, tmp_path):
    rows = CRITEO_SAMPLE.read_text().splitlines()
    rows[4] = "2" + rows[4][1:]  # label 2
    raw = tmp_path / "day_9"
    raw.write_text("\n".join(rows) + "\n")
    within = predict_file(version, raw, tmp_path / "ok.tsv", bad_row_budget=0.05)
    assert (within.scored, within.bad) == (99, 1)
    assert within.first_bad == ["day_9 line 5, field 1 (label), column 1: '2' label must be 0 or 1"]
    assert 5 not in np.loadtxt(tmp_path / "ok.tsv")[:, 0]
    with pytest.raises(DataQualityError, match=r"^day_9: 1 bad rows of 100 \(1.000% > budget 0.100%\); first: day_9 "
                                               r"line 5, field 1 \(label\), column 1: '2' label must be 0 or 1"):
        predict_file(version, raw, tmp_path / "no.tsv")
    assert not (tmp_path / "no.tsv").exists()  # nothing half-written is left as output


def test_a_version_without_its_dictionary_is_refused(version, tmp_path):
    partial = tmp_path / "old"
    shutil.copytree(version, partial)
    shutil.rmtree(partial / "dictionary")
    with pytest.raises(NotSelfContained, match=r"cannot score raw rows: it has no dictionary/values/\*\.parquet"):
        predict_file(partial, CRITEO_SAMPLE)


def test_a_copy_without_the_serving_export_scores_eagerly_and_refuses_torchscript(version, tmp_path):
    # What the gate fetches of a production version (tasks.criteo.predict.read_by_eager_scoring).
    partial = tmp_path / "for_the_gate"
    shutil.copytree(version, partial)
    shutil.rmtree(partial / "triton")
    assert predict_file(partial, CRITEO_SAMPLE, tmp_path / "eager.tsv").scored == 100
    with pytest.raises(NotSelfContained, match=f"has no {TORCHSCRIPT_FILE}: score it with --engine eager"):
        predict_file(partial, CRITEO_SAMPLE, tmp_path / "ts.tsv", engine="torchscript")


def test_fetch_model_resolves_latest_and_verifies_files(version, tmp_path):
    from datetime import datetime, timezone

    from tasks.release.publish import make_version, publish_model

    files = {p.relative_to(version).as_posix(): p for p in version.rglob("*") if p.is_file()
             and not p.relative_to(version).as_posix().startswith("export_tmp")}
    store = tmp_path / "store"
    v = make_version(datetime(2026, 1, 2, tzinfo=timezone.utc), "run1")
    publish_model(str(store), "criteo_dlrm", v, files, {"auc": 0.5}, {"run_id": "run1"}, allowed_stores=[str(store)])
    local = fetch_model(f"{store}/criteo_dlrm", tmp_path / "cache")
    assert local == tmp_path / "cache" / "criteo_dlrm" / v
    assert (local / PREPROCESSING_FILE).read_bytes() == (version / PREPROCESSING_FILE).read_bytes()
    again = fetch_model(f"{store}/criteo_dlrm/versions/{v}", tmp_path / "cache")
    assert again == local
    assert predict_file(local, CRITEO_SAMPLE).scored == 100
