"""The one list of settings (issue #25 item 3): every RECFLOW_* variable the code or the deployment files name is
declared in tasks/core/settings_registry.py (or a dataset's settings.py), the code reads none by hand, the README's
table is the one generated from the declarations, and `python -m tasks settings` lists them with masked secrets."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from tasks.core import settings_registry as registry
from tasks.core.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^RECFLOW_[A-Z0-9_]+$")
MENTION = re.compile(r"\bRECFLOW_[A-Z0-9_]*[A-Z0-9]\b")
SKIPPED_DIRS = {"tests", "node_modules", ".git", ".venv", ".venv-nvtabular", "data"}
DEPLOYMENT_FILES = ("docker-compose.yml", "Makefile", "deploy/Dockerfile", "deploy/env.example",
                    "deploy/make-secrets.sh", "scripts/airflow_init.sh", "scripts/airflow_env.sh")
# Raw reads allowed, each with its reason (the setting is declared all the same).
RAW_READS_ALLOWED = {
    "deploy/secret_url.py": "runs as a standalone stdlib script from Airflow's *_CMD options in the containers, before "
                            "recflow's code is on the path: RECFLOW_SECRETS_DIR only locates the secret files",
}


def source_files() -> list[Path]:
    return sorted(path for path in REPO.rglob("*.py")
                  if not SKIPPED_DIRS & set(path.relative_to(REPO).parts[:-1]) and path.is_file())


def raw_reads_and_names(path: Path) -> tuple[list[str], set[str]]:
    """(raw environment reads of a RECFLOW_* literal: `x.get("RECFLOW_…")`, `getenv(…)`, `x["RECFLOW_…"]`; every
    RECFLOW_* name the file names, as a literal or in its text)."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    reads: list[str] = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("get", "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and NAME.match(key.value):
            reads.append(f"{path.relative_to(REPO)}:{node.lineno}: {key.value}")
    literals = {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value)}
    return reads, literals | set(MENTION.findall(text))


def declared_names() -> set[str]:
    return {setting.name for setting in registry.all_settings()}


def test_every_recflow_name_in_the_code_is_declared():
    declared = declared_names()
    undeclared = {f"{path.relative_to(REPO)}: {name}" for path in source_files()
                  for name in raw_reads_and_names(path)[1] if name not in declared}
    assert not undeclared, "RECFLOW_* names that are not declared settings:\n" + "\n".join(sorted(undeclared))


def test_the_code_reads_settings_only_through_their_declaration():
    reads = [read for path in source_files() if str(path.relative_to(REPO)) not in RAW_READS_ALLOWED
             for read in raw_reads_and_names(path)[0]]
    assert not reads, ("read these through tasks.core.settings_registry (read / value), not the environment:\n"
                       + "\n".join(reads))
    for rel in RAW_READS_ALLOWED:  # an exception that no longer applies is removed, not kept
        assert raw_reads_and_names(REPO / rel)[0], f"{rel} no longer reads a setting by hand"


def test_every_setting_the_deployment_files_set_is_declared():
    declared = declared_names()
    found = {name: rel for rel in DEPLOYMENT_FILES if (REPO / rel).exists()
             for name in MENTION.findall((REPO / rel).read_text())}
    assert found, "the deployment files name no setting: the scan is broken"
    missing = {f"{rel}: {name}" for name, rel in found.items() if name not in declared}
    assert not missing, "settings set by the deployment files but not declared:\n" + "\n".join(sorted(missing))


def test_the_scan_sees_a_planted_violation(tmp_path, monkeypatch):
    planted = tmp_path / "planted.py"
    planted.write_text('import os\nENGINE = "RECFLOW_PLANTED_ENGINE"\n\n'
                       'def f(env):\n'
                       '    return (os.environ.get("RECFLOW_DATA_ROOT"), env["RECFLOW_PROFILE"],\n'
                       '            os.getenv("RECFLOW_X"))\n'
                       '"""mentions RECFLOW_PLANTED_DOC in text"""\n')
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    reads, names = raw_reads_and_names(planted)
    assert [read.split(": ")[1] for read in reads] == ["RECFLOW_DATA_ROOT", "RECFLOW_PROFILE", "RECFLOW_X"]
    assert {"RECFLOW_PLANTED_ENGINE", "RECFLOW_PLANTED_DOC"} <= names - declared_names()
    monkeypatch.setattr(f"{__name__}.source_files", lambda: [planted])
    with pytest.raises(AssertionError, match="RECFLOW_PLANTED_ENGINE"):
        test_every_recflow_name_in_the_code_is_declared()
    with pytest.raises(AssertionError, match="RECFLOW_DATA_ROOT"):
        test_the_code_reads_settings_only_through_their_declaration()


