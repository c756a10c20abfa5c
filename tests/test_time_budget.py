"""The training time budget: the verdict (models/common/time_budget.py), the launcher's reading of it and what a
task's attempts have left (tasks/dagkit/training.py)."""
from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from models.common.time_budget import MIN_MEASURED_S, too_slow
from tasks.core.dlrm_knobs import time_budget
from tasks.core.launch import CannotRunHere, TrainingFailed, TrainingTooSlow, _training_failed
from tasks.dagkit.training import attempts_time_left


def test_a_run_is_stopped_only_once_its_rate_is_measured_and_its_need_exceeds_the_budget() -> None:
    budget = 3 * 72 * 3600.0  # three attempts of a 72 h timeout
    cpu = 4.4e9 / 4_863  # NVIDIA's window at this machine's CPU rate: ~251 h
    assert too_slow(budget, MIN_MEASURED_S - 1, cpu, 4_863) is None  # not measured long enough yet
    assert too_slow(0, MIN_MEASURED_S, cpu, 4_863) is None  # no budget
    assert too_slow(budget, MIN_MEASURED_S, 4.4e9 / 5.5e6, 5.5e6) is None  # an H200: ~13 min
    line = too_slow(budget, MIN_MEASURED_S, cpu, 4_863)
    assert line == ("training too slow: at 4,863 samples/s this run needs ~251:24:51, more than the 216:00:00 its "
                    "task has left over its attempts (execution_timeout x attempts): train on a GPU (device), with "
                    "more processes (nproc), or on fewer rows (a shorter window, limit_train_batches)")


def test_the_launcher_fails_a_too_slow_run_without_retry_and_any_other_failure_with() -> None:
    slow = _training_failed("training worker 1 of 2 exited 1",
                            "models.common.time_budget.TrainingTooSlowError: training too slow: at 10 samples/s ...")
    assert isinstance(slow, TrainingTooSlow) and str(slow) == "training too slow: at 10 samples/s ..."
    refused = _training_failed("training exited 1", "cannot run here: 4 processes on this node but torch sees 2 GPU(s)")
    assert isinstance(refused, CannotRunHere) and str(refused).startswith("cannot run here: 4 processes")
    other = _training_failed("training exited 1", "RuntimeError: CUDA out of memory")
    assert isinstance(other, TrainingFailed) and str(other) == "training exited 1: RuntimeError: CUDA out of memory"


def test_a_task_has_its_timeout_for_this_attempt_and_each_retry_left() -> None:
    def ti(try_number: int, max_tries: int, timeout: timedelta | None) -> SimpleNamespace:
        return SimpleNamespace(try_number=try_number, max_tries=max_tries,
                               task=SimpleNamespace(execution_timeout=timeout))

    hours = timedelta(hours=72)
    one = 72 * 3600.0
    assert attempts_time_left(ti(1, 2, hours)) == {"time_budget_s": 3 * one, "attempt_time_s": one}  # 2 retries
    assert attempts_time_left(ti(3, 2, hours))["time_budget_s"] == one  # the last try
    assert attempts_time_left(ti(4, 5, hours))["time_budget_s"] == 3 * one  # cleared after try 3: 3 + retries
    assert attempts_time_left(ti(1, 2, None)) == {"time_budget_s": 0.0, "attempt_time_s": 0.0}


def test_a_run_that_resumes_has_every_attempt_and_one_that_starts_over_has_one() -> None:
    budget = {"time_budget_s": 300.0, "attempt_time_s": 100.0}
    by_time = {"checkpoint_every_minutes": 15, "checkpoint_every_steps": 0}
    assert time_budget({"knobs": by_time, **budget}) == 300.0
    assert time_budget({"knobs": {"checkpoint_every_minutes": 0, "checkpoint_every_steps": 50}, **budget}) == 300.0
    assert time_budget({"knobs": {"checkpoint_every_minutes": 0, "checkpoint_every_steps": 0}, **budget}) == 100.0
    assert time_budget({"knobs": by_time}) == 0.0  # outside a train task: no check


def test_the_shared_tasks_fail_a_refusal_of_the_node_without_retry_and_retry_other_errors(monkeypatch) -> None:
    """train, evaluate and gate turn CannotRunHere (a trainer's or evaluator's refusal of the node) into Airflow's
    no-retry failure; any other error stays itself, so Airflow retries it."""
    import sys

    from airflow.sdk.exceptions import AirflowFailException

    from tasks.dagkit.training import training_tasks

    def refuse(*args, **kwargs):
        raise CannotRunHere("cannot run here: device 'cuda' requested but torch 2.13.0+cpu sees no CUDA device")

    def fail(*args, **kwargs):
        raise TrainingFailed("evaluation exited 1: OSError: disk full")

    from tasks.release.runs import RunPaths

    pipeline = {"name": "refusing", "paths": RunPaths}  # no rebuildable outputs: the pruned-run check passes
    steps = SimpleNamespace(SPEC=SimpleNamespace(train=refuse, evaluate=refuse, gate=refuse, **pipeline))
    monkeypatch.setitem(sys.modules, "tests.refusing_steps", steps)
    shared = training_tasks("tests.refusing_steps", record_failure=lambda context: None)
    ti = SimpleNamespace(try_number=1, max_tries=2, task=SimpleNamespace(execution_timeout=None))
    params = {"model_name": "m", "aws_conn_id": "aws_default"}
    calls = {"train": lambda: shared.train.function({}, {}, run_id="r", ti=ti),
             "evaluate": lambda: shared.evaluate.function({}, {}, run_id="r"),
             "gate": lambda: shared.gate.function({}, {}, run_id="r", params=params)}
    for call in calls.values():
        with pytest.raises(AirflowFailException, match="CannotRunHere: cannot run here: device 'cuda'"):
            call()
    steps.SPEC = SimpleNamespace(train=fail, evaluate=fail, gate=fail, **pipeline)
    for call in calls.values():
        with pytest.raises(TrainingFailed, match="disk full"):
            call()


def test_a_model_child_refusing_its_node_is_cannot_run_here_and_its_tensorflow_grows_into_the_gpu(
        tmp_path, monkeypatch) -> None:
    """run_module (evaluation, export, scoring): a child's marked refusal is CannotRunHere (the evaluate and gate
    tasks do not retry it), and a TensorFlow child is told to take GPU memory as it needs it (it sees the worker's
    GPUs beside other jobs' processes)."""
    from tasks.core.launch import run_module

    (tmp_path / "refusing_child.py").write_text(
        "import os, sys\n"
        "open(sys.argv[1], 'w').write(os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH', 'unset'))\n"
        "print('RECFLOW-ERROR: cannot run here: device cuda on a CPU build', flush=True)\n"
        "sys.exit(1)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    with pytest.raises(CannotRunHere, match="^cannot run here: device cuda on a CPU build$"):
        run_module("refusing_child", [str(tmp_path / "env")], label="evaluate", what="evaluation")
    assert (tmp_path / "env").read_text() == "true"
