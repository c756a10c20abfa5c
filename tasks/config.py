"""The one home of recflow configuration: dataclasses with defaults, overridden by environment and DAG params.

Environment variables (all optional; with none set, everything runs on this machine):
  RECFLOW_DATA_ROOT        where every output lives (default: <repo>/data)
  RECFLOW_CRITEO_EPOCH     the logical date of Criteo day 0, ISO date (default 2026-01-01)
  RECFLOW_CRITEO_SOURCE    URL template of raw day files, with {day} (default: file://<data root>/criteo/source/day_{day})
  RECFLOW_BAD_ROW_BUDGET   fraction of malformed rows tolerated per day (default 0.001)
  RECFLOW_SPARK_PROFILE    local | cluster | gpu (default local)
  RECFLOW_PUBLISH_URI      where published models go: a directory or s3://bucket/prefix (default: <data root>/published)
  RECFLOW_FILE_SOURCE_ROOTS  directories a file:// source (a DAG's source_url param) may read from, separated by
                           ':' (default: the data root, and the folder of RECFLOW_CRITEO_SOURCE when it is file://)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Settings:
    data_root: Path = REPO_ROOT / "data"
    criteo_epoch: date = date(2026, 1, 1)
    criteo_source: str = ""  # empty: the synthetic source folder under the data root
    bad_row_budget: float = 0.001
    spark_profile: str = "local"
    publish_uri: str = ""  # empty: <data root>/published
    file_source_roots: tuple[Path, ...] = ()  # empty: see allowed_file_roots
    # Rows per block when streaming a day through validation: bounds memory, independent of day size.
    validation_block_bytes: int = 64 << 20

    @property
    def criteo_source_template(self) -> str:
        if self.criteo_source:
            return self.criteo_source
        return (self.data_root / "criteo" / "source").as_uri() + "/day_{day}"

    @property
    def allowed_file_roots(self) -> tuple[Path, ...]:
        """Where file:// sources may point: a trigger form must not read any file the worker can see."""
        if self.file_source_roots:
            return self.file_source_roots
        roots = [self.data_root]
        template = self.criteo_source_template
        if template.startswith("file://"):
            from urllib.parse import unquote, urlsplit

            roots.append(Path(unquote(urlsplit(template).path)).parent)
        return tuple(root.resolve() for root in roots)

    @property
    def publish_store(self) -> str:
        return self.publish_uri or str(self.data_root / "published")


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Settings from the environment (or the mapping given), falling back to the embedded defaults."""
    env = os.environ if env is None else env
    settings = Settings()
    overrides: dict[str, object] = {}
    if env.get("RECFLOW_DATA_ROOT"):
        overrides["data_root"] = Path(env["RECFLOW_DATA_ROOT"]).expanduser().resolve()
    if env.get("RECFLOW_CRITEO_EPOCH"):
        overrides["criteo_epoch"] = date.fromisoformat(env["RECFLOW_CRITEO_EPOCH"])
    if env.get("RECFLOW_CRITEO_SOURCE"):
        overrides["criteo_source"] = env["RECFLOW_CRITEO_SOURCE"]
    if env.get("RECFLOW_BAD_ROW_BUDGET"):
        overrides["bad_row_budget"] = float(env["RECFLOW_BAD_ROW_BUDGET"])
    if env.get("RECFLOW_SPARK_PROFILE"):
        overrides["spark_profile"] = env["RECFLOW_SPARK_PROFILE"]
    if env.get("RECFLOW_PUBLISH_URI"):
        overrides["publish_uri"] = env["RECFLOW_PUBLISH_URI"]
    if env.get("RECFLOW_FILE_SOURCE_ROOTS"):
        overrides["file_source_roots"] = tuple(Path(p).expanduser().resolve()
                                               for p in env["RECFLOW_FILE_SOURCE_ROOTS"].split(":") if p)
    return replace(settings, **overrides)


def criteo_day_index(logical_date: date, epoch: date) -> int:
    """Criteo day number for a logical date: day 0 is the epoch date."""
    index = (logical_date - epoch).days
    if index < 0:
        raise ValueError(f"logical date {logical_date} is before the Criteo epoch {epoch}: no day {index}")
    return index
