"""The Airflow UI as a new user meets it, in Chromium against a real api-server (scheduler + dag-processor +
api-server on PostgreSQL, LocalExecutor): every DAG's trigger dialog opens clean and triggers with its defaults,
bad param values are refused with the param's message, and a failed validation's log shows its one-line error.

The DAGs come from a DagBag of dags/, so a DAG added later is covered without editing this file. Each scenario is a
Node script (tests/browser/*.mjs) that prints one JSON result; screenshots land in build/browser-screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tasks.criteo.synthetic import CriteoDayGenerator, write_criteo_day

pytestmark = pytest.mark.browser

INGEST = "criteo_ingest"
ROWS = 2000
BAD_DAY = 5
# Values tried, in order, for a param with a pattern: the first its schema refuses is typed into the form.
BAD_STRINGS = ("not valid; at all", "%%%", " ", "0")


def _types(schema: dict) -> set[str]:
    kind = schema.get("type", [])
    return {kind} if isinstance(kind, str) else set(kind)


def _defaults(dag: dict) -> dict[str, Any]:
    return {name: param["default"] for name, param in dag["params"].items()}


def test_every_trigger_dialog_opens_clean_and_triggers_with_the_defaults(dagbag, cluster, browser):
    """For each DAG: the dialog shows no param in error and an enabled Trigger; Trigger (with "Unpause on trigger"
    unticked) creates one manual run whose conf is the params' defaults; the DAG stays paused."""
    api = cluster.api()
    problems = {}
    for dag_id, dag in dagbag.items():
        before = {run["dag_run_id"] for run in api.runs(dag_id)}
        result = browser.run("trigger_defaults", dag_id=dag_id, params=list(dag["params"]), trigger=True)
        print(f"\n{dag_id}: dialog '{result['heading']}' {result['seconds']} s, screenshot {result['screenshot']}; "
              f"unpause box offered {result.get('unpause_offered')}, ticked by default "
              f"{result.get('unpause_checked_by_default')}; logical date sent "
              f"{(result.get('sent') or {}).get('logical_date')}")
        if not result["clean"]:
            problems[dag_id] = f"the dialog opens with problems: {result['problems']}"
            continue
        if result["page_errors"]:
            problems[dag_id] = f"uncaught errors in the page: {result['page_errors']}"
            continue
        if result["status"] != 200:
            problems[dag_id] = f"Trigger answered HTTP {result['status']}: {result.get('answer')}"
            continue
        run_id = result["answer"]["dag_run_id"]
        run = api.run(dag_id, run_id)
        new_runs = {r["dag_run_id"] for r in api.runs(dag_id)} - before
        # Queued (paused DAG); nothing runs it. Marked failed so that unpausing the DAG later never starts it.
        api.set_run_state(dag_id, run_id, "failed")
        wrong = []
        if new_runs != {run_id}:
            wrong.append(f"runs created {sorted(new_runs)}, expected only {run_id}")
        if run["run_type"] != "manual" or run["state"] != "queued":
            wrong.append(f"run {run_id} is {run['run_type']}/{run['state']}, expected manual/queued")
        if run["conf"] != _defaults(dag):
            wrong.append(f"conf {run['conf']} != the params' defaults {_defaults(dag)}")
        if result.get("unpause_offered") and result.get("unpause_checked_at_trigger") is not False:
            wrong.append("the 'Unpause on trigger' box could not be unticked")
        if not api.dag(dag_id)["is_paused"]:
            wrong.append("the DAG was unpaused by the trigger")
        if wrong:
            problems[dag_id] = "; ".join(wrong)
    assert not problems, "\n".join(f"{dag_id}: {what}" for dag_id, what in problems.items())


def _refusal_cases(dag: dict) -> list[dict]:
    """Up to three bad values for one DAG, chosen from its params' schemas:
    - `required`: a string param that does not take null, emptied: the form marks it and disables Trigger;
    - `pattern`: a value that breaks a string param's pattern: the api-server's 400 names the param in the dialog;
    - `range`: a number param's minimum - 1: the field must not keep it."""
    cases = []
    params = dag["params"]
    required = [n for n, p in params.items() if _types(p["schema"]) == {"string"} and "enum" not in p["schema"]]
    if required:
        cases.append({"kind": "required", "param": required[0], "value": "", "submit": False})
    for name, param in params.items():
        schema = param["schema"]
        if "pattern" in schema and "string" in _types(schema):
            bad = next((s for s in BAD_STRINGS if not _valid(s, schema)), None)
            if bad is not None:
                cases.append({"kind": "pattern", "param": name, "value": bad, "submit": True})
                break
    for name, param in params.items():
        schema = param["schema"]
        if _types(schema) & {"integer", "number"} and "minimum" in schema and "enum" not in schema:
            cases.append({"kind": "range", "param": name, "value": str(schema["minimum"] - 1), "submit": False,
                          "minimum": schema["minimum"], "maximum": schema.get("maximum")})
            break
    return cases


