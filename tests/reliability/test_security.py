"""Security scan of the repository: maintained scanners for the generic checks, our own tests for the project's rules.

- detect-secrets (its default plugins and filters) reads every file `git ls-files --cached --others --exclude-standard`
  lists: everything tracked plus every new file that is not ignored (what the next commit can hold). Any finding
  fails, except the reviewed made-up credentials of test fixtures in REVIEWED_SECRETS.
- bandit reads the shipped code (dags/ tasks/ spark_jobs/ models/ scripts/). Every finding of medium or high
  severity fails unless it is in REVIEWED_BANDIT_FINDINGS, and so does any shell (shell=True, os.system) whatever
  severity bandit gives it: a literal command is "low" to bandit, but our rule is no shell at all. A reviewed false
  positive may instead carry `# nosec BXXX` on its line in the code.
- Rules no scanner knows: every torch.load anywhere (tests included) is weights_only=True, except the allow-listed
  one that proves a hostile checkpoint is hostile; docker-compose.yml ships no default password and names every
  secret as a required ${VAR:?...}; file:// sources stay inside the allowed roots.

Each scanner is also run on planted samples (`test_*_finds_planted_*`), so an empty finding list means it looked.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from detect_secrets import SecretsCollection
from detect_secrets.settings import default_settings

pytestmark = pytest.mark.reliability

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CODE = ("dags/", "tasks/", "spark_jobs/", "models/", "scripts/")
COMPOSE = REPO / "docker-compose.yml"

# Made-up credentials that tests hand to fake servers or parse back, by (file, value): reviewed, not secrets.
REVIEWED_SECRETS = {
    ("tests/test_download.py", "s3cret"): "proves a URL with credentials is refused without echoing them",
    ("tests/reliability/test_bad_inputs.py", "fake-password"): "the same, through a DAG task's error line",
    ("tests/test_registry.py", "p@ss/w:rd"): "an Airflow connection whose password needs URL-escaping",
}

# bandit findings that block (medium+, or a shell) but were reviewed, by (file, test id): none today. Add one only
# with the reason; prefer `# nosec BXXX` on the line when it is a false positive of that one line.
REVIEWED_BANDIT_FINDINGS: dict[tuple[str, str], str] = {}
# Shell use blocks at any severity: B602 subprocess shell=True, B604 other calls with shell=True, B605 os.system /
# os.popen & co. (bandit grades a literal command "low").
SHELL_TESTS = {"B602", "B604", "B605"}

# Unsafe torch loads that a test makes on purpose, by (file, enclosing function): reviewed, with the reason.
ALLOWED_UNSAFE_LOADS = {
    # Proves the planted checkpoint really is hostile: an unsafe load runs its payload (into tmp_path).
    ("tests/test_dlrm_train.py", "test_safe_loader_rejects_malicious_pickle_without_running_it"),
}


@functools.cache
def repo_files() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode()
    return tuple(sorted({p for p in listed.split("\0") if p and (REPO / p).is_file()}))


def python_files(prefixes: tuple[str, ...] = ("",)) -> list[str]:
    return [f for f in repo_files() if f.endswith(".py") and f.startswith(prefixes)]


# ---- (1) secrets in files: detect-secrets ------------------------------------------------------------------------


def detect_secrets_findings(root: Path, files: list[str]) -> list[tuple[str, int, str, str]]:
    """(file, line, kind, value) of everything detect-secrets' default plugins report in `files` (relative to root)."""
    secrets = SecretsCollection(root=str(root))
    with default_settings():
        secrets.scan_files(*files, num_processors=min(8, os.cpu_count() or 1))
    return sorted((Path(name).as_posix(), s.line_number, s.type, s.secret_value or "") for name, s in secrets)


def test_no_secrets_in_repository_files():
    files = list(repo_files())
    assert len(files) > 50 and "docker-compose.yml" in files
    findings = detect_secrets_findings(REPO, files)
    assert [f for f in findings if (f[0], f[3]) not in REVIEWED_SECRETS] == []
    assert set(REVIEWED_SECRETS) <= {(f[0], f[3]) for f in findings}, "a reviewed secret is gone: drop its entry"
    assert all(path.startswith("tests/") for path, _ in REVIEWED_SECRETS)


