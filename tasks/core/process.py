"""Run a child process (spark-submit, torchrun), or a group of them that succeed or fail together (the workers of
one distributed job), and stream their output into the task log line by line.

Airflow shows a task's log as it is written, so each line of the child is logged when it arrives, not at the end.
The child runs in its own process group; if the task is stopped (SIGTERM, timeout, exception), the whole group is
killed so no Spark driver or trainer outlives its task. So is it when the process that started this one dies: a
task whose Airflow supervisor was killed (a SIGKILLed LocalExecutor scheduler takes its supervisors with it) is an
orphan whose result nobody collects, and the scheduler runs the task again; its child must not run on beside the
retry (two Spark jobs writing one output, and twice the CPU the pool allows).

A child never inherits the task's secrets (issue #24): its environment is the one given (or this process's) without
the variables `child_environment` names as secret (the metadata database URL, Celery broker, JWT / API / fernet
keys, Airflow connections and variables, MinIO root credentials, anything named like a password, secret or token).
Children read local files and talk to Spark; credentials stay in the task that fetched or publishes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

ERROR_MARKER = "RECFLOW-ERROR:"  # recflow's jobs print their one-line failure reason after this marker
# A trainer's reason starts with this when its measured rate says the run cannot finish in its task's time
# (models/common/time_budget.py); the launcher fails the task without retry (tasks.core.launch.TrainingTooSlow).
TOO_SLOW = "training too slow:"
# A trainer's reason starts with this when the job cannot run on its node as configured (device auto on GPUs the
# framework cannot use, more NCCL processes than GPUs, a flag the device cannot honour): no retry either
# (tasks.core.launch.CannotRunHere).
CANNOT_RUN_HERE = "cannot run here:"


def cannot_run_here(reason: str) -> RuntimeError:
    """What a trainer raises when it cannot run on its node as configured. Its line is printed marked first, so the
    launcher picks it up (and fails without retry) however the process then ends: under torchrun the last error
    line is torchrun's own summary."""
    line = f"{CANNOT_RUN_HERE} {reason}"
    print(f"{ERROR_MARKER} {line}", flush=True)
    return RuntimeError(line)


# Variables a child never gets: Airflow's own secrets and connections, the deployment's root credentials, and
# anything whose name says it holds one (AWS_SECRET_ACCESS_KEY, *_PASSWORD, *_TOKEN, ...).
_SECRET_NAMES = re.compile(
    r"AIRFLOW_CONN_.*|AIRFLOW_VAR_.*|AIRFLOW__DATABASE__.*|AIRFLOW__CELERY__(BROKER_URL|RESULT_BACKEND).*"
    r"|AIRFLOW__.*(_CMD|_SECRET)|AIRFLOW__CORE__FERNET_KEY.*|AIRFLOW__API_AUTH__.*|AIRFLOW__API__SECRET_KEY.*"
    r"|MINIO_ROOT_.*|POSTGRES_.*|REDIS_PASSWORD|_AIRFLOW_WWW_USER_.*"
    r"|.*(SECRET|PASSWORD|PASSWD|TOKEN|PRIVATE_KEY|CREDENTIAL|FERNET|JWT).*", re.IGNORECASE)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) without the secret variables (see the module docstring)."""
    source = os.environ if env is None else env
    return {name: value for name, value in source.items() if not _SECRET_NAMES.fullmatch(name)}


def _groups(pgid: int | Sequence[int]) -> tuple[int, ...]:
    return (pgid,) if isinstance(pgid, int) else tuple(pgid)


@contextlib.contextmanager
def _group_killed_on_sigterm(pgid: int | Sequence[int], label: str) -> Iterator[None]:
    """While the child runs, SIGTERM first stops the child's process group (or groups), then does what it did
    before.

    Airflow 3's task runner answers SIGTERM (run marked failed, task cleared) by calling the operator's on_kill()
    and carrying on; its supervisor SIGKILLs the task 5 s later. No exception reaches run_streaming's `finally`,
    so without this the child, in its own session, would outlive its task.
    """
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set from main thread
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def stop_child(signum, frame):
        for group in _groups(pgid):
            log.warning("[%s] SIGTERM: stopping child process group %d", label, group)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_child)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _group_killed_when_orphaned(pgid: int | Sequence[int], label: str, poll_s: float = 1.0) -> Iterator[None]:
    """While the child runs, a watcher thread stops the child's group (or groups) if this process's parent dies
    (the parent pid changes when the parent is gone: the orphan is re-parented to init or a subreaper)."""
    parent = os.getppid()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if os.getppid() != parent:
                for group in _groups(pgid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGTERM)
                    log.warning("[%s] parent process %d died: stopped child process group %d", label, parent, group)
                if not done.wait(20):
                    for group in _groups(pgid):
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(group, signal.SIGKILL)
                return

    watcher = threading.Thread(target=watch, name=f"orphan-watch-{label}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


@dataclass(frozen=True)
class ProcessResult:
    returncode: int
    last_error_line: str
    tail: tuple[str, ...]


def _pick_error_line(tail: Sequence[str], marked: str | None) -> str:
    if marked:
        return marked
    for line in reversed(tail):
        if any(word in line for word in ("Error", "Exception", "error:", "FAILED")):
            return line.strip()
    return tail[-1].strip() if tail else "(no output)"


def run_streaming(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
                  label: str = "child", quiet_prefixes: Sequence[str] = (),
                  on_line: Callable[[str], None] | None = None) -> ProcessResult:
    """Run argv (a list, never a shell string), logging each output line as `[label] line`.

    on_line: also called with each line (without its newline) as it arrives, quiet or not, e.g. to collect lines of
    one kind for a summary at the end.
    """
    tail: deque[str] = deque(maxlen=50)
    marked: str | None = None
    proc = subprocess.Popen(
        list(argv), env=child_environment(env), cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="backslashreplace", bufsize=1,
        start_new_session=True,
    )
    try:
        with _group_killed_on_sigterm(proc.pid, label), _group_killed_when_orphaned(proc.pid, label):
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                if ERROR_MARKER in line:
                    marked = line.split(ERROR_MARKER, 1)[1].strip()
                if on_line is not None:
                    on_line(line)
                if not any(line.startswith(p) for p in quiet_prefixes):
                    log.info("[%s] %s", label, line)
            returncode = proc.wait()
    finally:
        if proc.poll() is None:
            log.warning("[%s] stopping child process group %d", label, proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return ProcessResult(returncode, _pick_error_line(tuple(tail), marked), tuple(tail))


@dataclass(frozen=True)
class ChildCommand:
    """One child of a group: its argv (a list, never a shell string), environment and log label."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    label: str = "child"


