"""Evaluate a trained Wide & Deep on a mapping of a prebatched-TFRecord dataset: MAP@k, AUC, logloss.

Entry point: `python -m models.wide_deep.evaluate --model_path RUN/model.weights.h5 --dataset_dir D --mapping test
--output_dir O` writes O/metrics.json with `map@12, auc, logloss, random_map@12, rows, displays` (the keys
tasks.core.launch.evaluate_in_child returns). A model is two files side by side: `model.weights.h5` (Keras
weights) and `model_config.json` (the feature layout and sizes to rebuild it, plus the training config): loading
runs no pickled or serialised code. `load_model` + `make_scorer` are the scoring API for prediction.

Scoring streams: MAP@k through metrics.MapAccumulator (memory: one batch + one display), AUC and logloss through
models.common.metrics.StreamingPredictions (5 bytes per row; sklearn's exact AUC needs every score at the end).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import tensorflow as tf

from models.common.evaluation import MetricsEvalResult, evaluator_parser, write_eval_metrics
from models.common.metrics import StreamingPredictions
from models.tfkit.cluster import use_device
from models.tfkit.saving import MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE, KerasModelFiles
from models.wide_deep.data import WideDeepSpec, make_dataset, read_spec
from models.wide_deep.metrics import MapAccumulator
from models.wide_deep.model import WideDeep, WideDeepModelConfig, build_model
from tasks.core.progress import RankLog

ARCHITECTURE = "wide_deep"
MODEL_FILES = KerasModelFiles(ARCHITECTURE, "Wide & Deep",
                              lambda config: build_model(WideDeepModelConfig.from_dict(config)))


def save_model(out_dir: Path, model: WideDeep, train_config: dict[str, Any], step: int) -> Path:
    """model.weights.h5 + model_config.json (written first: weights never exist without their layout)."""
    return MODEL_FILES.save(out_dir, model, model.config.to_dict(), train_config, step)


read_model_config = MODEL_FILES.read_config  # model_config.json beside the weights, of this architecture
load_model = MODEL_FILES.load  # rebuilt from model_config.json, weights loaded (inference: fp32)


def check_compatible(spec: WideDeepSpec, config: WideDeepModelConfig) -> None:
    """The dataset's features and cardinalities must be the ones the model was built for."""
    layout = {"onehot": {n: spec.cardinalities[n] for n in spec.onehot},
              "multihot": {n: spec.cardinalities[n] for n in spec.multihot},
              "hotness": dict(spec.hotness), "numerical": list(spec.numerical)}
    model = {"onehot": config.onehot, "multihot": config.multihot, "hotness": config.hotness,
             "numerical": list(config.numerical)}
    differs = [k for k in layout if layout[k] != model[k]]
    if differs:
        raise ValueError(f"{spec.path}: {', '.join(differs)} differ from the model's "
                         f"({ {k: layout[k] for k in differs} } vs { {k: model[k] for k in differs} })")


def make_scorer(model: WideDeep, jit_compile: bool = False):
    """A tf.function features -> logits [B] (float32)."""

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def score(features: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.cast(model(features, training=False), tf.float32)

    return score


def evaluate_mapping(model: WideDeep, spec: WideDeepSpec, mapping: str, batch_size: int, k: int = 12,
                     scorer=None, limit_batches: int | None = None) -> dict[str, Any]:
    """MAP@k, random MAP@k, AUC and logloss of the model over every row of `mapping` (in file order)."""
    scorer = scorer or make_scorer(model)
    dataset = make_dataset(spec, mapping, batch_size, with_display_id=True)
    if limit_batches is not None:
        dataset = dataset.take(limit_batches)
    ranking, clicks = MapAccumulator(k), StreamingPredictions()
    for features, labels, display_ids in dataset:
        logits = scorer(features).numpy()
        labels = labels.numpy()
        ranking.add(display_ids.numpy(), logits, labels)
        clicks.add(labels, logits)
    result, binary = ranking.result(), clicks.compute()
    return {f"map@{k}": result.map, f"random_map@{k}": result.random_map, "auc": binary["auc"],
            "logloss": binary["logloss"], "rows": binary["rows"], "displays": result.displays,
            "displays_without_positive": result.displays_without_positive, "map_k": k}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = evaluator_parser(
        "evaluate a recflow Wide & Deep model (MAP@k, AUC, logloss)",
        model_help=f"{MODEL_WEIGHTS_FILE} written by models.wide_deep.train ({MODEL_CONFIG_FILE} must sit beside it)",
        dataset_help="tfrecords directory (default: the one trained on)",
        mapping_help="source_spec mapping with display_id (the map channel)")
    parser.add_argument("--map_k", type=int, default=12)
    parser.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"),
                        help="cpu hides any GPU; auto/cuda: TensorFlow's placement (models.tfkit.cluster.use_device)")
    parser.add_argument("--eval_batch_size", type=int, default=131072)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> MetricsEvalResult:
    args = parse_args(argv)
    use_device(args.device)
    log = RankLog(0)
    document = read_model_config(args.model_path)
    dataset_dir = Path(args.dataset_dir or document["train_config"]["dataset_dir"])
    spec = read_spec(dataset_dir, args.feature_spec)
    check_compatible(spec, WideDeepModelConfig.from_dict(document["model"]))
    model = load_model(args.model_path)
    log(f"evaluating {args.model_path} (step {document['step']}) on {dataset_dir}/{args.mapping}, "
        f"{len(spec.source(args.mapping).files)} file(s)")
    started = time.perf_counter()
    metrics = evaluate_mapping(model, spec, args.mapping, args.eval_batch_size, args.map_k)
    seconds = time.perf_counter() - started
    result = {**metrics, "mapping": args.mapping, "model_path": str(args.model_path), "step": document["step"],
              "seconds": seconds}
    metrics_path = write_eval_metrics(args, result)
    k = args.map_k
    log(f"eval {args.mapping}: map@{k} {metrics[f'map@{k}']:.4f} (random {metrics[f'random_map@{k}']:.4f}) auc "
        f"{metrics['auc']:.4f} logloss {metrics['logloss']:.4f} over {metrics['rows']:,} rows / "
        f"{metrics['displays']:,} displays in {seconds:.1f}s ({metrics['rows'] / max(seconds, 1e-9):,.0f} rows/s) "
        f"-> {metrics_path}")
    return MetricsEvalResult(model_path=Path(args.model_path), mapping=args.mapping, metrics=result,
                      metrics_path=metrics_path)


if __name__ == "__main__":
    print(json.dumps(asdict(main()), default=str))