_FAKE_KEY_ID = "AKIA" + "Q7XW2MZ4RT5YB3NC"
# file -> (planted text, the detect-secrets plugin that must report it). Each value is split so that this file itself
# holds no secret; the written sample does.
PLANTED_SECRETS = {
    "dags/aws.py": (f"KEY = '{_FAKE_KEY_ID}'\n", "AWS Access Key"),
    "deploy/key.pem": ("-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n",
                       "Private Key"),
    "tasks/github.py": ("client(token='gh" + "p_" + "a1B2" * 9 + "')\n", "GitHub Token"),
    "tasks/db.py": ("DB_PASS" + "WORD = 'hunter2hunter2'\n", "Secret Keyword"),
    "deploy/app.yaml": ("db_pass" + "word: Tr0ub4dor3\n", "Secret Keyword"),
    "scripts/psql.sh": ("psql postgres://airflow" + ":Xy7kq9Lm2@db/airflow\n", "Basic Auth Credentials"),
    "deploy/slack.env": ("SLACK=" + "xox" + "b-" + "1234567890-" + "abcdefghijklmnop\n", "Slack Token"),
}


@pytest.fixture(scope="module")
def planted_secret_findings(tmp_path_factory) -> list[tuple[str, int, str, str]]:
    root = tmp_path_factory.mktemp("planted_secrets")
    for rel, (text, _) in PLANTED_SECRETS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return detect_secrets_findings(root, list(PLANTED_SECRETS))


@pytest.mark.parametrize("rel", PLANTED_SECRETS)
def test_detect_secrets_finds_planted_secrets(rel, planted_secret_findings):
    text, kind = PLANTED_SECRETS[rel]
    assert (rel, kind) in {(f[0], f[2]) for f in planted_secret_findings}, f"no {kind} found in {rel}: {text!r}"


# ---- (2) shell, unsafe deserialisation and the rest of the generic code checks: bandit ---------------------------


def bandit_report(root: Path, files: list[str]) -> dict[str, Any]:
    """bandit's JSON report over `files` (relative to root), every severity and confidence."""
    done = subprocess.run([sys.executable, "-m", "bandit", "--format", "json", "--quiet", *files], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), f"bandit failed ({done.returncode}): {done.stderr[-2000:]}"  # 1: found issues
    report = json.loads(done.stdout)
    assert report["errors"] == [], f"bandit could not read: {report['errors']}"
    for result in report["results"]:
        result["filename"] = Path(os.path.normpath(result["filename"])).as_posix()
    report["scanned"] = {Path(os.path.normpath(name)).as_posix() for name in report["metrics"]} - {"_totals"}
    return report


