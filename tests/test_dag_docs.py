"""Every DAG's page says what its code does: doc_md is the DAG file's prose plus a schedule sentence and a form
table written from the DAG's own timetable and params (tasks/dagkit/docs.py), and the prose makes no schedule claim
of its own that could drift from the timetable."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Parsed in a fresh interpreter with a chosen cron setting: the page must follow the code, not the code's default.
_PROBE = r"""
import ast, json, sys
from airflow.dag_processing.dagbag import DagBag
from tasks.dagkit.docs import render
bag = DagBag(dag_folder=sys.argv[1])
out = {}
for dag_id, dag in bag.dags.items():
    prose = ast.get_docstring(ast.parse(open(dag.fileloc).read()))
    out[dag_id] = {"doc_md": dag.doc_md, "expected": render(dag, prose), "prose": prose or "",
                   "params": list(dag.params)}
print(json.dumps({"errors": {k: str(v)[-300:] for k, v in bag.import_errors.items()}, "dags": out}))
"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict:
    import json

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow_home")), "PYTHONPATH": str(REPO),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "RECFLOW_RETRAIN_CRON": "17 3 * * 2"}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(REPO / "dags")], env=env, capture_output=True,
                         text=True, timeout=180, check=True)
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not parsed["errors"], parsed["errors"]
    return parsed["dags"]


def test_every_dag_page_is_its_prose_plus_its_own_schedule_and_form(pages):
    dag_files = {ast.get_docstring(ast.parse(p.read_text())) for p in (REPO / "dags").glob("*.py")}
    assert len(pages) == len(list((REPO / "dags").glob("*.py"))) and None not in dag_files
    for dag_id, page in pages.items():
        assert page["doc_md"] == page["expected"], f"{dag_id}: doc_md is not tasks.dagkit.docs.render's"
        assert page["prose"].strip() and page["doc_md"].startswith(page["prose"].strip())


def test_the_schedule_sentence_follows_the_timetable_the_code_built(pages):
    # The cron was set through the environment at parse time: the page shows it, not the default in the code.
    assert "On the cron `17 3 * * 2` UTC" in pages["criteo_dlrm"]["doc_md"]
    assert "On the cron `0 0 * * *` UTC, one run per data interval" in pages["criteo_ingest"]["doc_md"]
    assert "Manual only" in pages["movielens_ncf"]["doc_md"].split("#### When it runs")[1]  # triggered by ingest
    assert "Manual only" in pages["byo_dlrm"]["doc_md"]


def test_the_prose_makes_no_schedule_claim_of_its_own(pages):
    claims = re.compile(r"\bcron\b|schedul(?:e|ed on)\b|\basset events?\b", re.IGNORECASE)
    for dag_id, page in pages.items():
        found = claims.findall(page["prose"])
        assert not found, f"{dag_id}: its docstring states a schedule ({found}); the generated section says it"


def test_the_form_table_lists_every_param_in_order(pages):
    for dag_id, page in pages.items():
        table = page["doc_md"].split("#### Form", 1)[1]
        listed = re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.MULTILINE)
        assert listed == page["params"], dag_id
