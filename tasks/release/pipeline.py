"""The training pipeline protocol: what every training pipeline declares once (`TrainingPipeline`), and the steps
that are the same for all of them built on it: run paths, gate, lineage, publishable files, publish.

A pipeline's steps module ends with one `SPEC = TrainingPipeline(...)`: its name and dataset, its metric and the
knob holding the metric's floor, and the steps that really differ (resolve_run, train, evaluate, score_published,
the window it records, the trainer flags it hashes, its files and its own lineage). tasks/dagkit/training.py builds
the DAG tasks resolve_run -> train -> evaluate -> gate -> publish (-> prune, where `paths` declares rebuildable
outputs: tasks.release.runs.prune) from it, the same for every pipeline.

The hooks' signatures (run: the dict resolve_run returned, the same in every later task):

    resolve_run(settings, params, run_type, *, spark_master) -> dict | None   None: nothing new to train
    train(settings, run_id, run) -> dict                                      {"model_path", "metrics", ...}
    evaluate(settings, run_id, run, trained) -> dict                          holds the metric
    score_published(settings, run_id, version_uri, run, metrics, *, aws_conn_id) -> dict
    window(run) -> dict                       what the registry records as trained (automatic runs skip it)
    trainer_config(run) -> dict               the trainer's flags; its fingerprint is the run's config hash
    files(settings, run_id, run) -> {name in the version: local path}
    provenance(settings, run_id, run, params) -> dict   lineage beyond pipeline/run/profile/knobs/params/code/gate
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tasks.core.config import Settings, code_version
from tasks.core.layout import run_dir
from tasks.core.storage import fingerprint
from tasks.release.runs import RunPaths


@dataclass(frozen=True)
class TrainingPipeline:
    name: str  # the DAG id, the registry's pipeline, <data root>/runs/<name>/
    dataset: str  # what the registry records the runs as trained on
    metric: str  # the gated metric; "{knob}" fields are filled from the run's knobs ("map@{map_k}")
    floor_knob: str  # the knob with the metric's absolute minimum (the gate's first test)
    resolve_run: Callable[..., dict[str, Any] | None]
    train: Callable[[Settings, str, dict[str, Any]], dict[str, Any]]
    evaluate: Callable[[Settings, str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    window: Callable[[dict[str, Any]], dict[str, Any]]
    trainer_config: Callable[[dict[str, Any]], dict[str, Any]]
    files: Callable[[Settings, str, dict[str, Any]], dict[str, Path]]
    provenance: Callable[[Settings, str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    score_published: Callable[..., Mapping[str, Any]] | None = None  # None: compare by the recorded metric
    paths: Callable[[Path], RunPaths] = RunPaths  # a RunPaths subclass when the run has folders of its own
    bad_input: tuple[type[BaseException], ...] = (ValueError,)  # resolve_run errors a retry cannot mend

    def run_paths(self, settings: Settings, run_id: str) -> RunPaths:
        return self.paths(run_dir(settings.data_root, self.name, run_id))

    def metric_of(self, knobs: Mapping[str, Any]) -> str:
        return self.metric.format(**knobs)

    def gate(self, settings: Settings, run_id: str, metrics: dict[str, Any], run: dict[str, Any], *,
             model_name: str, registry_conn_id: str | None = None, aws_conn_id: str | None = None) -> dict[str, Any]:
        """The metric >= its floor knob, and not worse than the production model by more than max_regression on
        this run's own test rows (score_published; tasks.release.steps.gate_run)."""
        from tasks.release.steps import gate_run

        knobs = run["knobs"]
        score = None if self.score_published is None else (
            lambda uri: self.score_published(settings, run_id, uri, run, metrics, aws_conn_id=aws_conn_id))
        return gate_run(settings, pipeline=self.name, dataset=self.dataset, run_id=run_id, model_name=model_name,
                        metrics=metrics, metric=self.metric_of(knobs), min_value=knobs[self.floor_knob],
                        max_regression=knobs["max_regression"], window=self.window(run),
                        config_hash=fingerprint(self.trainer_config(run)),
                        gate_dir=self.run_paths(settings, run_id).gate, registry_conn_id=registry_conn_id,
                        score_production=score)

    def lineage(self, settings: Settings, run_id: str, run: dict[str, Any], params: dict[str, Any]
                ) -> dict[str, Any]:
        """Where the model came from: the pipeline's own provenance (its inputs and their fingerprints) plus the
        profile, knobs, params as triggered, code version and the gate's record."""
        gate_file = self.run_paths(settings, run_id).gate / "gate.json"
        return {"pipeline": self.name, "run_id": run_id, "profile": run["profile"], "knobs": run["knobs"],
                "params": params, "code_version": code_version(),
                **self.provenance(settings, run_id, run, params),
                "gate": json.loads(gate_file.read_text()) if gate_file.is_file() else None}

    def publishable_files(self, settings: Settings, run_id: str, run: dict[str, Any]) -> dict[str, Path]:
        """Everything a version holds (name in the version -> local path); FileNotFoundError names what is
        missing."""
        return require_files(run_id, self.files(settings, run_id, run))

    def publish(self, settings: Settings, run_id: str, when: datetime, metrics: dict[str, Any],
                lineage_doc: dict[str, Any], *, run: dict[str, Any], model_name: str, store_uri: str | None = None,
                aws_conn_id: str | None = None, registry_conn_id: str | None = None) -> dict[str, Any]:
        """Upload a self-contained version, then move latest (tasks.release.steps.publish_run)."""
        from tasks.release.steps import publish_run

        return publish_run(settings, pipeline=self.name, run_id=run_id, when=when, metrics=metrics,
                           lineage_doc=lineage_doc, files=lambda: self.publishable_files(settings, run_id, run),
                           model_name=model_name, store_uri=store_uri, aws_conn_id=aws_conn_id,
                           registry_conn_id=registry_conn_id)

    def record_failure(self, settings: Settings, run_id: str, *, reason: str = "",
                       registry_conn_id: str | None = None) -> bool:
        """Mark a registered run `failed` (tasks.release.steps.record_failure); never raises."""
        from tasks.release.steps import record_failure

        return record_failure(settings, self.name, run_id, reason=reason, registry_conn_id=registry_conn_id)