def blocking(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings that fail the scan unless reviewed: medium or high severity, or any shell."""
    return [r for r in report["results"] if r["issue_severity"] in ("MEDIUM", "HIGH") or r["test_id"] in SHELL_TESTS]


def describe(finding: dict[str, Any]) -> str:
    return (f"{finding['filename']}:{finding['line_number']}: {finding['test_id']} "
            f"({finding['issue_severity']}) {finding['issue_text']}")


def test_bandit_finds_nothing_unreviewed_in_shipped_code():
    files = python_files(SHIPPED_CODE)
    report = bandit_report(REPO, files)
    assert report["scanned"] == set(files)
    # bandit saw the code that starts processes (B603: a subprocess call without a shell, low, not blocking).
    assert any(r["test_id"] == "B603" for r in report["results"])
    found = blocking(report)
    assert [describe(r) for r in found if (r["filename"], r["test_id"]) not in REVIEWED_BANDIT_FINDINGS] == []
    stale = set(REVIEWED_BANDIT_FINDINGS) - {(r["filename"], r["test_id"]) for r in found}
    assert stale == set(), "reviewed bandit findings that bandit no longer reports: drop their entries"
    # A bare `# nosec` silences every test on its line; a reviewed false positive names its test (`# nosec B602`).
    bare = [f"{rel}:{number}" for rel in files for number, line in enumerate((REPO / rel).read_text().splitlines(), 1)
            if re.search(r"#\s*nosec\b(?!\s*:?\s*B\d{3})", line)]
    assert bare == [], "`# nosec` without the test id it is for"


PLANTED_CODE = {
    "shell_variable.py": ("import subprocess\nsubprocess.run(cmd, shell=True)\n", "B602"),
    "shell_literal.py": ("import subprocess as sp\nsp.run('ls -l', shell=True)\n", "B602"),
    "os_system.py": ("import os\nos.system('ls')\n", "B605"),
    "os_popen.py": ("from os import popen\npopen('ls')\n", "B605"),
    "pickle_loads.py": ("import pickle\npickle.loads(data)\n", "B301"),
    "read_pickle.py": ("import pandas as pd\npd.read_pickle(path)\n", "B301"),
    "yaml_load.py": ("import yaml\nyaml.load(text, Loader=yaml.Loader)\n", "B506"),
    "torch_load.py": ("import torch\ntorch.load(path)\n", "B614"),
}
SAFE_CODE = ("import subprocess, torch, yaml\nsubprocess.run(['ls'], shell=False, check=True)  # not os.system\n"
             "yaml.safe_load(text)\ntorch.load(path, weights_only=True)\n")


@pytest.fixture(scope="module")
def planted_bandit_report(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("planted_code")
    for name, (source, _) in PLANTED_CODE.items():
        (root / name).write_text(source)
    (root / "safe.py").write_text(SAFE_CODE)
    return bandit_report(root, [*PLANTED_CODE, "safe.py"])


@pytest.mark.parametrize("name", PLANTED_CODE)
def test_bandit_finds_planted_shell_and_unsafe_loads(name, planted_bandit_report):
    source, expected = PLANTED_CODE[name]
    found = {(r["filename"], r["test_id"]) for r in blocking(planted_bandit_report)}
    assert (name, expected) in found, f"bandit did not block {expected} in {source!r}"


def test_bandit_passes_safe_code(planted_bandit_report):
    assert "safe.py" in planted_bandit_report["scanned"]
    assert [describe(r) for r in blocking(planted_bandit_report) if r["filename"] == "safe.py"] == []


# ---- (3) every torch.load is weights_only, tests included; numpy never unpickles ----------------------------------


class _Calls(ast.NodeVisitor):
    """Every call with its dotted target (imports resolved: `import torch as T` -> torch.*) and the function it
    sits in."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.calls: list[tuple[str, ast.Call, str]] = []
        self.function = "<module>"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]  # `import os.path` binds `os`; `import torch.nn as nn` binds torch.nn
            self.aliases[alias.asname or top] = alias.name if alias.asname else top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and (base := self.dotted(node.value)):
            return f"{base}.{node.attr}"
        return None

    def visit_Call(self, node: ast.Call) -> None:
        self.calls.append((self.dotted(node.func) or "", node, self.function))
        self.generic_visit(node)


def calls_in(source: str) -> list[tuple[str, ast.Call, str]]:
    visitor = _Calls()
    visitor.visit(ast.parse(source))
    return visitor.calls


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_constant(node: ast.AST | None, value: Any) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def unsafe_load_findings(rel: str, source: str) -> list[str]:
    findings = []
    for name, call, function in calls_in(source):
        if (rel, function) in ALLOWED_UNSAFE_LOADS:
            continue
        where = f"{rel}:{call.lineno}: {name}"
        if name in ("torch.load", "torch.serialization.load") and not _is_constant(_keyword(call, "weights_only"),
                                                                                     True):
            findings.append(f"{where} without weights_only=True")
        elif name == "numpy.load" and not (_keyword(call, "allow_pickle") is None
                                           or _is_constant(_keyword(call, "allow_pickle"), False)):
            findings.append(f"{where} with allow_pickle")
    return findings


def test_every_torch_load_is_weights_only():
    sources = {rel: (REPO / rel).read_text() for rel in python_files()}
    loads = [(rel, function) for rel, source in sources.items() for name, _, function in calls_in(source)
             if name == "torch.load"]
    assert any(rel.startswith("models/") for rel, _ in loads), "no torch.load in models/: not looking at the loader"
    assert ALLOWED_UNSAFE_LOADS <= set(loads), "an allowed unsafe load is gone: drop its entry"
    assert [f for rel, source in sources.items() for f in unsafe_load_findings(rel, source)] == []


