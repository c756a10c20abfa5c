"""Security scan of the repository: no secrets in files, no shell in our code, only safe deserialisation, and a compose
file that ships no default password.

Files scanned are `git ls-files --cached --others --exclude-standard`: everything tracked plus every new file that is
not ignored (what the next commit can hold). Code checks walk the AST, not the text, so a comment or a string that
merely mentions `shell=True` is not a finding and an aliased import (`import subprocess as sp`) is. Each scanner is
also run on planted samples (`test_scanner_finds_planted_*`), so an empty finding list means the scanner looked.
"""

from __future__ import annotations

import ast
import functools
import math
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.reliability

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CODE = ("dags/", "tasks/", "spark_jobs/", "models/", "scripts/")
COMPOSE = REPO / "docker-compose.yml"

# Unsafe loads that a test makes on purpose, by (file, enclosing function): reviewed, with the reason.
ALLOWED_UNSAFE_LOADS = {
    # Proves the planted checkpoint really is hostile: an unsafe load runs its payload (into tmp_path).
    ("tests/test_dlrm_train.py", "test_safe_loader_rejects_malicious_pickle_without_running_it"),
}


@functools.cache
def repo_files() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode()
    return tuple(sorted({p for p in listed.split("\0") if p and (REPO / p).is_file()}))


@functools.cache
def text_of(rel: str) -> str | None:
    """The file as text, or None for binary / very large files."""
    data = (REPO / rel).read_bytes()
    if len(data) > 5 << 20 or b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def python_files(prefixes: tuple[str, ...] = ("",)) -> list[str]:
    return [f for f in repo_files() if f.endswith(".py") and f.startswith(prefixes)]


# ---- (1) secrets in files --------------------------------------------------------------------------------------

TOKEN_PATTERNS = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private key block": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    "AWS secret access key": re.compile(
        r"(?i)aws_?secret_?access_?key\W{0,4}[=:]\W{0,3}[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
    "GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
    "Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    "API secret key (sk-/rk-)": re.compile(r"\b[sr]k[-_](?:live_|proj-)?[A-Za-z0-9]{32,}"),
    "JSON web token": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
}
_SENSITIVE_WORDS = r"(?:password|passwd|passphrase|secret|token|api_?key|private_?key|access_?key|credential)"
SECRET_NAME = re.compile(rf"(?i){_SENSITIVE_WORDS}")
# Names that hold where or which secret, not the secret itself (POSTGRES_PASSWORD_FILE, aws_secret_name, ...).
NOT_A_SECRET_NAME = re.compile(r"(?i)[_.-](?:file|path|dir|url|uri|name|id|env|var|prefix|marker)s?$")
# KEY: value / KEY=value, not a variable inside a reference (`${POSTGRES_PASSWORD:?...}` is not a setting).
ASSIGNMENT = re.compile(rf"""(?ix)(?<![\w.${{-])([a-z0-9_.-]*{_SENSITIVE_WORDS}[a-z0-9_.-]*)["']?[ \t]*[:=][ \t]*
                            ("[^"\n]*"|'[^'\n]*'|[^\s"'\#,}}\]]*)""")
