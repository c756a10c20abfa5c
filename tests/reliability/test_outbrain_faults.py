"""outbrain_wide_deep under SIGKILL and bad input.

- Wide & Deep training killed mid-run (2 tf.distribute workers and their launcher, all frozen and killed at once as
  a machine death would) after the chief's first checkpoint leaves nothing partial marked complete; the retry (a new
  process, same inputs and output folder, as Airflow's) resumes from the chief's last checkpoint and ends at the
  step count, and about the MAP@12, of an uninterrupted run.
- The features step killed while its TFRecord writer child (`python -m tasks.formats.tfrecord`, after spark-submit)
  writes leaves no features manifest and nothing partial marked complete; a rerun in a fresh process builds a
  dataset that validate_dataset passes, with the row counts the Spark job of the killed attempt had found.
- Bad events over the budget fail outbrain_ingest's `validate` on its first try with one line naming file, line and
  column, leave no validated manifest and announce nothing; outbrain_wide_deep on a snapshot never ingested fails
  `resolve_run` at once with one line naming the DAG to run.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tasks.core.config import Settings
from tasks.core.storage import MANIFEST_NAME
from tasks.outbrain import layout
from tasks.outbrain.synthetic import write_snapshot
from tests.conftest import airflow_init, airflow_test_env, run_dag
from tests.reliability.faults import (assert_nothing_partial_marked_complete, chief_checkpoint_step, finish_child,
                                      kill_tree, leftover_temporaries, tagged_child)

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

# tests/test_wide_deep_train.py's tiny model (TINY) for 3 epochs: 2 workers x ~17 steps an epoch, a checkpoint every
# 10 steps.
EPOCHS, CHECKPOINT_EVERY = 3, 10
WRITER_MODULE = "tasks.formats.tfrecord"
# The features knobs of the kill test: one row per Example makes the writer do ~4,400 blocks for the train mapping
# (seconds of writing, not milliseconds), so the kill lands while its shards are open and half written.
# Two shuffle partitions: the local profile's 8 only add Spark tasks on a snapshot this small.
FEATURES = {"seed": 0, "prebatch_size": 1, "shards": 4, "spark_conf": {"spark.sql.shuffle.partitions": "2"}}
SPARK = "local[2]"

_TRAIN = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")  # the workers' lines, as the task log shows them
from tasks.core.launch import train_with_tf_workers
result = train_with_tf_workers("models.wide_deep.train", Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]),
                               workers=2, label="train")
print("RESULT " + json.dumps(result["metrics"]))
"""

