"""tasks.core.process.run_streaming stops its child when the process that started the task dies (issue #5): the shape
of a LocalExecutor scheduler killed with SIGKILL, which takes the task's supervisor with it but not the task
runner (own process group) nor its spark-submit (own session). tests/integration/test_scheduler_restart.py checks
the same through a real scheduler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_child_is_stopped_when_the_task_runner_is_orphaned(tmp_path: Path) -> None:
    child_pid_file, runner_pid_file = tmp_path / "child.pid", tmp_path / "runner.pid"
    runner = textwrap.dedent(f"""
        import os, sys
        from tasks.core.process import run_streaming
        open({str(runner_pid_file)!r}, "w").write(str(os.getpid()))
        run_streaming([sys.executable, "-c",
                       "import os, time; open({str(child_pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"])
    """)
    # The "supervisor": starts the runner in a session of its own (as Airflow's own process group), then waits.
    supervisor = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {runner!r}], "
                               "start_new_session=True)"],
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not (child_pid_file.exists() and child_pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child, runner_pid = int(child_pid_file.read_text()), int(runner_pid_file.read_text())
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while (_alive(child) or _alive(runner_pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in (child, runner_pid) if _alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert not survivors, "the orphaned runner's child (or the runner) outlived its parent by 10 s"
    finally:
        supervisor.kill()
