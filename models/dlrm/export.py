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

from pathlib import Path

import torch

from models.common.triton_export import MAX_ABS_DIFF, ExportResult, export_main, write_repository_files
from models.dlrm.evaluate import load_model_file
from models.dlrm.model import Dlrm
from tasks.core.storage import atomic_directory

MODEL_NAME = "dlrm"
PLATFORM = "pytorch_libtorch"


class ServingDlrm(torch.nn.Module):
    """What Triton serves: click probabilities [b, 1] from (numerical float32 [b, n_num], categorical int64)."""

    def __init__(self, model: Dlrm) -> None:
        super().__init__()
        self.model = model

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(numerical, categorical)).unsqueeze(1)


def example_batch(model: Dlrm, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    numerical = torch.randn(rows, model.hparams["num_numerical"], generator=generator).to(torch.float16).float()
    cards = model.hparams["categorical_cardinalities"]
    categorical = torch.stack([torch.randint(0, c, (rows,), generator=generator) for c in cards], dim=1)
    return numerical, categorical


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
        result = ExportResult(str(output_dir), str(Path(output_dir) / MODEL_NAME / "1" / "model.pt"), n_num, n_cat,
                              max_batch_size, len(numerical), difference)
        write_repository_files(tmp, result, MODEL_NAME, PLATFORM)
    return result


def load_serving_model(path: Path) -> torch.jit.ScriptModule:
    """The exported TorchScript module (what Triton loads), for tests and for `predict --engine torchscript`."""
    return torch.jit.load(str(path), map_location="cpu").eval()


def main(argv: list[str] | None = None) -> ExportResult:
    return export_main(argv, export, __doc__.splitlines()[0], model_help="model.pt written by training",
                       model_format="TorchScript", check="traced - eager")


if __name__ == "__main__":
    main()
