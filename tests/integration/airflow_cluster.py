"""A real Airflow on this machine for integration tests: a fresh PostgreSQL database, LocalExecutor, and the
scheduler, dag-processor and api-server running as subprocesses, each in its own process group.

    with airflow_cluster(tmp_path, extra_env={...}) as cluster:
        api = cluster.api()                       # scripts/airflow_api.AirflowApi, logged in
        cluster.airflow("backfill", "create", ...) # the CLI with the same environment
        cluster.service_log_tails()                # for assertion messages
        cluster.kill_service("scheduler")          # SIGKILL its process group, as a crash would
        cluster.start_service("scheduler")         # a new process with the same arguments and environment

The PostgreSQL server is the machine's (127.0.0.1:5432, user postgres, trust auth); the database is created at
start and dropped (with its connections) at the end. Everything else lives under the given directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.airflow_api import AirflowApi, ApiError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
USERNAME = "recflow"
SERVICES = {  # name -> airflow CLI arguments (the api-server's port is appended)
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "api-server": ["api-server", "--host", "127.0.0.1", "--workers", "1", "--port"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_database(prefix: str = "recflow_it") -> Iterator[str]:
    """A new, empty database on the local server; dropped (connections forced out) on exit. Yields its name."""
    import psycopg2

    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=10)
    admin.autocommit = True  # CREATE/DROP DATABASE cannot run inside a transaction
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield name
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def cluster_env(home: Path, db_url: str, api_port: int, password_file: Path,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every Airflow process of the cluster (services and CLI calls) shares."""
    venv_bin = Path(sys.executable).parent
    api_url = f"http://127.0.0.1:{api_port}"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # Two task processes at a time: the machine has 2 cores, and Spark/torch children use them.
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
        # Task processes report to the execution API of *this* api-server, not the default localhost:8080.
        "AIRFLOW__API__BASE_URL": api_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        # Scheduler (signs task tokens) and api-server (checks them) must share these; set them, don't rely
        # on the first process to write airflow.cfg.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        # Parse once quickly, then rarely: parsing competes with tasks for the 2 cores.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "120",
        # A busy scheduler loops at once; an idle one sleeps 1 s (default). Heartbeat 2 s instead of 5.
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        # The deployment's training profile for runs without conf (scheduled, asset-triggered): this machine's.
        "RECFLOW_PROFILE": "demo",
        "RECFLOW_TRAIN_DEVICE": "cpu",
    }
    if importlib.util.find_spec("asyncpg") is None:
        # Airflow derives an async URL (postgresql+asyncpg) from the sync one and creates that engine at import;
        # without asyncpg (not in requirements.txt) every airflow process dies at start. Empty = no async
        # engine; only multi-team, the task state store and the experimental /wait endpoint need it.
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = ""
    env.update(extra or {})
    return env


@dataclass
class AirflowCluster:
    home: Path
    env: dict[str, str]
    api_url: str
    username: str
    password: str
    database: str
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    service_args: dict[str, list[str]] = field(default_factory=dict)  # name -> airflow CLI arguments

    def api(self) -> AirflowApi:
        return AirflowApi.login(self.api_url, self.username, self.password)

    def airflow(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run the airflow CLI with the cluster's environment; on failure the error shows its output."""
        proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def start_service(self, name: str) -> subprocess.Popen:
        """(Re)start a service with its arguments and the cluster's environment; its log file is appended to."""
        proc = self.processes.get(name)
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"{name} (pid {proc.pid}) is still running")
        self.processes[name] = _start_service(name, self.service_args[name], self.env, self.log_dir)
        return self.processes[name]

    def kill_service(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        """Send `sig` to a service's whole process group (the leader and what it forked into the group, not
        children that made their own group or session); waits for the leader to exit. Returns its exit code."""
        proc = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        return proc.wait(timeout=30)

    def restart_service(self, name: str, sig: signal.Signals = signal.SIGKILL) -> subprocess.Popen:
        self.kill_service(name, sig)
        return self.start_service(name)

    def dead_services(self) -> list[str]:
        return [name for name, proc in self.processes.items() if proc.poll() is not None]

    def service_log_tails(self, lines: int = 40) -> str:
        """The last lines of each service's log, to put in an assertion message."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {path.name} (last {len(tail)} lines) -----\n" + "\n".join(tail))
        dead = self.dead_services()
        return (f"DEAD SERVICES: {dead}\n" if dead else "") + "\n".join(parts)

    def wait_until(self, check: Callable[[], Any], timeout: float, what: str, poll: float = 1.0) -> Any:
        """Poll check() until it returns something truthy; fails naming `what`, with the services' log tails."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.dead_services():
                break
            try:
                result = check()
                if result:
                    return result
            except (ApiError, OSError) as exc:  # api-server still starting, or a transient answer
                last_error = exc
            time.sleep(poll)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error})\n"
                             f"{self.service_log_tails()}")


