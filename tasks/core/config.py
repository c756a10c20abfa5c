"""The one home of recflow's deployment settings: a dataclass with defaults, overridden by the environment.

These settings name no dataset; each dataset package keeps its own (its settings.py: partition epoch, source) and
each pipeline its training profiles. Environment variables (all optional; with none set, everything runs here):
  RECFLOW_DATA_ROOT        where every output lives (default: <repo>/data)
  RECFLOW_BAD_ROW_BUDGET   fraction of malformed rows tolerated per partition (default 0.001)
  RECFLOW_SPARK_PROFILE    local | cluster | gpu (default local)
  RECFLOW_PUBLISH_URI      where published models go: a directory or s3://bucket/prefix (default: <data root>/published)
  RECFLOW_FILE_SOURCE_ROOTS  directories a file:// source (a DAG's source_url param) may read from, separated by
                           ':' (default: the data root, plus each dataset's configured file:// source folder)
  RECFLOW_PROFILE          training profile of scheduled and asset-triggered runs (default: full)
  RECFLOW_TRAIN_DEVICE     device of scheduled runs: cpu | cuda | auto (default auto)
  RECFLOW_TRAIN_NPROC      training processes per node of scheduled runs (default 1)
  RECFLOW_REGISTRY_CONN_ID Airflow connection (postgres / sqlite) of the model registry (default: none, the SQLite
                           file <data root>/registry.db); a named connection that does not exist fails the task
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    data_root: Path = REPO_ROOT / "data"
    bad_row_budget: float = 0.001
    spark_profile: str = "local"
    publish_uri: str = ""  # empty: <data root>/published
    file_source_roots: tuple[Path, ...] = ()  # empty: the data root (datasets add their source folders)
    # Bytes per block when streaming a file through validation: bounds memory, independent of file size.
    validation_block_bytes: int = 64 << 20
    # What a run without an explicit profile trains with (scheduled / asset-triggered runs carry no conf).
    profile: str = "full"
    train_device: str = "auto"
    train_nproc: int = 1
    registry_conn_id: str = ""  # empty: the SQLite registry under the data root

    def allowed_file_roots(self, *source_folders: Path) -> tuple[Path, ...]:
        """Where file:// sources may point: a trigger form must not read any file the worker can see. Explicit
        RECFLOW_FILE_SOURCE_ROOTS win; otherwise the data root plus the dataset's configured source folders."""
        if self.file_source_roots:
            return self.file_source_roots
        return tuple(root.resolve() for root in (self.data_root, *source_folders))

    @property
    def publish_store(self) -> str:
        return self.publish_uri or str(self.data_root / "published")


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Settings from the environment (or the mapping given), falling back to the embedded defaults."""
    env = os.environ if env is None else env
    overrides: dict[str, object] = {}
    if env.get("RECFLOW_DATA_ROOT"):
        overrides["data_root"] = Path(env["RECFLOW_DATA_ROOT"]).expanduser().resolve()
    if env.get("RECFLOW_BAD_ROW_BUDGET"):
        overrides["bad_row_budget"] = float(env["RECFLOW_BAD_ROW_BUDGET"])
    if env.get("RECFLOW_SPARK_PROFILE"):
        overrides["spark_profile"] = env["RECFLOW_SPARK_PROFILE"]
    if env.get("RECFLOW_PUBLISH_URI"):
        overrides["publish_uri"] = env["RECFLOW_PUBLISH_URI"]
    if env.get("RECFLOW_FILE_SOURCE_ROOTS"):
        overrides["file_source_roots"] = tuple(Path(p).expanduser().resolve()
                                               for p in env["RECFLOW_FILE_SOURCE_ROOTS"].split(":") if p)
    if env.get("RECFLOW_PROFILE"):
        overrides["profile"] = env["RECFLOW_PROFILE"]
    if env.get("RECFLOW_TRAIN_DEVICE"):
        device = env["RECFLOW_TRAIN_DEVICE"]
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"RECFLOW_TRAIN_DEVICE={device!r}: expected cpu, cuda or auto")
        overrides["train_device"] = device
    if env.get("RECFLOW_REGISTRY_CONN_ID"):
        overrides["registry_conn_id"] = env["RECFLOW_REGISTRY_CONN_ID"]
    if env.get("RECFLOW_TRAIN_NPROC"):
        overrides["train_nproc"] = int(env["RECFLOW_TRAIN_NPROC"])
    return replace(Settings(), **overrides)


def file_url_folder(template: str) -> Path | None:
    """The local folder of a file:// (or bare path) URL template, None for http(s)/s3 templates."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(template)
    if parts.scheme.lower() not in ("", "file"):
        return None
    return Path(unquote(parts.path) if parts.scheme else template).parent
