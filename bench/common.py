"""What every benchmark module shares: the two modes, summary statistics, figures, paths and machine facts.

A figure is the median of repeated samples with its spread (min-max) and the number of samples. A ratio is taken
from samples of the same run: paired sample by sample when the two sides were measured interleaved (loader,
training), otherwise the ratio of the medians with the widest range the two spreads allow (worst / best pairing).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import resource
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "bench"
CACHE_DIR = BENCH_DIR / ".cache"
RESULTS_DIR = BENCH_DIR / "results"
DOCS_DIR = REPO / "docs"
PERF_DIR = DOCS_DIR / "perf"
SEED = 1234

log = logging.getLogger("bench")


@dataclass(frozen=True)
class TrainShape:
    """The DLRM runs of the training figure: recflow's trainer and the TorchRec peer get the same numbers."""

    batch_size: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    lr: float            # base SGD lr of DlrmConfig's schedule (NVIDIA's 24 is for batch 65536; it diverges at 4096)
    warmup_steps: int    # not timed: the first log interval (allocations, first sparse updates)
    measured_steps: int  # timed, in intervals of log_every_steps
    log_every_steps: int
    repeats: int         # interleaved rounds (each: both sides at 1 and 2 processes, and the ceilings)
    # TorchRec variants (bench.torchrec_dlrm) measured against the trainer per process count; the fastest is the peer
    peer_variants: dict[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Mode:
    name: str
    day_rows: int                 # rows per synthetic Criteo day
    scaling_days: tuple[int, ...]  # ingest / preprocessing window sizes
    repeats: int                  # samples of every cheap measurement (floors, loader, training)
    spark_repeats: int            # ingest passes and preprocessing runs per window (each is minutes of Spark)
    loader_rows: int              # rows of the split-binary dataset read by the loader and training figures
    train: TrainShape

    @property
    def pass_days(self) -> list[int]:
        """Days one ingest pass ingests: the largest window of train days plus the test day after it."""
        return list(range(max(self.scaling_days) + 1))


# NVIDIA's DLRM sizes in both modes (bottom 512-256-128, top 1024-1024-512-256-1, embedding dim 128). quick must
# finish in < 10 min on 2 cores: its cost is spark-submits (~20-30 s of fixed start-up each: 2 x 2 preprocessing
# jobs, 2 in the end-to-end run, 6 on the cluster figure), the end-to-end run's 3M rows, and the training launches
# (~20-35 s each at these sizes: 2 repeats x (2 trainer + 2 TorchRec runs + 1 ceiling process), 20 timed steps). quick's TorchRec variant per process count is the fastest of a survey of all of them
# (5 + 40 steps, one run each, samples/s: 1 x 2 fused 7,185, dmp 6,782, plain 6,633; 2 x 1 dmp 7,041, plain 6,135);
# --full measures every variant every time. The 4- and 8-day windows are --full's.
NVIDIA_BOTTOM_MLP = (512, 256, 128)
NVIDIA_TOP_MLP = (1024, 1024, 512, 256, 1)
QUICK = Mode("quick", 50_000, (1, 2), repeats=3, spark_repeats=1, loader_rows=1_000_000,
             train=TrainShape(4096, NVIDIA_BOTTOM_MLP, NVIDIA_TOP_MLP, lr=1.0, warmup_steps=5, measured_steps=20,
                              log_every_steps=5, repeats=2, peer_variants={1: ("fused",), 2: ("dmp",)}))
FULL = Mode("full", 500_000, (1, 2, 4, 8), repeats=3, spark_repeats=3, loader_rows=4_000_000,
            train=TrainShape(4096, NVIDIA_BOTTOM_MLP, NVIDIA_TOP_MLP, lr=1.0, warmup_steps=5, measured_steps=40,
                             log_every_steps=5, repeats=3,
                             peer_variants={1: ("plain", "fused", "dmp"), 2: ("plain", "dmp")}))
MODES = {"quick": QUICK, "full": FULL}


@dataclass(frozen=True)
class Stat:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        if not samples:
            raise ValueError("no samples")
        values = [float(s) for s in samples]
        return cls(statistics.median(values), min(values), max(values), len(values))

    def scaled(self, factor: float) -> Stat:
        return Stat(self.median * factor, self.min * factor, self.max * factor, self.n)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Stat:
    """Ratio sample by sample (both sides measured interleaved, pair i side by side)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired ratio of {len(numerators)} and {len(denominators)} samples")
    return Stat.of([a / b for a, b in zip(numerators, denominators)])


def ratio_of(numerator: Stat, denominator: Stat) -> Stat:
    """Ratio of medians; the range pairs the extremes (worst and best case of two independent spreads)."""
    return Stat(numerator.median / denominator.median, numerator.min / denominator.max,
                numerator.max / denominator.min, min(numerator.n, denominator.n))


@dataclass
class Figure:
    """One row of the table: a measured value against its floor (or ceiling), and their ratio."""

    section: str
    name: str
    unit: str
    value: Stat
    reference_name: str = ""
    reference: Stat | None = None
    ratio: Stat | None = None
    ratio_method: str = ""  # "paired" | "medians"
    target: str = ""        # e.g. ">= 0.8"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _meminfo_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# What the harness itself writes: a previous run's uncommitted page does not make the measured code dirty.
OUTPUTS = (":(exclude)docs/PERFORMANCE*.md", ":(exclude)docs/perf", ":(exclude)bench/results")


def machine_info() -> dict[str, Any]:
    """Cores, RAM, CPU model, library versions and the code's commit (read-only git)."""
    versions = {"python": platform.python_version()}
    # Versions from package metadata: importing airflow just to ask would reconfigure this process's logging.
    for name in ("numpy", "pyarrow", "torch", "pyspark", "apache-airflow", "great-expectations"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return {"cores": os.cpu_count(), "ram_bytes": _meminfo_bytes(), "cpu": _cpu_model(),
            "platform": platform.platform(), "versions": versions,
            "commit": _git("rev-parse", "--short", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--", ".", *OUTPUTS))}


def cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for descendants so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_cpu_seconds() -> dict[str, float]:
    """CPU time the whole machine has spent so far, all cores: busy (user, nice, system, irq, softirq) and steal
    (time the hypervisor gave this VM's cores to someone else)."""
    import psutil

    times = psutil.cpu_times()
    busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))
    return {"busy": busy, "steal": getattr(times, "steal", 0.0)}


class OtherWork:
    """How much CPU the rest of the machine used while a block ran: the machine's busy CPU time minus this process's
    and its waited-for descendants' (`cpu_seconds`). The load average cannot tell: a run that keeps both cores busy
    shows a load of ~2 on its own. (A descendant nobody waits for, e.g. a daemon left behind, counts as other work.)"""

    def __enter__(self) -> OtherWork:
        self._machine, self._own, self._clock = machine_cpu_seconds(), cpu_seconds(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        machine, own = machine_cpu_seconds(), cpu_seconds()
        self.wall_s = time.monotonic() - self._clock
        self.own_cpu_s = own - self._own
        self.other_cpu_s = max(0.0, machine["busy"] - self._machine["busy"] - self.own_cpu_s)
        self.steal_cpu_s = machine["steal"] - self._machine["steal"]

    def summary(self) -> dict[str, float]:
        capacity = max(self.wall_s * (os.cpu_count() or 1), 1e-9)
        return {"own_cpu_s": round(self.own_cpu_s, 1), "other_cpu_s": round(self.other_cpu_s, 1),
                "steal_cpu_s": round(self.steal_cpu_s, 1),
                "other_share": round(self.other_cpu_s / capacity, 3),
                "steal_share": round(self.steal_cpu_s / capacity, 3)}


class Stage:
    """Logs a stage's start and end with its duration, CPU time and the load average (the machine may be shared)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = self.cpu_seconds = 0.0

    def __enter__(self) -> Stage:
        self._start, self._cpu = time.monotonic(), cpu_seconds()
        log.info("%s: start (load %s)", self.name, load_average())
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self._start
        self.cpu_seconds = cpu_seconds() - self._cpu
        log.info("%s: %s in %.1f s, %.1f CPU s (load %s)", self.name, "failed" if exc[0] else "done", self.seconds,
                 self.cpu_seconds, load_average())


class LoadMonitor:
    """Samples the 1-minute load average every few seconds for the whole run (the page says how busy it was)."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        samples = self.samples or [os.getloadavg()[0]]
        return {"max_1min": round(max(samples), 2), "mean_1min": round(statistics.fmean(samples), 2),
                "min_1min": round(min(samples), 2)}