def _start_service(name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it; closed with the process
    try:
        # Own session = own process group: teardown signals the service and every worker/task it forked.
        return subprocess.Popen([str(Path(sys.executable).parent / "airflow"), *args], env=dict(env),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=str(log_dir))
    finally:
        out.close()


def _stop_service(proc: subprocess.Popen, grace: float = 20.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # Children (task supervisors, spark-submit, torchrun) may outlive the leader: sweep the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def processes_mentioning(text: str) -> dict[int, str]:
    """Live processes whose command line contains `text` (pid -> command line), this process excluded."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited while we looked
            continue
        pid = int(cmdline.parent.name)
        if text in args and pid != os.getpid():
            found[pid] = args
    return found


def _kill_leftovers(workdir: Path) -> None:
    # Spark and torchrun children run in their own sessions (tasks/core/process.py), so stopping the services' groups
    # does not reach them; their command lines name paths under the cluster's directory.
    for pid, args in processes_mentioning(str(workdir) + "/").items():
        log.warning("killing leftover process %d: %s", pid, args[:200])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _dags_parsed(api: AirflowApi, dag_ids: tuple[str, ...]) -> bool:
    errors = api.import_errors()
    if errors:
        raise AssertionError(f"DAG import errors: {json.dumps(errors, indent=1)[:4000]}")
    return all(_has_dag(api, dag_id) for dag_id in dag_ids)


def _has_dag(api: AirflowApi, dag_id: str) -> bool:
    try:
        return bool(api.dag(dag_id))
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def celery_env(database: str) -> tuple[dict[str, str], int]:
    """CeleryExecutor on the machine's Redis (broker, one Redis database per cluster, emptied first) with results
    in the cluster's PostgreSQL database. Returns (environment, Redis database number)."""
    import redis

    number = 1 + int(database.rsplit("_", 1)[-1], 16) % 15  # 1..15; 0 is left to whatever else uses the server
    redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number).flushdb()
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",  # as parallelism: 2 cores
    }, number


@contextlib.contextmanager
def airflow_cluster(workdir: Path, extra_env: Mapping[str, str] | None = None,
                    dag_ids: tuple[str, ...] = (), startup_timeout: float = 240.0,
                    executor: str = "LocalExecutor") -> Iterator[AirflowCluster]:
    """Migrate a fresh PostgreSQL database, run scripts/airflow_init.sh, start the services, wait for the API
    and for `dag_ids` to be parsed; yield the cluster; stop the services and drop the database.

    executor="CeleryExecutor": tasks go through the local Redis to an `airflow celery worker` service (queue
    `default`), as in docker-compose.yml."""
    if executor not in ("LocalExecutor", "CeleryExecutor"):
        raise ValueError(f"executor {executor!r}: LocalExecutor or CeleryExecutor")
    home, log_dir = workdir / "airflow_home", workdir / "service_logs"
    home.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(16)
    password_file = home / "simple_auth_manager_passwords.json"
    password_file.write_text(json.dumps({USERNAME: password}))  # read by the api-server at each login
    port = free_port()
    with postgres_database() as database:
        db_url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"
        env = cluster_env(home, db_url, port, password_file, extra_env)
        services = dict(SERVICES)
        redis_db = None
        if executor == "CeleryExecutor":
            celery, redis_db = celery_env(database)
            env.update(celery)
            services["celery-worker"] = ["celery", "worker", "--queues", "default", "--concurrency", "2"]
        cluster = AirflowCluster(home, env, f"http://127.0.0.1:{port}", USERNAME, password, database, log_dir)
        started = time.monotonic()
        # airflow_init.sh runs `airflow db migrate` first, then pools and the spark_default connection.
        init = subprocess.run(["bash", str(REPO / "scripts" / "airflow_init.sh")], env=env, capture_output=True,
                              text=True, timeout=600)
        assert init.returncode == 0, f"airflow_init.sh failed:\n{init.stdout[-3000:]}\n{init.stderr[-5000:]}"
        log.info("database migrated and initialised in %.1f s", time.monotonic() - started)
        try:
            for name, args in services.items():
                cluster.service_args[name] = [*args, str(port)] if name == "api-server" else list(args)
                cluster.start_service(name)
            api = cluster.wait_until(cluster.api, startup_timeout, "the api-server to accept a login")
            cluster.wait_until(lambda: _dags_parsed(api, dag_ids), startup_timeout, f"DAGs {dag_ids} parsed")
            log.info("airflow cluster up in %.1f s (api %s)", time.monotonic() - started, cluster.api_url)
            yield cluster
        finally:
            for proc in reversed(list(cluster.processes.values())):
                _stop_service(proc)
            _kill_leftovers(workdir)
            if redis_db is not None:
                import redis

                redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=redis_db).flushdb()
