"""Bad-input corpus, DAG params: values the trigger form / REST API must refuse before any DAG run exists (so nothing
can be marked complete), checked against the DAGs' own Params (JSON schema). The DAG folder is parsed once per module
in a child interpreter with its own AIRFLOW_HOME, so Airflow's configuration never loads into the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

REPO = Path(__file__).resolve().parents[2]

_PARAMS_PROBE = r"""
import copy, json, sys
from airflow.dag_processing.dagbag import DagBag
cases = json.load(sys.stdin)
bag = DagBag(dag_folder=sys.argv[1])
results = {}
for case_id, (dag_id, name, value) in cases.items():
    params = copy.deepcopy(bag.dags[dag_id].params)
    assert name in params, f"{dag_id} has no param {name}"
    try:
        params[name] = value  # ParamsDict validates the value against the Param's JSON schema
        params.validate()
        results[case_id] = {"rejected": False}
    except Exception as exc:
        results[case_id] = {"rejected": True, "type": f"{type(exc).__module__}.{type(exc).__name__}",
                            "message": str(exc)}
print("PARAMS-RESULT " + json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()},
                                     "results": results}))
"""

INGEST, DLRM = "criteo_ingest", "criteo_dlrm"
BAD_PARAMS = [  # id, dag, param, value
    ("source-url-semicolon-rm", INGEST, "source_url", "file:///x; rm -rf /"),
    ("source-url-pipe", INGEST, "source_url", "http://host/day_0|sh"),
    ("source-url-and-and", INGEST, "source_url", "s3://bucket/day_0&&curl evil"),
    ("source-url-command-substitution", INGEST, "source_url", "file:///$(reboot)"),
    ("source-url-backticks", INGEST, "source_url", "https://host/`id`"),
    ("source-url-newline", INGEST, "source_url", "file:///data/day_0\nrm -rf /"),
    ("source-url-ftp-scheme", INGEST, "source_url", "ftp://host/day_0"),
    ("day-negative", INGEST, "day", -1),
    ("day-out-of-range", INGEST, "day", 10_001),
    ("day-as-shell-string", INGEST, "day", "3; ls"),
    ("bad-row-budget-above-1", INGEST, "bad_row_budget", 1.5),
    ("bad-row-budget-negative", INGEST, "bad_row_budget", -0.01),
    ("expected-sha256-not-hex", INGEST, "expected_sha256", "z" * 64),
    ("aws-conn-id-shell", INGEST, "aws_conn_id", "aws_default;id"),
    ("train-days-shell", DLRM, "train_days", "0-3;ls"),
    ("threshold-overrides-shell", DLRM, "threshold_overrides", "cat_1:2 && ls"),
    ("bottom-mlp-command-substitution", DLRM, "bottom_mlp", "512,$(id)"),
    ("nproc-zero", DLRM, "nproc", 0),
    ("nproc-too-many", DLRM, "nproc", 65),
    ("batch-size-zero", DLRM, "batch_size", 0),
    ("lr-zero", DLRM, "lr", 0),
    ("device-unknown", DLRM, "device", "tpu"),
    ("dictionary-days-unknown", DLRM, "dictionary_days", "some"),
    ("min-auc-above-1", DLRM, "min_auc", 1.2),
    ("model-name-path", DLRM, "model_name", "team/criteo"),
    ("model-name-parent", DLRM, "model_name", "../criteo"),
    pytest.param("model-name-dotdot", DLRM, "model_name", "..", id="model-name-dotdot"),
    ("publish-uri-shell", DLRM, "publish_uri", "s3://bucket/models;rm -rf /"),
    ("publish-uri-relative", DLRM, "publish_uri", "published/models"),
]
GOOD_PARAMS = [  # controls: the probe accepts what the DAGs accept
    ("source-url-s3", INGEST, "source_url", "s3://criteo-bucket/raw/day_0.gz"),
    ("source-url-https-query", INGEST, "source_url", "https://host/day_0.gz?X-Amz-Expires=300"),
    ("day-3", INGEST, "day", 3),
    ("model-name", DLRM, "model_name", "criteo_dlrm-v2.1"),
    ("publish-uri-s3", DLRM, "publish_uri", "s3://recflow-models/published"),
    # Well-formed, so the form takes them; the deployment's allow-lists refuse them where they are used, on the
    # task's first try (test_bad_inputs.py: source / publish store / connection outside the allow-lists).
    ("source-url-any-host", INGEST, "source_url", "https://evil.example/day_0"),
    ("aws-conn-id-any-connection", INGEST, "aws_conn_id", "prod_admin"),
    ("publish-uri-any-directory", DLRM, "publish_uri", "/etc/recflow"),
]


def _case_id(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.fixture(scope="module")
def param_results(tmp_path_factory) -> dict:
    cases = {}
    for case in BAD_PARAMS + GOOD_PARAMS:
        values = case.values if hasattr(case, "values") else case
        cases[values[0]] = list(values[1:])
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow_home")),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _PARAMS_PROBE, str(REPO / "dags")], input=json.dumps(cases),
                          env=env, capture_output=True, text=True, timeout=180)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PARAMS-RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    parsed = json.loads(lines[-1].removeprefix("PARAMS-RESULT "))
    assert parsed["errors"] == {}
    return parsed["results"]


@pytest.mark.parametrize("case_id, dag_id, name, value", BAD_PARAMS, ids=[_case_id(c) for c in BAD_PARAMS])
def test_bad_dag_param_is_rejected(param_results, case_id, dag_id, name, value):
    result = param_results[case_id]
    assert result["rejected"], f"{dag_id} accepted {name}={value!r}"
    assert result["type"] == "airflow.sdk.exceptions.ParamValidationError"
    # Airflow appends jsonschema's multi-line schema dump after this first line, which names the param and value.
    first = result["message"].splitlines()[0]
    assert first.startswith(f"Invalid input for param {name}: "), first
    print(f"[error line] ParamValidationError: {first}")


@pytest.mark.parametrize("case_id, dag_id, name, value", GOOD_PARAMS, ids=[c[0] for c in GOOD_PARAMS])
def test_good_dag_param_is_accepted(param_results, case_id, dag_id, name, value):
    assert param_results[case_id] == {"rejected": False}