URL_PASSWORD = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]*:([^\s/@'\"]+)@")
PLACEHOLDER_WORDS = ("test", "example", "dummy", "fake", "placeholder", "changeme", "change-me", "redacted", "your",
                     "not-a-real")


def is_placeholder(value: str) -> bool:
    """Empty, a reference (${VAR}, $VAR, {{ var }}, <value>), a repeated character, or a value that says it is fake."""
    v = value.strip().strip("'\"")
    return (not v or v.startswith(("$", "{{", "%(", "<")) or len(set(v)) == 1
            or any(word in v.lower() for word in PLACEHOLDER_WORDS))


def looks_generated(value: str) -> bool:
    """Long and random-looking, as a real key or generated password is (test fixtures are short words)."""
    classes = sum(bool(re.search(p, value)) for p in ("[a-z]", "[A-Z]", "[0-9]", "[^A-Za-z0-9]"))
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values()) if value else 0.0
    return len(value) >= 16 and " " not in value and (classes >= 3 or entropy >= 3.5)


def _suspicious(rel: str, value: str) -> bool:
    # Test fixtures talk to servers on 127.0.0.1 with made-up credentials; there only a real-looking secret counts.
    if is_placeholder(value):
        return False
    return looks_generated(value) if rel.startswith("tests/") else True


def _python_literals(source: str) -> list[tuple[int, str, str]]:
    """(line, name, value) of string literals bound to a name: assignments, keywords, dict entries, defaults."""
    found: list[tuple[int, str, str]] = []

    def add(name_node: Any, value: Any, name: str | None = None) -> None:
        name = name or (name_node.id if isinstance(name_node, ast.Name) else getattr(name_node, "attr", None))
        if name and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found.append((value.lineno, name, value.value))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                add(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            add(node.target, node.value)
        elif isinstance(node, ast.keyword) and node.arg:
            add(None, node.value, node.arg)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    add(None, value, key.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            for arg, default in zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults):
                add(None, default, arg.arg)
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                add(None, default, arg.arg)
    return found


def secret_findings(rel: str, text: str) -> list[str]:
    findings = []
    for kind, pattern in TOKEN_PATTERNS.items():
        findings += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {kind}" for m in pattern.finditer(text)]
    for match in URL_PASSWORD.finditer(text):
        if _suspicious(rel, match.group(1)):
            findings.append(f"{rel}:{text.count(chr(10), 0, match.start()) + 1}: password in a URL")
    if rel.endswith(".py"):
        named = _python_literals(text)
    else:
        named = [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in ASSIGNMENT.finditer(text)]
    for line, name, value in named:
        if SECRET_NAME.search(name) and not NOT_A_SECRET_NAME.search(name) and _suspicious(rel, value):
            findings.append(f"{rel}:{line}: {name} is set to a literal (use an Airflow connection or ${{VAR:?...}})")
    return findings


def test_no_secrets_in_repository_files():
    scanned, findings = 0, []
    for rel in repo_files():
        text = text_of(rel)
        if text is not None:
            scanned += 1
            findings += secret_findings(rel, text)
    assert scanned > 50 and "docker-compose.yml" in repo_files()
    assert findings == []


_FAKE_KEY_ID = "AKIA" + "Q7XW2MZ4RT5YB3NC"
_PLANTED_SECRETS = [
    ("dags/x.py", f"KEY = '{_FAKE_KEY_ID}'\n"),
    ("deploy/key.pem", "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIE\n"),
    ("tasks/x.py", "client(token='gh" + "p_" + "a1B2" * 9 + "')\n"),
    ("tasks/x.py", "DB_PASSWORD = 'hunter2hunter2'\n"),
    ("tasks/x.py", "def connect(password='Tr0ub4dor&3'):\n    pass\n"),
    ("tasks/x.py", "conn = {'login': 'ops', 'password': 'correct-horse'}\n"),
    ("deploy/app.yaml", "db_password: Tr0ub4dor3\n"),
    ("deploy/env.example", "AIRFLOW_JWT_SECRET=abc123\n"),
    ("docs/setup.md", "export API_TOKEN=\"q9Zk3LmP0x\"\n"),
    ("scripts/x.sh", "psql postgres://airflow:Xy7kq9Lm2@db/airflow\n"),
    ("tests/test_x.py", "SECRET = 'vQ8#nL2$pZ5@wR9!kT4m'\n"),
]


@pytest.mark.parametrize("rel, text", _PLANTED_SECRETS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(_PLANTED_SECRETS)])
def test_scanner_finds_planted_secrets(rel, text):
    assert secret_findings(rel, text), f"missed a planted secret in {rel}: {text!r}"


@pytest.mark.parametrize("rel, text", [
    ("tests/servers.py", "secret_key: str = 'testing'\n"),
    ("tests/test_x.py", "env = {'POSTGRES_PASSWORD': 'pg-secret'}\n"),
    ("tasks/x.py", "url.render_as_string(hide_password=True)\n"),
    ("deploy/env.example", "POSTGRES_PASSWORD=\nAIRFLOW_PASSWORDS_FILE=./secrets/pw.json\n"),
    ("docker-compose.yml", "  POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it}\n  X: redis://:${REDIS_PASSWORD}@r\n"),
])
def test_scanner_accepts_placeholders(rel, text):
    assert secret_findings(rel, text) == []


# ---- (2) no shell in our code; (3) torch.load is weights_only; (4) no pickle / unsafe yaml -------------------------

SHELL_CALLS = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
               "asyncio.create_subprocess_shell", "commands.getoutput"}
PICKLE_CALLS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "cPickle.load",
                "cPickle.loads", "dill.load", "dill.loads", "joblib.load", "pandas.read_pickle", "shelve.open",
                "marshal.load", "marshal.loads", "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load",
                "yaml.full_load_all"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader"}


class _Calls(ast.NodeVisitor):
    """Every call with its dotted target (imports resolved: `import subprocess as sp` -> subprocess.*) and the
    function it sits in."""

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


def shell_findings(rel: str, source: str) -> list[str]:
    findings = []
    for name, call, _ in calls_in(source):
        shell = _keyword(call, "shell")
        if name in SHELL_CALLS or (shell is not None and not (_is_constant(shell, False) or _is_constant(shell, None))):
            findings.append(f"{rel}:{call.lineno}: {name or 'call'}(...) runs a shell")
    return findings


def unsafe_load_findings(rel: str, source: str) -> list[str]:
    findings = []
    for name, call, function in calls_in(source):
        if (rel, function) in ALLOWED_UNSAFE_LOADS:
            continue
        where = f"{rel}:{call.lineno}: {name}"
        if name in ("torch.load", "torch.serialization.load") and not _is_constant(_keyword(call, "weights_only"),
                                                                                     True):
            findings.append(f"{where} without weights_only=True")
        elif name in PICKLE_CALLS:
            findings.append(f"{where} deserialises arbitrary objects")
        elif name in ("yaml.load", "yaml.load_all"):
            loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
            loader_name = _Calls().dotted(loader) if loader is not None else None
            if not loader_name or loader_name.rsplit(".", 1)[-1] not in SAFE_YAML_LOADERS:
                findings.append(f"{where} without Loader=SafeLoader")
        elif name in ("numpy.load", "np.load") and not (_keyword(call, "allow_pickle") is None
                                                         or _is_constant(_keyword(call, "allow_pickle"), False)):
            findings.append(f"{where} with allow_pickle")
    return findings


