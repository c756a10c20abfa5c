"""Evaluate a trained DLRM (model.pt) on a split-binary mapping: ROC AUC and logloss, written to metrics.json.

Entry point: `python -m models.dlrm.evaluate --model_path RUN/model.pt [--mapping test]`, or `main(argv)`.
Predictions are streamed batch by batch and kept as float32 (5 bytes/row with the label) for the exact AUC.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from models.common.evaluation import ClickEvalResult, evaluator_parser, write_eval_metrics
from models.torchkit.checkpoint import FORMAT_VERSION, MODEL_KIND, host_state, safe_load, write_torch_atomic
from models.torchkit.device_batches import ahead_on_device, to_host_behind
from models.torchkit.distributed import AMP_DTYPES, amp_dtype as resolve_amp_dtype, autocast_context, select_device
from models.common.metrics import StreamingPredictions
from tasks.core.progress import RankLog
from models.dlrm.data import PrefetchingReader, SplitBinaryDataset, decodes_on_device, to_device
from models.dlrm.model import Dlrm, build_model, embedding_table_bytes
from tasks.formats.feature_spec import FeatureSpec


def save_model_file(path: Path, model: Dlrm, config: dict[str, Any], step: int) -> Path:
    """model.pt: final weights + the hparams to rebuild the model + the training config (what publish uploads)."""
    write_model_file(path, model.state_dict(), model.hparams, config, step)
    return path


def write_model_file(path: Path, state: dict[str, torch.Tensor], hparams: dict[str, Any], config: dict[str, Any],
                     step: int, checkpoint: dict[str, Any] | None = None) -> str:
    """Write model.pt from a state dict; returns the weights' sha256 (models.torchkit.checkpoint.state_checksum),
    hashed while the file is written. checkpoint: the rest of a training checkpoint (optimizer, schedule, RNG,
    records), so that the file also serves as the run's final checkpoint (load_checkpoint reads it)."""
    weights = host_state(state)  # no copy for CPU tensors; one for a GPU's (its joint table kept one storage)
    payload = {"kind": MODEL_KIND, "version": FORMAT_VERSION, "architecture": "dlrm", "state_dict": weights,
               "hparams": hparams, "config": config, "step": step}
    if checkpoint is not None:
        payload["checkpoint"] = checkpoint
    return str(write_torch_atomic(path, payload, checksum_of=weights))


def load_model_file(path: Path, device: torch.device | str = "cpu") -> tuple[Dlrm, dict[str, Any]]:
    """Rebuild the model from model.pt with the weights_only loader; returns (model in eval mode, payload). The
    file's tensors are memory-mapped and the tables are never initialised, only filled from the file: on a GPU the
    model is built there (not first on the host, then copied) and the tables are copied in from the mapped file; on
    the CPU the model's weights are the mapped file's own (no copy: the tables are read from the page cache as
    they are looked up). A model whose tables do not fit the GPU (trained sharded over several) is built on the
    CPU instead, with a line that says so: scoring it there takes longer but finishes. Callers score on the model's
    device (`model_device`)."""
    payload = safe_load(Path(path), MODEL_KIND, map_location="cpu", mmap=True)
    device = _device_that_holds(payload["hparams"], torch.device(device))
    with torch.device(device):
        model = build_model(payload["hparams"], init_tables=False)  # strict load: every table is filled, or raises
    model.load_state_dict(payload["state_dict"], assign=device.type == "cpu")
    return model.eval(), payload


GPU_TABLE_SHARE = 0.9  # of a GPU's memory the tables may take when scoring; the rest: CUDA, the MLPs, a batch


def _device_that_holds(hparams: dict[str, Any], device: torch.device) -> torch.device:
    if device.type != "cuda":
        return device
    tables = embedding_table_bytes(hparams["categorical_cardinalities"], hparams["bottom_mlp_sizes"][-1],
                                   hparams.get("max_table_size"))
    total = torch.cuda.get_device_properties(device).total_memory
    if tables <= GPU_TABLE_SHARE * total:
        return device
    print(f"[scoring] the model's embedding tables ({tables / 2**30:.1f} GiB) do not fit one GPU ({device}, "
          f"{total / 2**30:.1f} GiB): scoring on the CPU", flush=True)
    return torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model loaded by load_model_file lives (its batches go there)."""
    return next(model.parameters()).device


@torch.no_grad()
def predict_dataset(
    model: torch.nn.Module,
    dataset: SplitBinaryDataset,
    device: torch.device,
    amp: bool = False,
    limit_batches: int | None = None,
    prefetch_depth: int = 4,
    amp_dtype: torch.dtype | None = None,
) -> StreamingPredictions:
    """Logits for every row of the dataset's batches (in file order), collected with their labels."""
    was_training = model.training
    model.eval()
    indices = list(range(len(dataset)))[: limit_batches if limit_batches is not None else None]
    predictions = StreamingPredictions()
    try:
        with PrefetchingReader(dataset, indices, prefetch_depth, raw=decodes_on_device(device)) as reader:
            batches = ahead_on_device(reader, partial(to_device, device=device), device)
            for labels, logits in to_host_behind(_scored(model, batches, device, amp, amp_dtype), device):
                predictions.add(labels, logits)
    finally:
        model.train(was_training)
    return predictions


