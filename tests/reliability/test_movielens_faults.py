"""movielens_ncf under SIGKILL and bad input.

- Training killed mid-run (2 tf.distribute workers, their launcher, all frozen and killed at once as a machine death
  would) leaves nothing partial marked complete; the retry (a new process, same inputs and output folder, as
  Airflow's) resumes from the chief's last checkpoint and ends where an uninterrupted run ends.
- Bad ratings over the budget fail `validate` on its first try with one line naming file, line and column, leave no
  manifest, and announce nothing (so no retraining starts); a training run on a snapshot never ingested fails
  `resolve_run` at once with one line naming the DAG to run.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tasks.movielens import layout
from tasks.movielens.synthetic import write_archive
from tests.conftest import airflow_init, airflow_test_env, run_dag
from tests.reliability.faults import (assert_nothing_partial_marked_complete, chief_checkpoint_step, finish_child,
                                      kill_tree, tagged_child)
from tests.test_ncf_train import TINY, make_planted_dataset

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

CONFIG = {**TINY, "epochs": 4, "checkpoint_every_steps": 10, "seed": 3}
_TRAIN = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")  # the workers' lines, as the task log shows them
from tasks.core.launch import train_with_tf_workers
result = train_with_tf_workers("models.ncf.train", Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]),
                               workers=2, label="train")
print("RESULT " + json.dumps(result["metrics"]))
"""


def _train(dataset: Path, out: Path, tag: str) -> subprocess.Popen:
    return tagged_child(_TRAIN, [str(dataset), str(out), json.dumps(CONFIG)], tag)


def test_sigkill_during_two_worker_training_then_retry_resumes_and_ends_like_a_clean_run(tmp_path: Path):
    dataset = make_planted_dataset(tmp_path / "dataset")
    clean, _ = finish_child(_train(dataset, tmp_path / "clean", "ncf-clean"))

    out = tmp_path / "killed"
    proc = _train(dataset, out, "ncf-killed")
    deadline = time.monotonic() + 300
    while chief_checkpoint_step(out) < CONFIG["checkpoint_every_steps"] and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    assert proc.poll() is None, "training finished before a checkpoint could be interrupted"
    killed = kill_tree(proc, "ncf-killed")
    assert len(killed) >= 3  # the launcher and both workers
    assert not (out / "metrics.json").exists() and not (out / "_MANIFEST.json").exists()
    assert_nothing_partial_marked_complete(tmp_path)
    # TensorFlow's own pointer (the `checkpoint` index, rewritten by rename) names a checkpoint that reads whole.
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    assert latest and tf.train.load_checkpoint(latest).get_variable_to_shape_map()

    resumed, log = finish_child(_train(dataset, out, "ncf-retry"))
    step = int(re.search(r"resumed from step (\d+)", log).group(1))
    assert step >= CONFIG["checkpoint_every_steps"]
    assert resumed["steps"] == clean["steps"] and resumed["resumed_from_step"] == step
    assert resumed["hr@10"] == pytest.approx(clean["hr@10"], abs=0.02)
    assert resumed["hr@10"] >= 3 * resumed["random_hr@10"]
    assert_nothing_partial_marked_complete(tmp_path)


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    home, data = tmp_path_factory.mktemp("airflow"), tmp_path_factory.mktemp("data")
    return airflow_init(airflow_test_env(home, data))


def test_bad_ratings_fail_validation_once_with_one_line_and_announce_nothing(airflow_env):
    root = Path(airflow_env["RECFLOW_DATA_ROOT"])
    bad = {line: "3,17,7.5,1200000000" for line in range(40, 400, 30)}  # 12 of ~2,400 rows: over the 0.1% budget
    write_archive(layout.source_dir(root), "ml-20m", users=100, items=150, ratings_per_user=24, seed=2, bad_lines=bad)
    run = run_dag(airflow_env, "movielens_ingest", {"dataset": "ml-20m"}, timeout=600)
    assert run["state"] == "failed"
    tasks = run["tasks"]
    assert tasks["download"]["state"] == "success"
    assert tasks["validate"]["state"] == "failed" and tasks["validate"]["try_number"] == 1  # bad input: no retry
    assert tasks["announce"]["state"] == "upstream_failed"
    errors = [line for line in run["log"].splitlines() if "DataQualityError" in line and "line 40 column rating" in line]
    assert errors, run["log"][-4000:]
    assert "ratings.csv line 40 column rating: '7.5'" in errors[0] and "budget" in errors[0]
    validated = layout.validated_dir(root, "ml-20m")
    assert not (validated / "_MANIFEST.json").exists()
    quarantined = [json.loads(line) for line in (validated / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(q["line"] for q in quarantined) == sorted(bad)


def test_training_a_snapshot_never_ingested_fails_at_once_with_one_line(airflow_env):
    run = run_dag(airflow_env, "movielens_ncf", {"profile": "demo", "dataset": "ml-1m"}, timeout=600)
    assert run["state"] == "failed"
    assert run["tasks"]["resolve_run"]["state"] == "failed" and run["tasks"]["resolve_run"]["try_number"] == 1
    assert all(t["state"] == "upstream_failed" for name, t in run["tasks"].items() if name != "resolve_run")
    assert "MovieLens snapshot ml-1m is not ingested" in run["log"] and "run movielens_ingest with dataset=ml-1m" in \
        run["log"]
