"""spark-submit command lines and conf profiles, run with their output streamed into the task log.

Profiles (RECFLOW_SPARK_PROFILE or a DAG param):
  local    embedded default: whatever master the `spark_default` connection names (local[*] when unset),
           small shuffle partition counts sized for one machine.
  cluster  NVIDIA's CPU settings (spark.sql.files.maxPartitionBytes 1 GiB, 600 shuffle partitions, locality wait 0)
           for a standalone / YARN / Kubernetes master.
  gpu      the cluster profile plus the RAPIDS Accelerator (com.nvidia.spark.SQLPlugin), its settings scaled by one
           GPU executor's resources (GpuExecutor: cores, host memory, GPU memory; RECFLOW_GPU_EXECUTOR_*): one
           executor per GPU, task GPU amount 1/cores, concurrent GPU tasks from the GPU's memory, pinned pool and
           memory overhead from the executor's memory, the RAPIDS shuffle manager (docs/gpu_spark.md has the rules
           and their sources). On a local[...] master no GPU resources are requested (Spark's local mode does not
           schedule them; the one GPU the driver sees is used). The RAPIDS jar is not on PyPI: its path or URL comes
           from RECFLOW_RAPIDS_JAR (the GPU image in docker-compose downloads it). The Accelerator runs only on the
           Spark versions its release was built for (RAPIDS_SUPPORTED_SPARK): the profile refuses any other Spark
           with one line, before a job starts and fails obscurely on its executors.
  gpu-explain  the RAPIDS Accelerator in explain-only mode (spark.rapids.sql.mode=explainOnly): the job runs on the
           CPU with the gpu profile's plan choices and logs what would not run on the GPU (NOT_ON_GPU); no GPU is
           requested, so it runs on any worker that has the jar. run_spark_job collects those lines and logs a
           summary per job (GpuFallbacks).

On a cluster (any master but local[...]), what the driver and the executors need beyond the master's URL:
  code     the tasks/ and spark_jobs/ packages, zipped and shipped with --py-files (code_archive): executors
           import the schema and the jobs' own modules (a mapInArrow function runs there). The driver runs here
           (client mode) and imports the repo from PYTHONPATH.
  python   spark.pyspark.python is this interpreter's path: the workers must have the same environment at the
           same path (one image for Airflow workers and Spark workers, as in docker-compose.yml).
  driver   executors connect back to the driver: RECFLOW_SPARK_DRIVER_HOST sets spark.driver.host (and so the
           address it binds) when this machine's hostname does not resolve to an address they can reach.
  data     executors read the inputs and write parquet under the output's temporary folder themselves, and the
           driver renames that folder into place: the data root must be one shared path on every node.
docs/ARCHITECTURE.md ("Spark on a cluster") has what tests/integration/test_spark_standalone.py shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tasks.core.config import REPO_ROOT, engine_choice
from tasks.core.process import run_streaming
from tasks.core.settings_registry import read, value
from tasks.core.storage import atomic_file

log = logging.getLogger(__name__)

SPARK_JOBS_DIR = REPO_ROOT / "spark_jobs"
LOG4J_CONF = SPARK_JOBS_DIR / "log4j2.properties"
CODE_PACKAGES = ("tasks", "spark_jobs")  # what executors import, shipped to a cluster (code_archive)
CODE_ARCHIVE_PREFIX = "recflow_spark_code-"

_LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
_CLUSTER_CONF = {  # NVIDIA run_spark_cpu.sh, per job
    "spark.task.cpus": "1",
    "spark.sql.files.maxPartitionBytes": "1073741824",
    "spark.sql.shuffle.partitions": "600",
    "spark.driver.maxResultSize": "2G",
    "spark.locality.wait": "0s",
    "spark.network.timeout": "1800s",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
_RAPIDS_CONF = {  # NVIDIA run_spark_gpu_DGX-2.sh on top of the CPU conf; both RAPIDS profiles
    "spark.plugins": "com.nvidia.spark.SQLPlugin",
    "spark.rapids.sql.reader.batchSizeRows": "4000000",
    "spark.rapids.sql.explain": "NOT_ON_GPU",
    "spark.sql.autoBroadcastJoinThreshold": "1GB",
    "spark.rapids.sql.incompatibleOps.enabled": "true",
    # Parquet timestamps without a time zone read as TIMESTAMP, not Spark 4's TIMESTAMP_NTZ, which RAPIDS has no
    # GPU support for (the scan and every join carrying one would stay on the CPU); the same instants under the
    # jobs' UTC session time zone (docs/gpu_spark.md).
    "spark.sql.parquet.inferTimestampNTZ.enabled": "false",
}
PROFILES = ("local", "cluster", "gpu", "gpu-explain")
GPU_PROFILES = ("gpu", "gpu-explain")  # load the RAPIDS Accelerator: plan for the GPU (jobs choose GPU-friendly plans)
# The RAPIDS Accelerator release deploy/Dockerfile installs, and the Spark versions it ships shims for (its download
# page, docs/download.md of NVIDIA/cudf-spark, formerly spark-rapids): Scala 2.12 for 3.3-3.5, 2.13 for 3.5 and 4.x.
RAPIDS_RELEASE = "26.08.1"
RAPIDS_SUPPORTED_SPARK = frozenset(
    [f"3.3.{p}" for p in range(5)] + [f"3.4.{p}" for p in range(5)] + [f"3.5.{p}" for p in range(10)]
    + [f"4.0.{p}" for p in range(5)] + ["4.1.1", "4.1.2", "4.1.3", "4.2.0"])
RAPIDS_JAR_URL = ("https://repo1.maven.org/maven2/com/nvidia/rapids-4-spark_{scala}/{release}/"
                  "rapids-4-spark_{scala}-{release}.jar")
# Spark's GPU discovery script (its examples/src/main/scripts/getGpusResources.sh; pyspark's pip package lacks it):
# deploy/Dockerfile writes it here in the GPU image. RECFLOW_GPU_DISCOVERY_SCRIPT names another path.
GPU_DISCOVERY_SCRIPT = "/opt/rapids/getGpusResources.sh"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())


def _supported_ranges() -> str:
    """RAPIDS_SUPPORTED_SPARK as ranges of patch versions, e.g. "3.3.0-3.3.4, ..., 4.2.0"."""
    by_minor: dict[tuple[int, ...], list[int]] = {}
    for version in sorted(RAPIDS_SUPPORTED_SPARK, key=_version_tuple):
        numbers = _version_tuple(version)
        by_minor.setdefault(numbers[:2], []).append(numbers[2])
    ranges = []
    for (major, minor), patches in by_minor.items():
        low, high = f"{major}.{minor}.{patches[0]}", f"{major}.{minor}.{patches[-1]}"
        ranges.append(low if low == high else f"{low}-{high}")
    return ", ".join(ranges)


def installed_spark_version() -> str:
    """The version of the Spark this environment submits to (pyspark's own, read without starting a JVM)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError:
        return version("pyspark-client")


def check_rapids_spark_version(spark_version: str) -> None:
    """Raise ValueError with one line when the RAPIDS Accelerator release does not support this Spark version."""
    numbers = _version_tuple(spark_version)
    if ".".join(map(str, numbers)) not in RAPIDS_SUPPORTED_SPARK:
        raise ValueError(f"the gpu Spark profiles need a Spark the RAPIDS Accelerator {RAPIDS_RELEASE} supports "
                         f"({_supported_ranges()}); this environment has Spark {spark_version}: pin pyspark to a "
                         "supported version or use the local / cluster profile")


def rapids_jar_url(spark_version: str) -> str:
    """Maven Central's RAPIDS Accelerator jar for this Spark's Scala: pyspark's Spark 3.x is built for Scala 2.12,
    Spark 4 for 2.13 (a jar of the other Scala fails on the executors, not at submit)."""
    scala = "2.13" if _version_tuple(spark_version)[:1] >= (4,) else "2.12"
    return RAPIDS_JAR_URL.format(scala=scala, release=RAPIDS_RELEASE)


def rapids_shuffle_manager(spark_version: str) -> str:
    """The RAPIDS shuffle manager class of this Spark version's shim (one class per version, e.g. spark411)."""
    return f"com.nvidia.spark.rapids.spark{''.join(map(str, _version_tuple(spark_version)))}.RapidsShuffleManager"


def parse_size_mib(text: str, what: str) -> int:
    """A Spark-style memory size ("48g", "7500m", "1t"; a bare number is MiB) in MiB; ValueError naming `what`."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"{what}={text!r}: expected a size such as 48g or 7500m")
    number, unit = int(match.group(1)), match.group(2) or "m"
    return {"k": number // 1024, "m": number, "g": number << 10, "t": number << 20}[unit]


def jvm_memory(setting: str) -> str:
    """A declared setting holding a JVM memory size (`2g`, `512m`, `8192`), checked before Spark starts: a typo
    otherwise surfaces as a JVM start-up failure deep in the task log."""
    text = value(setting).strip()
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgGtT]?", text):
        raise ValueError(f"{setting}={text!r} is not a JVM memory size: write it as a number with an optional k, m, "
                         "g or t suffix, e.g. 2g or 8192m")
    return text


@dataclass(frozen=True)
class GpuExecutor:
    """One GPU executor's resources, from which the gpu profile's RAPIDS settings are derived (one executor per
    GPU: the Accelerator supports one GPU per executor). Defaults: NVIDIA's DGX-2 preprocessing config (80 cores and
    16 V100-32GB: 5 cores per executor; (800 - 32) / 16 = 48 GB per executor of which 32 GB heap).

    The rules (docs/gpu_spark.md cites each): task GPU amount = 1/cores (the RAPIDS tuning guide: the reciprocal of
    the executor's task concurrency); concurrent GPU tasks = GPU memory / 7500 MiB, 1 to 4, at most the cores
    (spark-rapids-tools' AutoTuner); heap = min(90% of the memory, 2 GiB per core), pinned pool = what is left after
    the heap, 10% of it for JVM overhead and a 1 GiB pageable pool, at most 4 GiB (AutoTuner); memory overhead =
    that 10% + pinned pool + pageable pool (the tuning guide: overhead must cover the pinned pool).
    """

    cores: int = 5
    memory_mib: int = 48 << 10       # host memory of the executor: heap + overhead
    gpu_memory_mib: int = 32 << 10

    GPU_MEMORY_PER_TASK_MIB = 7500   # AutoTuner DEF_GPU_MEM_PER_TASK_MB: 2 concurrent tasks on a 15 GB T4
    MAX_CONCURRENT_GPU_TASKS = 4
    HEAP_PER_CORE_MIB = 2 << 10
    HEAP_OVERHEAD_FRACTION = 0.1
    MAX_PINNED_MIB = 4 << 10
    PAGEABLE_POOL_MIB = 1 << 10

    def __post_init__(self) -> None:
        for name in ("cores", "memory_mib", "gpu_memory_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GpuExecutor.{name}={value!r}: must be a positive integer")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GpuExecutor:
        """RECFLOW_GPU_EXECUTOR_CORES, RECFLOW_GPU_EXECUTOR_MEMORY (e.g. 48g) and RECFLOW_GPU_MEMORY (e.g. 80g) over
        the defaults."""
        env = os.environ if env is None else env
        values: dict[str, int] = {}
        if read("RECFLOW_GPU_EXECUTOR_CORES", env):
            text = read("RECFLOW_GPU_EXECUTOR_CORES", env)
            if not text.strip().isdigit():
                raise ValueError(f"RECFLOW_GPU_EXECUTOR_CORES={text!r}: expected a positive integer")
            values["cores"] = int(text)
        if read("RECFLOW_GPU_EXECUTOR_MEMORY", env):
            values["memory_mib"] = parse_size_mib(read("RECFLOW_GPU_EXECUTOR_MEMORY", env),
                                                  "RECFLOW_GPU_EXECUTOR_MEMORY")
        if read("RECFLOW_GPU_MEMORY", env):
            values["gpu_memory_mib"] = parse_size_mib(read("RECFLOW_GPU_MEMORY", env), "RECFLOW_GPU_MEMORY")
        return cls(**values)

    @property
    def task_gpu_amount(self) -> str:
        """1/cores, truncated to 6 decimals: Spark runs floor(1 / amount) tasks per GPU, so rounding up would lose
        one (1/6 -> 0.166667 gives 5)."""
        return "1" if self.cores == 1 else f"{(10**6 // self.cores) / 10**6:.6f}"

    @property
    def concurrent_gpu_tasks(self) -> int:
        by_memory = self.gpu_memory_mib // self.GPU_MEMORY_PER_TASK_MIB
        return max(1, min(self.MAX_CONCURRENT_GPU_TASKS, by_memory, self.cores))

    @property
    def heap_mib(self) -> int:
        return min(int(self.memory_mib * (1 - self.HEAP_OVERHEAD_FRACTION)), self.HEAP_PER_CORE_MIB * self.cores)

    @property
    def pinned_pool_mib(self) -> int:
        """0 (no pool) when the memory leaves no room beside the heap."""
        heap_overhead = int(self.heap_mib * self.HEAP_OVERHEAD_FRACTION)
        left = self.memory_mib - self.heap_mib - heap_overhead - self.PAGEABLE_POOL_MIB
        return max(0, min(self.MAX_PINNED_MIB, left))

    @property
    def memory_overhead_mib(self) -> int:
        return int(self.heap_mib * self.HEAP_OVERHEAD_FRACTION) + self.pinned_pool_mib + self.PAGEABLE_POOL_MIB


def rapids_conf(profile: str, master: str, executor: GpuExecutor, spark_version: str,
                jar: str | None) -> dict[str, str]:
    """The RAPIDS Accelerator's conf for a gpu / gpu-explain job on `master` (see the module docstring)."""
    conf = dict(_RAPIDS_CONF)
    if profile == "gpu-explain":
        # Plans as the GPU would, runs on the CPU: no GPU resources, no pinned memory, Spark's own shuffle.
        conf["spark.rapids.sql.mode"] = "explainOnly"
        return conf
    conf.update({
        "spark.rapids.sql.concurrentGpuTasks": str(executor.concurrent_gpu_tasks),
        "spark.rapids.memory.pinnedPool.size": f"{executor.pinned_pool_mib}m",
        "spark.executor.extraJavaOptions": "-Dai.rapids.cudf.prefer-pinned=true",
    })
    if not master.startswith("local"):
        conf.update({
            "spark.executor.cores": str(executor.cores),
            "spark.task.cpus": "1",
            "spark.executor.memory": f"{executor.heap_mib}m",
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": executor.task_gpu_amount,
            "spark.executor.resource.gpu.discoveryScript":
                read("RECFLOW_GPU_DISCOVERY_SCRIPT") or GPU_DISCOVERY_SCRIPT,
        })
        if not master.startswith("spark://"):  # YARN / Kubernetes containers: the pinned pool lives off-heap
            conf["spark.executor.memoryOverhead"] = f"{executor.memory_overhead_mib}m"
    if jar and "://" not in jar:
        # The shuffle manager is created before --jars are loaded: the jar must be on both class paths. (26.08+
        # sets it itself on Spark 4 when unset; explicit works for every release and Spark.)
        threads = str(max(executor.cores, 1))
        conf.update({
            "spark.shuffle.manager": rapids_shuffle_manager(spark_version),
            "spark.driver.extraClassPath": jar,
            "spark.executor.extraClassPath": jar,
            "spark.rapids.shuffle.multiThreaded.writer.threads": threads,
            "spark.rapids.shuffle.multiThreaded.reader.threads": threads,
        })
    return conf


_NOT_ON_GPU = re.compile(r"^\s*!(?P<kind>[A-Za-z]*) <(?P<name>[^<>\s]+)> (?:(?P<what>.*?) )?"
                         r"cannot run on GPU because (?P<reason>.*)$")
_WHOLE_PLAN = re.compile(r"Can't replace any part of this plan due to: (?P<reason>.*)$")
# The plugin's start-up line (Plugin.scala logPluginMode): proof that it loaded, and in which mode.
_PLUGIN_MODE = re.compile(r"RAPIDS Accelerator is (?P<mode>in explain only mode|enabled|disabled)\b")
_KIND_ORDER = ("Expression", "Input", "Partitioning", "Output", "Command", "Exec", "Plan")


@dataclass
class GpuFallbacks:
    """What the RAPIDS Accelerator said would not run on the GPU, from a job's output (spark.rapids.sql.explain=
    NOT_ON_GPU). The line format is RapidsMeta.print in NVIDIA/spark-rapids (sql-plugin/.../RapidsMeta.scala):
    `<indent><'!'><operation name> <Class> [<expression>] cannot run on GPU because <reasons; ...>`, the operation
    name Exec / Expression / Input / Partitioning / Output / Command, empty when no rule exists for the class.
    Lines marked `@` (could run, but its plan cannot) or `*` are not fallbacks and are not counted."""

    counts: Counter = field(default_factory=Counter)  # (kind, class, reason) -> times seen (once per plan)
    plugin_mode: str | None = None  # "explain only" / "enabled" / "disabled" as the plugin said; None: not seen

    def feed(self, line: str) -> None:
        mode = _PLUGIN_MODE.search(line)
        if mode:
            self.plugin_mode = mode.group("mode").removeprefix("in ").removesuffix(" mode")
            return
        match = _NOT_ON_GPU.match(line)
        if match:
            name = match.group("name")
            kind = match.group("kind") or ("Exec" if name.endswith("Exec") else "Expression")
            reason = re.sub(r"#\d+L?", "", match.group("reason").strip())  # attribute ids differ per plan
            self.counts[(kind, name, reason)] += 1
            return
        match = _WHOLE_PLAN.search(line)
        if match:
            self.counts[("Plan", "whole plan", match.group("reason").strip())] += 1

    def operators(self) -> set[str]:
        return {name for (_, name, _) in self.counts}

    def summary(self, job: str) -> list[str]:
        """One line per distinct fallback, expressions (the causes) before the operators they keep off the GPU."""
        if not self.counts and self.plugin_mode is None:  # silence proves nothing if the plugin never spoke
            return [f"RAPIDS explain of {job}: the RAPIDS Accelerator never logged its start-up line: was the jar "
                    "loaded (RECFLOW_RAPIDS_JAR) and is Spark's log level WARN or lower?"]
        if not self.counts:
            return [f"RAPIDS explain of {job}: no NOT_ON_GPU lines (every operator would run on the GPU)"]
        ordered = sorted(self.counts.items(), key=lambda item: (_KIND_ORDER.index(item[0][0])
                                                                if item[0][0] in _KIND_ORDER else 99, -item[1]))
        lines = [f"RAPIDS explain of {job}: {len(self.counts)} operator(s)/expression(s) would not run on the GPU"]
        lines += [f"  NOT_ON_GPU {kind} <{name}> (x{count}): {reason}" for (kind, name, reason), count in ordered]
        return lines


def spark_master_is_local(master: str | None) -> bool:
    """Whether a Spark master runs everything on this machine: none configured (empty / None: Spark's own default
    is local[*]) or local, local[N], local[*], local[N,F], local-cluster[...]. Any other master (spark://, yarn,
    k8s://, mesos://) is a cluster."""
    return not master or master.strip().lower().startswith("local")


def choose_engine_for_master(what: str, engine: str | None, env_var: str, engines: tuple[str, ...],
                             spark_master: str | None, spark_profile: str = "local", *,
                             one_machine: str = "arrow") -> str:
    """The engine of a step that can run as Spark jobs or on one machine (`one_machine`, e.g. arrow): the one
    asked for, else env_var, else `one_machine` when the Spark master is local (spark_master_is_local) and the
    profile is the local one, else spark (a cluster master, or a cluster / GPU profile, asks for Spark's jobs).
    Logs the choice and its reason as one line; a bad engine is a ValueError naming where it came from."""
    local = spark_master_is_local(spark_master) and spark_profile == "local"
    default = one_machine if local else "spark"
    chosen, where = engine_choice(engine, env_var, engines, default)
    if where == "default":
        where = (f"default on one machine: Spark master {spark_master or 'unset'}, profile {spark_profile}" if local
                 else f"default with Spark master {spark_master or 'unset'} and profile {spark_profile}")
    elif where != "asked for":
        where = f"set by {where}"
    log.info("%s engine: %s (%s)", what, chosen, where)
    return chosen


class SparkJobFailed(RuntimeError):
    """A spark-submit run exited non-zero; the message is the job's last error line."""


@dataclass(frozen=True)
class SparkSubmit:
    """One spark-submit invocation, as an argument list (never a shell string)."""

    job: str                       # path under spark_jobs/, e.g. "<dataset>/day_stats.py"
    args: Sequence[str]
    master: str = "local[*]"
    profile: str = "local"
    conf_overrides: Mapping[str, str] = field(default_factory=dict)
    rapids_jar: str | None = None
    spark_version: str | None = None  # None: the installed pyspark's (what spark-submit runs here)
    driver_host: str | None = None    # None: RECFLOW_SPARK_DRIVER_HOST, else Spark's own choice (hostname's address)
    gpu_executor: GpuExecutor | None = None  # gpu profile: None = GpuExecutor.from_env()

    @property
    def on_cluster(self) -> bool:
        return not self.master.startswith("local")

    def conf(self) -> dict[str, str]:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown Spark profile {self.profile!r}; expected one of {', '.join(PROFILES)}")
        conf = dict(_LOCAL_CONF if self.profile == "local" else _CLUSTER_CONF)
        # The local profile's driver, on any master; and any profile's on a local master, where the driver is the
        # executor too (the RAPIDS profiles' included: not Spark's 1g).
        if self.profile == "local" or not self.on_cluster:
            conf["spark.driver.memory"] = jvm_memory("RECFLOW_SPARK_DRIVER_MEMORY")
        if self.profile in GPU_PROFILES:
            conf.update(rapids_conf(self.profile, self.master, self.gpu_executor or GpuExecutor.from_env(),
                                    self.spark_version or installed_spark_version(), self.rapids_jar_path()))
        conf["spark.pyspark.python"] = sys.executable
        conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONF.as_uri()}")
        driver_host = self.driver_host or read("RECFLOW_SPARK_DRIVER_HOST")
        if self.on_cluster and driver_host:
            conf["spark.driver.host"] = driver_host
        conf.update(self.conf_overrides)
        return conf

    def rapids_jar_path(self) -> str | None:
        return self.rapids_jar or read("RECFLOW_RAPIDS_JAR") or None

    def argv(self) -> list[str]:
        if self.profile in GPU_PROFILES:
            spark_version = self.spark_version or installed_spark_version()
            check_rapids_spark_version(spark_version)
            if not self.rapids_jar_path():
                raise ValueError(f"the {self.profile} Spark profile needs the RAPIDS Accelerator jar: set "
                                 f"RECFLOW_RAPIDS_JAR (Maven Central: {rapids_jar_url(spark_version)})")
        argv = [spark_submit_binary(), "--master", self.master, "--name", f"recflow:{self.job.removesuffix('.py')}"]
        for key, value in sorted(self.conf().items()):
            argv += ["--conf", f"{key}={value}"]
        if self.profile in GPU_PROFILES:
            argv += ["--jars", self.rapids_jar_path()]
        if self.on_cluster:
            argv += ["--py-files", str(code_archive())]
        argv += [str(SPARK_JOBS_DIR / self.job), *self.args]
        return argv


def spark_submit_binary() -> str:
    """spark-submit from the same environment as this interpreter (pyspark's pip package ships it)."""
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if not found:
        raise FileNotFoundError("spark-submit not found: install pyspark in this environment or set PATH")
    return found


def code_archive() -> Path:
    """A zip of the tasks/ and spark_jobs/ packages for --py-files on a cluster (executors import the schema and the
    jobs' modules), under build/. Named by the hash of its content and written once: concurrent submits share it,
    and a running job's archive is never replaced under it (executors fetch it from the driver when they start)."""
    import hashlib
    import zipfile

    sources = [(path.relative_to(REPO_ROOT).as_posix(), path) for package in CODE_PACKAGES
               for path in sorted((REPO_ROOT / package).rglob("*.py"))]
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = REPO_ROOT / "build" / f"{CODE_ARCHIVE_PREFIX}{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        with atomic_file(target, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in sources:
                zf.write(path, name)
        _remove_old_archives(target)
    return target


def _remove_old_archives(current: Path, max_age_s: float = 86400.0) -> None:
    """Archives of earlier code, once no job can still be starting with them (a day old): each edit of the code
    makes a new one."""
    import time

    for path in current.parent.glob(f"{CODE_ARCHIVE_PREFIX}*.zip"):
        with contextlib.suppress(FileNotFoundError):
            if path != current and time.time() - path.stat().st_mtime > max_age_s:
                path.unlink()


def run_spark_job(submit: SparkSubmit, env: Mapping[str, str] | None = None,
                  label: str = "spark") -> GpuFallbacks | None:
    """Run spark-submit, streaming its output into this process's log line by line as it happens.

    Under the gpu profiles the RAPIDS Accelerator's NOT_ON_GPU lines are also collected and summarised in the log
    at the end (before a failure is raised); the collection is returned (None under the CPU profiles).
    """
    argv = submit.argv()
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    child_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The job imports tasks.* (schema, storage): make the repo importable in driver and local executors.
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
    log.info("spark-submit %s (master %s, profile %s)", submit.job, submit.master, submit.profile)
    fallbacks = GpuFallbacks() if submit.profile in GPU_PROFILES else None
    result = run_streaming(argv, env=child_env, label=label, on_line=fallbacks.feed if fallbacks is not None else None)
    if fallbacks is not None:
        for line in fallbacks.summary(submit.job):
            log.info("[%s] %s", label, line)
    if result.returncode != 0:
        raise SparkJobFailed(f"{submit.job} failed (exit {result.returncode}): {result.last_error_line}")
    return fallbacks
