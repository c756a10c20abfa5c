"""MovieLens's own settings: where snapshot archives come from, which snapshot runs use, the bad-row budget.

  RECFLOW_MOVIELENS_SOURCE      URL template of the archives, with {name} (the snapshot, "ml-20m") and optionally
                                {source_dir} (<data root>/movielens/source). Default: file://{source_dir}/{name}.zip,
                                the demo's synthetic archives. GroupLens itself:
                                https://files.grouplens.org/datasets/movielens/{name}.zip
                                The published checksum is fetched from the archive's URL + ".md5".
  RECFLOW_MOVIELENS_DATASET     the snapshot runs use by default: ml-20m (NVIDIA's NCF recipe) or ml-1m
  RECFLOW_MOVIELENS_BAD_ROW_BUDGET  fraction of malformed rating rows tolerated (default: the deployment's
                                RECFLOW_BAD_ROW_BUDGET)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tasks.core.config import DatasetSource, Settings
from tasks.core.settings_registry import Setting, declare, read, value
from tasks.movielens.layout import source_dir
from tasks.movielens.schema import DEFAULT_DATASET, ratings_format

GROUPLENS_SOURCE = "https://files.grouplens.org/datasets/movielens/{name}.zip"
DEFAULT_SOURCE = "file://{source_dir}/{name}.zip"


declare(
    Setting("RECFLOW_MOVIELENS_SOURCE", "url", "", "URL template of the snapshot archives, with `{name}` (and "
            "optionally `{source_dir}`); the checksum is fetched from the archive's URL + `.md5`",
            default_note="`file://{source_dir}/{name}.zip` (the demo's synthetic archives)"),
    Setting("RECFLOW_MOVIELENS_DATASET", "choice", DEFAULT_DATASET, "the MovieLens snapshot runs use by default: "
            "`ml-20m` (NVIDIA's NCF recipe) or `ml-1m`"),
    Setting("RECFLOW_MOVIELENS_BAD_ROW_BUDGET", "float", "", "fraction of malformed rating rows tolerated",
            default_note="`RECFLOW_BAD_ROW_BUDGET`"),
    Setting("RECFLOW_MOVIELENS_INGEST_CRON", "cron", "0 5 * * 1", "movielens_ingest's schedule (UTC)",
            parse_time=True),
)


@dataclass(frozen=True)
class MovieLensSettings(DatasetSource):
    source: str = ""  # empty: DEFAULT_SOURCE, the synthetic archives under the data root
    dataset: str = DEFAULT_DATASET
    bad_row_budget: float | None = None  # None: the deployment's (Settings.bad_row_budget)

    def __post_init__(self) -> None:
        ratings_format(self.dataset)  # an unknown snapshot fails here, with one line
        if self.bad_row_budget is not None and not 0.0 <= self.bad_row_budget <= 1.0:
            raise ValueError(f"MovieLens bad-row budget {self.bad_row_budget} is not a fraction in 0..1")

    def source_template(self, data_root: Path) -> str:
        """The archive URL template with {source_dir} filled in ({name} left for source_url)."""
        template = self.source or DEFAULT_SOURCE
        return template.replace("{source_dir}", source_dir(data_root).as_posix())

    def source_url(self, data_root: Path, name: str) -> str:
        ratings_format(name)
        return self.source_template(data_root).replace("{name}", name)

    def budget(self, settings: Settings) -> float:
        return settings.bad_row_budget if self.bad_row_budget is None else self.bad_row_budget


def load_movielens_settings(env: dict[str, str] | None = None) -> MovieLensSettings:
    env = os.environ if env is None else env
    budget = read("RECFLOW_MOVIELENS_BAD_ROW_BUDGET", env)
    return MovieLensSettings(
        source=value("RECFLOW_MOVIELENS_SOURCE", env),
        dataset=read("RECFLOW_MOVIELENS_DATASET", env) or DEFAULT_DATASET,
        bad_row_budget=float(budget) if budget else None,
    )
