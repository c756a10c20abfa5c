"""Serving export of a trained TF2 DLRM: a TensorFlow SavedModel laid out as a Triton model repository (what
NVIDIA's TF2 deployment/tf/deploy_monolithic.py produces), the TensorFlow counterpart of models.dlrm.export.

  python -m models.dlrm_tf.export --model_path RUN/train/model.weights.h5 --output_dir RUN/export

Output:
  <output_dir>/dlrm/config.pbtxt                platform tensorflow_savedmodel; input__0 numerical FP32 [n_num],
                                                input__1 categorical INT64 [n_cat] (ids after the dictionary);
                                                output__0 FP32 [1], the click probability
  <output_dir>/dlrm/1/model.savedmodel/         the SavedModel, serving signature of the same names
  <output_dir>/export.json                      shapes, the check below and its numbers

The SavedModel is reloaded and checked against the Keras model on a random batch (float16-rounded numericals, ids
within each cardinality): the export is refused if the two differ by more than 1e-6. Written atomically (the whole
repository appears at once).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from models.common.triton_export import MAX_ABS_DIFF, ExportResult, export_main, write_repository_files
from models.dlrm_tf.evaluate import load_model
from models.dlrm_tf.model import DlrmTf
from tasks.core.storage import atomic_directory

MODEL_NAME = "dlrm"
SAVEDMODEL_DIR = "model.savedmodel"
PLATFORM = "tensorflow_savedmodel"


class ServingDlrm(tf.Module):
    """What Triton serves: click probabilities [b, 1] from (numerical float32 [b, n_num], categorical int64)."""

    def __init__(self, model: DlrmTf) -> None:
        super().__init__()
        self.model = model
        n_num = model.config.num_numerical
        n_cat = len(model.config.categorical_cardinalities)
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, n_num], tf.float32, name="input__0"),
            tf.TensorSpec([None, n_cat], tf.int64, name="input__1")])

    def _serve(self, numerical: tf.Tensor, categorical: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = self.model((numerical, tf.cast(categorical, tf.int32)), training=False)
        return {"output__0": tf.sigmoid(logits)[:, None]}


def example_batch(model: DlrmTf, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    numerical = rng.normal(size=(rows, model.config.num_numerical)).astype(np.float16).astype(np.float32)
    categorical = np.stack([rng.integers(0, c, rows) for c in model.config.categorical_cardinalities], axis=1)
    return numerical, categorical.astype(np.int64)


def export(model_path: Path, output_dir: Path, max_batch_size: int = 65536) -> ExportResult:
    model = load_model(model_path)
    serving = ServingDlrm(model)
    n_num, n_cat = model.config.num_numerical, len(model.config.categorical_cardinalities)
    numerical, categorical = example_batch(model, 37, seed=2)
    with atomic_directory(Path(output_dir)) as tmp:
        saved = tmp / MODEL_NAME / "1" / SAVEDMODEL_DIR
        tf.saved_model.save(serving, str(saved), signatures={"serving_default": serving.serve})
        loaded = tf.saved_model.load(str(saved)).signatures["serving_default"]
        exported = loaded(input__0=tf.constant(numerical), input__1=tf.constant(categorical))["output__0"].numpy()
        eager = serving.serve(tf.constant(numerical), tf.constant(categorical))["output__0"].numpy()
        difference = float(np.abs(exported - eager).max())
        if not difference <= MAX_ABS_DIFF:
            raise RuntimeError(f"SavedModel export of {model_path} differs from the Keras model by {difference:.3g} "
                               f"(> {MAX_ABS_DIFF}): not exported")
        result = ExportResult(str(output_dir), str(Path(output_dir) / MODEL_NAME / "1" / SAVEDMODEL_DIR), n_num,
                              n_cat, max_batch_size, len(numerical), difference)
        write_repository_files(tmp, result, MODEL_NAME, PLATFORM)
    return result


def load_serving_model(path: Path):
    """The exported serving signature (what Triton runs): f(input__0=, input__1=) -> {"output__0": probabilities}."""
    return tf.saved_model.load(str(path)).signatures["serving_default"]


def main(argv: list[str] | None = None) -> ExportResult:
    return export_main(argv, export, __doc__.splitlines()[0], model_help="model.weights.h5 written by training",
                       model_format="SavedModel", check="saved - keras")


if __name__ == "__main__":
    main()