# The features task body (tasks.outbrain.wide_deep.build_features without the run dict), in its own process.
_FEATURES = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s %(message)s")
from tasks.core.config import Settings
from tasks.outbrain.features import build_features
root, tables, out, knobs = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
result = build_features(Settings(data_root=root), tables, out, spark_master=sys.argv[5], **knobs)
print("RESULT " + json.dumps(result), flush=True)
"""


def _killed_output(proc: subprocess.Popen) -> str:
    output, _ = proc.communicate(timeout=30)
    return output


# ---- 1. training killed after a checkpoint --------------------------------------------------------------------------


def test_sigkill_during_two_worker_wide_deep_training_then_retry_resumes_and_ends_like_a_clean_run(tmp_path: Path):
    pytest.importorskip("tensorflow")
    from tests.test_wide_deep_train import TINY
    from tests.wide_deep_fakes import make_planted_tfrecords

    config = {**TINY, "epochs": EPOCHS, "checkpoint_every_steps": CHECKPOINT_EVERY}
    dataset = make_planted_tfrecords(tmp_path / "dataset")
    clean, _ = finish_child(_train(dataset, tmp_path / "clean", config, "wd-clean"))
    assert clean["workers"] == 2 and clean["resumed_from_step"] is None

    out = tmp_path / "killed"
    proc = _train(dataset, out, config, "wd-killed")
    deadline = time.monotonic() + 300
    while chief_checkpoint_step(out) < CHECKPOINT_EVERY and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    assert proc.poll() is None, "training finished before a checkpoint could be interrupted:\n" + \
        _killed_output(proc)[-3000:]
    workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if "models.wide_deep.train" in " ".join(p.cmdline())]
    killed = kill_tree(proc, "wd-killed")
    assert len(workers) == 2 and {p.pid for p in workers} <= set(killed)  # the launcher and both workers
    log = _killed_output(proc)
    assert "finished:" not in log, log[-3000:]  # killed mid-run, not at its end
    assert not (out / "metrics.json").exists() and not (out / MANIFEST_NAME).exists()
    assert not (out / "model.weights.h5").exists()
    assert_nothing_partial_marked_complete(tmp_path)
    # TensorFlow's own pointer (the `checkpoint` index, rewritten by rename) names a checkpoint that reads whole.
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    assert latest and tf.train.load_checkpoint(latest).get_variable_to_shape_map()
    last_checkpoint = chief_checkpoint_step(out)

    resumed, log = finish_child(_train(dataset, out, config, "wd-retry"))
    step = int(re.search(r"\[rank 0\] resumed from step (\d+)", log).group(1))
    assert step >= CHECKPOINT_EVERY and step == last_checkpoint
    assert resumed["resumed_from_step"] == step
    assert resumed["steps"] == clean["steps"] == EPOCHS * clean["steps_per_epoch"]
    assert [r["epoch"] for r in resumed["history"]] == list(range(EPOCHS))
    assert resumed["map@12"] == pytest.approx(clean["map@12"], abs=0.02)
    assert resumed["map@12"] > resumed["random_map@12"] + 0.05, resumed
    assert (out / MANIFEST_NAME).is_file() and not list(tmp_path.rglob(".tmp-checkpoints-worker*"))
    assert_nothing_partial_marked_complete(tmp_path)


def _train(dataset: Path, out: Path, config: dict, tag: str) -> subprocess.Popen:
    return tagged_child(_TRAIN, [str(dataset), str(out), json.dumps(config)], tag)


# ---- 2. the TFRecord writer killed while it writes -------------------------------------------------------------------


def _validated_snapshot(root: Path, displays: int, seed: int) -> Path:
    from tasks.outbrain.ingest import download_snapshot, validate_snapshot
    from tasks.outbrain.settings import OutbrainSettings

    write_snapshot(layout.source_dir(root), displays=displays, seed=seed)
    settings, outbrain = Settings(data_root=root), OutbrainSettings()
    download_snapshot(settings, "kaggle", outbrain=outbrain)
    validate_snapshot(settings, "kaggle", outbrain=outbrain)
    return layout.validated_dir(root, "kaggle")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _writer(proc: subprocess.Popen) -> tuple[psutil.Process, Path] | None:
    """The TFRecord writer child of the features task and its output folder, once records of its shards are on disk
    (TensorFlow's writer flushes every 4 KiB: a few Examples)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            argv = child.cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        if WRITER_MODULE in argv and "--output" in argv:
            output = Path(argv[argv.index("--output") + 1])
            if any(_size(shard) for shard in output.glob("part-*.tfrecord")):
                return child, output
    return None


def test_sigkill_of_the_tfrecord_writer_marks_nothing_complete_and_a_rerun_builds_the_whole_dataset(
        tmp_path: Path):
    from tasks.outbrain.features import DatasetInvalid, validate_dataset

    root = tmp_path / "data"
    tables = _validated_snapshot(root, displays=1500, seed=4)
    clicks = json.loads((tables / MANIFEST_NAME).read_text())["extra"]["tables"]["clicks_train"]["good"]
    out = layout.features_root(root) / "kaggle-kill"
    args = [str(root), str(tables), str(out), json.dumps(FEATURES), SPARK]

    proc = tagged_child(_FEATURES, args, "ob-features-killed")
    deadline = time.monotonic() + 300
    while (found := _writer(proc)) is None:
        assert proc.poll() is None, "the features step ended before its writer could be caught:\n" + \
            _killed_output(proc)[-3000:]
        assert time.monotonic() < deadline, "no TFRecord writer writing within 300 s"
        time.sleep(0.02)
    writer, shards = found
    killed = kill_tree(proc, "ob-features-killed")
    assert writer.pid in killed
    log = _killed_output(proc)
    assert "RESULT " not in log and "features built" not in log, log[-3000:]
    tmp = shards.parents[1]  # <features root>/.tmp-kaggle-kill~...: the killed attempt's temporary
    assert tmp.parent == out.parent and tmp.name.startswith(".tmp-kaggle-kill")
    # Spark had finished (it wrote its stats) and the writer was part way through its shards: a kill mid-write.
    spark_stats = json.loads((tmp / "stats.json").read_text())
    torn = sum(_size(shard) for shard in shards.glob("part-*.tfrecord"))
    assert torn > 0 and not (tmp / "tfrecords" / f"_{shards.name}.json").exists()  # the writer's summary: not yet
    assert not (tmp / MANIFEST_NAME).exists()
    assert not out.exists()  # readers see no features dataset at all, let alone one marked complete
    with pytest.raises(DatasetInvalid, match="no _MANIFEST.json"):
        validate_dataset(out)
    assert_nothing_partial_marked_complete(root)

    rerun, rerun_log = finish_child(tagged_child(_FEATURES, args, "ob-features-retry"))
    assert not rerun["cached"] and "removed 1 leftover temporaries" in rerun_log
    checked = validate_dataset(out)
    rows = {"train": spark_stats["train"]["rows"], "test": spark_stats["test"]["rows"]}
    assert rerun["rows"] == checked["rows"] == rows and checked["prebatch_size"] == 1
    assert rows["train"] + rows["test"] == clicks  # every validated click is in one split
    stats = json.loads((out / "stats.json").read_text())
    assert {m: stats["tfrecords"][m]["rows"] for m in rows} == rows
    assert torn < sum(_size(shard) for shard in (out / "tfrecords" / shards.name).glob("part-*.tfrecord"))
    assert not leftover_temporaries(layout.features_root(root))
    assert_nothing_partial_marked_complete(root)


# ---- 3. bad input through Airflow ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    home, data = tmp_path_factory.mktemp("airflow"), tmp_path_factory.mktemp("data")
    return airflow_init(airflow_test_env(home, data))


def _break_events(source: Path, lines: list[int]) -> None:
    """Give events.csv an out-of-range timestamp on each of `lines` (1 = the header) and republish SHA256SUMS."""
    path = source / "events.csv"
    text = path.read_text().split("\n")
    column = text[0].split(",").index("timestamp")
    for number in lines:
        fields = text[number - 1].split(",")
        fields[column] = "99999999999"
        text[number - 1] = ",".join(fields)
    path.write_text("\n".join(text))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums = source / "SHA256SUMS"
    sums.write_text("".join(f"{digest}  events.csv\n" if row.endswith("  events.csv") else row + "\n"
                            for row in sums.read_text().splitlines()))


def test_bad_events_fail_validation_once_with_one_line_and_announce_nothing(airflow_env):
    root = Path(airflow_env["RECFLOW_DATA_ROOT"])
    source = layout.source_dir(root)
    write_snapshot(source, displays=300, seed=2)
    bad = list(range(40, 300, 30))  # 9 of 300 events: 3%, over the 0.1% budget
    _break_events(source, bad)
    run = run_dag(airflow_env, "outbrain_ingest", {"snapshot": "broken"}, timeout=600)
    assert run["state"] == "failed"
    tasks = run["tasks"]
    assert tasks["download"]["state"] == "success", run["log"][-4000:]
    assert tasks["validate"]["state"] == "failed" and tasks["validate"]["try_number"] == 1  # bad input: no retry
    assert tasks["announce"]["state"] == "upstream_failed"
    errors = [line for line in run["log"].splitlines()
              if "DataQualityError" in line and "events.csv line 40 column timestamp" in line]
    assert errors, run["log"][-4000:]
    assert "events.csv line 40 column timestamp: '99999999999' is not in 0..1295999999 (9 bad rows of 300, " \
        in errors[0] and "budget" in errors[0], errors[0]
    validated = layout.validated_dir(root, "broken")
    assert not (validated / MANIFEST_NAME).exists()
    quarantined = [json.loads(line) for line in (validated / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(q["line"] for q in quarantined if q["file"] == "events.csv") == bad
    assert_nothing_partial_marked_complete(layout.validated_dir(root, "broken").parent)


def test_training_a_snapshot_never_ingested_fails_at_once_with_one_line(airflow_env):
    run = run_dag(airflow_env, "outbrain_wide_deep", {"profile": "demo", "snapshot": "unseen"}, timeout=600)
    assert run["state"] == "failed"
    assert run["tasks"]["resolve_run"]["state"] == "failed" and run["tasks"]["resolve_run"]["try_number"] == 1
    assert all(t["state"] == "upstream_failed" for name, t in run["tasks"].items() if name != "resolve_run"), \
        run["tasks"]
    lines = [line for line in run["log"].splitlines() if "Outbrain snapshot unseen is not ingested" in line]
    assert lines, run["log"][-4000:]
    assert "run outbrain_ingest with snapshot=unseen first" in lines[0]
