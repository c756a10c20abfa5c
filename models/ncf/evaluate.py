"""Evaluate a trained NeuMF on a leave-one-out test mapping (HR@k, NDCG@k), and score (user, item) pairs.

Entry point: `python -m models.ncf.evaluate --model_path RUN/model.weights.h5 --dataset_dir D [--mapping test]
--output_dir O` writes O/metrics.json. A model is two files side by side: `model.weights.h5` (Keras weights) and
`model_config.json` (the sizes to rebuild it, plus the training config): loading runs no pickled or serialised
code. `load_model` + `score` are the scoring API for prediction.

The ranking math here is TensorFlow (batches of users, on the device the model is on) and follows
models/ncf/metrics.py exactly (duplicates masked, ties against the positive); the tests hold the two together.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from models.common.evaluation import MetricsEvalResult, evaluator_parser, write_eval_metrics
from models.ncf.data import RankingSeries, load_mapping, ranking_series, read_spec
from models.ncf.metrics import RankingMetrics, random_baseline
from models.ncf.model import NeuMF, NeuMFConfig, build_model
from models.tfkit.cluster import use_device
from models.tfkit.saving import MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE, KerasModelFiles
from tasks.core.progress import RankLog

ARCHITECTURE = "neumf"
MODEL_FILES = KerasModelFiles(ARCHITECTURE, "NeuMF", lambda config: build_model(NeuMFConfig.from_dict(config)))


def save_model(out_dir: Path, model: NeuMF, train_config: dict[str, Any], step: int) -> Path:
    """model.weights.h5 + model_config.json (written first: weights never exist without their sizes)."""
    return MODEL_FILES.save(out_dir, model, model.config.to_dict(), train_config, step)


read_model_config = MODEL_FILES.read_config  # model_config.json beside the weights, of this architecture
load_model = MODEL_FILES.load  # rebuilt from model_config.json, weights loaded (inference: fp32)


def score(model: NeuMF, users: Any, items: Any, batch_size: int = 65536) -> np.ndarray:
    """Logits (float32) for each (user, item) pair; higher means more likely to interact."""
    users = np.asarray(users, dtype=np.int64).reshape(-1)
    items = np.asarray(items, dtype=np.int64).reshape(-1)
    if users.shape != items.shape:
        raise ValueError(f"{users.size} users but {items.size} items")
    for name, ids, card in (("user", users, model.config.users), ("item", items, model.config.items)):
        if ids.size and (ids.min() < 0 or ids.max() >= card):
            raise ValueError(f"{name} ids span [{ids.min()}, {ids.max()}], the model knows [0, {card})")
    out = [model((tf.constant(users[i:i + batch_size]), tf.constant(items[i:i + batch_size])),
                 training=False).numpy() for i in range(0, users.size, batch_size)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def ranking_sums_tf(scores: tf.Tensor, items: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(hits, NDCG sum) over rows of [B, S] scores/items, positive in column 0 (rules: models/ncf/metrics.py)."""
    samples = tf.shape(items)[1]
    positions = tf.range(samples)
    earlier = positions[None, :] < positions[:, None]  # [j, j'] = j' comes before j
    repeated = tf.reduce_any(tf.equal(items[:, :, None], items[:, None, :]) & earlier[None], axis=2)
    scores = tf.cast(scores, tf.float32)
    beats = tf.logical_not(repeated[:, 1:]) & (scores[:, 1:] >= scores[:, :1])
    rank = tf.reduce_sum(tf.cast(beats, tf.int32), axis=1)
    hit = rank < k
    gains = tf.where(hit, math.log(2.0) / tf.math.log(tf.cast(rank, tf.float64) + 2.0), tf.zeros([], tf.float64))
    return tf.reduce_sum(tf.cast(hit, tf.float64)), tf.reduce_sum(gains)


