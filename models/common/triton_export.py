"""What a serving export of a click model shares across frameworks: its Triton model repository's config.pbtxt
(input__0 numerical FP32 [n_num], input__1 categorical INT64 [n_cat], output__0 FP32 [1], the click probability),
export.json describing the export and its check, and the exporter's command line. The framework's exporter writes
the model file itself (models.dlrm.export: TorchScript; models.dlrm_tf.export: SavedModel)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_ABS_DIFF = 1e-6  # the exported model against the one it came from, on a check batch: more refuses the export


@dataclass
class ExportResult:
    repository: str
    model_file: str
    num_numerical: int
    num_categorical: int
    max_batch_size: int
    checked_rows: int
    max_abs_diff: float


def triton_config(model_name: str, platform: str, num_numerical: int, num_categorical: int,
                  max_batch_size: int) -> str:
    """config.pbtxt of the exported model (Triton's protobuf text format)."""
    return f"""name: "{model_name}"
platform: "{platform}"
max_batch_size: {max_batch_size}
input [
  {{
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ {num_numerical} ]
  }},
  {{
    name: "input__1"
    data_type: TYPE_INT64
    dims: [ {num_categorical} ]
  }}
]
output [
  {{
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }}
]
dynamic_batching {{ }}
"""


def write_repository_files(tmp: Path, result: ExportResult, model_name: str, platform: str) -> None:
    """config.pbtxt and export.json into the repository being written at `tmp` (the model file is already there)."""
    (tmp / model_name / "config.pbtxt").write_text(triton_config(model_name, platform, result.num_numerical,
                                                                 result.num_categorical, result.max_batch_size))
    (tmp / "export.json").write_text(json.dumps(asdict(result), indent=2, sort_keys=True))


def export_main(argv: list[str] | None, export: Callable[[Path, Path, int], ExportResult], description: str,
                model_help: str, model_format: str, check: str) -> ExportResult:
    """An exporter's entry point: `--model_path M --output_dir D [--max_batch_size N]`, then one line saying what was
    written and how far the exported model's outputs were from the original's (`check` names the two)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model_path", type=Path, required=True, help=model_help)
    parser.add_argument("--output_dir", type=Path, required=True, help="the Triton model repository to write")
    parser.add_argument("--max_batch_size", type=int, default=65536)
    args = parser.parse_args(argv)
    result = export(args.model_path, args.output_dir, args.max_batch_size)
    print(f"exported {args.model_path} to {result.model_file} ({model_format}, Triton repository "
          f"{result.repository}); max |{check}| = {result.max_abs_diff:.2g} on {result.checked_rows} rows", flush=True)
    return result
