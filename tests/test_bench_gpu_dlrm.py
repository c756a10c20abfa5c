"""bench.gpu_dlrm (issue #28 §5) at a tiny size on the CPU: one JSON line with the device, the trainer's steady
rate, the model step alone and the fixed cost as a ratio to one save; it imports no Airflow, TensorFlow or GX."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_dlrm

REPO = Path(__file__).resolve().parents[1]

PROGRAM = """
import json, sys
from bench import gpu_dlrm
result = gpu_dlrm.main(sys.argv[1:])
heavy = sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'tensorflow', 'great_expectations', 'fbgemm_gpu'})
print(json.dumps({'heavy_imports': heavy}))
"""


def test_cpu_mode_prints_one_json_line_with_the_fixed_cost_ratio(tmp_path: Path) -> None:
    argv = ["--device", "cpu", "--table_scale", "4096", "--train_rows", "3072", "--test_rows", "512",
            "--batch_size", "512", "--step_iterations", "1", "--log_every_steps", "2", "--work", str(tmp_path / "w"),
            "--json", str(tmp_path / "out.json")]
    proc = subprocess.run([sys.executable, "-c", PROGRAM, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    result, imports = lines[-2], lines[-1]
    assert imports == {"heavy_imports": []}
    assert json.loads((tmp_path / "out.json").read_text()) == result
    assert result["device"].startswith("cpu") and result["shape"]["table_scale"] == 4096
    assert result["table_bytes"] == sum(gpu_dlrm.cardinalities(4096)) * 128 * 4
    assert result["train_steady_samples_per_second"] > 0 and result["model_step_samples_per_second"] > 0
    fixed = result["fixed_cost"]
    assert fixed["fixed_s"] == pytest.approx(fixed["train_wall_s"] - fixed["train_loop_s"] - fixed["final_write_s"],
                                             abs=0.002)
    # (the figures are rounded to 1 ms; a tiny save is a few ms)
    assert fixed["fixed_vs_save"] == pytest.approx(fixed["fixed_s"] / fixed["reference_save_s"], rel=0.2)
    assert {"build_model_s", "final_eval_s", "checksum_alone_s", "other_s"} <= set(fixed)
    rows = gpu_dlrm.figures(result)
    assert [f.target for f in rows] == ["<= 2", "≈ 1", "≈ 1"] and rows[0].ratio.median == fixed["fixed_vs_save"]


def test_the_gpu_default_is_criteo_f15_at_full_size() -> None:
    shape, _ = gpu_dlrm.parse_args(["--device", "cuda"])
    assert shape.amp and shape.batch_size == 65536 and shape.train_rows == 8_388_608
    assert sum(gpu_dlrm.cardinalities(shape.table_scale)) == 32_709_138


def test_the_profile_bench_runs_its_next_experiments_on_the_cpu(tmp_path: Path) -> None:
    """bench.gpu_dlrm_profile's sections for the next GPU session, at a tiny size: the row-padded interaction
    computes the same output, and every section leaves its figures in the JSON."""
    from bench import gpu_dlrm_profile

    out = tmp_path / "profile.json"
    gpu_dlrm_profile.main(["--device", "cpu", "--table_scale", "4096", "--batch_size", "256", "--iterations", "1",
                           "--profile_steps", "1", "--top", "3", "--compile", "off", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["interaction"]["same_output"] is True and result["interaction"]["pad_rows"] == 5
    assert {"on_device", "h2d_pageable", "h2d_copy", "h2d_side_stream"} <= set(result["loop"])
    assert all(figure["samples_per_second"] > 0 for name, figure in result["loop"].items() if name != "batch_bytes")
    assert result["update_cast"]["same_result"] is True
    assert all(result["update_cast"][k]["samples_per_second"] > 0 for k in ("default", "compiled_cast_add"))
    assert result["profile"] and result["ops_ms"]["index_add_batch_ids"] > 0 and "updates" not in result