def test_each_declaration_is_complete_and_named_once():
    settings = registry.all_settings()
    assert len(settings) == len({s.name for s in settings}) >= 60
    for setting in settings:
        assert NAME.match(setting.name) and setting.type and setting.doc and "\n" not in setting.doc, setting
        assert setting.where in ("python", "deploy"), setting


def test_an_undeclared_name_is_refused_and_a_second_different_declaration_too():
    with pytest.raises(KeyError, match="RECFLOW_NOT_A_SETTING is not a declared setting"):
        registry.read("RECFLOW_NOT_A_SETTING", {})
    same = registry.declared("RECFLOW_PROFILE")
    registry.declare(same)  # the same declaration again (a module re-imported) is fine
    with pytest.raises(ValueError, match="declared twice"):
        registry.declare(registry.Setting("RECFLOW_PROFILE", "choice", "demo", "another default"))
    with pytest.raises(ValueError, match="named RECFLOW_"):
        registry.declare(registry.Setting("OTHER_PROFILE", "str", "", "no prefix"))


def _typed(setting: registry.Setting, default: object) -> object:
    text = setting.default
    if isinstance(default, tuple):
        return tuple(item for item in re.split(r"[,\s]+", text) if item)
    return type(default)(text)


def test_settings_defaults_are_the_declared_defaults():
    """The Settings dataclass's typed defaults are the declarations' (no second value drifting away)."""
    defaults = Settings()
    names = {f.name for f in fields(Settings)}
    checked = 0
    for setting in registry.all_settings():
        if not setting.field:
            continue
        assert setting.field in names, setting
        default = getattr(defaults, setting.field)
        if setting.default:
            assert _typed(setting, default) == default, setting.name
            checked += 1
        else:
            assert default in ("", 0, (), None) or setting.field == "data_root", setting.name
    assert checked >= 15
    assert load_settings({}) == defaults


def test_value_falls_back_to_the_declared_default_and_read_to_none():
    assert registry.value("RECFLOW_TASK_RETRIES", {}) == "2"
    assert registry.value("RECFLOW_TASK_RETRIES", {"RECFLOW_TASK_RETRIES": "0"}) == "0"
    assert registry.read("RECFLOW_TASK_RETRIES", {}) is None
    assert registry.value("RECFLOW_RETRAIN_CRON", {}) == "0 6 * * 1"  # a dataset's, loaded on first use


def test_the_readme_table_is_the_generated_one():
    readme = (REPO / "README.md").read_text()
    assert registry.readme_with_table(readme) == readme, (
        "README.md's settings table is stale: run `python -m tasks settings --markdown --update-readme`")
    for setting in registry.all_settings():
        assert f"| `{setting.name}` |" in readme


def test_secret_looking_values_are_masked():
    plain = registry.declared("RECFLOW_PUBLISH_URI")
    assert registry.masked(plain, "s3://models/published") == "s3://models/published"
    url = "https://user:hunter2@host/x"  # pragma: allowlist secret
    assert registry.masked(plain, url) == "https://user:***@host/x"
    presigned = registry.masked(plain, "https://b.s3/x.gz?X-Amz-Signature=abc&X-Amz-Credential=k&day=3")
    assert "abc" not in presigned and "=k" not in presigned and "day=3" in presigned
    secret = registry.Setting("RECFLOW_REGISTRY_PASSWORD", "str", "", "a password")
    assert registry.masked(secret, "hunter2") == registry.MASK


def test_the_settings_command_prints_every_setting_with_its_value(monkeypatch, capsys):
    from tasks.cli import main

    monkeypatch.setenv("RECFLOW_MAX_DAY_INDEX", "77")
    monkeypatch.setenv("RECFLOW_CRITEO_SOURCE", "https://me:hunter2@mirror/day_{day}.gz")  # pragma: allowlist secret
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("RECFLOW_")}
    assert set(lines) == declared_names()
    assert lines["RECFLOW_MAX_DAY_INDEX"] == ["env", "77"]
    assert lines["RECFLOW_TASK_RETRIES"] == ["default", "2"]
    assert "hunter2" not in out and "https://me:***@mirror/day_{day}.gz" in out
    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == registry.markdown_table()
