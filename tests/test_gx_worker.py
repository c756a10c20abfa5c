"""Great Expectations in its worker process (tasks.core.validation.start_gx_worker / run_gx_suites).

Each case runs in a fresh interpreter: the point is what happens in a process that has not imported GX yet (the
pytest process has, through other tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import CRITEO_SAMPLE, REPO


def run_script(body: str) -> dict:
    """Run `body` in a fresh interpreter at the repo root; it prints one JSON line last, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=REPO, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "leaked semaphore" not in done.stderr  # the worker ends without leaving anything to the tracker
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_suites_run_in_the_worker_and_this_process_never_imports_gx():
    result = run_script(f"""
        import json, os, sys
        from tasks.core import validation
        from tasks.criteo.gx_suite import run_raw_suite
        validation.start_gx_worker()
        lines = open({str(CRITEO_SAMPLE)!r}, "rb").read().split(b"\\n")[:50]
        good = run_raw_suite(lines, mostly=0.99)
        bad = run_raw_suite([b"2\\t" + line.split(b"\\t", 1)[1] for line in lines], mostly=0.99)  # labels of 2
        print(json.dumps({{"good": good["success"], "bad": bad["success"],
                           "checked": good["statistics"]["evaluated_expectations"],
                           "worker": validation._gx_worker.process.pid != os.getpid(),
                           "gx_here": "great_expectations" in sys.modules}}))
    """)
    assert result["good"] is True and result["bad"] is False
    assert result["checked"] == 1 + 1 + 2 + 13 + 26  # columns, field count, label set + not null, 39 value rules
    assert result["worker"] is True and result["gx_here"] is False


def test_the_worker_does_not_run_the_parent_main_script(tmp_path):
    """An Airflow task's main module is the `airflow` script: multiprocessing's spawn would run it (its imports, ~1.7
    s of CPU) in the worker before anything else. The worker is a plain `python -m` child instead."""
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        marker = {str(tmp_path / "ran")!r}
        open(marker, "a").write(__name__ + "\\n")
        if __name__ == "__main__":
            from tasks.core import validation
            from tasks.criteo.gx_suite import run_raw_suite
            validation.start_gx_worker()
            lines = open({str(CRITEO_SAMPLE)!r}, "rb").read().split(b"\\n")[:10]
            print(json.dumps({{"success": run_raw_suite(lines, mostly=0.99)["success"]}}))
    """))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"success": True}
    assert (tmp_path / "ran").read_text().split() == ["__main__"]  # the script ran once, in its own process only


def test_a_dead_worker_falls_back_to_this_process():
    result = run_script(f"""
        import json, logging, sys
        logging.basicConfig(level=logging.WARNING)
        from tasks.core import validation
        from tasks.criteo.gx_suite import run_raw_suite
        validation.start_gx_worker()
        worker = validation._gx_worker
        worker.process.kill()
        worker.process.wait()
        lines = open({str(CRITEO_SAMPLE)!r}, "rb").read().split(b"\\n")[:20]
        result = run_raw_suite(lines, mostly=0.99)
        print(json.dumps({{"success": result["success"], "gx_here": "great_expectations" in sys.modules,
                           "worker_left": validation._gx_worker is not None}}))
    """)
    assert result["success"] is True and result["gx_here"] is True and result["worker_left"] is False
    assert "Great Expectations worker process is gone" in result["stderr"]


def test_a_thread_gives_its_slot_back_once_when_it_starts_waiting_for_gx(monkeypatch):
    """releasing_while_gx_runs: the slot of a validation goes back when its GX wait begins (the next one starts on
    the cores meanwhile), once, and only inside the block."""
    from tasks.core import validation

    calls = []
    monkeypatch.setattr(validation, "_gx_worker", None)
    monkeypatch.setattr(validation, "run_gx_suites_here", lambda frames, name: calls.append(name) or {})
    with validation.releasing_while_gx_runs(lambda: calls.append("released")):
        validation.run_gx_suites({}, "a")
        validation.run_gx_suites({}, "b")
    validation.run_gx_suites({}, "c")
    assert calls == ["released", "a", "b", "c"]


def test_an_ingest_day_holds_a_slot_until_its_gx_wait_and_none_starts_after_a_failure(monkeypatch):
    import threading
    from concurrent.futures import CancelledError

    import pytest

    from tasks.core import validation
    from tasks.criteo import cli as criteo_cli

    slots, stop, seen = threading.Semaphore(1), threading.Event(), []

    def day_steps(args, settings, day, with_day_stats):
        seen.append(slots.acquire(blocking=False))  # False: this day holds the only slot
        validation.run_gx_suites({}, f"day {day}")
        seen.append(slots.acquire(blocking=False))  # True: given back as the GX wait began
        slots.release()
        return [f"records of day {day}"]

    monkeypatch.setattr(criteo_cli, "_ingest_day_records", day_steps)
    monkeypatch.setattr(validation, "_gx_worker", None)
    monkeypatch.setattr(validation, "run_gx_suites_here", lambda frames, name: {})
    assert criteo_cli._ingest_day_in_slot(slots, stop, None, None, 0, True) == ["records of day 0"]
    assert seen == [False, True]
    assert slots.acquire(blocking=False) and not slots.acquire(blocking=False)  # given back once, not twice
    slots.release()
    stop.set()
    with pytest.raises(CancelledError, match="day 1 not started"):
        criteo_cli._ingest_day_in_slot(slots, stop, None, None, 1, True)
    assert slots.acquire(blocking=False)  # a day that does not start gives its slot back
