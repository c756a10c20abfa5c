"""What the evaluators' entry points share (`python -m models.<model>.evaluate --model_path ...`): the flags that
name the model and the data, where metrics.json goes, and the results their main() returns."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.core.storage import write_text_atomic
from tasks.formats.feature_spec import FEATURE_SPEC_FILE


@dataclass
class ClickEvalResult:
    """A click model's evaluation: ROC AUC and logloss over every row of the mapping."""

    model_path: Path
    mapping: str
    auc: float
    logloss: float
    rows: int
    batches: int
    seconds: float
    metrics_path: Path


@dataclass
class MetricsEvalResult:
    """An evaluation whose metrics are the model's own (the metrics.json document)."""

    model_path: Path
    mapping: str
    metrics: dict[str, Any]
    metrics_path: Path


def evaluator_parser(description: str, model_help: str, dataset_help: str, mapping_help: str,
                     feature_spec_help: str | None = None) -> argparse.ArgumentParser:
    """A parser with the flags every evaluator takes: --model_path, --dataset_dir (default: the one the model trained
    on), --feature_spec, --mapping (default: test) and --output_dir (default: <model dir>/eval_<mapping>)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model_path", required=True, type=Path, help=model_help)
    parser.add_argument("--dataset_dir", default="", help=dataset_help)
    parser.add_argument("--feature_spec", default=FEATURE_SPEC_FILE, help=feature_spec_help)
    parser.add_argument("--mapping", default="test", help=mapping_help)
    parser.add_argument("--output_dir", default="",
                        help="where metrics.json goes (default: <model dir>/eval_<mapping>)")
    return parser


def write_eval_metrics(args: argparse.Namespace, document: dict[str, Any]) -> Path:
    """metrics.json (atomically) in --output_dir, else in eval_<mapping> beside the model; its path."""
    out_dir = Path(args.output_dir) if args.output_dir else Path(args.model_path).parent / f"eval_{args.mapping}"
    metrics_path = out_dir / "metrics.json"
    write_text_atomic(metrics_path, json.dumps(document, indent=2, sort_keys=True))
    return metrics_path


def final_eval_words(metrics: dict[str, Any] | None) -> str:
    """How a click trainer's closing line names its final evaluation: the test AUC, or that it was left to the
    pipeline's evaluate task (--no-final_eval)."""
    if not metrics:
        return "no final evaluation (--no-final_eval: evaluate scores the written model)"
    return f"auc {metrics['auc']:.5f}"
