"""The one home of recflow's deployment settings: a dataclass with defaults, overridden by the environment.

These settings name no dataset; each dataset package keeps its own (its settings.py: partition epoch, source) and
each pipeline its training profiles. Every environment variable (all optional; with none set, everything runs here) is
declared once, with its type, default and doc, in tasks/core/settings_registry.py and read through that declaration;
`python -m tasks settings` lists them with their current values, and the README's table is generated from them.

An input outside an allow-list raises a NotAllowed error whose one line names the setting to change; it is bad input,
so the DAGs fail the task without retry.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from tasks.core.settings_registry import read

REPO_ROOT = Path(__file__).resolve().parents[2]
_LIST_SEPARATORS = re.compile(r"[,\s]+")


class NotAllowed(Exception):
    """An input (a source URL, a publish store, a connection id) lies outside the deployment's allow-lists. The
    message is one line naming the setting that would allow it. Bad input does not get better on retry."""


@dataclass(frozen=True)
class Settings:
    data_root: Path = REPO_ROOT / "data"
    bad_row_budget: float = 0.001
    spark_profile: str = "local"
    publish_uri: str = ""  # empty: <data root>/published
    file_source_roots: tuple[Path, ...] = ()  # empty: the data root (datasets add their source folders)
    # Bytes per block when streaming a file through validation: bounds memory, independent of file size. 16 MiB, not
    # 64: pyarrow parses a block that stays in the CPU's caches ~1.6x faster (1.58 -> 1.00 s of CPU per 1M click log
    # rows), the pages are reused instead of faulted in afresh, and checked_blocks' helper thread overlaps more of a
    # file (docs/PERFORMANCE-endtoend.md, issue #27 round 4).
    validation_block_bytes: int = 16 << 20
    # What a run without an explicit profile trains with (scheduled / asset-triggered runs carry no conf).
    profile: str = "full"
    train_device: str = "auto"
    train_nproc: int = 1
    # Multi-node training (tasks.core.launch.NodeLayout); one node by default.
    train_nnodes: int = 1
    train_node_rank: int = 0
    train_rdzv_endpoint: str = ""
    train_node_hosts: tuple[str, ...] = ()
    train_tf_port: int = 0
    registry_conn_id: str = ""  # empty: the SQLite registry under the data root
    # What a trigger form may name (see the module docstring): empty = derived from the configured source / store.
    source_allowed_prefixes: tuple[str, ...] = ()
    publish_allowed: tuple[str, ...] = ()
    allowed_conn_ids: tuple[str, ...] = ("aws_default",)
    partition_lock_timeout_s: float = 3600.0
    # Finished training runs per pipeline whose rebuildable outputs (datasets) are kept (tasks.release.runs.prune);
    # 0 keeps every run's.
    keep_run_datasets: int = 2
    # The loosest release gate a trigger form may set; None: the deployment profile's value (tasks.core.profiles).
    release_min_value: float | None = None
    release_max_regression: float | None = None
    # Input limits (docs/input_limits.md): what one download, decompression, task or window may take.
    download_max_bytes: int = 64 << 30
    expanded_max_bytes: int = 64 << 30
    download_deadline_s: float = 6 * 3600.0
    task_timeout_s: float = 6 * 3600.0
    download_task_timeout_s: float = 12 * 3600.0
    spark_task_timeout_s: float = 24 * 3600.0
    train_task_timeout_s: float = 72 * 3600.0
    max_window_days: int = 366
    max_day_index: int = 10_000
    max_line_bytes: int = 64 << 10
    train_memory_bytes: int = 0  # 0: the worker's MemAvailable

    def allowed_file_roots(self, *source_folders: Path) -> tuple[Path, ...]:
        """Where file:// sources may point: a trigger form must not read any file the worker can see. Explicit
        RECFLOW_FILE_SOURCE_ROOTS win; otherwise the data root plus the dataset's configured source folders."""
        if self.file_source_roots:
            return self.file_source_roots
        return tuple(root.resolve() for root in (self.data_root, *source_folders))

    def allowed_source_prefixes(self, *source_templates: str) -> tuple[str, ...]:
        """URL prefixes an http(s)/s3 source may start with. Explicit RECFLOW_SOURCE_ALLOWED_PREFIXES win;
        otherwise the folder of each configured http(s)/s3 source template (file:// templates add none)."""
        if self.source_allowed_prefixes:
            return self.source_allowed_prefixes
        return tuple(dict.fromkeys(p for t in source_templates if (p := url_template_prefix(t))))

    @property
    def allowed_publish_stores(self) -> tuple[str, ...]:
        """Where a publish URI may point: explicit RECFLOW_PUBLISH_ALLOWED, else the configured store only."""
        return self.publish_allowed or (self.publish_store,)

    @property
    def publish_store(self) -> str:
        return self.publish_uri or str(self.data_root / "published")


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Settings from the environment (or the mapping given), falling back to the embedded defaults."""
    env = os.environ if env is None else env
    overrides: dict[str, object] = {}
    if read("RECFLOW_DATA_ROOT", env):
        overrides["data_root"] = Path(read("RECFLOW_DATA_ROOT", env)).expanduser().resolve()
    if read("RECFLOW_BAD_ROW_BUDGET", env):
        overrides["bad_row_budget"] = float(read("RECFLOW_BAD_ROW_BUDGET", env))
    if read("RECFLOW_SPARK_PROFILE", env):
        overrides["spark_profile"] = read("RECFLOW_SPARK_PROFILE", env)
    if read("RECFLOW_PUBLISH_URI", env):
        overrides["publish_uri"] = read("RECFLOW_PUBLISH_URI", env)
    if read("RECFLOW_FILE_SOURCE_ROOTS", env):
        overrides["file_source_roots"] = tuple(Path(p).expanduser().resolve()
                                               for p in read("RECFLOW_FILE_SOURCE_ROOTS", env).split(":") if p)
    if read("RECFLOW_PROFILE", env):
        overrides["profile"] = read("RECFLOW_PROFILE", env)
    if read("RECFLOW_TRAIN_DEVICE", env):
        device = read("RECFLOW_TRAIN_DEVICE", env)
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"RECFLOW_TRAIN_DEVICE={device!r}: expected cpu, cuda or auto")
        overrides["train_device"] = device
    if read("RECFLOW_REGISTRY_CONN_ID", env):
        overrides["registry_conn_id"] = read("RECFLOW_REGISTRY_CONN_ID", env)
    if read("RECFLOW_TRAIN_NPROC", env):
        overrides["train_nproc"] = int(read("RECFLOW_TRAIN_NPROC", env))
    overrides.update(_multi_node_overrides(env))
    if read("RECFLOW_SOURCE_ALLOWED_PREFIXES", env):
        prefixes = _list(read("RECFLOW_SOURCE_ALLOWED_PREFIXES", env))
        for prefix in prefixes:
            parts = urlsplit(prefix)
            if parts.scheme.lower() not in ("http", "https", "s3") or not parts.netloc:
                raise ValueError(f"RECFLOW_SOURCE_ALLOWED_PREFIXES: {prefix!r} is not an http(s):// or s3:// URL "
                                 "prefix with a host or bucket (file:// sources use RECFLOW_FILE_SOURCE_ROOTS)")
        overrides["source_allowed_prefixes"] = prefixes
    if read("RECFLOW_PUBLISH_ALLOWED", env):
        overrides["publish_allowed"] = _list(read("RECFLOW_PUBLISH_ALLOWED", env))
    if read("RECFLOW_ALLOWED_CONN_IDS", env):
        overrides["allowed_conn_ids"] = _list(read("RECFLOW_ALLOWED_CONN_IDS", env))
    if read("RECFLOW_PARTITION_LOCK_TIMEOUT_S", env):
        overrides["partition_lock_timeout_s"] = float(read("RECFLOW_PARTITION_LOCK_TIMEOUT_S", env))
    if read("RECFLOW_KEEP_RUN_DATASETS", env):
        kept = int(read("RECFLOW_KEEP_RUN_DATASETS", env))
        if kept < 0:
            raise ValueError(f"RECFLOW_KEEP_RUN_DATASETS={kept}: expected 0 (keep all) or more")
        overrides["keep_run_datasets"] = kept
    for name, key in (("RECFLOW_RELEASE_MIN_VALUE", "release_min_value"),
                      ("RECFLOW_RELEASE_MAX_REGRESSION", "release_max_regression")):
        if read(name, env):
            overrides[key] = float(read(name, env))
    overrides.update(_limit_overrides(env))
    return replace(Settings(), **overrides)


# The input-limit settings (Settings' input limits), one environment variable per field.
_LIMITS: tuple[tuple[str, str, type], ...] = (
    ("RECFLOW_DOWNLOAD_MAX_BYTES", "download_max_bytes", int),
    ("RECFLOW_EXPANDED_MAX_BYTES", "expanded_max_bytes", int),
    ("RECFLOW_DOWNLOAD_DEADLINE_S", "download_deadline_s", float),
    ("RECFLOW_TASK_TIMEOUT_S", "task_timeout_s", float),
    ("RECFLOW_DOWNLOAD_TASK_TIMEOUT_S", "download_task_timeout_s", float),
    ("RECFLOW_SPARK_TASK_TIMEOUT_S", "spark_task_timeout_s", float),
    ("RECFLOW_TRAIN_TASK_TIMEOUT_S", "train_task_timeout_s", float),
    ("RECFLOW_MAX_WINDOW_DAYS", "max_window_days", int),
    ("RECFLOW_MAX_DAY_INDEX", "max_day_index", int),
    ("RECFLOW_MAX_LINE_BYTES", "max_line_bytes", int),
    ("RECFLOW_TRAIN_MEMORY_BYTES", "train_memory_bytes", int),
)


def _limit_overrides(env: Mapping[str, str]) -> dict[str, object]:
    """The input-limit settings set in the environment, each a positive number (one line naming it otherwise)."""
    overrides: dict[str, object] = {}
    for name, key, kind in _LIMITS:
        if read(name, env):
            try:
                value = kind(read(name, env))
            except ValueError:
                expected = "an integer" if kind is int else "a number"
                raise ValueError(f"{name}={read(name, env)!r}: expected {expected}") from None
            if value < 0 or (value == 0 and key != "train_memory_bytes"):
                raise ValueError(f"{name}={read(name, env)!r}: expected a positive value")
            overrides[key] = value
    return overrides


def _multi_node_overrides(env: Mapping[str, str]) -> dict[str, object]:
    """The RECFLOW_TRAIN_NNODES / _NODE_RANK / _RDZV_ENDPOINT / _NODE_HOSTS / _TF_PORT settings, checked together."""
    overrides: dict[str, object] = {}
    for name, key in (("RECFLOW_TRAIN_NNODES", "train_nnodes"), ("RECFLOW_TRAIN_NODE_RANK", "train_node_rank"),
                      ("RECFLOW_TRAIN_TF_PORT", "train_tf_port")):
        if read(name, env):
            try:
                overrides[key] = int(read(name, env))
            except ValueError:
                raise ValueError(f"{name}={read(name, env)!r}: expected an integer") from None
    nnodes, rank = overrides.get("train_nnodes", 1), overrides.get("train_node_rank", 0)
    if nnodes < 1 or not 0 <= rank < nnodes:
        raise ValueError(f"RECFLOW_TRAIN_NODE_RANK={rank} with RECFLOW_TRAIN_NNODES={nnodes}: "
                         f"expected 0 .. {nnodes - 1}")
    if read("RECFLOW_TRAIN_RDZV_ENDPOINT", env):
        endpoint = read("RECFLOW_TRAIN_RDZV_ENDPOINT", env).strip()
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"RECFLOW_TRAIN_RDZV_ENDPOINT={endpoint!r}: expected host:port")
        overrides["train_rdzv_endpoint"] = endpoint
    if read("RECFLOW_TRAIN_NODE_HOSTS", env):
        hosts = _list(read("RECFLOW_TRAIN_NODE_HOSTS", env))
        if len(hosts) != nnodes:
            raise ValueError(f"RECFLOW_TRAIN_NODE_HOSTS names {len(hosts)} host(s) for RECFLOW_TRAIN_NNODES={nnodes}")
        overrides["train_node_hosts"] = hosts
    return overrides


def _list(value: str) -> tuple[str, ...]:
    return tuple(item for item in _LIST_SEPARATORS.split(value) if item)


def url_template_prefix(template: str) -> str | None:
    """The folder of an http(s)/s3 URL template ('https://host/raw/day_{day}.gz' -> 'https://host/raw/'),
    up to the last '/' before the first placeholder; None for file:// templates and plain paths."""
    parts = urlsplit(template)
    if parts.scheme.lower() not in ("http", "https", "s3") or not parts.netloc:
        return None
    root = f"{parts.scheme}://{parts.netloc}/"
    head = template.split("{", 1)[0].split("?", 1)[0]
    folder = head[: head.rfind("/") + 1]
    return folder if len(folder) > len(root) else root


