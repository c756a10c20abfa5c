"""The training pipeline protocol (tasks/release/pipeline.py): every training DAG's steps module declares a SPEC with
the hooks' one signature, and the steps written once on it (gate, lineage, publishable files, publish) do what each
pipeline's copy used to, on a stand-in pipeline with a local registry and store (no training)."""

from __future__ import annotations

import importlib
import inspect
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.core.config import Settings
from tasks.core.storage import fingerprint
from tasks.release.pipeline import TrainingPipeline
from tasks.release.steps import open_registry

# DAG id -> the steps module its training tasks are built from (tasks.dagkit.training.training_tasks)
STEPS = {"criteo_dlrm": "tasks.criteo.dlrm", "byo_dlrm": "tasks.byo.pipeline",
         "movielens_ncf": "tasks.movielens.ncf", "outbrain_wide_deep": "tasks.outbrain.wide_deep"}
HOOKS = {"resolve_run": ["settings", "params", "run_type", "spark_master"],
         "train": ["settings", "run_id", "run"],
         "evaluate": ["settings", "run_id", "run", "trained"],
         "score_published": ["settings", "run_id", "version_uri", "run", "metrics", "aws_conn_id"],
         "provenance": ["settings", "run_id", "run", "params"],
         "files": ["settings", "run_id", "run"]}


@pytest.mark.parametrize("dag_id", sorted(STEPS))
def test_every_training_dag_builds_its_tasks_from_a_spec_with_the_protocols_signatures(dag_id):
    spec = importlib.import_module(STEPS[dag_id]).SPEC
    assert isinstance(spec, TrainingPipeline) and spec.name == dag_id
    assert f'training_tasks("{STEPS[dag_id]}"' in (Path(__file__).parents[1] / "dags" / f"{dag_id}.py").read_text()
    for hook, names in HOOKS.items():
        params = list(inspect.signature(getattr(spec, hook)).parameters)
        assert params[:len(names)] == names, f"{dag_id} {hook}{tuple(params)}"


def stand_in(scored: list) -> TrainingPipeline:
    """A pipeline whose train folder holds a weights file, scoring the production version as 0.7."""
    def files(settings, run_id, run):
        paths = spec.run_paths(settings, run_id)
        return {"weights.bin": paths.train / "weights.bin", "gate.json": paths.gate / "gate.json"}

    def score(settings, run_id, version_uri, run, metrics, *, aws_conn_id=None):
        scored.append((run_id, version_uri, metrics["rows"]))
        return {"hit@{k}".format(k=run["knobs"]["k"]): 0.7, "rows": metrics["rows"]}

    spec = TrainingPipeline(
        name="standin_pipeline", dataset="standin", metric="hit@{k}", floor_knob="min_hit",
        resolve_run=lambda *a, **k: None, train=lambda *a: {}, evaluate=lambda *a: {},
        window=lambda run: {"snapshot": run["snapshot"]}, trainer_config=lambda run: {"width": run["knobs"]["k"]},
        files=files, provenance=lambda settings, run_id, run, params: {"snapshot": run["snapshot"],
                                                                       "params": {"redacted": True}},
        score_published=score)
    return spec


def test_gate_lineage_and_publish_written_once_serve_a_pipeline(tmp_path):
    scored: list = []
    spec = stand_in(scored)
    settings = Settings(data_root=tmp_path / "data")  # registry.db and published/ under it
    run = {"snapshot": "s1", "profile": "demo", "knobs": {"k": 5, "min_hit": 0.5, "max_regression": 0.05}}
    when = datetime(2026, 11, 27, tzinfo=timezone.utc)

    first = spec.gate(settings, "run_1", {"hit@5": 0.8, "rows": 40}, run, model_name="standin", registry_conn_id="")
    assert first["passed"] and first["metric"] == "hit@5" and scored == []  # no production model yet
    with pytest.raises(FileNotFoundError, match=r"cannot publish run_1: missing .*weights\.bin"):
        spec.publishable_files(settings, "run_1", run)
    paths = spec.run_paths(settings, "run_1")
    assert paths.root == tmp_path / "data" / "runs" / "standin_pipeline" / "run_1"
    paths.train.mkdir(parents=True)
    (paths.train / "weights.bin").write_bytes(b"w")
    doc = spec.lineage(settings, "run_1", run, {"secret": "x"})
    assert doc["pipeline"] == "standin_pipeline" and doc["knobs"] == run["knobs"] and doc["snapshot"] == "s1"
    assert doc["params"] == {"redacted": True} and doc["gate"]["passed"]  # the pipeline's provenance wins
    published = spec.publish(settings, "run_1", when, {"hit@5": 0.8}, doc, run=run, model_name="standin",
                             registry_conn_id="")
    assert published["became_latest"]
    with open_registry(settings, "") as registry:
        record = registry.get_run("standin_pipeline", "run_1")
    assert (record.status, record.dataset, record.window) == ("published", "standin", {"snapshot": "s1"})
    assert record.config_hash == fingerprint({"width": 5})

    second = spec.gate(settings, "run_2", {"hit@5": 0.6, "rows": 40}, run, model_name="standin",
                       registry_conn_id="")
    assert scored == [("run_2", published["uri"], 40)]  # the production version scored on run_2's own rows
    assert not second["passed"] and second["baseline_hit@5"] == 0.7
    assert json.loads((spec.run_paths(settings, "run_2").gate / "gate.json").read_text()) == second


@pytest.mark.parametrize("dag_id", ["movielens_ncf", "outbrain_wide_deep"])
def test_the_tensorflow_trainers_get_the_runs_device(dag_id, tmp_path, monkeypatch):
    """The trigger form's device reaches NCF's and Wide & Deep's trainers (--device), as it does DLRM's: on a GPU
    node whose TensorFlow cannot use the GPUs, device cpu is how a user trains there (models.tfkit.cluster)."""
    import tasks.core.launch as launch
    from tasks.core.config import load_settings
    from tasks.core.profiles import resolve_knobs

    steps = importlib.import_module(STEPS[dag_id])
    profiles = importlib.import_module(STEPS[dag_id].rsplit(".", 1)[0] + ".profiles")
    launched = []
    monkeypatch.setattr(launch, "train_with_tf_workers",
                        lambda module, data, out, config, **kw: launched.append(config))
    monkeypatch.setenv("RECFLOW_DATA_ROOT", str(tmp_path))
    knobs = resolve_knobs(profiles.KNOBS, profiles.PROFILES, "demo", {})
    run = {"knobs": knobs, "workers": 1, "device": "cpu", "profile": "demo",
           "window": {"snapshot": "s", "dataset": "d"}}
    steps.train(load_settings(), "run1", run)
    assert launched and launched[0]["device"] == "cpu"
