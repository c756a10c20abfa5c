"""Run a measured child process and record the resident memory of its whole process tree while it runs.

With psutil (installed in .venv) a sampler thread sums the RSS of the child and all its descendants (the Spark JVM,
its Python workers, torchrun's ranks) every 0.1 s; the peak is the largest sum seen, so a spike shorter than the
interval can be missed. Without psutil the only portable number is getrusage(RUSAGE_CHILDREN).ru_maxrss: the largest
RSS of any *single* waited-for descendant since this process started (never a sum, never per time window); the
result says which method produced it.

Children write their output to a log file (the Spark and Airflow chatter stays out of the console); the child runs
in its own session so an interrupted benchmark can stop the whole group it started.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    import psutil
except ImportError:  # documented fallback; the results name the method used
    psutil = None

SAMPLE_INTERVAL_S = 0.1
RSS_METHOD = ("psutil: sum of RSS over the process tree, sampled every 0.1 s; a child caught between vfork and "
              "exec (it shares its parent's memory) is skipped; pages shared between processes, e.g. forked PySpark "
              "workers, count once per process, so the sum is an upper bound" if psutil is not None else
              "getrusage(RUSAGE_CHILDREN).ru_maxrss: largest single descendant since the benchmark started")


class ChildFailed(RuntimeError):
    """A measured child exited non-zero; the message names its log file and last lines; `run` holds what was
    measured up to the failure (its wall time and RSS samples)."""

    run: ChildRun | None = None


@dataclass
class ChildRun:
    seconds: float
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time.monotonic(), tree RSS bytes)
    root_samples: list[tuple[float, int]] = field(default_factory=list)  # the child process's own RSS
    maxrss_children: int = 0  # fallback figure (bytes), see module docstring
    log_path: Path | None = None
    peak_breakdown: dict[str, int] = field(default_factory=dict)  # process name -> RSS at the overall peak sample

    def peak_rss(self, start: float | None = None, end: float | None = None) -> int:
        """Peak tree RSS between two time.monotonic() instants (CLOCK_MONOTONIC is system-wide, so a child's
        timestamps compare with ours); the fallback's single number when psutil is absent."""
        if psutil is None:
            return self.maxrss_children
        lo = float("-inf") if start is None else start
        hi = float("inf") if end is None else end
        inside = [rss for t, rss in self.samples if lo <= t <= hi]
        return max(inside) if inside else 0

    def root_rss_at(self, instant: float) -> int:
        """The child process's own RSS at its last sample before an instant (its growth from day to day)."""
        before = [rss for t, rss in self.root_samples if t <= instant]
        return before[-1] if before else 0

    def rss_before(self, instant: float) -> int:
        """The last tree RSS sample before an instant (the child's baseline before its measured work)."""
        before = [rss for t, rss in self.samples if t < instant]
        return before[-1] if before else 0


def process_tree(root: psutil.Process) -> dict[int, tuple[int, int, int, str]]:
    """pid -> (ppid, rss, vms, name) of root and all its descendants."""
    seen: dict[int, tuple[int, int, int, str]] = {}  # pid -> (ppid, rss, vms, name)
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    for proc in processes:
        try:
            with proc.oneshot():
                memory = proc.memory_info()
                seen[proc.pid] = (proc.ppid(), memory.rss, memory.vms, proc.name())
        except psutil.Error:
            continue  # exited between listing and reading
    return seen


def rss_by_name(processes: dict[int, tuple[int, int, int, str]]) -> dict[str, int]:
    """pid -> (ppid, rss, vms, name) to RSS summed per process name.

    A child caught between vfork and exec (the JVM starts PySpark's workers that way) shares its parent's memory and
    reports the parent's RSS under the name of the forking thread; it is skipped, or the JVM would count twice. Its
    signature, the parent's exact rss and vms, does not happen between two processes with their own memory.
    """
    by_name: dict[str, int] = {}
    for ppid, rss, vms, name in processes.values():
        parent = processes.get(ppid)
        if parent is not None and (parent[1], parent[2]) == (rss, vms):
            continue
        by_name[name] = by_name.get(name, 0) + rss
    return by_name


def _sample(pid: int, run: ChildRun, stop: threading.Event) -> None:
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    peak = 0
    while not stop.is_set():
        tree = process_tree(root)
        by_name = rss_by_name(tree)
        rss = sum(by_name.values())
        if rss:
            now = time.monotonic()
            run.samples.append((now, rss))
            run.root_samples.append((now, tree[pid][1] if pid in tree else 0))
        if rss > peak:
            peak, run.peak_breakdown = rss, by_name
        stop.wait(SAMPLE_INTERVAL_S)


def run_child(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
              cwd: Path | None = None, timeout: float | None = None) -> ChildRun:
    """Run argv to completion (output to log_path), sampling its tree's RSS; ChildFailed on a non-zero exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run = ChildRun(seconds=0.0, log_path=log_path)
    stop = threading.Event()
    started = time.monotonic()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(list(argv), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
        sampler = None
        if psutil is not None:
            sampler = threading.Thread(target=_sample, args=(proc.pid, run, stop), daemon=True)
            sampler.start()
        try:
            returncode = proc.wait(timeout=timeout)
        finally:
            stop.set()
            if sampler is not None:
                sampler.join()
            if proc.poll() is None:  # interrupted or timed out: stop the group this function started
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    run.seconds = time.monotonic() - started
    if returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-8:]
        failure = ChildFailed(f"{' '.join(argv[:4])} ... exited {returncode}; log {log_path}; last lines:\n"
                              + "\n".join(tail))
        failure.run = run
        raise failure
    run.maxrss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
    return run