def test_no_shell_in_dags_tasks_spark_jobs_models_scripts():
    files = python_files(SHIPPED_CODE)
    assert {"tasks/core/process.py", "tasks/core/spark_submit.py"} <= set(files)
    assert [f for rel in files for f in shell_findings(rel, text_of(rel))] == []


def test_every_torch_load_is_weights_only_and_nothing_unpickles():
    files = python_files()
    loads = [name for rel in files for name, _, _ in calls_in(text_of(rel)) if name == "torch.load"]
    assert loads, "no torch.load found at all: the scan is not looking at the checkpoint loader"
    assert [f for rel in files for f in unsafe_load_findings(rel, text_of(rel))] == []


@pytest.mark.parametrize("source", [
    "import subprocess\nsubprocess.run('ls', shell=True)\n",
    "import subprocess as sp\nsp.Popen(cmd, shell=flag)\n",
    "import os\nos.system('ls')\n",
    "from os import popen as p\np('ls')\n",
    "import subprocess\nsubprocess.getoutput('ls')\n",
])
def test_scanner_finds_planted_shell(source):
    assert shell_findings("tasks/x.py", source)
    assert shell_findings("tasks/x.py", "import subprocess\nsubprocess.run(['ls'], shell=False)\n# os.system\n") == []


@pytest.mark.parametrize("source", [
    "import torch\ntorch.load(p)\n",
    "import torch as T\nT.load(p, weights_only=False)\n",
    "from torch import load\nload(p, map_location='cpu')\n",
    "import pickle\npickle.loads(b)\n",
    "import yaml\nyaml.load(s)\n",
    "import yaml\nyaml.load(s, Loader=yaml.Loader)\n",
    "import yaml\nyaml.full_load(s)\n",
    "import numpy as np\nnp.load(f, allow_pickle=True)\n",
    "import pandas as pd\npd.read_pickle(f)\n",
])
def test_scanner_finds_planted_unsafe_loads(source):
    assert unsafe_load_findings("models/x.py", source)
    safe = ("import torch, yaml\ntorch.load(p, weights_only=True)\nyaml.load(s, Loader=yaml.SafeLoader)\n"
            "yaml.safe_load(s)\n")
    assert unsafe_load_findings("models/x.py", safe) == []


# ---- (5) the compose file ships no default password ---------------------------------------------------------------

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
        if SECRET_VAR.search(key) and not key.upper().endswith("_FILE") and not REFERENCE.fullmatch(value.strip()):
            findings.append(f"{where}.{key} is a literal, not a ${{VAR:?...}} reference")
        if key.lower() == "simple_auth_manager_all_admins" or key.upper().endswith("__SIMPLE_AUTH_MANAGER_ALL_ADMINS"):
            findings.append(f"{where}.{key} turns authentication off")
    for name, secret in (document.get("secrets") or {}).items():
        if "file" in secret and not REQUIRED_REFERENCE.fullmatch(str(secret["file"])):
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
    assert "${POSTGRES_PASSWORD:?" in compose_text  # the scan sees the real file's secrets
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
    from tasks.criteo.ingest import download_day
    from tasks.core.download import DownloadError
    from tests.reliability.contract import nothing_complete, one_line

    data, outside = tmp_path / "data", tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "day_0"
    secret.write_bytes(b"0\t1\n")
    (data / "criteo" / "source").mkdir(parents=True)
    (data / "criteo" / "source" / "link").symlink_to(secret)  # a link out of an allowed root is followed first
    settings = load_settings({"RECFLOW_DATA_ROOT": str(data)})
    for url in (secret.as_uri(), str(secret), "file:///etc/passwd", (data / "criteo/source/link").as_uri(),
                (data / "criteo/source/../../../elsewhere/day_0").as_uri()):
        with pytest.raises(DownloadError) as caught:
            download_day(settings, 0, source=url)
        one_line(caught.value, "outside the allowed roots", "RECFLOW_FILE_SOURCE_ROOTS")
    nothing_complete(data)
    assert not any((data / "criteo").glob("raw/**/day_0*"))
    # Allowed explicitly (or under the configured source's folder), the same file downloads.
    allowed = load_settings({"RECFLOW_DATA_ROOT": str(data), "RECFLOW_FILE_SOURCE_ROOTS": f"/nonexistent:{outside}"})
    assert download_day(allowed, 0, source=secret.as_uri())["bytes"] == 4
    templated = load_settings({"RECFLOW_DATA_ROOT": str(tmp_path / "d2"),
                               "RECFLOW_CRITEO_SOURCE": outside.as_uri() + "/day_{day}"})
    assert templated.allowed_file_roots == (tmp_path.resolve() / "d2", outside.resolve())
    assert download_day(templated, 0)["bytes"] == 4
