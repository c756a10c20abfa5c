"""What every preprocessing job's entry point shares, whichever engine runs it (spark_jobs/, nvt_jobs/): logging
that names the job and day, and the one marked failure line tasks.core.process picks up. Stdlib only: NVTabular's
environment imports it too."""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from tasks.core.process import ERROR_MARKER

T = TypeVar("T")
log = logging.getLogger("recflow.job")


def configure_logging(context: str) -> None:
    """Log lines to stdout prefixed with the job's context (run, day). Under spark-submit the root logger has no
    handler yet; when a test calls main() in-process, the host's handlers are kept (no force)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s %(levelname)s [{context}] %(message)s")
    logging.getLogger().setLevel(logging.INFO)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run_job(main: Callable[[Sequence[str]], T], argv: Sequence[str]) -> T:
    """Run a job's main; on failure print one marked line the task log (and tasks.core.process) can pick up."""
    start = time.monotonic()
    # A stopped job (its task's SIGTERM to the process group) unwinds instead of vanishing, so atomic_directory
    # removes its half-written temporary output; Python's default SIGTERM action runs no cleanup.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        result = main(argv)
    except Exception as exc:  # noqa: BLE001 - reported as one line, then re-raised for the exit code
        print(f"{ERROR_MARKER} {type(exc).__name__}: {exc}", flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    log.info("done in %.1f s", time.monotonic() - start)
    return result
