"""SIGKILL fault injection for pipeline steps: run a step in a child process (tests/reliability/fault_child.py), kill
its whole process tree at a chosen moment as a machine or container death would, and check what a reader can see.

- StepProcess runs one attempt in its own session with its output captured line by line (with arrival times).
- kill_tree SIGSTOPs every process of the tree (repeating until no new descendant appears), then SIGKILLs them all,
  and proves none survives: neither a descendant nor any process carrying the attempt's environment tag (a
  process that left the tree, e.g. reparented to init, still inherits the environment).
- assert_nothing_partial_marked_complete is the reader's invariant, checked after every kill.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tasks.core.storage import MANIFEST_NAME
from tests.reliability.fault_child import READY, RESULT

REPO = Path(__file__).resolve().parents[2]
TAG_ENV = "RECFLOW_FAULT_TAG"


@dataclass
class Attempt:
    """What one child attempt did: its output lines with arrival times, the READY time, the result if it finished."""

    step: str
    lines: list[tuple[float, str]]
    started: float
    ended: float
    returncode: int | None
    result: dict[str, Any] | None
    killed_at: float | None = None
    killed_pids: list[int] = field(default_factory=list)

    @property
    def ready_at(self) -> float | None:
        return self.time_of(re.escape(READY))

    @property
    def seconds(self) -> float:
        """Duration of the step itself (from READY to exit): the clock a kill delay is measured on."""
        return self.ended - (self.ready_at or self.started)

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def time_of(self, pattern: str) -> float | None:
        """Arrival time of the first output line matching the regex, or None."""
        found = re.compile(pattern)
        return next((t for t, line in self.lines if found.search(line)), None)

    def matches(self, pattern: str, before: float | None = None) -> list[re.Match]:
        found = re.compile(pattern)
        return [m for t, line in self.lines if (before is None or t <= before) and (m := found.search(line))]

    def tail(self, n: int = 60) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


class StepProcess:
    """One attempt of a step, `python -m tests.reliability.fault_child step spec`, in its own session."""

    def __init__(self, step: str, spec: dict[str, Any], env: dict[str, str]) -> None:
        self.step = step
        self.tag = uuid.uuid4().hex
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.fault_child", step, json.dumps(spec)],
            cwd=REPO, env={**env, TAG_ENV: self.tag}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="backslashreplace", bufsize=1, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, pattern: str, timeout: float) -> float:
        """Arrival time of the first line matching the regex; fails if the child exits or times out first."""
        found = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                hit = next((t for t, line in self.lines if found.search(line)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if not self._reader.is_alive() or left <= 0:
                    tail = "\n".join(line for _, line in self.lines[-40:])
                    raise AssertionError(f"{self.step}: no line matching {pattern!r} "
                                         f"({'exited' if left > 0 else 'timed out'}); output tail:\n{tail}")
                self._changed.wait(min(left, 0.5))

    def finish(self, timeout: float) -> Attempt:
        """Wait for the child to exit (killing its tree on timeout) and return the attempt."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc, self.tag)
            raise AssertionError(f"{self.step} did not finish within {timeout:.0f} s") from None
        ended = time.monotonic()
        self._reader.join(timeout=10)
        results = [line[len(RESULT):] for _, line in self.lines if line.startswith(RESULT)]
        return Attempt(self.step, list(self.lines), self.started, ended, self.proc.returncode,
                       json.loads(results[-1]) if results else None)

    def kill_at(self, when: float) -> Attempt:
        """Sleep until the monotonic time `when`, then kill the whole tree. If the child had already exited, the
        attempt comes back with no killed pids (the caller decides: the kill came too late)."""
        time.sleep(max(0.0, when - time.monotonic()))
        alive = self.proc.poll() is None
        killed = kill_tree(self.proc, self.tag) if alive else []
        if not alive:
            self.proc.wait()
        ended = time.monotonic()
        self._reader.join(timeout=10)
        return Attempt(self.step, list(self.lines), self.started, ended, self.proc.returncode, None,
                       killed_at=ended if alive else None, killed_pids=killed)


