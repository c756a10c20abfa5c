"""The RAPIDS Accelerator profiles of tasks.core.spark_submit: the gpu profile's settings scaled by a GPU executor's
resources, the gpu-explain profile (explain-only: CPU execution, NOT_ON_GPU lines collected and summarised), and the
image's jar matching the pinned Spark. docs/gpu_spark.md has the rules and their sources.

The explain lines below are in the format RapidsMeta.print writes (NVIDIA/spark-rapids, sql-plugin/src/main/scala/
com/nvidia/spark/rapids/RapidsMeta.scala at 796ef8b: indent, `!` for "cannot be replaced", the rule's operation name,
`<Class>`, the wrapped expression for expressions, then `cannot run on GPU because <reasons>`), logged by
GpuOverrides.logWarning after a header line; the reasons are the plugin's own messages (GpuFileSourceScanExec's
"unsupported file format", RegexParser's "\\z is not supported on GPU for find or replace", RuleNotFoundExprMeta's
"GPU does not currently support the operator").
"""

from __future__ import annotations

import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.core import spark_submit
from tasks.core.spark_submit import (GPU_DISCOVERY_SCRIPT, RAPIDS_JAR_URL, RAPIDS_RELEASE, GpuExecutor, GpuFallbacks,
                                     SparkSubmit, check_rapids_spark_version, installed_spark_version,
                                     parse_size_mib, run_spark_job)

REPO = Path(__file__).resolve().parents[1]
JAR = "/opt/rapids/rapids-4-spark.jar"