def code_version() -> str:
    """The commit of the running code, for lineage: RECFLOW_CODE_VERSION (baked into the image at build time),
    else `git rev-parse HEAD` of the checkout, else 'unknown'."""
    baked = (read("RECFLOW_CODE_VERSION") or "").strip()
    if baked:
        return baked
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def file_url_folder(template: str) -> Path | None:
    """The local folder of a file:// (or bare path) URL template, None for http(s)/s3 templates."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(template)
    if parts.scheme.lower() not in ("", "file"):
        return None
    return Path(unquote(parts.path) if parts.scheme else template).parent


class DatasetSource:
    """What a dataset's settings class gets from naming where its raw files come from (`source_template`): the
    allow-lists a download is checked against. Mixed into each dataset package's settings class."""

    def source_template(self, data_root: Path) -> str:
        raise NotImplementedError

    def allowed_file_roots(self, settings: Settings) -> tuple[Path, ...]:
        """The deployment's file roots plus the configured source folder (when it is a local one)."""
        folder = file_url_folder(self.source_template(settings.data_root))
        return settings.allowed_file_roots(*([folder] if folder else []))

    def allowed_source_prefixes(self, settings: Settings) -> tuple[str, ...]:
        """URL prefixes an http(s)/s3 source may start with: RECFLOW_SOURCE_ALLOWED_PREFIXES, else the folder of
        the configured http(s)/s3 source template (none when the source is a file:// one)."""
        return settings.allowed_source_prefixes(self.source_template(settings.data_root))

    def allow_lists(self, settings: Settings) -> dict[str, tuple]:
        """The keyword arguments of tasks.core.download.check_source_allowed / download for this source."""
        return {"allowed_file_roots": self.allowed_file_roots(settings),
                "allowed_prefixes": self.allowed_source_prefixes(settings)}


def choose_engine(engine: str | None, env_var: str, engines: tuple[str, ...], default: str = "spark") -> str:
    """A pipeline's preprocessing engine: the one given, else the deployment's env_var, else `default`; a bad one is
    a ValueError naming where it came from."""
    return engine_choice(engine, env_var, engines, default)[0]


def engine_choice(engine: str | None, env_var: str, engines: tuple[str, ...], default: str) -> tuple[str, str]:
    """choose_engine's engine and where it came from: "asked for", the env_var's name, or "default"."""
    from_env = read(env_var)
    chosen, where = (engine, "asked for") if engine else (from_env, env_var) if from_env else (default, "default")
    if chosen not in engines:
        raise ValueError(f"{'engine' if engine else env_var} {chosen!r}: expected one of {', '.join(engines)}")
    return chosen, where
