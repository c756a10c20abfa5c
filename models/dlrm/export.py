"""Serving export of a trained DLRM: TorchScript laid out as a Triton model repository, as NVIDIA's DLRM deployment
(triton/deployer.py) does.

  python -m models.dlrm.export --model_path RUN/train/model.pt --output_dir RUN/export [--max_batch_size 65536]

Output:
  <output_dir>/dlrm/config.pbtxt     platform pytorch_libtorch; input__0 numerical FP32 [n_num], input__1
                                     categorical INT64 [n_cat] (ids after the dictionary); output__0 FP32 [1], the
                                     click probability
  <output_dir>/dlrm/1/model.pt       the traced module: sigmoid(Dlrm(numerical, categorical))
  <output_dir>/export.json           shapes, the check below and its numbers

The exported module is traced on a batch of random valid inputs and then checked against the eager model on another
batch of another size (so a batch size baked into the trace would show): the export is refused if the two differ
by more than 1e-6. Inputs are what the split-binary loader hands the model: numericals already log-transformed (and
rounded through float16, as stored), categoricals as dictionary ids.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models.dlrm.evaluate import load_model_file
from models.dlrm.model import Dlrm
from tasks.core.storage import atomic_directory

MODEL_NAME = "dlrm"
MAX_ABS_DIFF = 1e-6


class ServingDlrm(torch.nn.Module):
    """What Triton serves: click probabilities [b, 1] from (numerical float32 [b, n_num], categorical int64)."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__()
        self.model = model

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(numerical, categorical)).unsqueeze(1)


@dataclass
class ExportResult:
    repository: str
    model_file: str
    num_numerical: int
    num_categorical: int
    max_batch_size: int
    checked_rows: int
    max_abs_diff: float


def example_batch(model: Dlrm, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    numerical = torch.randn(rows, model.hparams["num_numerical"], generator=generator).to(torch.float16).float()
    cards = model.hparams["categorical_cardinalities"]
    categorical = torch.stack([torch.randint(0, c, (rows,), generator=generator) for c in cards], dim=1)
    return numerical, categorical


def triton_config(num_numerical: int, num_categorical: int, max_batch_size: int) -> str:
    """config.pbtxt of the exported model (Triton's protobuf text format)."""
    return f"""name: "{MODEL_NAME}"
platform: "pytorch_libtorch"
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


@torch.no_grad()
def export(model_path: Path, output_dir: Path, max_batch_size: int = 65536) -> ExportResult:
    model, _ = load_model_file(model_path)
    serving = ServingDlrm(model).eval()
    traced = torch.jit.trace(serving, example_batch(model, 64, seed=1), check_trace=False)
    numerical, categorical = example_batch(model, 37, seed=2)
    difference = float((traced(numerical, categorical) - serving(numerical, categorical)).abs().max())
    if not difference <= MAX_ABS_DIFF:
        raise RuntimeError(f"TorchScript export of {model_path} differs from the eager model by {difference:.3g} "
                           f"(> {MAX_ABS_DIFF}): not exported")
    n_num, n_cat = model.hparams["num_numerical"], len(model.hparams["categorical_cardinalities"])
    with atomic_directory(Path(output_dir)) as tmp:
        version_dir = tmp / MODEL_NAME / "1"
        version_dir.mkdir(parents=True)
        traced.save(str(version_dir / "model.pt"))
        (tmp / MODEL_NAME / "config.pbtxt").write_text(triton_config(n_num, n_cat, max_batch_size))
        result = ExportResult(str(output_dir), str(Path(output_dir) / MODEL_NAME / "1" / "model.pt"), n_num, n_cat,
                              max_batch_size, len(numerical), difference)
        (tmp / "export.json").write_text(json.dumps(asdict(result), indent=2, sort_keys=True))
    return result


def load_serving_model(path: Path) -> torch.jit.ScriptModule:
    """The exported TorchScript module (what Triton loads), for tests and for `predict --engine torchscript`."""
    return torch.jit.load(str(path), map_location="cpu").eval()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_path", type=Path, required=True, help="model.pt written by training")
    parser.add_argument("--output_dir", type=Path, required=True, help="the Triton model repository to write")
    parser.add_argument("--max_batch_size", type=int, default=65536)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> ExportResult:
    args = parse_args(argv)
    result = export(args.model_path, args.output_dir, args.max_batch_size)
    print(f"exported {args.model_path} to {result.model_file} (TorchScript, Triton repository {result.repository}); "
          f"max |traced - eager| = {result.max_abs_diff:.2g} on {result.checked_rows} rows", flush=True)
    return result


if __name__ == "__main__":
    main()