def conf_of(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


# --- scaling rules ---------------------------------------------------------------------------------------------------


def test_task_gpu_amount_lets_every_core_run_a_task() -> None:
    for cores in range(1, 129):
        amount = float(GpuExecutor(cores=cores).task_gpu_amount)
        # Spark runs floor(1 / amount) tasks per GPU and accepts only amounts <= 0.5 or whole numbers.
        assert math.floor(1 / amount) == cores, cores
        assert amount == 1 or amount <= 0.5


@pytest.mark.parametrize(("cores", "gpu_gib", "expected"), [
    (8, 15109 / 1024, 2),   # T4 (15109 MiB usable): AutoTuner's reason for 7500 MiB per task
    (8, 40, 4),             # A100-40GB: capped at 4
    (8, 80, 4),
    (8, 7, 1),              # less than one task's worth still runs one
    (2, 80, 2),             # never more GPU tasks than the executor runs at once
    (1, 80, 1),
])
def test_concurrent_gpu_tasks_follow_gpu_memory(cores: int, gpu_gib: float, expected: int) -> None:
    executor = GpuExecutor(cores=cores, gpu_memory_mib=int(gpu_gib * 1024))
    assert executor.concurrent_gpu_tasks == expected


def test_heap_pinned_pool_and_overhead_from_executor_memory() -> None:
    dgx2 = GpuExecutor()  # 5 cores, 48 GiB: heap is 2 GiB per core, the pinned pool its 4 GiB cap
    assert (dgx2.heap_mib, dgx2.pinned_pool_mib, dgx2.memory_overhead_mib) == (10240, 4096, 1024 + 4096 + 1024)
    # 8 GiB for 4 cores: the heap takes 90%, nothing is left to pin (0 = no pool)
    small = GpuExecutor(cores=4, memory_mib=8192)
    assert (small.heap_mib, small.pinned_pool_mib, small.memory_overhead_mib) == (7372, 0, 737 + 1024)
    # 12 GiB for 4 cores: the pinned pool is what the heap, its 10% and the 1 GiB pageable pool leave
    mid = GpuExecutor(cores=4, memory_mib=12288)
    assert (mid.heap_mib, mid.pinned_pool_mib) == (8192, 12288 - 8192 - 819 - 1024)
    for memory in range(4096, 200_000, 1537):
        executor = GpuExecutor(cores=16, memory_mib=memory)
        if executor.pinned_pool_mib:  # whenever there is a pool, heap + overhead fit the executor's memory
            assert executor.heap_mib + executor.memory_overhead_mib <= memory
            assert executor.pinned_pool_mib <= 4096


def test_executor_resources_from_the_environment() -> None:
    executor = GpuExecutor.from_env({"RECFLOW_GPU_EXECUTOR_CORES": "12", "RECFLOW_GPU_EXECUTOR_MEMORY": "96g",
                                     "RECFLOW_GPU_MEMORY": "81559m"})
    assert executor == GpuExecutor(cores=12, memory_mib=96 * 1024, gpu_memory_mib=81559)
    assert GpuExecutor.from_env({}) == GpuExecutor()
    assert parse_size_mib("1t", "x") == 1 << 20 and parse_size_mib("2048", "x") == 2048
    with pytest.raises(ValueError, match=r"^RECFLOW_GPU_MEMORY='lots': expected a size such as 48g or 7500m$"):
        GpuExecutor.from_env({"RECFLOW_GPU_MEMORY": "lots"})
    with pytest.raises(ValueError, match=r"^RECFLOW_GPU_EXECUTOR_CORES='-2': expected a positive integer$"):
        GpuExecutor.from_env({"RECFLOW_GPU_EXECUTOR_CORES": "-2"})
    with pytest.raises(ValueError, match=r"^GpuExecutor.cores=0: must be a positive integer$"):
        GpuExecutor(cores=0)


# --- the gpu profile's conf ------------------------------------------------------------------------------------------


def test_gpu_profile_on_a_standalone_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECFLOW_GPU_DISCOVERY_SCRIPT", raising=False)
    executor = GpuExecutor(cores=8, memory_mib=64 << 10, gpu_memory_mib=80 << 10)
    argv = SparkSubmit("criteo/transform.py", [], master="spark://10.0.0.1:7077", profile="gpu", rapids_jar=JAR,
                       spark_version="4.1.1", gpu_executor=executor).argv()
    conf = conf_of(argv)
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    assert conf["spark.executor.cores"] == "8" and conf["spark.task.cpus"] == "1"
    assert conf["spark.executor.resource.gpu.amount"] == "1"       # one executor per GPU
    assert conf["spark.task.resource.gpu.amount"] == "0.125000"    # 8 tasks share it
    assert conf["spark.executor.resource.gpu.discoveryScript"] == GPU_DISCOVERY_SCRIPT
    assert conf["spark.rapids.sql.concurrentGpuTasks"] == "4"
    assert conf["spark.executor.memory"] == "16384m" and conf["spark.rapids.memory.pinnedPool.size"] == "4096m"
    assert "spark.executor.memoryOverhead" not in conf              # standalone: no containers to size
    assert conf["spark.executor.extraJavaOptions"] == "-Dai.rapids.cudf.prefer-pinned=true"
    assert conf["spark.rapids.sql.explain"] == "NOT_ON_GPU" and "spark.rapids.sql.mode" not in conf
    # The RAPIDS shuffle manager of the Spark's shim, with the jar on both class paths (created before --jars load).
    assert conf["spark.shuffle.manager"] == "com.nvidia.spark.rapids.spark411.RapidsShuffleManager"
    assert conf["spark.driver.extraClassPath"] == JAR and conf["spark.executor.extraClassPath"] == JAR
    assert conf["spark.rapids.shuffle.multiThreaded.writer.threads"] == "8"
    assert conf["spark.sql.shuffle.partitions"] == "600"            # the CPU cluster conf underneath
    assert argv[argv.index("--jars") + 1] == JAR


def test_gpu_profile_on_yarn_sizes_the_container_and_honours_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECFLOW_GPU_DISCOVERY_SCRIPT", "/etc/spark/gpus.sh")
    monkeypatch.setenv("RECFLOW_GPU_EXECUTOR_CORES", "4")
    submit = SparkSubmit("job.py", [], master="yarn", profile="gpu", rapids_jar="https://mirror.invalid/r.jar",
                         spark_version="3.5.9", conf_overrides={"spark.rapids.sql.concurrentGpuTasks": "1"})
    conf = conf_of(submit.argv())
    assert conf["spark.task.resource.gpu.amount"] == "0.250000"
    assert conf["spark.executor.memoryOverhead"] == f"{GpuExecutor(cores=4).memory_overhead_mib}m"
    assert conf["spark.executor.resource.gpu.discoveryScript"] == "/etc/spark/gpus.sh"
    assert conf["spark.rapids.sql.concurrentGpuTasks"] == "1"       # an explicit override wins
    # A jar given by URL cannot go on a class path: the shuffle stays Spark's (26.08+ sets RAPIDS' on Spark 4 itself).
    assert "spark.shuffle.manager" not in conf and "spark.executor.extraClassPath" not in conf


def test_gpu_profile_on_a_local_master_requests_no_gpu_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECFLOW_SPARK_DRIVER_MEMORY", raising=False)
    conf = conf_of(SparkSubmit("job.py", [], master="local[4]", profile="gpu", rapids_jar=JAR,
                               spark_version="4.1.1", gpu_executor=GpuExecutor(cores=4)).argv())
    assert not [key for key in conf if ".resource." in key]  # Spark's local mode does not schedule GPUs
    assert "spark.executor.cores" not in conf and "spark.executor.memory" not in conf
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin" and conf["spark.rapids.sql.concurrentGpuTasks"] == "4"
    # The driver is the executor: sized by the setting, as the local profile's (Spark's own default is 1g)
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.sql.parquet.inferTimestampNTZ.enabled"] == "false"  # RAPIDS runs no TIMESTAMP_NTZ


def test_gpu_explain_profile_plans_for_the_gpu_and_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = SparkSubmit("criteo/day_stats.py", [], master="spark://10.0.0.1:7077", profile="gpu-explain",
                       rapids_jar=JAR, spark_version="4.1.1").argv()
    conf = conf_of(argv)
    assert conf["spark.plugins"] == "com.nvidia.spark.SQLPlugin"
    assert conf["spark.rapids.sql.mode"] == "explainOnly" and conf["spark.rapids.sql.explain"] == "NOT_ON_GPU"
    assert conf["spark.sql.autoBroadcastJoinThreshold"] == "1GB"   # the gpu profile's plan choices
    gpu_only = [key for key in conf if ".resource." in key or "pinnedPool" in key or "shuffle.manager" in key
                or "extraClassPath" in key or "concurrentGpuTasks" in key]
    assert gpu_only == []                                          # schedules on a machine without a GPU
    assert argv[argv.index("--jars") + 1] == JAR
    monkeypatch.delenv("RECFLOW_RAPIDS_JAR", raising=False)
    with pytest.raises(ValueError, match=r"^the gpu-explain Spark profile needs the RAPIDS Accelerator jar"):
        SparkSubmit("job.py", [], profile="gpu-explain").argv()
    with pytest.raises(ValueError, match=r"this environment has Spark 4\.1\.0: pin pyspark"):
        SparkSubmit("job.py", [], profile="gpu-explain", rapids_jar=JAR, spark_version="4.1.0").argv()


def test_the_image_installs_the_release_that_supports_the_pinned_spark() -> None:
    pinned = installed_spark_version()
    check_rapids_spark_version(pinned)
    assert pinned.startswith("4.")  # Spark 4 is Scala 2.13: the _2.13 jar
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert RAPIDS_JAR_URL.format(scala="2.13", release=RAPIDS_RELEASE) in dockerfile
    assert "getGpusResources.sh" in dockerfile and GPU_DISCOVERY_SCRIPT in dockerfile


# --- NOT_ON_GPU lines ------------------------------------------------------------------------------------------------

EXPLAIN_OUTPUT = textwrap.dedent("""\
    26/11/24 08:00:00 WARN RapidsPluginUtils: RAPIDS Accelerator 26.08.1 using cudf 26.08.1, private revision x
    26/11/24 08:00:00 WARN RapidsPluginUtils: RAPIDS Accelerator is in explain only mode, to disable set `spark.rapids.sql.enabled` to false. To change the mode, restart the application and change `spark.rapids.sql.mode`.
    26/11/24 08:00:01 WARN GpuOverrides:
    !Exec <DataWritingCommandExec> cannot run on GPU because not all data writing commands can be replaced
      !Output <InsertIntoHadoopFsRelationCommand> cannot run on GPU because not all expressions can be replaced
      !Exec <ProjectExec> cannot run on GPU because not all expressions can be replaced
        @Expression <AttributeReference> f#12 could run on GPU
        !Expression <RLike> RLIKE(f#12[0], ^[01]\\z) cannot run on GPU because \\z is not supported on GPU for find or replace near index 6
        ! <UnixMillis> unix_millis(publish_time#31) cannot run on GPU because GPU does not currently support the operator class org.apache.spark.sql.catalyst.expressions.UnixMillis
        *Expression <Alias> cast(label#20 as tinyint) AS label#40 will run on GPU
        !Exec <FileSourceScanExec> cannot run on GPU because unsupported file format: org.apache.spark.sql.execution.datasources.text.TextFileFormat
    26/11/24 08:00:02 WARN GpuOverrides:
      !Expression <RLike> RLIKE(f#57[0], ^[01]\\z) cannot run on GPU because \\z is not supported on GPU for find or replace near index 6
    26/11/24 08:00:03 WARN GpuOverrides: Can't replace any part of this plan due to: Delta Lake metadata queries are not efficient on GPU
    2026-11-24 08:00:04 INFO [day_stats day=0] columnar copy: 7 rows
""")


def test_not_on_gpu_lines_are_collected_and_summarised() -> None:
    fallbacks = GpuFallbacks()
    for line in EXPLAIN_OUTPUT.splitlines():
        fallbacks.feed(line)
    rlike = ("Expression", "RLike", "\\z is not supported on GPU for find or replace near index 6")
    assert fallbacks.counts[rlike] == 2  # the same fallback in two plans (attribute ids differ) counts twice
    assert fallbacks.counts[("Expression", "UnixMillis", "GPU does not currently support the operator class "
                             "org.apache.spark.sql.catalyst.expressions.UnixMillis")] == 1
    assert fallbacks.counts[("Exec", "FileSourceScanExec", "unsupported file format: "
                             "org.apache.spark.sql.execution.datasources.text.TextFileFormat")] == 1
    assert fallbacks.counts[("Output", "InsertIntoHadoopFsRelationCommand",
                             "not all expressions can be replaced")] == 1
    assert fallbacks.counts[("Plan", "whole plan", "Delta Lake metadata queries are not efficient on GPU")] == 1
    assert "AttributeReference" not in fallbacks.operators() and "Alias" not in fallbacks.operators()
    assert sum(fallbacks.counts.values()) == 8
    summary = fallbacks.summary("criteo/day_stats.py")
    assert summary[0] == "RAPIDS explain of criteo/day_stats.py: 7 operator(s)/expression(s) would not run on the GPU"
    assert summary[1] == f"  NOT_ON_GPU Expression <RLike> (x2): {rlike[2]}"  # causes first, most frequent first
    assert summary[-1].startswith("  NOT_ON_GPU Plan <whole plan> (x1): Delta Lake")
    assert fallbacks.plugin_mode == "explain only"
    loaded = GpuFallbacks()
    loaded.feed("26/11/24 08:00:00 WARN RapidsPluginUtils: RAPIDS Accelerator is enabled, to disable GPU support set "
                "`spark.rapids.sql.enabled` to false.")
    assert loaded.plugin_mode == "enabled"
    assert loaded.summary("job.py") == [
        "RAPIDS explain of job.py: no NOT_ON_GPU lines (every operator would run on the GPU)"]
    # No start-up line: silence proves nothing, and the summary says so.
    assert "never logged its start-up line" in GpuFallbacks().summary("job.py")[0]


def test_run_spark_job_logs_the_fallback_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A stand-in spark-submit prints the explain output; the summary reaches the task log after the job's lines."""
    out = tmp_path / "explain.txt"
    out.write_text(EXPLAIN_OUTPUT)
    fake = tmp_path / "spark-submit"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write(open({str(out)!r}).read())\n")
    fake.chmod(0o755)
    monkeypatch.setattr(spark_submit, "spark_submit_binary", lambda: str(fake))
    caplog.set_level("INFO", logger="tasks.core")
    fallbacks = run_spark_job(SparkSubmit("criteo/day_stats.py", [], profile="gpu-explain", rapids_jar=JAR,
                                          spark_version="4.1.1"), label="spark day=0")
    assert fallbacks is not None and {"RLike", "UnixMillis", "FileSourceScanExec"} <= fallbacks.operators()
    messages = [r.getMessage() for r in caplog.records]
    last_job_line = max(i for i, m in enumerate(messages) if "columnar copy" in m)
    summary_at = messages.index("[spark day=0] RAPIDS explain of criteo/day_stats.py: 7 operator(s)/expression(s) "
                                "would not run on the GPU")
    assert summary_at > last_job_line
    assert run_spark_job(SparkSubmit("job.py", []), label="cpu") is None  # CPU profiles collect nothing


# --- a real job under gpu-explain (needs the jar) --------------------------------------------------------------------


@pytest.mark.spark
def test_criteo_day_stats_under_gpu_explain(tmp_path: Path) -> None:
    jar = os.environ.get("RECFLOW_RAPIDS_JAR")
    if not jar:
        pytest.skip("RECFLOW_RAPIDS_JAR is not set: the gpu-explain profile needs the RAPIDS Accelerator jar "
                    f"({RAPIDS_JAR_URL.format(scala='2.13', release=RAPIDS_RELEASE)}), which cannot be downloaded "
                    "on this machine")
    from tasks.core.storage import read_manifest
    from tasks.criteo.synthetic import write_criteo_day

    raw = tmp_path / "day_0"
    write_criteo_day(raw, 0, rows=300)
    out = tmp_path / "stats"
    submit = SparkSubmit("criteo/day_stats.py", ["--input", str(raw), "--output", str(out), "--day", "0"],
                         master="local[2]", profile="gpu-explain", rapids_jar=jar,
                         conf_overrides={"spark.sql.shuffle.partitions": "2"})
    fallbacks = run_spark_job(submit, label="spark gpu-explain")
    assert read_manifest(out)["rows"]["good"] == 300  # explain-only: the job itself ran, on the CPU
    assert fallbacks.plugin_mode == "explain only"
    # What docs/gpu_spark.md predicts from the RAPIDS docs: the text reader falls back; the validation regexes,
    # `$`-anchored since `\z` has no GPU implementation, do not.
    assert "FileSourceScanExec" in fallbacks.operators(), fallbacks.summary("criteo/day_stats.py")
    assert "RLike" not in fallbacks.operators(), fallbacks.summary("criteo/day_stats.py")