@pytest.mark.parametrize("source", [
    "import torch\ntorch.load(p)\n",
    "import torch as T\nT.load(p, weights_only=False)\n",
    "from torch import load\nload(p, map_location='cpu')\n",
    "import torch\ntorch.serialization.load(p, weights_only=flag)\n",
    "import numpy as np\nnp.load(f, allow_pickle=True)\n",
])
def test_scanner_finds_planted_unsafe_loads(source):
    assert unsafe_load_findings("models/x.py", source)
    safe = "import torch, numpy as np\ntorch.load(p, weights_only=True)\nnp.load(f)\nnp.load(f, allow_pickle=False)\n"
    assert unsafe_load_findings("models/x.py", safe) == []


def test_unsafe_load_allow_list_names_one_function_of_one_file():
    (rel, function), = ALLOWED_UNSAFE_LOADS
    source = (f"import torch\ndef {function}():\n    torch.load(p, weights_only=False)\n"
              "def other():\n    torch.load(p)\n")
    assert [f.split(": ")[0] for f in unsafe_load_findings(rel, source)] == [f"{rel}:5"]
    assert len(unsafe_load_findings("tests/test_other.py", source)) == 2


# ---- (4) the compose file ships no default password ---------------------------------------------------------------

SECRET_VAR = re.compile(r"(?i)password|secret")
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")
REQUIRED_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:\?[^}]*\}")


