"""The package layout's rules, checked on the source (AST imports, not text):

- generic packages name no dataset: they never import a dataset package, and the word "criteo" (or another
  dataset's name) appears nowhere in them, code or docs;
- a dataset package never imports another dataset package (a new pipeline touches only its own folders);
- models never import a dataset package or the Airflow glue;
- DAG files import, at module level, only Airflow and the parse-cheap glue (no model, Spark or TensorFlow code);
- imports point one way (issue #25 item 2), down the layers of LAYERS: DAGs -> pipelines -> {engines, models,
  release} -> dataset contracts -> core and formats. Nothing imports upward, and the units of one layer (each engine,
  models, release) do not import each other sideways: what a dataset's engines share is in its contract module.
The DAG-integrity test checks the DAG rule at run time too (which modules a parse really loads).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GENERIC = ("tasks/core", "tasks/formats", "tasks/release", "tasks/dagkit", "models/common", "models/torchkit",
           "models/tfkit", "spark_jobs/common.py")
DATASET_PACKAGES = sorted(p.name for p in (REPO / "tasks").iterdir()
                          if p.is_dir() and (p / "__init__.py").exists() and f"tasks/{p.name}" not in GENERIC)
MODEL_PACKAGES = sorted(p.name for p in (REPO / "models").iterdir()
                        if p.is_dir() and (p / "__init__.py").exists() and f"models/{p.name}" not in GENERIC)
FORBIDDEN_AT_DAG_PARSE = ("models", "spark_jobs", "torch", "tensorflow", "keras", "pyspark", "sklearn", "pyarrow",
                          "great_expectations")


def python_files(rel: str) -> list[Path]:
    path = REPO / rel
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def imported_modules(path: Path, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (`from a.b import c` gives a.b and a.b.c)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def dataset_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] in ("tasks", "spark_jobs") and parts[1] in DATASET_PACKAGES:
        return parts[1]
    return None


def test_the_layout_has_generic_and_dataset_packages():
    assert {"criteo", "movielens"} <= set(DATASET_PACKAGES) and {"dlrm", "ncf"} <= set(MODEL_PACKAGES)
    for rel in GENERIC:
        assert python_files(rel), f"{rel} holds no Python file"


@pytest.mark.parametrize("rel", GENERIC)
def test_generic_packages_import_no_dataset_package(rel):
    found = {f"{path.relative_to(REPO)}: {module}" for path in python_files(rel)
             for module in imported_modules(path) if dataset_of(module)}
    assert not found, f"generic code imports a dataset package: {sorted(found)}"


@pytest.mark.parametrize("rel", GENERIC)
def test_generic_packages_name_no_dataset(rel):
    words = [*DATASET_PACKAGES, "outbrain", "movielens"]
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}" for path in python_files(rel)
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if any(word in line.lower() for word in words)]
    assert not found, "generic code names a dataset:\n" + "\n".join(found)


def test_dataset_packages_do_not_import_each_other():
    for dataset in DATASET_PACKAGES:
        for rel in (f"tasks/{dataset}", f"spark_jobs/{dataset}"):
            if not (REPO / rel).exists():
                continue
            for path in python_files(rel):
                others = {m for m in imported_modules(path) if dataset_of(m) not in (None, dataset)}
                assert not others, f"{path.relative_to(REPO)} imports another dataset's package: {sorted(others)}"


def test_models_import_no_dataset_package_and_no_airflow_glue():
    for path in python_files("models"):
        bad = {m for m in imported_modules(path) if dataset_of(m) or m.startswith(("tasks.dagkit", "airflow"))}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_dag_files_import_no_model_spark_or_tf_code_at_module_level():
    for path in python_files("dags"):
        bad = {m for m in imported_modules(path, top_level_only=True)
               if m.split(".")[0] in FORBIDDEN_AT_DAG_PARSE}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)} at parse time"


def test_the_checks_see_a_planted_violation(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom tasks.criteo.schema import LABEL\n\ndef f():\n    import torch\n")
    modules = imported_modules(planted)
    assert {dataset_of(m) for m in modules} >= {"criteo"} and "torch" in modules
    assert "torch" not in imported_modules(planted, top_level_only=True)


def test_every_dataset_package_is_registered_once_with_a_demo():
    import importlib

    from tasks.pipelines import PIPELINES

    registered = {module.split(".")[1] for module in PIPELINES.values()}
    assert registered == set(DATASET_PACKAGES), "a dataset package without a pipeline line (or the reverse)"
    for module in PIPELINES.values():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_arguments) and callable(loaded.run_demo), module


# ---- imports point one way ----------------------------------------------------------------------------------------

# The layers, top to bottom: (layer, [(unit, what belongs to it)]). A module may import a module of a lower layer, or
# one of its own unit; never upward, never sideways into another unit of its layer. A dataset package's modules are
# contracts when named in CONTRACT_MODULES, engines when named *_arrow, and pipeline steps otherwise.
LAYERS = (
    ("dags", [("dags", "dags/")]),
    ("pipelines", [("pipelines", "tasks/cli.py, tasks/pipelines.py, tasks/dagkit/, the steps of tasks/<dataset>/")]),
    ("engines, models, release", [("spark", "spark_jobs/"), ("nvtabular", "nvt_jobs/"),
                                  ("arrow", "tasks/<dataset>/*_arrow.py"), ("models", "models/"),
                                  ("release", "tasks/release/")]),
    ("dataset contracts", [("contracts", "tasks/<dataset>/<one of CONTRACT_MODULES>.py")]),
    ("core and formats", [("core", "tasks/core/, tasks/formats/")]),
)
CONTRACT_MODULES = ("contract", "schema", "layout", "settings", "spec", "raw_fields", "raw_rows", "raw_tables",
                    "raw_ratings")
# Imports allowed against the rule, each with its reason: (importing module, imported module) -> why.
ALLOWED_IMPORTS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> tuple[int, str] | None:
    """(depth in LAYERS, unit) of a module of this repository; None for everything else (stdlib, third party)."""
    parts = module.split(".")
    if parts[0] == "dags":
        return 0, "dags"
    if parts[0] == "spark_jobs":
        return 2, "spark"
    if parts[0] == "nvt_jobs":
        return 2, "nvtabular"
    if parts[0] == "models":
        return 2, "models"
    if parts[0] != "tasks":
        return None
    package = parts[1] if len(parts) > 1 else ""
    if package in ("core", "formats"):
        return 4, "core"
    if package == "release":
        return 2, "release"
    if package in DATASET_PACKAGES and len(parts) > 2:
        if parts[2].endswith("_arrow"):
            return 2, "arrow"
        if parts[2] in CONTRACT_MODULES:
            return 3, "contracts"
    return 1, "pipelines"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_targets(path: Path) -> set[str]:
    """The repository modules a file imports: `from a import b` counts a.b when b is a module, else a."""
    tree = ast.parse(path.read_text(), filename=str(path))
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = REPO.joinpath(*node.module.split("."), alias.name)
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                targets.add(f"{node.module}.{alias.name}" if is_module else node.module)
    return {target for target in targets if layer_of(target) is not None}


def wrong_way_imports(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        source = module_name(path)
        depth, unit = layer_of(source)
        for target in sorted(import_targets(path)):
            target_depth, target_unit = layer_of(target)
            if target_depth > depth or target_unit == unit or (source, target) in ALLOWED_IMPORTS:
                continue
            way = "up" if target_depth < depth else "sideways"
            found.append(f"{path.relative_to(REPO)}: {target} ({unit} -> {target_unit}, {way})")
    return found


def layered_files() -> list[Path]:
    return [path for top in ("dags", "tasks", "models", "spark_jobs", "nvt_jobs") for path in python_files(top)]


def test_imports_point_one_way():
    found = wrong_way_imports(layered_files())
    assert not found, "imports against the layers (tests/test_layout.py LAYERS):\n" + "\n".join(found)


def test_every_allowed_exception_is_still_needed():
    imports = {(module_name(path), target) for path in layered_files() for target in import_targets(path)}
    assert set(ALLOWED_IMPORTS) <= imports, "an allowed import no longer happens: remove it from ALLOWED_IMPORTS"


def test_the_layer_check_sees_planted_violations(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    planted = tmp_path / "tasks" / "criteo" / "preprocess_arrow.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from spark_jobs.criteo.transform import ROW_ORDER\nfrom tasks.criteo.schema import LABEL\n\n"
                       "def f():\n    from tasks.criteo.dlrm import run_paths\n")
    contract = tmp_path / "tasks" / "criteo" / "contract.py"
    contract.write_text("from tasks.release import runs\nfrom tasks.core import storage\n")
    found = wrong_way_imports([planted, contract])
    assert found == ["tasks/criteo/preprocess_arrow.py: spark_jobs.criteo.transform (arrow -> spark, sideways)",
                     "tasks/criteo/preprocess_arrow.py: tasks.criteo.dlrm (arrow -> pipelines, up)",
                     "tasks/criteo/contract.py: tasks.release (contracts -> release, up)"]


def test_the_layer_map_covers_every_layered_module():
    units = {unit for _, members in LAYERS for unit, _ in members}
    for path in layered_files():
        assert layer_of(module_name(path))[1] in units, path
    for dataset in DATASET_PACKAGES:
        assert any((REPO / "tasks" / dataset / f"{name}.py").exists() for name in CONTRACT_MODULES), dataset


def test_spark_and_nvtabular_jobs_are_launched_not_imported():
    """spark_jobs/ and nvt_jobs/ run in their own processes (spark-submit; NVTabular's environment): the steps name
    them by path or module string, and take what they share from the dataset's contract, never from a job module."""
    found = [f"{path.relative_to(REPO)}: {module}"
             for top in ("dags", "tasks", "models", "bench", "scripts") for path in python_files(top)
             for module in imported_modules(path) if module.split(".")[0] in ("spark_jobs", "nvt_jobs")]
    assert not found, "modules importing a job module:\n" + "\n".join(found)
