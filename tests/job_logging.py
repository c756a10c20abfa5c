"""What tests that call a job's main() in-process share: the jobs' configure_logging replaces the root logger's
handlers (force=True) and sets its level; `root_logging_kept` gives pytest's back afterwards."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def root_logging_kept() -> Iterator[None]:
    """Restore the root logger's handlers and level as they were on entry."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
