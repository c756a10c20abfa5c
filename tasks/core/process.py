"""Run a child process (spark-submit, torchrun) and stream its output into the task log line by line.

Airflow shows a task's log as it is written, so each line of the child is logged when it arrives, not at the end.
The child runs in its own process group; if the task is stopped (SIGTERM, timeout, exception), the whole group is
killed so no Spark driver or trainer outlives its task. So is it when the process that started this one dies: a
task whose Airflow supervisor was killed (a SIGKILLed LocalExecutor scheduler takes its supervisors with it) is an
orphan whose result nobody collects, and the scheduler runs the task again; its child must not run on beside the
retry (two Spark jobs writing one output, and twice the CPU the pool allows).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

ERROR_MARKER = "RECFLOW-ERROR:"  # recflow's jobs print their one-line failure reason after this marker


@contextlib.contextmanager
def _group_killed_on_sigterm(pgid: int, label: str) -> Iterator[None]:
    """While the child runs, SIGTERM first stops the child's process group, then does what it did before.

    Airflow 3's task runner answers SIGTERM (run marked failed, task cleared) by calling the operator's on_kill()
    and carrying on; its supervisor SIGKILLs the task 5 s later. No exception reaches run_streaming's `finally`,
    so without this the child, in its own session, would outlive its task.
    """
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set from main thread
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def stop_child(signum, frame):
        log.warning("[%s] SIGTERM: stopping child process group %d", label, pgid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
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
def _group_killed_when_orphaned(pgid: int, label: str, poll_s: float = 1.0) -> Iterator[None]:
    """While the child runs, a watcher thread stops the child's group if this process's parent dies (the parent
    pid changes when the parent is gone: the orphan is re-parented to init or a subreaper)."""
    parent = os.getppid()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if os.getppid() != parent:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                log.warning("[%s] parent process %d died: stopped child process group %d", label, parent, pgid)
                if not done.wait(20):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
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
                  label: str = "child", quiet_prefixes: Sequence[str] = ()) -> ProcessResult:
    """Run argv (a list, never a shell string), logging each output line as `[label] line`."""
    tail: deque[str] = deque(maxlen=50)
    marked: str | None = None
    proc = subprocess.Popen(
        list(argv), env=dict(env) if env is not None else None, cwd=cwd, stdout=subprocess.PIPE,
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
