"""Outbrain's own settings: where a snapshot's files come from, which snapshot runs use, the bad-row budget.

  RECFLOW_OUTBRAIN_SOURCE       URL template of one file, with {file} (the file stem, "clicks_train") and optionally
                                {source_dir} (<data root>/outbrain/source). When the template ends with {file} the
                                source is tried as <file>.csv, then <file>.csv.gz, then Kaggle's <file>.csv.zip; a
                                template naming the extension ("https://mirror/outbrain/{file}.csv.zip") is used as
                                it is. Default: file://{source_dir}/{file}, the demo's synthetic files. A SHA256SUMS
                                file beside the files (sha256sum format), when there is one, is checked.
  RECFLOW_OUTBRAIN_SNAPSHOT     the snapshot name runs use by default (default "kaggle")
  RECFLOW_OUTBRAIN_BAD_ROW_BUDGET  fraction of malformed rows tolerated per file (default: the deployment's
                                RECFLOW_BAD_ROW_BUDGET)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tasks.core.config import DatasetSource, Settings
from tasks.core.settings_registry import Setting, declare, read, value
from tasks.outbrain.layout import source_dir
from tasks.outbrain.schema import DEFAULT_SNAPSHOT, check_snapshot_name, table

DEFAULT_SOURCE = "file://{source_dir}/{file}"
SOURCE_SUFFIXES = (".csv", ".csv.gz", ".csv.zip")  # tried in this order when the template names no extension


declare(
    Setting("RECFLOW_OUTBRAIN_SOURCE", "url", "", "URL template of one Outbrain file, with `{file}` (and optionally "
            "`{source_dir}`); `.csv`, `.csv.gz`, `.csv.zip` tried in turn; a SHA256SUMS beside them is checked",
            default_note="`file://{source_dir}/{file}` (the demo's synthetic files)"),
    Setting("RECFLOW_OUTBRAIN_SNAPSHOT", "str", DEFAULT_SNAPSHOT, "the Outbrain snapshot name runs use by default"),
    Setting("RECFLOW_OUTBRAIN_BAD_ROW_BUDGET", "float", "", "fraction of malformed Outbrain rows tolerated per file",
            default_note="`RECFLOW_BAD_ROW_BUDGET`"),
    Setting("RECFLOW_OUTBRAIN_INGEST_CRON", "cron", "0 5 * * 2", "outbrain_ingest's schedule (UTC)", parse_time=True),
    Setting("RECFLOW_OUTBRAIN_FEATURES_ENGINE", "choice", "spark", "who builds the Wide & Deep features when a run's "
            "`engine` param is empty: `spark` or `nvtabular`"),
)


@dataclass(frozen=True)
class OutbrainSettings(DatasetSource):
    source: str = ""  # empty: DEFAULT_SOURCE, the synthetic files under the data root
    snapshot: str = DEFAULT_SNAPSHOT
    bad_row_budget: float | None = None  # None: the deployment's (Settings.bad_row_budget)

    def __post_init__(self) -> None:
        check_snapshot_name(self.snapshot)
        if self.bad_row_budget is not None and not 0.0 <= self.bad_row_budget <= 1.0:
            raise ValueError(f"Outbrain bad-row budget {self.bad_row_budget} is not a fraction in 0..1")
        if "{file}" not in (self.source or DEFAULT_SOURCE):
            raise ValueError(f"RECFLOW_OUTBRAIN_SOURCE {self.source!r} has no {{file}} placeholder")

    def source_template(self, data_root: Path) -> str:
        """The URL template with {source_dir} filled in ({file} left for source_urls)."""
        template = self.source or DEFAULT_SOURCE
        return template.replace("{source_dir}", source_dir(data_root).as_posix())

    def source_urls(self, data_root: Path, name: str, template: str | None = None) -> tuple[str, ...]:
        """The URLs to try for one file, in order: the three suffixes when the template ends at {file}, else the
        template's one URL. `template` overrides the configured one (a run's source_url param)."""
        table(name)
        template = template or self.source_template(data_root)
        head, sep, query = template.partition("?")  # a presigned URL keeps its query string last
        url = head.replace("{file}", name)
        if head.endswith("{file}"):
            return tuple(f"{url}{suffix}{sep}{query}" for suffix in SOURCE_SUFFIXES)
        return (f"{url}{sep}{query}",)

    def budget(self, settings: Settings) -> float:
        return settings.bad_row_budget if self.bad_row_budget is None else self.bad_row_budget


def load_outbrain_settings(env: dict[str, str] | None = None) -> OutbrainSettings:
    env = os.environ if env is None else env
    budget = read("RECFLOW_OUTBRAIN_BAD_ROW_BUDGET", env)
    return OutbrainSettings(
        source=value("RECFLOW_OUTBRAIN_SOURCE", env),
        snapshot=read("RECFLOW_OUTBRAIN_SNAPSHOT", env) or DEFAULT_SNAPSHOT,
        bad_row_budget=float(budget) if budget else None,
    )
