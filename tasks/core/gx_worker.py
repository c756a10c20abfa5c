"""`python -m tasks.core.gx_worker`: Great Expectations in a process of its own (tasks.core.validation.start_gx_worker).

It imports GX as soon as it starts, then answers pickled (frames, source name) requests read from stdin with pickled
(ok, results or traceback) written to stdout, one at a time, until stdin closes. It is started as a plain child
process: multiprocessing's spawn would first run the parent's main script in it (in an Airflow task, the `airflow`
script's imports, ~1.7 s of CPU).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import traceback


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the answers' own channel; fd 1 now goes to stderr, so nothing that a
    os.dup2(2, 1)                         # library prints can corrupt them
    import tqdm

    # GX's progress bars would create tqdm's default lock, a named multiprocessing semaphore, which a terminated
    # worker leaves to the resource tracker (a warning at exit); progress bars are off here, a thread lock will do.
    tqdm.tqdm.set_lock(threading.RLock())
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its import logs hundreds of INFO lines
    import great_expectations  # noqa: F401 - the import is the point: done before the first request

    from tasks.core.validation import run_gx_suites_here

    requests = sys.stdin.buffer
    while True:
        try:
            # stdin is the pipe from the parent that started this worker; nothing else can write to it.
            frames, source_name = pickle.load(requests)  # nosec B301
        except EOFError:
            return
        try:
            answer = (True, run_gx_suites_here(frames, source_name))
        except Exception:  # noqa: BLE001 - reported to the caller, who raises it with this traceback
            answer = (False, traceback.format_exc(limit=5))
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    main()
