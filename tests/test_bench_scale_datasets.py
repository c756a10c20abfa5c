"""bench/scale_datasets.py without its heavy stages: the sizes hit ml-20m's and a tenth of Kaggle's Outbrain (checked
against the generators themselves at a small size), the NCF command line is the full profile's, and the reports
compute their figures from the stages' records. The stages themselves run in `python -m bench.scale_datasets`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scale_datasets as bench
from models.ncf.config import build_parser, config_from_namespace


def test_movielens_full_size_is_ml20m_and_the_generator_draws_its_ratings_per_user():
    from tasks.movielens.synthetic import generate_ratings

    assert bench.movielens_size(1.0) == bench.ML20M
    small = {"users": 600, "items": 1000, "ratings_per_user": bench.ML20M["ratings_per_user"]}
    drawn = generate_ratings("ml-20m", **small, seed=bench.SEED).rows / small["users"]
    ml20m_per_user = 20_000_263 / 138_493
    assert abs(drawn / ml20m_per_user - 1) < 0.03, drawn


def test_outbrain_displays_give_a_tenth_of_kaggles_click_rows():
    from tasks.outbrain.synthetic import generate_snapshot

    displays = 20_000
    per_display = generate_snapshot(displays=displays, seed=bench.SEED).tables["clicks_train"].num_rows / displays
    assert abs(bench.OUTBRAIN_10PCT_DISPLAYS * per_display / 8_700_000 - 1) < 0.03, per_display
    assert bench.outbrain_displays(0.5) == bench.OUTBRAIN_10PCT_DISPLAYS // 2


def test_ncf_command_line_is_the_full_profile_for_a_fixed_number_of_steps(tmp_path):
    argv = bench.ncf_train_argv(tmp_path / "ds", tmp_path / "out", steps=20)
    assert argv[1:3] == ["-m", "models.ncf.train"]
    cfg = config_from_namespace(build_parser("t").parse_args(argv[3:]))
    assert (cfg.batch_size, cfg.negatives, cfg.factors, cfg.mlp_sizes) == (1 << 20, 4, 64, (256, 256, 128, 64))
    assert (cfg.epochs, cfg.limit_train_batches, cfg.learning_rate) == (1, 20, 0.0045)
    whole = config_from_namespace(build_parser("t").parse_args(
        bench.ncf_train_argv(tmp_path / "ds", tmp_path / "out", steps=0, batch_size=4096)[3:]))
    assert (whole.limit_train_batches, whole.batch_size) == (None, 4096)


def _stage(work: Path, name: str, seconds: float, rss: int, disk: int, **extra) -> None:
    (work / f"{name}.stage.json").write_text(json.dumps({"seconds": seconds, "peak_rss_bytes": rss,
                                                         "disk_bytes": disk, **extra}))


def test_movielens_report_extrapolates_a_partial_epoch_from_the_trainers_rate(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "ml-20m.zip").write_bytes(b"x" * 1000)
    _stage(tmp_path, "make", 5.0, 10, 0)
    _stage(tmp_path, "ingest", 10.0, 2_000_000_000, 3000, steps={"validate_snapshot": 9.0},
           results={"validate_snapshot": {"rows": 1_000_000}})
    _stage(tmp_path, "preprocess", 50.0, 3_000_000_000, 4000, steps={"preprocess": 45.0},
           results={"preprocess": {"users": 100, "items": 50, "rows": {"train": 209_716, "test": 10_100}}})
    _stage(tmp_path, "train", 30.0, 1_000_000_000, 5000,
           metrics={"steps": 2, "batch_size": 1 << 18, "samples_per_s": 1 << 16, "hr@10": 0.5})
    figures = bench.movielens_report(tmp_path)
    assert figures["ingest_rows_per_s"] == 100_000 and figures["preprocess_rows_per_s"] == 20_000
    assert figures["disk_per_input_gb"] == 4.0
    assert figures["epoch_steps"] == 4 and figures["epoch_seconds_from_rate"] == 16.0  # 4 x 2^18 / 2^16
    assert figures["whole_epoch_measured"] is False
    assert json.loads((tmp_path / "figures.json").read_text())["train_steps"] == 2


def test_outbrain_report_has_one_entry_per_engine_measured(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "clicks_train.csv").write_bytes(b"x" * 500)
    _stage(tmp_path, "make", 5.0, 10, 0)
    tables = {"clicks_train": {"total": 1000}, "events": {"total": 250}}
    _stage(tmp_path, "ingest", 2.0, 10, 0, steps={}, results={"validate_snapshot": {"tables": tables}})
    _stage(tmp_path, "features-spark", 4.0, 10, 1000, steps={"build_features": 3.5})
    _stage(tmp_path, "features-nvtabular", 2.0, 10, 1500, steps={"build_features": 1.5})
    figures = bench.outbrain_report(tmp_path)
    assert figures["click_rows"] == 1000 and figures["ingest_all_rows_per_s"] == 625
    assert sorted(figures["features"]) == ["nvtabular", "spark"]
    assert figures["features"]["spark"]["click_rows_per_s"] == 250
    assert figures["features"]["nvtabular"]["disk_per_input_gb"] == 3.0


def test_a_stage_the_dataset_does_not_have_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["outbrain", "--stage", "train"])


def test_a_failed_stage_keeps_its_record_and_stops_the_bench(tmp_path):
    import sys

    with pytest.raises(SystemExit, match="exited 3"):
        bench._measured("boom", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path, "movielens")
    record = json.loads((tmp_path / "boom.stage.json").read_text())
    assert record["seconds"] > 0 and "exited 3" in record["failed"]
