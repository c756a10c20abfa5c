"""Issue #24 item 5: a BYO spec is user input, so its size is bounded before anything walks or prints it. A YAML
alias bomb (each level a list of 9 aliases of the level below) is a few hundred bytes that expand 9-fold per level;
before the cap, a bad value in it came back as an error message of megabytes (depth 5: 2.8 MB) and the fetch task
was OOM-killed around depth 9. Now: a file over MAX_SPEC_BYTES, or a spec that expands beyond MAX_SPEC_NODES /
MAX_SPEC_CHARS, is refused with one short line, and values in error lines are quoted with a bounded repr."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tasks.byo.spec import MAX_SPEC_BYTES, SHOWN_CHARS, load_csv_spec
from tasks.formats.feature_spec import FeatureSpecError
from tests.reliability.contract import one_line

pytestmark = pytest.mark.reliability

SMALL_CSV = Path(__file__).parents[1] / "data" / "byo" / "small_csv.yaml"
SHORT = 600  # characters an error line may take here: the path, the key and a bounded value


def _bomb(depth: int, key: str = "categorical") -> str:
    """small_csv.yaml with channel_spec.<key> replaced by an alias bomb of `depth` levels."""
    levels = ['b0: &b0 ["x"]'] + [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, depth + 1)]
    spec = yaml.safe_load(SMALL_CSV.read_text())
    spec["channel_spec"][key] = "BOMB"
    text = yaml.dump(spec).replace("BOMB", f"*b{depth}")
    return "metadata:\n  bombs:\n" + "\n".join(f"    {line}" for line in levels) + "\n" + text.replace(
        "metadata: {}\n", "")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "feature_spec.yaml"
    path.write_text(text)
    return path


def test_a_small_alias_bomb_is_refused_with_one_short_line(tmp_path):
    path = _write(tmp_path, _bomb(depth=6))  # 9**6 = 531,441 leaves: past the node cap, and a 3 MB repr before
    assert path.stat().st_size < 2000  # small_csv.yaml itself is ~1 KB of it
    started = time.monotonic()
    with pytest.raises(FeatureSpecError) as raised:
        load_csv_spec(path)
    message = one_line(raised.value, str(path), "aliases expanded")
    assert len(message) < SHORT, len(message)
    assert time.monotonic() - started < 5


def test_a_deep_alias_bomb_is_refused_without_expanding_it(tmp_path):
    path = _write(tmp_path, _bomb(depth=12))  # 9**12 leaves: expanding it would never finish
    started = time.monotonic()
    with pytest.raises(FeatureSpecError, match="aliases expanded") as raised:
        load_csv_spec(path)
    assert len(str(raised.value)) < SHORT
    assert time.monotonic() - started < 5


def test_a_bad_value_under_the_caps_is_quoted_with_a_bounded_repr(tmp_path):
    path = _write(tmp_path, _bomb(depth=3))  # 729 leaves: within the caps, still a bad channel list
    with pytest.raises(FeatureSpecError) as raised:
        load_csv_spec(path)
    message = one_line(raised.value, "channel_spec.categorical: must be a list of feature names")
    assert len(message) < len(str(path)) + SHOWN_CHARS + 100, message


def test_a_spec_file_over_the_size_cap_is_refused_before_parsing(tmp_path):
    text = SMALL_CSV.read_text() + "#" * MAX_SPEC_BYTES + "\n"
    path = _write(tmp_path, text)
    with pytest.raises(FeatureSpecError) as raised:
        load_csv_spec(path)
    one_line(raised.value, str(path), f"at most {MAX_SPEC_BYTES}")


def test_a_spec_whose_top_level_is_not_a_mapping_is_refused_with_one_short_line(tmp_path):
    path = _write(tmp_path, "- &a [x, x, x, x]\n- &b [*a, *a, *a, *a]\n- [*b, *b, *b, *b]\n")
    with pytest.raises(FeatureSpecError) as raised:
        load_csv_spec(path)
    assert len(one_line(raised.value, str(path), "mapping of sections")) < SHORT


def test_nvidias_own_spec_with_its_anchor_is_still_accepted():
    spec = load_csv_spec(SMALL_CSV)  # source_spec's numerical chunks are an alias of channel_spec.numerical
    assert spec.channel_spec["numerical"] == ["num_0", "num_1", "num_2"]