def _settings(node: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(where, key, value) of every scalar setting in the compose document: mappings and KEY=VALUE list items."""
    found: list[tuple[str, str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                found += _settings(value, f"{path}.{key}")
            elif value is not None:
                found.append((path, str(key), str(value)))
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, str) and "=" in item:
                key, _, value = item.partition("=")
                found.append((path, key, value))
            elif isinstance(item, (dict, list)):
                found += _settings(item, path)
    return found


def compose_default_secrets(text: str) -> list[str]:
    """What would let the deployment start with a password nobody set: literal values, defaults, unguarded vars."""
    findings = []
    references = [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]
    for var, operator in references:
        if SECRET_VAR.search(var) and operator in ("-", ":-", "+", ":+"):
            findings.append(f"${{{var}{operator}...}} gives a secret a default")
    secret_vars = {var for var, _ in references if SECRET_VAR.search(var)}
    required = {var for var, operator in references if operator == ":?"}
    findings += [f"${{{var}}} is never required with ${{{var}:?...}}" for var in sorted(secret_vars - required)]
    document = yaml.safe_load(text)
    for where, key, value in _settings(document):
        reads_secret_file = key.upper().endswith("_CMD") and "/run/secrets/" in value  # Airflow's <option>_CMD
        if (SECRET_VAR.search(key) and not key.upper().endswith("_FILE") and not reads_secret_file
                and not REFERENCE.fullmatch(value.strip())):
            findings.append(f"{where}.{key} is a literal, not a ${{VAR:?...}} reference")
        if key.lower() == "simple_auth_manager_all_admins" or key.upper().endswith("__SIMPLE_AUTH_MANAGER_ALL_ADMINS"):
            findings.append(f"{where}.{key} turns authentication off")
    for name, secret in (document.get("secrets") or {}).items():
        if "file" in secret and not REQUIRED_REFERENCE.match(str(secret["file"])):  # ${DIR:?...}/name is required
            findings.append(f"secrets.{name}.file {secret['file']!r} ships a file instead of requiring one")
    return findings


def compose_unrequired_secret_values(text: str) -> list[str]:
    """The strict rule: every reference to a password/secret variable is ${VAR:?...}, so each place fails on its
    own when the variable is unset (not only because another line requires the same variable)."""
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        for match in REFERENCE.finditer(line):
            if SECRET_VAR.search(match.group(1)) and match.group(2) != ":?":
                findings.append(f"docker-compose.yml:{number}: {match.group(0)} in {line.strip()[:70]!r}")
    return findings


@pytest.fixture(scope="module")
def compose_text() -> str:
    assert COMPOSE.is_file(), "docker-compose.yml is missing"
    return COMPOSE.read_text()


def test_compose_ships_no_default_password(compose_text):
    assert "${RECFLOW_SECRETS_DIR:?" in compose_text  # the scan sees the real file's secrets (files in that folder)
    assert compose_default_secrets(compose_text) == []


def test_compose_every_password_and_secret_is_a_required_reference(compose_text):
    assert compose_unrequired_secret_values(compose_text) == []


@pytest.mark.parametrize("snippet", [
    "services:\n  db:\n    environment:\n      POSTGRES_PASSWORD: airflow\n",
    "services:\n  db:\n    environment:\n      - MINIO_ROOT_PASSWORD=minioadmin\n",
    "services:\n  db:\n    environment:\n      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:-airflow}\n",
    "services:\n  db:\n    environment:\n      PGPASSWORD: ${PG_PASSWORD}\n",
    "x-env:\n  AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS: 'True'\n",
    "secrets:\n  admin:\n    file: ./deploy/admin_password.json\n",
])
def test_scanner_finds_planted_compose_defaults(snippet):
    assert compose_default_secrets(snippet)


@pytest.mark.parametrize("snippet, found", [
    ("x-env:\n  PGPASSWORD: ${PG_PASSWORD:?set it}\n  URL: postgres://u:${PG_PASSWORD:?set it}@db/x\n", False),
    ("x-env:\n  PGPASSWORD: ${PG_PASSWORD:?set it}\n  REDIS_PASSWORD: ${REDIS_PASSWORD}\n", True),
    ("x-env:\n  PGPASSWORD: ${PG_PASSWORD:?set it}\n  URL: postgres://u:${PG_PASSWORD}@db/x\n", True),
])
def test_scanner_finds_planted_unrequired_compose_secrets(snippet, found):
    assert bool(compose_unrequired_secret_values(snippet)) is found


# --- file:// sources stay inside the allowed roots ----------------------------------------------------------------


def test_file_source_outside_the_allowed_roots_is_refused(tmp_path):
    from tasks.core.config import load_settings
    from tasks.core.download import DownloadError
    from tasks.criteo.ingest import download_day
    from tasks.criteo.settings import load_criteo_settings
    from tests.reliability.contract import nothing_complete, one_line

    data, outside = tmp_path / "data", tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "day_0"
    secret.write_bytes(b"0\t1\n")
    (data / "criteo" / "source").mkdir(parents=True)
    (data / "criteo" / "source" / "link").symlink_to(secret)  # a link out of an allowed root is followed first
    settings, criteo = load_settings({"RECFLOW_DATA_ROOT": str(data)}), load_criteo_settings({})
    for url in (secret.as_uri(), str(secret), "file:///etc/passwd", (data / "criteo/source/link").as_uri(),
                (data / "criteo/source/../../../elsewhere/day_0").as_uri()):
        with pytest.raises(DownloadError) as caught:
            download_day(settings, 0, source=url, criteo=criteo)
        one_line(caught.value, "outside the allowed roots", "RECFLOW_FILE_SOURCE_ROOTS")
    nothing_complete(data)
    assert not any((data / "criteo").glob("raw/**/day_0*"))
    # Allowed explicitly (or under the configured source's folder), the same file downloads.
    allowed = load_settings({"RECFLOW_DATA_ROOT": str(data), "RECFLOW_FILE_SOURCE_ROOTS": f"/nonexistent:{outside}"})
    assert download_day(allowed, 0, source=secret.as_uri(), criteo=criteo)["bytes"] == 4
    elsewhere = load_settings({"RECFLOW_DATA_ROOT": str(tmp_path / "d2")})
    templated = load_criteo_settings({"RECFLOW_CRITEO_SOURCE": outside.as_uri() + "/day_{day}"})
    assert templated.allowed_file_roots(elsewhere) == (tmp_path.resolve() / "d2", outside.resolve())
    assert download_day(elsewhere, 0, criteo=templated)["bytes"] == 4