def _valid(value: Any, schema: dict) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def test_bad_values_are_refused_with_the_params_message(dagbag, cluster, browser, failing_validation_run):
    # failing_validation_run: its criteo_ingest run (test below) executes while these cases are tried.
    api = cluster.api()
    problems = []
    for dag_id, dag in dagbag.items():
        before = {run["dag_run_id"] for run in api.runs(dag_id)}
        cases = _refusal_cases(dag)
        if not cases:
            continue
        result = browser.run("bad_values", dag_id=dag_id, params=list(dag["params"]), cases=[
            {"param": c["param"], "value": c["value"], "submit": c["submit"],
             "shot": f"bad-{c['kind']}-{dag_id}-{c['param']}.png"} for c in cases])
        for case, seen in zip(cases, result["cases"], strict=True):
            name, wrong, shown = case["param"], None, seen["problems"]
            field_messages = [f["message"] for f in shown["fields"] if f["name"] == name]
            print(f"\n{dag_id} {case['kind']} {name}={case['value']!r} ({seen['seconds']} s): field shows "
                  f"{seen['value_after_blur']!r}, field messages {field_messages}, Trigger enabled "
                  f"{shown['submit_enabled']}, HTTP {seen.get('status')}, alert "
                  f"{(shown['alert'] or '').splitlines()[:3]}; {seen['screenshot']}")
            if case["kind"] == "required":
                if shown["submit_enabled"] or field_messages != ["This field is required"]:
                    wrong = f"field messages {field_messages}, Trigger enabled {shown['submit_enabled']}"
            elif case["kind"] == "pattern":
                alert = shown["alert"] or ""
                if seen.get("status") != 400 or f"Invalid input for param {name}:" not in alert \
                        or "does not match" not in alert:
                    wrong = f"HTTP {seen.get('status')}, alert {alert!r}, sent {seen.get('sent')}"
            else:  # range: the number field clamps into [minimum, maximum] when it loses focus (or marks the field)
                value = seen["value_after_blur"]
                clamped = value not in ("", case["value"]) and float(value) >= case["minimum"] and (
                    case["maximum"] is None or float(value) <= case["maximum"])
                if not (clamped or field_messages or not shown["submit_enabled"]):
                    wrong = f"the field kept {value!r} with no message and Trigger enabled"
            if wrong:
                problems.append(f"{dag_id} {case['kind']} {name}={case['value']!r}: {wrong}")
        created = {run["dag_run_id"] for run in api.runs(dag_id)} - before
        if created:
            problems.append(f"{dag_id}: refused values created runs {sorted(created)}")
    assert not problems, "\n".join(problems)


def _write_bad_day(source: Path) -> None:
    """Day BAD_DAY: ROWS good rows with 3 broken (0.15% > the 0.1% budget), the first on line 11 (label 2)."""
    write_criteo_day(source / "day_0", 0, ROWS, generator=CriteoDayGenerator(seed=11))
    lines = (source / "day_0").read_bytes().split(b"\n")
    lines[10] = b"2" + lines[10][1:]                 # label outside {0,1}
    lines[20] = b"1\t2\t3"                           # 3 fields instead of 40
    fields = lines[30].split(b"\t")
    lines[30] = b"\t".join([fields[0], b"x7", *fields[2:]])  # non-numeric integer
    (source / f"day_{BAD_DAY}").write_bytes(b"\n".join(lines))
    (source / "day_0").unlink()


@pytest.fixture(scope="module")
def failing_validation_run(cluster) -> str:
    """A criteo_ingest run of a day that fails validation, triggered through the REST API (not waited for)."""
    api = cluster.api()
    _write_bad_day(Path(cluster.env["RECFLOW_DATA_ROOT"]) / "source")
    api.set_paused(INGEST, False)  # no scheduled run follows: day 0 (the epoch) is today, see recflow_env
    return api.trigger(INGEST, {"day": BAD_DAY})["dag_run_id"]


def test_a_failed_validation_shows_its_one_line_error_in_the_task_log(cluster, browser, failing_validation_run):
    api, run_id = cluster.api(), failing_validation_run
    run = cluster.wait_until(lambda: (r := api.run(INGEST, run_id))["state"] in ("success", "failed") and r, 300,
                             f"{INGEST} run {run_id} to finish", poll=2.0)
    tis = {ti["task_id"]: ti for ti in api.task_instances(INGEST, run_id)}
    assert run["state"] == "failed" and tis["validate_raw"]["state"] == "failed", (
        run["state"], {t: ti["state"] for t, ti in tis.items()})
    log = api.task_log(INGEST, run_id, "validate_raw")
    errors = [line.strip() for line in log.splitlines() if f"DataQualityError: day_{BAD_DAY}:" in line]
    assert errors, log[-3000:]
    error = re.sub(r"^(\w+\.)*(?=DataQualityError)", "", errors[-1])
    assert re.match(rf"DataQualityError: day_{BAD_DAY}: 3 bad rows of {ROWS} .*; first: day_{BAD_DAY} line 11, "
                    rf"field 1 \(label\), column 1: '2' label must be 0 or 1; ", error), error

    result = browser.run("task_log", dag_id=INGEST, run_id=run_id, task_id="validate_raw", try_number=1,
                         expect=f"DataQualityError: day_{BAD_DAY}:", shot=f"task-log-{INGEST}-validate_raw.png")
    print(f"\nUI log page {result['url']} ({result['seconds']} s): {result['texts']}; {result['screenshot']}")
    assert error in result["texts"], f"the UI shows {result['texts']}, the REST log {error!r}"
    assert "Failed" in result["state"], result["state"]
