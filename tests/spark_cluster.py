"""A real Spark standalone cluster on this machine for integration tests and benchmarks: one master and one worker,
bound to 127.0.0.1, each a `spark-class` child process (pyspark's own Spark distribution) in its own process group.

    with spark_standalone(tmp_path / "spark") as cluster:
        cluster.master_url          # spark://127.0.0.1:<port>, what the spark_default connection names
        cluster.applications()      # the master's JSON view: active + completed applications
        cluster.log_tails()         # for assertion messages

Ports are chosen by the daemons themselves (port 0) and read back from their logs, so two clusters (or another
session's) never race for a port; the master's REST submission server, which would take the fixed port 6066, is
off. Readiness is polled with a deadline: the master's log line, then its JSON API until the worker is ALIVE with
all its cores; a daemon that dies or a deadline that passes fails with the logs' tails. Teardown stops each
daemon's whole process group (the worker's executors and their Python workers are in it), SIGKILL after a grace,
whatever the body raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Whole lines only (the log may be read while a line is half written): the URL up to its newline, the port up to
# the sentence's full stop.
MASTER_URL_LINE = re.compile(r"Starting Spark master at (spark://\S+)\r?\n")
MASTER_UI_LINE = re.compile(r"Successfully started service 'MasterUI' on port (\d+)\.")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, whatever *_proxy says


class ClusterStartError(RuntimeError):
    """The standalone master or worker did not come up; the message carries the daemons' log tails."""


def spark_home() -> Path:
    """pyspark's bundled Spark distribution (jars/, bin/): what spark-submit here runs, so daemons and drivers
    share one Spark version. Set explicitly: bin/spark-class otherwise asks whatever `python3` is on PATH."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class SparkStandalone:
    workdir: Path
    env: dict[str, str]
    master_url: str = ""
    web_url: str = ""  # the master's web UI, whose /json/ is the cluster's state
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def worker_dir(self) -> Path:
        """Where the worker runs executors: one folder per application, with each executor's stdout, stderr and
        the files the driver shipped (--py-files)."""
        return self.workdir / "work"

    def state(self) -> dict[str, Any]:
        """The master's JSON view: workers, cores, activeapps, completedapps."""
        with _NO_PROXY.open(f"{self.web_url}/json/", timeout=10) as response:
            return json.load(response)

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master has seen, active and completed (id, name, state, duration ...)."""
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for name in self.processes:
            path = self.workdir / f"{name}.log"
            tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
            parts.append(f"----- {name}.log (last {len(tail)} lines) -----\n" + "\n".join(tail))
        dead = [f"{name} (exit {proc.returncode})" for name, proc in self.processes.items() if proc.poll() is not None]
        return (f"DEAD: {', '.join(dead)}\n" if dead else "") + "\n".join(parts)

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            # Own session = own process group: teardown reaches the daemon and every executor it forked.
            self.processes[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                                    cwd=str(self.workdir))
        finally:
            out.close()
        return self.processes[name]

    def _wait_for(self, check, what: str, deadline: float) -> Any:
        while True:
            dead = [name for name, proc in self.processes.items() if proc.poll() is not None]
            if dead:
                raise ClusterStartError(f"Spark {' and '.join(dead)} exited while waiting for {what}\n"
                                        f"{self.log_tails()}")
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise ClusterStartError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.25)

    def _log_match(self, name: str, pattern: re.Pattern) -> str | None:
        path = self.workdir / f"{name}.log"
        found = pattern.search(path.read_text(errors="replace")) if path.exists() else None
        return found.group(1) if found else None

    def _worker_alive(self, cores: int) -> bool:
        try:
            state = self.state()
        except (OSError, ValueError):  # the UI not serving yet, or a half-written answer
            return False
        return any(w.get("state") == "ALIVE" and w.get("cores") == cores for w in state.get("workers", []))

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM each daemon's process group (worker first), SIGKILL what is left after the grace."""
        for proc in reversed(list(self.processes.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
            # Executors (and their Python workers) may outlive the worker's JVM: sweep the group either way.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def daemon_env(workdir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The daemons' environment: bound to 127.0.0.1, logs and scratch under workdir, small daemon heaps."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOCAL_DIRS": str(workdir / "scratch"),
        "SPARK_LOG_DIR": str(workdir),
        "SPARK_CONF_DIR": str(workdir / "conf"),  # empty: no site spark-defaults.conf changes what is tested
        "SPARK_DAEMON_MEMORY": "512m",  # the master's and worker's own heaps; executors get spark.executor.memory
        # The REST submission server would bind the fixed port 6066 (a second cluster on this machine would fail).
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(extra or {}),
    }


@contextlib.contextmanager
def spark_standalone(workdir: Path, cores: int = 2, memory: str = "2g", startup_timeout_s: float = 180.0,
                     extra_env: Mapping[str, str] | None = None) -> Iterator[SparkStandalone]:
    """Start a master and one worker (`cores`, `memory`) on 127.0.0.1, wait until the worker is registered, yield
    the cluster, stop both (their process groups) on exit."""
    workdir = Path(workdir)
    for sub in ("work", "scratch", "conf"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    cluster = SparkStandalone(workdir, daemon_env(workdir, extra_env))
    spark_class = str(spark_home() / "bin" / "spark-class")
    deadline = time.monotonic() + startup_timeout_s
    try:
        cluster._start("master", [spark_class, MASTER_CLASS, "--host", HOST, "--port", "0", "--webui-port", "0"])
        cluster.master_url = cluster._wait_for(lambda: cluster._log_match("master", MASTER_URL_LINE),
                                               "the master's URL in its log", deadline)
        ui_port = cluster._wait_for(lambda: cluster._log_match("master", MASTER_UI_LINE),
                                    "the master's web UI port in its log", deadline)
        cluster.web_url = f"http://{HOST}:{ui_port}"
        cluster._start("worker", [spark_class, WORKER_CLASS, "--host", HOST, "--port", "0", "--webui-port", "0",
                                  "--cores", str(cores), "--memory", memory, "--work-dir", str(cluster.worker_dir),
                                  cluster.master_url])
        cluster._wait_for(lambda: cluster._worker_alive(cores), f"a worker with {cores} cores ALIVE at "
                          f"{cluster.web_url}/json/", deadline)
        yield cluster
    finally:
        cluster.stop()


def wait_for_completed(cluster: SparkStandalone, names: set[str], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The completed applications named `names` (a driver's exit reaches the master asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = [app for app in cluster.state().get("completedapps", []) if app.get("name") in names]
        if {app["name"] for app in done} >= names or time.monotonic() > deadline:
            return done
        time.sleep(0.5)