def run_clean(step: str, spec: dict[str, Any], env: dict[str, str], timeout: float = 300) -> Attempt:
    """One uninterrupted attempt; it must succeed."""
    attempt = StepProcess(step, spec, env).finish(timeout)
    assert attempt.returncode == 0 and attempt.result is not None, (
        f"{step} failed (exit {attempt.returncode}):\n{attempt.tail()}")
    return attempt


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _dead(process: psutil.Process) -> bool:
    try:
        # A reparented zombie waits for its new parent (init may not reap here): it runs nothing, writes nothing.
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes (of any parentage) whose environment carries this attempt's tag."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(TAG_ENV) == tag and not _dead(process):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_tree(proc: subprocess.Popen, tag: str) -> list[int]:
    """SIGSTOP every process of the tree rooted at proc, then SIGKILL them all at once; returns their pids.

    Stopping first freezes the tree, so no process can fork, rename or exit cleanly between the first and the last
    kill (run_streaming puts spark-submit and torchrun in their own sessions, so killing one group is not enough).
    Asserts that nothing of the tree, and nothing carrying the attempt's tag, is left running.
    """
    root = psutil.Process(proc.pid)
    stopped: dict[int, psutil.Process] = {}
    while True:  # a process forked while we were stopping its parent shows up on the next pass
        new = [p for p in _tree(root) if p.pid not in stopped]
        if not new:
            break
        for process in new:
            try:
                process.send_signal(signal.SIGSTOP)
                stopped[process.pid] = process
            except psutil.NoSuchProcess:
                pass
    for process in stopped.values():
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (alive := [p for p in stopped.values() if not _dead(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes survived SIGKILL: {[(p.pid, p.name()) for p in alive]}"
    escaped = tagged_processes(tag)
    assert not escaped, f"processes of the killed attempt outside its tree: {[(p.pid, p.name()) for p in escaped]}"
    return sorted(stopped)


# ---- the reader's invariant ------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _visible(path: Path, root: Path) -> bool:
    """A path readers can reach: no component is a writer's temporary (.tmp-*), the download's .part or a lock."""
    return not any(part.startswith((".tmp-", ".lock-")) or part.endswith(".part")
                   for part in path.relative_to(root).parts)


def assert_manifest_verifies(directory: Path) -> dict[str, Any]:
    """The directory's manifest parses and every file it lists exists with the listed size (and sha256, where the
    manifest lists one: those of many-GB outputs list sizes only, docs/ARCHITECTURE.md "Manifests")."""
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    assert manifest["files"], f"{directory}: manifest lists no files"
    for rel, entry in manifest["files"].items():
        path = directory / rel
        assert path.is_file(), f"{directory} is marked complete but {rel} is missing"
        assert path.stat().st_size == entry["bytes"], (
            f"{directory} is marked complete but {rel} has {path.stat().st_size} bytes, manifest {entry['bytes']}")
        if "sha256" in entry:
            assert sha256(path) == entry["sha256"], f"{directory} is marked complete but {rel} differs from its sha256"
    return manifest


def assert_nothing_partial_marked_complete(root: Path) -> list[str]:
    """Every completion mark below root vouches only for complete content; returns what was checked.

    Marks: `_MANIFEST.json` (every listed file present with its size, and sha256 where listed), download sidecars
    (the file has the recorded size and sha256), publish pointers `latest.json` (name a committed version),
    checkpoint pointers (name a step file) and step files (load with the safe loader), and JSON outputs written by
    rename (parse).
    """
    checked = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or not _visible(path, root):
            continue
        rel = path.relative_to(root).as_posix()
        if path.name == MANIFEST_NAME:
            assert_manifest_verifies(path.parent)
        elif path.name.endswith(".download.json"):
            record = json.loads(path.read_text())
            data = path.with_name(path.name.removesuffix(".download.json"))
            assert data.is_file() and data.stat().st_size == record["bytes"], f"{rel} vouches for a partial {data}"
            if not record.get("decompressed"):
                assert sha256(data) == record["sha256"], f"{rel} vouches for {data} with another sha256"
        elif path.name.endswith(".sha256.json"):  # tasks.core.download.recorded_sha256: true while it matches
            record = json.loads(path.read_text())
            data = path.with_name(path.name.removesuffix(".sha256.json"))
            status = data.stat() if data.is_file() else None
            if status and [status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns] == record["identity"]:
                assert sha256(data) == record["sha256"], f"{rel} records another sha256 for the unchanged {data}"
        elif path.name == "latest.json":
            version = json.loads(path.read_text())["version"]
            committed = path.parent / "versions" / version / MANIFEST_NAME
            assert committed.is_file(), f"{rel} names {version}, which has no manifest"
        elif path.name == "latest" and path.parent.name == "checkpoints":
            assert (path.parent / path.read_text().strip()).is_file(), f"{rel} names a missing checkpoint"
        elif path.name == "model.pt" and "/export/" in f"/{rel}":
            import torch  # the TorchScript export (not a pickle): a torn archive fails to load

            torch.jit.load(str(path), map_location="cpu")
        elif re.fullmatch(r"step_\d{8,}\.pt", path.name) or (path.name == "model.pt" and "versions" not in rel):
            from models.torchkit.checkpoint import CHECKPOINT_KIND, MODEL_KIND, safe_load

            # The last checkpoint is the run's model.pt (one write, hard-linked): a model file with a checkpoint
            # section, which the trainer's resume reads as a checkpoint.
            safe_load(path, (CHECKPOINT_KIND, MODEL_KIND) if path.name != "model.pt" else MODEL_KIND)
        elif path.suffix == ".json":
            json.loads(path.read_text())
        else:
            continue
        checked.append(rel)
    return checked


# ---- comparing outputs -----------------------------------------------------------------------------------------------


def file_digests(directory: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every visible file below directory by relative path, leaving out names matching `exclude`."""
    return {p.relative_to(directory).as_posix(): sha256(p) for p in sorted(directory.rglob("*"))
            if p.is_file() and _visible(p, directory) and not any(re.fullmatch(x, p.name) for x in exclude)}


def parquet_rows(directory: Path):
    """A parquet directory's rows as a table sorted by every column (Spark names part files with a per-job UUID and
    orders rows by task completion, so two runs of a job are equal as row sets, not byte for byte)."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table()
    return table.sort_by([(name, "ascending") for name in table.column_names])


def manifest_content(directory: Path, drop: tuple[str, ...] = ("created_at",)) -> dict[str, Any]:
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    return {k: v for k, v in manifest.items() if k not in drop}


def tagged_child(code: str, args: list[str], tag: str) -> subprocess.Popen:
    """`python -c code args` in its own session, tagged for kill_tree, output captured."""
    env = {**os.environ, TAG_ENV: tag, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish_child(proc: subprocess.Popen, timeout: float = 600) -> tuple[dict, str]:
    """A child's result (the JSON after its last `RESULT ` marker) and its whole output; it must exit 0."""
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-4000:]
    return json.loads(output.rsplit("RESULT ", 1)[1].splitlines()[0]), output


def chief_checkpoint_step(out: Path) -> int:
    """The step of a TensorFlow run's newest complete chief checkpoint in out/checkpoints (0 when there is none)."""
    index = out / "checkpoints" / "checkpoint"
    if not index.is_file():
        return 0
    match = re.search(r'model_checkpoint_path: ".*?(\d+)"', index.read_text())
    return int(match.group(1)) if match else 0


def leftover_temporaries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".tmp-*"))


def env_for(data_root: Path, source_template: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the RECFLOW_* settings as a worker would have them, the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECFLOW_")}
    env.update({"RECFLOW_DATA_ROOT": str(data_root), "RECFLOW_CRITEO_SOURCE": source_template,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                "PYTHONUNBUFFERED": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                # The steps' tiny models gate at the thresholds their conf names: this test deployment lets a run
                # set any (a real one only lets a run tighten its own; tasks.core.profiles).
                "RECFLOW_RELEASE_MIN_VALUE": "0", "RECFLOW_RELEASE_MAX_REGRESSION": "1"})
    env.update(extra or {})
    return env
