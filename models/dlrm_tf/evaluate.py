"""Evaluate a trained TF2 DLRM on a split-binary mapping: ROC AUC and logloss, written to metrics.json.

Entry point: `python -m models.dlrm_tf.evaluate --model_path RUN/model.weights.h5 [--mapping test]`, or
`main(argv)`: the same flags and metrics.json keys as models.dlrm.evaluate, so a pipeline runs either evaluator the
same way. A model is `model.weights.h5` + `model_config.json` beside it (models.tfkit.saving: rebuilt from the JSON,
no pickled or serialised code runs). Every row of the mapping is scored (the short last batch too), in file order,
so both frameworks report AUC on the same test rows.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import tensorflow as tf

from models.common.evaluation import ClickEvalResult, evaluator_parser, write_eval_metrics
from models.common.metrics import StreamingPredictions
from models.dlrm_tf import data
from models.dlrm_tf.model import DlrmTf, DlrmTfModelConfig, build_model
from models.tfkit.cluster import use_device
from models.tfkit.saving import MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE, KerasModelFiles
from tasks.core.progress import RankLog
from tasks.formats.feature_spec import FeatureSpec

ARCHITECTURE = "dlrm_tf"
# Loading overwrites every table: they are built as zeros, not drawn (load_weights refuses a file that lacks one).
MODEL_FILES = KerasModelFiles(ARCHITECTURE, "DLRM (TensorFlow 2)", partial(build_model, init_tables=False))


def save_model(out_dir: Path, model: DlrmTf, train_config: dict[str, Any], step: int) -> Path:
    """model_config.json, then model.weights.h5 (atomically); the weights' path."""
    return MODEL_FILES.save(out_dir, model, model.config.to_dict(), train_config, step)


read_model_config = MODEL_FILES.read_config  # model_config.json beside the weights, of this architecture
load_model = MODEL_FILES.load  # rebuilt from model_config.json, weights loaded


def make_predictor(model: DlrmTf, jit_compile: bool = False):
    """A tf.function (numerical, categorical) -> logits in inference mode."""

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def predict(numerical: tf.Tensor, categorical: tf.Tensor) -> tf.Tensor:
        return model((numerical, categorical), training=False)

    return predict


def predict_mapping(model: DlrmTf, files: data.MappingFiles, batch_size: int, limit_batches: int | None = None,
                    prefetch: int = 4, predictor=None) -> tuple[StreamingPredictions, int]:
    """Logits of every row of the mapping's batches (file order), with their labels; and the batches scored."""
    predictor = predictor or make_predictor(model)
    dataset = data.eval_batches(files, batch_size, prefetch)
    if limit_batches is not None:
        dataset = dataset.take(limit_batches)
    predictions, batches = StreamingPredictions(), 0
    for (numerical, categorical), label in dataset:
        predictions.add(label.numpy(), predictor(numerical, categorical).numpy())
        batches += 1
    return predictions, batches


def check_cardinalities(spec: FeatureSpec, model_config: DlrmTfModelConfig, where: Path) -> None:
    """The dataset's tables must match the model's, or ids would index the wrong (or a missing) row."""
    sizes = [int(c) for c in spec.get_categorical_sizes()]
    if sizes != model_config.categorical_cardinalities or (
            spec.get_number_of_numerical_features() != model_config.num_numerical):
        raise ValueError(f"{where}: dataset has {spec.get_number_of_numerical_features()} numericals and "
                         f"cardinalities {sizes}, the model was trained with {model_config.num_numerical} and "
                         f"{model_config.categorical_cardinalities}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = evaluator_parser(
        "evaluate a recflow TF2 DLRM on a split-binary mapping",
        model_help=f"{MODEL_WEIGHTS_FILE} written by models.dlrm_tf.train ({MODEL_CONFIG_FILE} beside it)",
        dataset_help="dataset directory (default: the one the model trained on)",
        mapping_help="source_spec mapping to evaluate (default: test)",
        feature_spec_help="feature spec file inside dataset_dir")
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--limit_batches", type=int, default=None, help="evaluate at most this many batches")
    parser.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"),
                        help="cpu hides any GPU; auto/cuda: TensorFlow's placement (models.tfkit.cluster.use_device)")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=False,
                        help="accepted for the PyTorch evaluator's command line; scoring runs in fp32")
    parser.add_argument("--prefetch_depth", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> ClickEvalResult:
    args = parse_args(argv)
    use_device(args.device)
    log = RankLog(0)
    document = read_model_config(args.model_path)
    dataset_dir = Path(args.dataset_dir or document["train_config"]["dataset_dir"])
    spec = FeatureSpec.from_yaml(dataset_dir / args.feature_spec)
    check_cardinalities(spec, DlrmTfModelConfig.from_dict(document["model"]), dataset_dir / args.feature_spec)
    files = data.mapping_files(spec, args.mapping)
    model = load_model(args.model_path)
    started = time.perf_counter()
    log(f"evaluating {args.model_path} (step {document['step']}) on {dataset_dir}/{args.mapping}: {files.rows} rows "
        f"in batches of {args.batch_size}")
    predictions, batches = predict_mapping(model, files, args.batch_size, args.limit_batches, args.prefetch_depth)
    metrics = predictions.compute()
    seconds = time.perf_counter() - started
    read_bytes = metrics["rows"] * files.bytes_per_row
    # The reader runs inside tf.data, overlapped with scoring: its rates here are end to end (read + score).
    document_out = {**metrics, "mapping": args.mapping, "model_path": str(args.model_path), "step": document["step"],
                    "seconds": seconds, "read_batches_per_second": batches / seconds if seconds > 0 else 0.0,
                    "read_megabytes_per_second": read_bytes / 1e6 / seconds if seconds > 0 else 0.0}
    metrics_path = write_eval_metrics(args, document_out)
    log(f"eval {args.mapping}: auc {metrics['auc']:.5f} logloss {metrics['logloss']:.5f} over {metrics['rows']} rows "
        f"in {seconds:.1f}s -> {metrics_path}")
    return ClickEvalResult(model_path=Path(args.model_path), mapping=args.mapping, auc=metrics["auc"],
                      logloss=metrics["logloss"], rows=metrics["rows"], batches=batches, seconds=seconds,
                      metrics_path=metrics_path)


if __name__ == "__main__":
    print(json.dumps(asdict(main()), default=str))
