"""Smoke check of NVTabular's own environment (.venv-nvtabular, `make nvt-env`): a 3-op workflow on a CPU dataset.

  .venv-nvtabular/bin/python scripts/nvt_smoke.py

Runs in that interpreter only (NVTabular 23.08 cannot share recflow's main environment: DESIGN.md "Environments"),
so it imports nothing from recflow. The workflow is the shape of NVIDIA's DLRM preprocessing
(PyTorch/Recommendation/DLRM/preproc/preproc_NVTabular.py): Categorify with a frequency threshold on the
categoricals, FillMissing then LogOp on the numericals, fitted and applied on a `cpu=True` Dataset (pandas + a Dask
local scheduler), then saved and loaded back. Prints one JSON line (versions, rows, seconds); exits non-zero with
one line when a result is wrong.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time


def main() -> int:
    started = time.monotonic()
    import numpy as np
    import pandas as pd

    import nvtabular as nvt
    from merlin.io import Dataset
    from nvtabular import ops

    imported = time.monotonic() - started
    rows = 1000
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "cat_0": rng.choice(["a", "b", "c", "rare1", "rare2"], size=rows, p=[0.5, 0.3, 0.198, 0.001, 0.001]),
        "cat_1": rng.integers(0, 20, size=rows).astype("int64"),
        "int_0": rng.integers(0, 100, size=rows).astype("float64"),
        "label": rng.integers(0, 2, size=rows).astype("int64"),
    })
    frame.loc[::7, "int_0"] = np.nan
    frame.loc[0, "cat_0"], frame.loc[1, "cat_0"] = "rare1", "rare2"  # each seen at most a few times

    # Categorify writes its fitted value tables under out_path (default: the current directory)
    categories = tempfile.mkdtemp(prefix="nvt-smoke-")
    categorical = ["cat_0", "cat_1"] >> ops.Categorify(freq_threshold=5, out_path=categories)
    numerical = ["int_0"] >> ops.FillMissing(fill_val=0.0) >> ops.LogOp()
    workflow = nvt.Workflow(categorical + numerical + ["label"])
    dataset = Dataset(frame, cpu=True)
    workflow.fit(dataset)
    out = workflow.transform(dataset).to_ddf().compute().reset_index(drop=True)

    def fail(message: str) -> int:
        print(f"nvt_smoke: FAILED: {message}", file=sys.stderr)
        return 1

    if len(out) != rows:
        return fail(f"{len(out)} rows out of {rows}")
    expected = np.log1p(frame["int_0"].fillna(0.0).to_numpy())
    if not np.allclose(out["int_0"].to_numpy(dtype="float64"), expected, rtol=1e-6):
        return fail("LogOp(FillMissing(int_0)) differs from log1p(fillna(0))")
    ids = dict(zip(frame["cat_0"], out["cat_0"]))
    kept = {value for value, count in frame["cat_0"].value_counts().items() if count >= 5}
    if len({ids[value] for value in kept}) != len(kept):
        return fail(f"frequent values {sorted(kept)} do not get distinct ids: {ids}")
    rare = {value for value in ids if value not in kept}
    if len({ids[value] for value in rare}) != 1 or ids[next(iter(rare))] in {ids[v] for v in kept}:
        return fail(f"rare values {sorted(rare)} should share one id apart from the frequent ones: {ids}")
    with tempfile.TemporaryDirectory() as tmp:
        workflow.save(tmp)
        loaded = nvt.Workflow.load(tmp)
        again = loaded.transform(dataset).to_ddf().compute().reset_index(drop=True)
    shutil.rmtree(categories, ignore_errors=True)
    if not again.equals(out):
        return fail("the saved and reloaded workflow transforms differently")
    print(json.dumps({"nvtabular": nvt.__version__, "numpy": np.__version__, "pandas": pd.__version__,
                      "rows": rows, "import_s": round(imported, 1),
                      "seconds": round(time.monotonic() - started, 1),
                      "cat_0_ids": len(set(ids.values())), "log_check": math.isfinite(float(out["int_0"].sum()))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
