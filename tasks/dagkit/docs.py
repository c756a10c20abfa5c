"""A DAG's doc_md from its own schedule and params, so the page the UI shows cannot drift from the code.

A DAG file's docstring says what the pipeline does (the prose); `document(dag, prose)` appends a "When it runs"
section written from the DAG's timetable and a "Form" table written from its params. tests/test_dag_docs.py
checks that every DAG's doc_md is exactly that, and that the prose itself makes no schedule claim.
"""

from __future__ import annotations

import re
from typing import Any


_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z(`])")


def describe_schedule(dag: Any) -> str:
    """One sentence for the DAG's timetable: manual only, a cron (trigger or data-interval) or asset events."""
    timetable = dag.timetable
    kind = type(timetable).__name__
    zone = getattr(timetable, "timezone", None)
    zone = f" {getattr(zone, 'name', zone)}" if zone is not None else ""
    if kind == "NullTimetable":
        return "Manual only: no schedule (trigger it from the UI's form, the REST API or `airflow dags trigger`)."
    if kind == "CronTriggerTimetable":
        return f"On the cron `{timetable.expression}`{zone}; a run has no data interval."
    if kind == "CronDataIntervalTimetable":
        return (f"On the cron `{timetable.expression}`{zone}, one run per data interval (the interval that just "
                "ended is the run's logical date); backfillable.")
    if kind == "AssetTriggeredTimetable":
        condition = timetable.asset_condition
        names = ", ".join(f"`{asset.name}`" for asset in getattr(condition, "objects", (condition,)))
        joined = "any" if type(condition).__name__ == "AssetAny" else "each"
        return f"When {joined} of these assets has a new event: {names}."
    raise ValueError(f"{dag.dag_id}: no description for a {kind} schedule (add one to tasks/dagkit/docs.py)")


def describe_params(dag: Any) -> list[str]:
    """Markdown table rows of the trigger form: param, its default (empty: the profile's or the deployment's value)
    and the first sentence of its description."""
    rows = ["| param | default | what it sets |", "|---|---|---|"]
    for name in dag.params:
        param = dag.params.get_param(name)
        default = "" if param.value is None else f"`{param.value}`"
        about = _SENTENCE_END.split(str(param.description or param.schema.get("title") or ""))[0].rstrip(".")
        rows.append(f"| `{name}` | {default} | {about.replace('|', '/')} |")
    return rows


def render(dag: Any, prose: str | None) -> str:
    """The doc_md `document` gives this DAG: its prose, then the generated schedule and form sections."""
    parts = [(prose or "").strip(), "", "#### When it runs", "", describe_schedule(dag)]
    if dag.params:
        parts += ["", "#### Form", "", *describe_params(dag)]
    return "\n".join(parts) + "\n"


def document(dag: Any, prose: str | None) -> Any:
    """Set the DAG's doc_md from its prose (the DAG file's docstring) and its own schedule and params."""
    dag.doc_md = render(dag, prose)
    return dag
