"""spark-submit command lines and conf profiles, run with their output streamed into the task log.

Profiles (RECFLOW_SPARK_PROFILE or a DAG param):
  local    embedded default: whatever master the `spark_default` connection names (local[*] when unset),
           small shuffle partition counts sized for one machine.
  cluster  NVIDIA's CPU settings (spark.sql.files.maxPartitionBytes 1 GiB, 600 shuffle partitions, locality wait 0)
           for a standalone / YARN / Kubernetes master.
  gpu      the cluster profile plus the RAPIDS Accelerator (com.nvidia.spark.SQLPlugin). The RAPIDS jar is not on
           PyPI: its path or URL comes from RECFLOW_RAPIDS_JAR (the GPU image in docker-compose downloads it).
           The Accelerator runs only on the Spark versions it was built for (RAPIDS_SUPPORTED_SPARK): the profile
           refuses any other Spark with one line, before a job starts and fails obscurely on its executors.

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
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tasks.core.config import REPO_ROOT
from tasks.core.process import run_streaming
from tasks.core.storage import atomic_file

log = logging.getLogger(__name__)

SPARK_JOBS_DIR = REPO_ROOT / "spark_jobs"
LOG4J_CONF = SPARK_JOBS_DIR / "log4j2.properties"
CODE_PACKAGES = ("tasks", "spark_jobs")  # what executors import, shipped to a cluster (code_archive)
CODE_ARCHIVE_PREFIX = "recflow_spark_code-"

_LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "2g",
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
_RAPIDS_CONF = {  # NVIDIA run_spark_gpu_DGX-2.sh on top of the CPU conf
    "spark.plugins": "com.nvidia.spark.SQLPlugin",
    "spark.task.resource.gpu.amount": "0.01",
    "spark.executor.resource.gpu.amount": "1",
    "spark.rapids.sql.concurrentGpuTasks": "2",
    "spark.rapids.sql.reader.batchSizeRows": "4000000",
    "spark.rapids.memory.pinnedPool.size": "16g",
    "spark.rapids.sql.explain": "NOT_ON_GPU",
    "spark.sql.autoBroadcastJoinThreshold": "1GB",
    "spark.rapids.sql.incompatibleOps.enabled": "true",
    "spark.executor.extraJavaOptions": "-Dai.rapids.cudf.prefer-pinned=true",
}
PROFILES = ("local", "cluster", "gpu")
# Spark versions the RAPIDS Accelerator 26.06 (its newest release) ships shims for: 3.3.x-3.5.x and 4.0.x-4.1.1
# (docs/ARCHITECTURE.md, "Spark versions"). The project pins pyspark 4.1.1, the newest Spark it supports.
RAPIDS_SUPPORTED_SPARK = ((3, 3, 0), (4, 1, 1))


def installed_spark_version() -> str:
    """The version of the Spark this environment submits to (pyspark's own, read without starting a JVM)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError:
        return version("pyspark-client")


def check_rapids_spark_version(spark_version: str) -> None:
    """Raise ValueError with one line when the RAPIDS Accelerator does not support this Spark version."""
    numbers = tuple(int(part) for part in spark_version.split("+")[0].split(".")[:3] if part.isdigit())
    low, high = RAPIDS_SUPPORTED_SPARK
    if len(numbers) < 3 or not low <= numbers <= high:
        raise ValueError(f"the gpu Spark profile needs a Spark the RAPIDS Accelerator supports "
                         f"({'.'.join(map(str, low))} to {'.'.join(map(str, high))}); this environment has Spark "
                         f"{spark_version}: pin pyspark to a supported version or use the local / cluster profile")


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

    @property
    def on_cluster(self) -> bool:
        return not self.master.startswith("local")

    def conf(self) -> dict[str, str]:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown Spark profile {self.profile!r}; expected one of {', '.join(PROFILES)}")
        conf = dict(_LOCAL_CONF if self.profile == "local" else _CLUSTER_CONF)
        if self.profile == "gpu":
            conf.update(_RAPIDS_CONF)
        conf["spark.pyspark.python"] = sys.executable
        conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONF.as_uri()}")
        driver_host = self.driver_host or os.environ.get("RECFLOW_SPARK_DRIVER_HOST")
        if self.on_cluster and driver_host:
            conf["spark.driver.host"] = driver_host
        conf.update(self.conf_overrides)
        return conf

    def argv(self) -> list[str]:
        argv = [spark_submit_binary(), "--master", self.master, "--name", f"recflow:{self.job.removesuffix('.py')}"]
        for key, value in sorted(self.conf().items()):
            argv += ["--conf", f"{key}={value}"]
        if self.profile == "gpu":
            check_rapids_spark_version(self.spark_version or installed_spark_version())
            jar = self.rapids_jar or os.environ.get("RECFLOW_RAPIDS_JAR")
            if not jar:
                raise ValueError("the gpu Spark profile needs the RAPIDS Accelerator jar: set RECFLOW_RAPIDS_JAR")
            argv += ["--jars", jar]
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


def run_spark_job(submit: SparkSubmit, env: Mapping[str, str] | None = None, label: str = "spark") -> None:
    """Run spark-submit, streaming its output into this process's log line by line as it happens."""
    argv = submit.argv()
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    child_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The job imports tasks.* (schema, storage): make the repo importable in driver and local executors.
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH")]))
    log.info("spark-submit %s (master %s, profile %s)", submit.job, submit.master, submit.profile)
    result = run_streaming(argv, env=child_env, label=label)
    if result.returncode != 0:
        raise SparkJobFailed(f"{submit.job} failed (exit {result.returncode}): {result.last_error_line}")
