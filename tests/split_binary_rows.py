"""Reading split-binary rows back in tests: a plain oracle, independent of the training loader."""

from __future__ import annotations

import numpy as np

from tasks.formats.feature_spec import FeatureSpec


def read_rows(spec: FeatureSpec, mapping: str, start_row: int, n_rows: int) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
    """Rows [start_row, start_row + n_rows) (fewer at the end) as (numerical f16 [n, n_num], categorical int64
    [n, n_cat] in channel order, label bool [n]), with np.fromfile on each file the spec names."""
    from tasks.formats.split_binary import _mapping_files

    arrays = []
    for data_file in _mapping_files(spec, mapping):
        data = np.fromfile(data_file.path, dtype=data_file.dtype).reshape(-1, data_file.width)
        arrays.append(data[start_row:start_row + n_rows])
    n = len(arrays[0])
    has_numerical = spec.get_number_of_numerical_features() > 0
    numerical = arrays[1].astype(np.float16) if has_numerical else np.zeros((n, 0), np.float16)
    cats = [c.astype(np.int64) for c in arrays[2 if has_numerical else 1:]]
    categorical = np.concatenate(cats, axis=1) if cats else np.zeros((n, 0), np.int64)
    return numerical, categorical, arrays[0][:, 0] != 0
