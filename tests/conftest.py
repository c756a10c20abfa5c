import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest_plugins = ["tests.servers"]

SHARED_DATA = REPO.parent / "shared" / "data"
CRITEO_SAMPLE = SHARED_DATA / "criteo_sample_100.tsv"
