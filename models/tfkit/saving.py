"""A trained Keras model on disk: two files side by side, `model.weights.h5` (Keras weights) and
`model_config.json` (`{"architecture", "model", "train_config", "step"}`: the architecture's name, the settings to
rebuild it, the training config and the step). Loading rebuilds the model from the JSON with the architecture's
own builder and then loads the weights: no pickled or serialised code runs.

The JSON is written first and the weights atomically after it, so weights never exist without their config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import keras

from models.tfkit.checkpoint import save_weights_atomic
from tasks.core.storage import write_text_atomic

MODEL_WEIGHTS_FILE = "model.weights.h5"
MODEL_CONFIG_FILE = "model_config.json"


@dataclass(frozen=True)
class KerasModelFiles:
    """How one architecture saves and loads: its name in model_config.json, the name error messages use for it
    ("a <title> model is ..."), and `build`, which turns model_config.json's "model" entry into a built model (whose
    weights loading then overwrites: it need not draw initial values)."""

    architecture: str
    title: str
    build: Callable[[dict[str, Any]], keras.Model]

    def save(self, out_dir: Path, model: keras.Model, model_config: dict[str, Any], train_config: dict[str, Any],
             step: int) -> Path:
        """OUT/model_config.json, then OUT/model.weights.h5 (atomically); the weights' path."""
        document = {"architecture": self.architecture, "model": model_config, "train_config": train_config,
                    "step": step}
        write_text_atomic(Path(out_dir) / MODEL_CONFIG_FILE, json.dumps(document, indent=2, sort_keys=True))
        return save_weights_atomic(model, Path(out_dir) / MODEL_WEIGHTS_FILE)

    def read_config(self, model_path: Path | str) -> dict[str, Any]:
        """model_config.json beside `model_path` (the weights file), checked to be of this architecture."""
        path = Path(model_path).parent / MODEL_CONFIG_FILE
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: missing; a {self.title} model is {MODEL_WEIGHTS_FILE} + "
                                    f"{MODEL_CONFIG_FILE}") from None
        if document.get("architecture") != self.architecture:
            raise ValueError(f"{path}: architecture {document.get('architecture')!r}, expected "
                             f"{self.architecture!r}")
        return document

    def load(self, model_path: Path | str) -> keras.Model:
        """Rebuild the model from model_config.json beside `model_path` and load its weights (inference: fp32)."""
        model = self.build(self.read_config(model_path)["model"])
        model.load_weights(str(model_path))
        return model