def require_files(run_id: str, files: dict[str, Path], missing: Iterable[str] = ()) -> dict[str, Path]:
    """`files` when every one is a file, else FileNotFoundError naming those that are not (and `missing`: what a
    pipeline found absent otherwise, e.g. a glob that matched nothing)."""
    absent = [*(str(path) for path in files.values() if not path.is_file()), *missing]
    if absent:
        raise FileNotFoundError(f"cannot publish {run_id}: missing {', '.join(absent)}")
    return files


def score_with_predict(settings: Settings, run_id: str, version_uri: str, *, paths: RunPaths, cache_dir: Path,
                       required: Callable[[list[str]], list[str]], predict_module: str,
                       args: Callable[[Path], list[str]], aws_conn_id: str | None,
                       wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """A published version's metrics on a run's own test rows: the version fetched and verified here (with the
    task's connection; only the files `wanted` names, default all), then scored by `predict_module score`-style
    `args(local copy)` in a child process (the model may be large; the Airflow worker never loads the framework),
    which writes them to gate/production_metrics.json."""
    from tasks.core.launch import run_module
    from tasks.release.steps import fetch_production

    local = fetch_production(settings, version_uri, cache_dir, aws_conn_id=aws_conn_id, required=required,
                             wanted=wanted)
    out = paths.gate / "production_metrics.json"
    run_module(predict_module, [*args(local), "--metrics-out", str(out)], label=f"gate {run_id}",
               what=f"scoring production {version_uri}")
    return json.loads(out.read_text())["metrics"]