def _scored(model: torch.nn.Module, batches, device: torch.device, amp: bool, amp_dtype: torch.dtype | None):
    """(labels, fp32 logits) per batch, still on the device: read back by the caller (one batch behind on CUDA)."""
    for numerical, categorical, label in batches:
        with autocast_context(device, amp, amp_dtype):
            logits = model(numerical, categorical)
        yield label, logits.float()


def check_cardinalities(spec: FeatureSpec, hparams: dict[str, Any], where: Path) -> None:
    """The dataset's tables must match the model's, or ids would index the wrong (or a missing) row."""
    data_sizes = [int(c) for c in spec.get_categorical_sizes()]
    if data_sizes != list(hparams["categorical_cardinalities"]) or (
        spec.get_number_of_numerical_features() != hparams["num_numerical"]
    ):
        raise ValueError(
            f"{where}: dataset has {spec.get_number_of_numerical_features()} numericals and cardinalities "
            f"{data_sizes}, the model was trained with {hparams['num_numerical']} and "
            f"{hparams['categorical_cardinalities']}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = evaluator_parser("evaluate a recflow DLRM model.pt on a split-binary mapping",
                              model_help="model.pt written by models.dlrm.train",
                              dataset_help="dataset directory (default: the one the model trained on)",
                              mapping_help="source_spec mapping to evaluate (default: test)",
                              feature_spec_help="feature spec file inside dataset_dir")
    parser.add_argument("--batch_size", type=int, default=16384)
    parser.add_argument("--limit_batches", type=int, default=None, help="evaluate at most this many batches")
    parser.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--amp_dtype", default="auto", choices=AMP_DTYPES,
                        help="autocast type of --amp (auto: bf16 on the CPU and GPUs of compute capability >= 8, "
                             "fp16 on older GPUs, as the trainer's)")
    parser.add_argument("--prefetch_depth", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> ClickEvalResult:
    args = parse_args(argv)
    log = RankLog(0)
    device = select_device(args.device)
    if args.amp:
        resolve_amp_dtype(device, args.amp_dtype)  # a bad --amp_dtype is refused before any loading
    model, payload = load_model_file(args.model_path, device)
    loaded_on = model_device(model)
    moved, device = loaded_on != device, loaded_on  # moved: to the CPU, tables that fit no single GPU
    if moved and args.amp and args.amp_dtype == "fp16":
        log("--amp_dtype fp16 is CUDA's: bf16 on the CPU")
    dtype = resolve_amp_dtype(device, "auto" if moved else args.amp_dtype) if args.amp else None
    dataset_dir = Path(args.dataset_dir or payload["config"]["dataset_dir"])
    spec = FeatureSpec.from_yaml(dataset_dir / args.feature_spec)
    check_cardinalities(spec, payload["hparams"], dataset_dir / args.feature_spec)
    started = time.perf_counter()
    with SplitBinaryDataset(spec, args.mapping, args.batch_size, drop_last_batch=False,
                            pin_memory=torch.device(device).type == "cuda") as dataset:
        log(f"evaluating {args.model_path} (step {payload['step']}) on {dataset_dir}/{args.mapping}: "
            f"{dataset.rows} rows in {len(dataset)} batches on {device}")
        predictions = predict_dataset(model, dataset, device, args.amp, args.limit_batches, args.prefetch_depth, dtype)
        read = dataset.stats
    metrics = predictions.compute()
    seconds = time.perf_counter() - started
    document = {**metrics, "mapping": args.mapping, "model_path": str(args.model_path), "step": payload["step"],
                "seconds": seconds, "read_batches_per_second": read.batches_per_second,
                "read_megabytes_per_second": read.megabytes_per_second}
    metrics_path = write_eval_metrics(args, document)
    log(f"eval {args.mapping}: auc {metrics['auc']:.5f} logloss {metrics['logloss']:.5f} over {metrics['rows']} rows "
        f"in {seconds:.1f}s (read {read.megabytes_per_second:.1f} MB/s) -> {metrics_path}")
    return ClickEvalResult(model_path=Path(args.model_path), mapping=args.mapping, auc=metrics["auc"],
                      logloss=metrics["logloss"], rows=metrics["rows"], batches=read.batches, seconds=seconds,
                      metrics_path=metrics_path)


if __name__ == "__main__":
    print(json.dumps(asdict(main()), default=str))