@dataclass(frozen=True)
class GroupResult:
    results: tuple[ProcessResult, ...]  # in the order the children were given
    first_failed: int | None  # index of the first child that exited non-zero (the cause); None if all succeeded

    @property
    def ok(self) -> bool:
        return self.first_failed is None


def _read_lines(proc: subprocess.Popen, label: str, tail: deque[str], marked: list[str],
                quiet_prefixes: Sequence[str], finished: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        if ERROR_MARKER in line:
            marked.append(line.split(ERROR_MARKER, 1)[1].strip())
        if not any(line.startswith(p) for p in quiet_prefixes):
            log.info("[%s] %s", label, line)
    finished.put(proc)


def _signal_groups(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)


def run_streaming_group(children: Sequence[ChildCommand], cwd: str | None = None, label: str = "group",
                        quiet_prefixes: Sequence[str] = (), stop_grace_s: float = 20.0) -> GroupResult:
    """Run several children at once (e.g. the workers of one distributed job), logging each line as
    `[child label] line`. They succeed or fail together: when one exits non-zero the others are stopped (SIGTERM
    to their process groups, SIGKILL after `stop_grace_s`), because the survivors of a collective job would wait
    for the dead one forever. Each child runs in its own session and is stopped with the task, as in
    run_streaming."""
    tails = [deque(maxlen=50) for _ in children]
    marks: list[list[str]] = [[] for _ in children]
    finished: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    first_failed: int | None = None
    try:
        for child in children:
            procs.append(subprocess.Popen(
                list(child.argv), env=child_environment(child.env), cwd=cwd,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                errors="backslashreplace", bufsize=1, start_new_session=True))
        readers = [threading.Thread(target=_read_lines, name=f"reader-{child.label}", daemon=True,
                                    args=(proc, child.label, tails[i], marks[i], quiet_prefixes, finished))
                   for i, (child, proc) in enumerate(zip(children, procs))]
        for reader in readers:
            reader.start()
        pgids = [proc.pid for proc in procs]
        with _group_killed_on_sigterm(pgids, label), _group_killed_when_orphaned(pgids, label):
            pending, stopping_since = len(procs), None
            while pending:
                try:
                    proc = finished.get(timeout=0.5)
                except queue.Empty:
                    if stopping_since is not None and time.monotonic() - stopping_since > stop_grace_s:
                        _signal_groups(procs, signal.SIGKILL)
                    continue
                pending -= 1
                index = procs.index(proc)
                if proc.wait() != 0 and first_failed is None:
                    first_failed = index
                    log.warning("[%s] %s exited %d: stopping the other %d", label, children[index].label,
                                proc.returncode, sum(p.poll() is None for p in procs))
                    _signal_groups(procs, signal.SIGTERM)
                    stopping_since = time.monotonic()
            for reader in readers:
                reader.join(timeout=5)
    finally:
        running = [proc for proc in procs if proc.poll() is None]
        if running:
            log.warning("[%s] stopping %d child process group(s)", label, len(running))
            _signal_groups(running, signal.SIGTERM)
            for proc in running:
                try:
                    proc.wait(timeout=stop_grace_s)
                except subprocess.TimeoutExpired:
                    _signal_groups([proc], signal.SIGKILL)
                    proc.wait()
    results = tuple(ProcessResult(proc.returncode, _pick_error_line(tuple(tail), mark[-1] if mark else None),
                                  tuple(tail)) for proc, tail, mark in zip(procs, tails, marks))
    return GroupResult(results=results, first_failed=first_failed)