def make_series_scorer(model: NeuMF, k: int, jit_compile: bool = False):
    """A tf.function (users [B], items [B, S]) -> (hits, NDCG sum), scoring and ranking in one graph."""

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def score_series(users: tf.Tensor, items: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        samples = tf.shape(items)[1]
        flat_users = tf.reshape(tf.repeat(users[:, None], samples, axis=1), [-1])
        logits = model((flat_users, tf.reshape(items, [-1])), training=False)
        return ranking_sums_tf(tf.reshape(logits, tf.shape(items)), items, k)

    return score_series


def evaluate_ranking(model: NeuMF, series: RankingSeries, k: int = 10, users_per_batch: int = 5000,
                     jit_compile: bool = False, scorer=None) -> RankingMetrics:
    """HR@k / NDCG@k of the model over every test series, in batches of users (NVIDIA: 5000)."""
    scorer = scorer or make_series_scorer(model, k, jit_compile)
    hits = gains = 0.0
    users = series.users.shape[0]
    for start in range(0, users, users_per_batch):
        h, g = scorer(tf.constant(series.users[start:start + users_per_batch]),
                      tf.constant(series.items[start:start + users_per_batch]))
        hits, gains = hits + float(h), gains + float(g)
    if not math.isfinite(gains):
        raise ValueError("NDCG is not finite: the model's scores diverged")
    return RankingMetrics(hit_rate=hits / users, ndcg=gains / users, users=users)


def ranking_document(metrics: RankingMetrics, series: RankingSeries, k: int) -> dict[str, Any]:
    """The metrics.json keys shared by the trainer and the evaluator."""
    baseline = random_baseline(series.items, k)
    return {f"hr@{k}": metrics.hit_rate, f"ndcg@{k}": metrics.ndcg, "users": metrics.users,
            "samples_per_series": series.samples_per_series, "rows": metrics.users * series.samples_per_series,
            f"random_hr@{k}": baseline.hit_rate, f"random_ndcg@{k}": baseline.ndcg, "topk": k}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = evaluator_parser(
        "evaluate a recflow NeuMF model on a leave-one-out test mapping",
        model_help=f"{MODEL_WEIGHTS_FILE} written by models.ncf.train ({MODEL_CONFIG_FILE} must sit beside it)",
        dataset_help="dataset directory (default: the one the model trained on)",
        mapping_help="source_spec mapping of [positive, negatives] series")
    parser.add_argument("--topk", type=int, default=10)
    parser.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"),
                        help="cpu hides any GPU; auto/cuda: TensorFlow's placement (models.tfkit.cluster.use_device)")
    parser.add_argument("--users_per_batch", type=int, default=5000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> MetricsEvalResult:
    args = parse_args(argv)
    use_device(args.device)
    log = RankLog(0)
    document = read_model_config(args.model_path)
    dataset_dir = Path(args.dataset_dir or document["train_config"]["dataset_dir"])
    spec = read_spec(dataset_dir, args.feature_spec)
    model_cfg = NeuMFConfig.from_dict(document["model"])
    if (spec.users, spec.items) != (model_cfg.users, model_cfg.items):
        raise ValueError(f"{spec.path}: {spec.users} users x {spec.items} items, the model was trained with "
                         f"{model_cfg.users} x {model_cfg.items}")
    series = ranking_series(spec, load_mapping(spec, args.mapping))
    model = load_model(args.model_path)
    started = time.perf_counter()
    log(f"evaluating {args.model_path} (step {document['step']}) on {dataset_dir}/{args.mapping}: "
        f"{series.users.shape[0]} users x {series.samples_per_series} samples")
    metrics = evaluate_ranking(model, series, args.topk, args.users_per_batch)
    seconds = time.perf_counter() - started
    result = {**ranking_document(metrics, series, args.topk), "mapping": args.mapping,
              "model_path": str(args.model_path), "step": document["step"], "seconds": seconds}
    metrics_path = write_eval_metrics(args, result)
    k = args.topk
    log(f"eval {args.mapping}: hr@{k} {metrics.hit_rate:.4f} ndcg@{k} {metrics.ndcg:.4f} (random "
        f"{result[f'random_hr@{k}']:.4f} / {result[f'random_ndcg@{k}']:.4f}) over {metrics.users} users in "
        f"{seconds:.1f}s -> {metrics_path}")
    return MetricsEvalResult(model_path=Path(args.model_path), mapping=args.mapping, metrics=result,
                      metrics_path=metrics_path)


if __name__ == "__main__":
    print(json.dumps(asdict(main()), default=str))
