"""spark-submit command lines per profile (tasks.core.spark_submit) and streaming child processes (tasks.core.process)."""

from __future__ import annotations

import re

import logging
import os
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from tasks.core import process

from tasks.core import settings_registry, spark_submit
from tasks.core.process import ERROR_MARKER, run_streaming
from tasks.core.spark_submit import RAPIDS_RELEASE, SPARK_JOBS_DIR, SparkJobFailed, SparkSubmit, run_spark_job


def conf_of(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_local_profile_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECFLOW_RAPIDS_JAR", raising=False)
    argv = SparkSubmit("criteo/day_stats.py", ["--day", "3"]).argv()
    assert Path(argv[0]).name == "spark-submit" and os.access(argv[0], os.X_OK)
    assert option(argv, "--master") == "local[*]"
    assert option(argv, "--name") == "recflow:criteo/day_stats"
    conf = conf_of(argv)
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.driver.extraJavaOptions"].startswith("-Dlog4j2.configurationFile=file:")
    assert "spark.plugins" not in conf
    assert "--jars" not in argv and "--py-files" not in argv
    assert argv[-3:] == [str(SPARK_JOBS_DIR / "criteo/day_stats.py"), "--day", "3"]


def test_conf_overrides_win() -> None:
    submit = SparkSubmit("job.py", [], conf_overrides={"spark.sql.shuffle.partitions": "2", "spark.x": "y"})
    conf = conf_of(submit.argv())
    assert conf["spark.sql.shuffle.partitions"] == "2" and conf["spark.x"] == "y"


def test_local_driver_memory_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECFLOW_SPARK_DRIVER_MEMORY", raising=False)
    assert conf_of(SparkSubmit("job.py", []).argv())["spark.driver.memory"] == "2g"
    monkeypatch.setenv("RECFLOW_SPARK_DRIVER_MEMORY", "8g")  # ml-20m's preprocess ran out of a 2g heap
    assert conf_of(SparkSubmit("job.py", []).argv())["spark.driver.memory"] == "8g"
    for typo in ("8 GB", "g8", "0g", ""):
        monkeypatch.setenv("RECFLOW_SPARK_DRIVER_MEMORY", typo)
        with pytest.raises(ValueError, match="RECFLOW_SPARK_DRIVER_MEMORY=.* is not a JVM memory size"):
            SparkSubmit("job.py", []).argv()
    monkeypatch.setenv("RECFLOW_SPARK_DRIVER_MEMORY", "8g")
    # The local profile's client-mode driver keeps the setting on a cluster master too
    assert conf_of(SparkSubmit("job.py", [], master="spark://h:7077").argv())["spark.driver.memory"] == "8g"
    # A cluster's driver memory is the cluster's deployment to size (spark-defaults), not this machine's setting.
    assert "spark.driver.memory" not in conf_of(SparkSubmit("job.py", [], master="spark://h:7077",
                                                            profile="cluster").argv())
    # A job's own conf still wins over the setting.
    overridden = SparkSubmit("job.py", [], conf_overrides={"spark.driver.memory": "1g"})
    assert conf_of(overridden.argv())["spark.driver.memory"] == "1g"


def test_cluster_profile_ships_the_code() -> None:
    argv = SparkSubmit("criteo/day_stats.py", ["--day", "1"], master="spark://127.0.0.1:7077",
                       profile="cluster").argv()
    assert option(argv, "--master") == "spark://127.0.0.1:7077"
    conf = conf_of(argv)
    assert conf["spark.sql.shuffle.partitions"] == "600"
    assert conf["spark.sql.files.maxPartitionBytes"] == "1073741824"
    assert "spark.plugins" not in conf
    archive = Path(option(argv, "--py-files"))
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
    assert {"tasks/criteo/schema.py", "tasks/core/storage.py", "spark_jobs/criteo/day_stats.py",
            "spark_jobs/common.py"} <= names
    # The script comes after every option (spark-submit reads what follows it as the job's own arguments).
    assert argv.index("--py-files") < argv.index(str(SPARK_JOBS_DIR / "criteo/day_stats.py"))


def test_driver_host_is_set_for_a_cluster_master_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECFLOW_SPARK_DRIVER_HOST", "10.1.2.3")
    on_cluster = conf_of(SparkSubmit("job.py", [], master="spark://127.0.0.1:7077").argv())
    assert on_cluster["spark.driver.host"] == "10.1.2.3"
    # local[*]: driver and executors share one JVM; an address meant for a cluster's executors must not apply.
    assert "spark.driver.host" not in conf_of(SparkSubmit("job.py", []).argv())
    explicit = SparkSubmit("job.py", [], master="spark://127.0.0.1:7077", driver_host="127.0.0.1")
    assert conf_of(explicit.argv())["spark.driver.host"] == "127.0.0.1"
    monkeypatch.delenv("RECFLOW_SPARK_DRIVER_HOST")
    assert "spark.driver.host" not in conf_of(SparkSubmit("job.py", [], master="spark://h:7077").argv())


def test_code_archive_is_named_by_its_content_and_written_once(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    for rel in ("tasks/__init__.py", "tasks/core/schema.py", "spark_jobs/job.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"# {rel}\n")
    (repo / "tasks" / "notes.txt").write_text("not code")
    monkeypatch.setattr(spark_submit, "REPO_ROOT", repo)
    first = spark_submit.code_archive()
    assert first.parent == repo / "build" and first.name.startswith("recflow_spark_code-")
    with zipfile.ZipFile(first) as zf:
        assert sorted(zf.namelist()) == ["spark_jobs/job.py", "tasks/__init__.py", "tasks/core/schema.py"]
    written = first.stat().st_mtime_ns, first.stat().st_ino
    again = spark_submit.code_archive()
    assert again == first and (again.stat().st_mtime_ns, again.stat().st_ino) == written  # not rewritten
    # An edit makes a new archive beside the old one (a job starting with the old one keeps it); a day later the
    # old one is removed when the next new one is written.
    (repo / "spark_jobs" / "job.py").write_text("# edited\n")
    edited = spark_submit.code_archive()
    assert edited != first and first.exists()
    os.utime(first, (time.time() - 2 * 86400,) * 2)
    (repo / "spark_jobs" / "job.py").write_text("# edited twice\n")
    newest = spark_submit.code_archive()
    assert not first.exists() and edited.exists() and newest.exists()
    assert not list((repo / "build").glob(".tmp-*"))


def test_cluster_profile_on_a_local_master_needs_no_archive() -> None:
    argv = SparkSubmit("job.py", [], profile="cluster").argv()
    assert "--py-files" not in argv
    assert conf_of(argv)["spark.sql.shuffle.partitions"] == "600"


def test_gpu_profile_adds_rapids(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = tmp_path / "rapids-4-spark_2.13.jar"
    monkeypatch.setenv("RECFLOW_RAPIDS_JAR", str(jar))
    argv = SparkSubmit("criteo/day_stats.py", [], master="spark://127.0.0.1:7077", profile="gpu").argv()
    conf = conf_of(argv)
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    assert conf["spark.executor.resource.gpu.amount"] == "1"
    assert conf["spark.sql.shuffle.partitions"] == "600"  # the CPU cluster conf underneath
    assert option(argv, "--jars") == str(jar)
    # An explicit jar beats the environment.
    argv = SparkSubmit("job.py", [], profile="gpu", rapids_jar="/opt/rapids.jar").argv()
    assert option(argv, "--jars") == "/opt/rapids.jar"


# RAPIDS Accelerator 26.08.1 ships shims for 3.3.0-3.3.4, 3.4.0-3.4.4, 3.5.0-3.5.9, 4.0.0-4.0.4, 4.1.1-4.1.3, 4.2.0:
# a range check would wrongly accept 4.1.0 (no shim) between supported versions.
@pytest.mark.parametrize("version", ["4.1.0", "4.2.1", "3.2.4", "4.3.0", "3.5.10"])
def test_gpu_profile_refuses_a_spark_the_rapids_accelerator_does_not_support(version: str) -> None:
    submit = SparkSubmit("job.py", [], profile="gpu", rapids_jar="/opt/rapids.jar", spark_version=version)
    with pytest.raises(ValueError, match=rf"RAPIDS Accelerator 26.08.1 supports \(3.3.0-3.3.4, .*, 4.1.1-4.1.3, "
                                         rf"4.2.0\); this environment has Spark {re.escape(version)}: pin pyspark"):
        submit.argv()


@pytest.mark.parametrize("version", ["4.1.1", "4.2.0", "4.0.4", "3.5.9", "3.3.0"])
def test_gpu_profile_accepts_supported_sparks(version: str) -> None:
    argv = SparkSubmit("job.py", [], profile="gpu", rapids_jar="/opt/rapids.jar", spark_version=version).argv()
    assert "/opt/rapids.jar" in argv


def test_the_pinned_spark_is_one_the_gpu_profile_can_run() -> None:
    from tasks.core.spark_submit import check_rapids_spark_version, installed_spark_version

    check_rapids_spark_version(installed_spark_version())  # raises when the pin drifts past RAPIDS' range


def test_gpu_profile_without_jar_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECFLOW_RAPIDS_JAR", raising=False)
    with pytest.raises(ValueError, match=r"gpu Spark profile needs the RAPIDS Accelerator jar: set RECFLOW_RAPIDS_JAR"
                                         r" \(Maven Central: https://repo1.maven.org/maven2/com/nvidia/"):
        SparkSubmit("job.py", [], profile="gpu").argv()
    # The jar named is the one for the Scala of the Spark in use: pyspark 3.x is Scala 2.12, Spark 4 is 2.13
    for spark_version, scala in (("3.5.3", "2.12"), ("4.1.1", "2.13")):
        release = re.escape(RAPIDS_RELEASE)
        jar = rf"rapids-4-spark_{scala}/{release}/rapids-4-spark_{scala}-{release}\.jar\)$"
        with pytest.raises(ValueError, match=jar):
            SparkSubmit("job.py", [], profile="gpu", spark_version=spark_version).argv()


def test_unknown_profile() -> None:
    with pytest.raises(ValueError, match=r"unknown Spark profile 'tpu'; expected one of local, cluster, gpu, "
                                         r"gpu-explain$"):
        SparkSubmit("job.py", [], profile="tpu").argv()


# --- tasks.core.process.run_streaming ------------------------------------------------------------------------------


class Recorder(logging.Handler):
    """Records (monotonic time, message) of each log record; can raise after a given message to fake a kill."""

    def __init__(self, raise_on: str | None = None):
        super().__init__(logging.INFO)
        self.records: list[tuple[float, str]] = []
        self.raise_on = raise_on

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.records.append((time.monotonic(), message))
        if self.raise_on and self.raise_on in message:
            raise KeyboardInterrupt("task stopped")


@pytest.fixture
def recorder():
    handlers = []

    def attach(raise_on: str | None = None) -> Recorder:
        handler = Recorder(raise_on)
        process.log.addHandler(handler)
        handlers.append(handler)
        return handler

    old_level = process.log.level
    process.log.setLevel(logging.INFO)
    yield attach
    for handler in handlers:
        process.log.removeHandler(handler)
    process.log.setLevel(old_level)


def python_child(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", textwrap.dedent(code)]


def test_lines_are_logged_as_they_arrive(recorder) -> None:
    seen = recorder()
    result = run_streaming(python_child("""
        import time
        print("first line", flush=True)
        time.sleep(1)
        print("second line", flush=True)
    """), label="kid")
    done = time.monotonic()
    assert result.returncode == 0
    lines = [(t, m) for t, m in seen.records if m.startswith("[kid]")]
    assert [m for _, m in lines] == ["[kid] first line", "[kid] second line"]
    first_at, second_at = lines[0][0], lines[1][0]
    assert second_at - first_at > 0.8  # the first line was logged while the child was still sleeping
    assert done - first_at > 0.8
    assert result.tail == ("first line", "second line")


def test_marked_error_line_is_returned(recorder) -> None:
    seen = recorder()
    result = run_streaming(python_child(f"""
        import sys
        print("starting")
        print("WARN something noisy")
        print("{ERROR_MARKER} ValueError: day_3 line 7: bad label", flush=True)
        print("Traceback (most recent call last):")
        print("RuntimeError: wrapper")
        sys.exit(3)
    """), quiet_prefixes=("WARN",))
    assert result.returncode == 3
    assert result.last_error_line == "ValueError: day_3 line 7: bad label"
    assert "WARN something noisy" in result.tail
    assert not [m for _, m in seen.records if "something noisy" in m]  # quiet prefix: kept in tail, not logged


def test_without_marker_the_last_error_looking_line_is_returned(recorder) -> None:
    recorder()
    result = run_streaming(python_child("""
        import sys
        print("java.lang.IllegalStateException: boom")
        print("shutting down")
        sys.exit(1)
    """))
    assert result.returncode == 1
    assert result.last_error_line == "java.lang.IllegalStateException: boom"


def _gone(pid: int) -> bool:
    """True when the pid no longer runs (exited, or a zombie waiting for its new parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_interrupted_parent_kills_the_child_process_group(recorder) -> None:
    seen = recorder(raise_on="pids")
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_streaming(python_child("""
            import os, subprocess, sys, time
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            print("pids", os.getpid(), grandchild.pid, flush=True)
            time.sleep(60)
            print("never")
        """))
    assert time.monotonic() - start < 20
    pids_line = [m for _, m in seen.records if "pids" in m][0]  # recorded just before the handler raised
    child, grandchild = (int(x) for x in pids_line.split()[-2:])
    deadline = time.monotonic() + 10
    while not (_gone(child) and _gone(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), f"child {child} still running"
    assert _gone(grandchild), f"grandchild {grandchild} in the child's process group still running"


# --- run_spark_job with a stand-in spark-submit ---------------------------------------------------------------


def test_run_spark_job_failure_names_the_job_and_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      recorder) -> None:
    fake = tmp_path / "spark-submit"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        print("argv", " ".join(sys.argv[1:]))
        print("pythonpath", os.environ["PYTHONPATH"])
        print("{ERROR_MARKER} FileNotFoundError: /data/day_0", flush=True)
        sys.exit(2)
    """))
    fake.chmod(0o755)
    monkeypatch.setattr(spark_submit, "spark_submit_binary", lambda: str(fake))
    seen = recorder()
    expected = r"^criteo/day_stats.py failed \(exit 2\): FileNotFoundError: /data/day_0$"
    with pytest.raises(SparkJobFailed, match=expected):
        run_spark_job(SparkSubmit("criteo/day_stats.py", ["--day", "0"]), label="spark day=0")
    messages = [m for _, m in seen.records]
    pythonpath = [m for m in messages if m.startswith("[spark day=0] pythonpath ")][0]
    assert str(spark_submit.REPO_ROOT) in pythonpath.split(" ", 3)[-1].split(os.pathsep)
    assert any(m.startswith("[spark day=0] argv --master local[*]") for m in messages)


@pytest.mark.parametrize("master", [None, "", "local", "local[*]", "local[2]", "local[4,2]", " LOCAL[*] ",
                                    "local-cluster[2,1,1024]"])
def test_a_local_or_unset_master_is_local(master: str | None) -> None:
    assert spark_submit.spark_master_is_local(master)


@pytest.mark.parametrize("master", ["spark://head:7077", "yarn", "k8s://https://api:6443", "mesos://m:5050"])
def test_a_cluster_master_is_not_local(master: str) -> None:
    assert not spark_submit.spark_master_is_local(master)


def test_engine_for_master_defaults_by_master_and_explicit_choices_win(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    # Settings are read through their declaration: declare this made-up one for the test's duration.
    monkeypatch.setitem(settings_registry._DECLARED, "RECFLOW_X_ENGINE",
                        settings_registry.Setting("RECFLOW_X_ENGINE", "choice", "", "a test's engine setting"))
    monkeypatch.delenv("RECFLOW_X_ENGINE", raising=False)
    engines = ("spark", "arrow")

    def choose(engine: str | None, master: str | None, profile: str = "local") -> str:
        return spark_submit.choose_engine_for_master("x", engine, "RECFLOW_X_ENGINE", engines, master, profile)

    with caplog.at_level(logging.INFO, logger="tasks.core.spark_submit"):
        assert choose(None, "local[*]") == "arrow"
    assert "x engine: arrow (default on one machine: Spark master local[*], profile local)" in caplog.messages
    assert choose(None, None) == "arrow"
    assert choose(None, "spark://head:7077") == "spark"
    assert choose(None, "local[*]", "gpu") == "spark"  # a GPU profile asks for the RAPIDS jobs
    assert choose("spark", "local[*]") == "spark"
    assert choose("arrow", "yarn") == "arrow"
    monkeypatch.setenv("RECFLOW_X_ENGINE", "spark")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tasks.core.spark_submit"):
        assert choose(None, "local[*]") == "spark"
    assert "x engine: spark (set by RECFLOW_X_ENGINE)" in caplog.messages
    monkeypatch.setenv("RECFLOW_X_ENGINE", "pandas")
    with pytest.raises(ValueError, match="RECFLOW_X_ENGINE 'pandas'"):
        choose(None, "local[*]")
