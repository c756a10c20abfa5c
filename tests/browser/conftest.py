"""The browser tier's machinery: the tools it needs (fail, don't skip, when one is missing), the DAGs of dags/ as a
DagBag sees them, a real Airflow cluster (tests/integration/airflow_cluster.py), and a runner of the Node scenario
scripts (tests/browser/*.mjs: playwright-core driving the system Chromium against the cluster's api-server).

Screenshots go to $RECFLOW_BROWSER_SCREENSHOTS (default: the session's tmp dir) and are copied to
build/browser-screenshots/ at the end of the session, failed or not.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.airflow_cluster import AirflowCluster, airflow_cluster

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STABLE_SCREENSHOTS = REPO / "build" / "browser-screenshots"
INSTALL_HINT = "run `make browser-deps` (apt-get install -y chromium; npm ci for playwright-core)"
NODE_MAJOR = 20  # playwright-core's engines field
# A UI state may take this long to show up (the machine is slow and shared); a scenario as a whole 10x that.
UI_TIMEOUT_MS = int(os.environ.get("RECFLOW_BROWSER_TIMEOUT_MS", "120000"))


@dataclass(frozen=True)
class BrowserTools:
    chromium: str
    node: str


@pytest.fixture(scope="session")
def browser_tools() -> BrowserTools:
    """The system Chromium, Node.js and the repo's playwright-core; the tier FAILS naming what to install."""
    missing = []
    chromium = (os.environ.get("RECFLOW_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
                or "")
    if not chromium or not os.access(chromium, os.X_OK):
        missing.append("chromium (Debian package)")
    node = shutil.which("node") or ""
    if not node:
        missing.append(f"Node.js >= {NODE_MAJOR}")
    else:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
        if int(re.sub(r"^v(\d+).*", r"\1", version or "v0") or 0) < NODE_MAJOR:
            missing.append(f"Node.js >= {NODE_MAJOR} (found {version})")
    pinned = json.loads((REPO / "package.json").read_text())["devDependencies"]["playwright-core"]
    installed = REPO / "node_modules" / "playwright-core" / "package.json"
    if not installed.is_file():
        missing.append(f"playwright-core {pinned} in node_modules")
    elif (found := json.loads(installed.read_text())["version"]) != pinned:
        missing.append(f"playwright-core {pinned} in node_modules (found {found})")
    if missing:
        pytest.fail(f"browser tier: missing {', '.join(missing)}: {INSTALL_HINT}", pytrace=False)
    return BrowserTools(chromium=chromium, node=node)


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Iterator[Path]:
    configured = os.environ.get("RECFLOW_BROWSER_SCREENSHOTS")
    folder = Path(configured) if configured else tmp_path_factory.mktemp("browser-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    STABLE_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in STABLE_SCREENSHOTS.glob("*.png"):
        old.unlink()
    for shot in folder.glob("*.png"):
        shutil.copy2(shot, STABLE_SCREENSHOTS / shot.name)


def recflow_env(work: Path) -> dict[str, str]:
    """What recflow's DAGs see in this tier, for the DagBag and the cluster alike."""
    data = work / "data"
    return {
        "RECFLOW_DATA_ROOT": str(data),
        "RECFLOW_CRITEO_SOURCE": (data / "source").as_uri() + "/day_{day}",
        "RECFLOW_RETRY_DELAY_S": "1",
        # Day 0 = today: criteo_ingest's first interval ends tomorrow, so unpausing it schedules nothing now and
        # the only runs are the ones the tests make.
        "RECFLOW_CRITEO_EPOCH": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "RECFLOW_RETRAIN_CRON": "0 6 1 1 *",
    }


# Runs in a fresh interpreter (Airflow's DagBag, as the dag-processor would parse dags/).
_DAGBAG_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": {k: str(v)[-1000:] for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id, dag in sorted(bag.dags.items()):
    params = {}
    for name in dag.params.keys():
        param = dag.params.get_param(name)
        params[name] = {"schema": param.schema, "default": param.value, "description": param.description}
    out["dags"][dag_id] = {"params": params}
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("browser_tier")


@pytest.fixture(scope="module")
def dagbag(workdir) -> dict[str, dict[str, Any]]:
    """Every DAG in dags/ with its params (schema and default): {dag_id: {"params": {name: {...}}}}."""
    home = workdir / "dagbag_home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, **recflow_env(workdir), "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _DAGBAG_PROBE, str(REPO / "dags")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not parsed["errors"], f"DAG import errors: {parsed['errors']}"
    assert parsed["dags"], "the DagBag of dags/ is empty"
    return parsed["dags"]


@pytest.fixture(scope="module")
def cluster(browser_tools, workdir, dagbag) -> Iterator[AirflowCluster]:
    """scheduler + dag-processor + api-server on a fresh PostgreSQL database; every DAG of the DagBag parsed
    (and paused: new DAGs start paused)."""
    with airflow_cluster(workdir, recflow_env(workdir), dag_ids=tuple(dagbag)) as running:
        yield running


class ScenarioFailed(AssertionError):
    pass


@dataclass
class Browser:
    """Runs tests/browser/<scenario>.mjs with the cluster's address and login; returns the script's result."""
    tools: BrowserTools
    cluster: AirflowCluster
    shots: Path
    state: Path

    def run(self, scenario: str, **args: Any) -> dict[str, Any]:
        payload = {"url": self.cluster.api_url, "username": self.cluster.username,
                   "password": self.cluster.password, "chromium": self.tools.chromium, "shots": str(self.shots),
                   "state": str(self.state), "timeout_ms": UI_TIMEOUT_MS, **args}
        started = time.monotonic()
        proc = subprocess.run([self.tools.node, str(HERE / f"{scenario}.mjs"), json.dumps(payload)], cwd=REPO,
                              capture_output=True, text=True, timeout=10 * UI_TIMEOUT_MS / 1000)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        result = json.loads(lines[-1][len("RESULT "):]) if lines else None
        if proc.returncode != 0 or not result or not result.get("ok"):
            detail = (json.dumps(result, indent=1) if result
                      else f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            raise ScenarioFailed(f"browser scenario {scenario} {json.dumps(args)[:300]} failed:\n{detail}\n"
                                 f"{self.cluster.service_log_tails(15)}")
        result["seconds"] = round(time.monotonic() - started, 1)
        return result


@pytest.fixture(scope="module")
def browser(browser_tools, cluster, screenshots, workdir) -> Browser:
    return Browser(browser_tools, cluster, screenshots, workdir / "browser-login.json")
