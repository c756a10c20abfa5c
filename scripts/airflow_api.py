"""recflow's calls to Airflow 3's REST API (/api/v2) through Airflow's official Python client, apache-airflow-client:
log in, unpause, trigger with conf, wait, list runs and tasks (every page), read logs.

`AirflowApi` is a thin facade over the client's API classes (DAGApi, DagRunApi, TaskInstanceApi, ...): its methods
return rows as plain JSON dicts (what the server sent: nulls kept, timestamps as ISO strings), listings page through
all rows, and any other endpoint is one official call away: `PoolApi(api.client).get_pool("spark")`.

Authentication is the simple auth manager's: `POST /auth/token` with a user and password returns a JWT that is
sent as `Authorization: Bearer ...` (the password of a user named in `[core] simple_auth_manager_users` is in the
JSON file `[core] simple_auth_manager_passwords_file`, by default `$AIRFLOW_HOME/simple_auth_manager_passwords.json
.generated`). That endpoint is outside the client's spec, so `login` posts to it through the client's transport.
Other auth managers issue tokens differently; pass one with --token / AIRFLOW_API_TOKEN.

  export AIRFLOW_API_URL=http://localhost:8080 AIRFLOW_API_USER=admin AIRFLOW_API_PASSWORD=...
  python scripts/airflow_api.py unpause criteo_ingest
  python scripts/airflow_api.py trigger criteo_ingest --conf '{"day": 0}' --wait    # prints the run, exit 1 if failed
  python scripts/airflow_api.py runs criteo_ingest [--run-type backfill]
  python scripts/airflow_api.py tasks criteo_ingest <run id>
  python scripts/airflow_api.py log criteo_ingest <run id> validate_raw [--try 1]

Params are validated by the API server when a run is triggered: a bad conf is refused with HTTP 400 and the
validation message, and no run is created (ApiError carries the status and the message; the CLI exits 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import urllib3
from airflow_client.client import (ApiClient, ApiException, BackfillApi, Configuration, DAGApi, DAGPatchBody,
                                   DAGRunPatchBody, DagRunApi, ImportErrorApi, TaskInstanceApi,
                                   TriggerDAGRunPostBody, XComApi)
from pydantic_core import to_jsonable_python

FINISHED_RUN_STATES = frozenset({"success", "failed"})
PAGE_SIZE = 100  # rows per request; the server caps a page at [api] maximum_page_limit (100 by default)


class ApiError(ApiException):
    """An error answer of the API: the HTTP status and the server's message (FastAPI's `detail`)."""

    def __init__(self, method: str, url: str, status: int, reason: str | None, body: str):
        super().__init__(status=status, reason=reason, body=body)
        self.request = f"{method} {url}"
        try:
            self.detail: Any = json.loads(body)["detail"]
        except (ValueError, TypeError, KeyError):
            self.detail = body[:2000] or reason

    def __str__(self) -> str:
        return f"{self.request}: HTTP {self.status}: {self.detail}"


class _ApiClient(ApiClient):
    """The official ApiClient with a default timeout, raising ApiError for an error answer and ConnectionError
    (an OSError) when no answer comes."""

    def __init__(self, configuration: Configuration, timeout: float):
        super().__init__(configuration)
        self.timeout = timeout

    def call_api(self, method, url, header_params=None, body=None, post_params=None, _request_timeout=None):
        try:
            response = super().call_api(method, url, header_params, body, post_params,
                                        _request_timeout or self.timeout)
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionError(f"{method} {url}: {exc}") from exc
        if not 200 <= response.status <= 299:
            raise ApiError(method, url, response.status, response.reason, response.read().decode(errors="replace"))
        return response


class AirflowApi:
    """A logged-in client: `client` is the official ApiClient, the methods recflow's scripts and tests use."""

    def __init__(self, base_url: str, token: str | None, timeout: float = 30.0):
        self.client = _ApiClient(Configuration(host=base_url.rstrip("/"), access_token=token), timeout)
        self.dag_api, self.dag_run_api = DAGApi(self.client), DagRunApi(self.client)
        self.task_instance_api, self.xcom_api = TaskInstanceApi(self.client), XComApi(self.client)

    @classmethod
    def login(cls, base_url: str, username: str, password: str, timeout: float = 30.0) -> AirflowApi:
        """Get a JWT from the simple auth manager's token endpoint (POST /auth/token)."""
        api = cls(base_url, None, timeout)
        request = api.client.param_serialize("POST", "/auth/token", header_params={"Content-Type": "application/json"},
                                             body={"username": username, "password": password})
        response = api.client.call_api(*request)
        api.client.configuration.access_token = json.loads(response.read())["access_token"]
        return api

    def set_paused(self, dag_id: str, paused: bool) -> dict:
        """Pause or unpause a DAG."""
        return _plain(self.dag_api.patch_dag(dag_id, DAGPatchBody(is_paused=paused)))

    def dag(self, dag_id: str) -> dict:
        """A DAG (ApiError 404 until the dag-processor has parsed it)."""
        return _plain(self.dag_api.get_dag(dag_id))

    def import_errors(self) -> list[dict]:
        """Every DAG import error."""
        return _all(ImportErrorApi(self.client).get_import_errors, "import_errors", order_by=["id"])

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, logical_date: str | None = None,
                run_id: str | None = None, note: str | None = None) -> dict:
        """Create a manual run (logical_date None = a run without a logical date, keyed by its run_after)."""
        body = TriggerDAGRunPostBody(logical_date=logical_date, conf=conf or {}, dag_run_id=run_id, note=note)
        return _plain(self.dag_run_api.trigger_dag_run(dag_id, body))

    def run(self, dag_id: str, run_id: str) -> dict:
        """One run of a DAG."""
        return _plain(self.dag_run_api.get_dag_run(dag_id, run_id))

    def runs(self, dag_id: str, run_type: str | None = None) -> list[dict]:
        """Every run of a DAG, oldest first, optionally of one type (manual, scheduled, backfill, asset_triggered)."""
        return _all(self.dag_run_api.get_dag_runs, "dag_runs", dag_id=dag_id, order_by=["id"],
                    run_type=[run_type] if run_type else None)

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> dict:
        """Mark a run success / failed / queued (marking it failed also stops its running tasks)."""
        return _plain(self.dag_run_api.patch_dag_run(dag_id, run_id, DAGRunPatchBody(state=state)))

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600.0, poll: float = 2.0,
                     until: frozenset[str] = FINISHED_RUN_STATES) -> dict:
        """Poll a run until its state is in `until`; TimeoutError names the last state seen."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if run["state"] in until:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} run {run_id} still {run['state']} after {timeout:.0f} s")
            time.sleep(poll)

    def upstream_asset_events(self, dag_id: str, run_id: str) -> list[dict]:
        """The asset events that triggered an asset-triggered run (each with its `extra`)."""
        return [_plain(e) for e in self.dag_run_api.get_upstream_asset_events(dag_id, run_id).asset_events]

    def backfills(self, dag_id: str) -> list[dict]:
        """Backfills of a DAG, oldest first (`completed_at` is set once all their runs finished)."""
        return _all(BackfillApi(self.client).list_backfills, "backfills", dag_id=dag_id, order_by=["id"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of a run."""
        return _all(self.task_instance_api.get_task_instances, "task_instances", dag_id=dag_id,
                    dag_run_id=run_id, order_by=["id"])

    def task_tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict]:
        """Every try of a task instance, oldest first (the TI history plus the TI)."""
        tries = self.task_instance_api.get_task_instance_tries(dag_id, run_id, task_id).task_instances
        return sorted((_plain(t) for t in tries), key=lambda t: t["try_number"])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom value, deserialized (JSON-native values come back as they were returned)."""
        entry = self.xcom_api.get_xcom_entry(dag_id=dag_id, dag_run_id=run_id, task_id=task_id, xcom_key=key,
                                          deserialize=True)
        return entry.actual_instance.value

    def task_log_events(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[Any]:
        """The whole log of one try as structured events (dicts with timestamp, event, level, logger, ...)."""
        # Raw JSON: the client's log model keeps only `event` and `timestamp` of each event (level, logger and
        # error_detail are dropped when it parses the list), so read the answer of its official call ourselves.
        answer = self.task_instance_api.get_log_without_preload_content(dag_id, run_id, task_id, try_number,
                                                                        full_content=True)
        return json.loads(answer.data)["content"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The whole log of one try as text: one line per event, '<level> <logger>: <event>' when known."""
        return "\n".join(_log_line(entry) for entry in self.task_log_events(dag_id, run_id, task_id, try_number))


def _plain(model: Any) -> dict:
    """A response model as JSON-native data, nulls kept (the client's to_dict() drops them), extra fields merged."""
    data = model.model_dump(mode="json", by_alias=True, exclude={"additional_properties"})
    return {**data, **to_jsonable_python(getattr(model, "additional_properties", {}))}


def _all(list_page: Callable[..., Any], rows_field: str, **params: Any) -> list[dict]:
    """Every row of a listing endpoint, fetched PAGE_SIZE rows at a time (limit/offset) up to its total_entries."""
    rows: list[dict] = []
    while True:
        page = list_page(limit=PAGE_SIZE, offset=len(rows), **params)
        batch = getattr(page, rows_field)
        rows.extend(_plain(row) for row in batch)
        if not batch or (page.total_entries is not None and len(rows) >= page.total_entries):
            return rows


def _log_line(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    level, logger = entry.get("level", ""), entry.get("logger", "")
    prefix = " ".join(p for p in (str(level).upper(), f"{logger}:" if logger else "") if p)
    line = f"{prefix} {entry.get('event', '')}".strip()
    # A task's exception travels as structured `error_detail` (one item per chained exception), not in `event`.
    for error in entry.get("error_detail") or ():
        line += f"\n    {error.get('exc_type')}: {error.get('exc_value')}"
    return line


def _client(args: argparse.Namespace) -> AirflowApi:
    token = args.token or os.environ.get("AIRFLOW_API_TOKEN")
    if token:
        return AirflowApi(args.url, token)
    password = args.password or os.environ.get("AIRFLOW_API_PASSWORD")
    if not password:
        raise SystemExit("no credentials: set AIRFLOW_API_PASSWORD (or --password), or AIRFLOW_API_TOKEN")
    return AirflowApi.login(args.url, args.user, password)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("AIRFLOW_API_URL", "http://localhost:8080"))
    parser.add_argument("--user", default=os.environ.get("AIRFLOW_API_USER", "admin"))
    parser.add_argument("--password", default=None, help="default: $AIRFLOW_API_PASSWORD")
    parser.add_argument("--token", default=None, help="a JWT instead of user/password")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("unpause", "pause"):
        sub.add_parser(name).add_argument("dag_id")
    trigger = sub.add_parser("trigger")
    trigger.add_argument("dag_id")
    trigger.add_argument("--conf", type=json.loads, default={})
    trigger.add_argument("--logical-date", default=None, help="ISO timestamp with timezone; default none")
    trigger.add_argument("--wait", action="store_true", help="poll until the run finishes")
    trigger.add_argument("--timeout", type=float, default=3600.0)
    runs = sub.add_parser("runs")
    runs.add_argument("dag_id")
    runs.add_argument("--run-type", default=None, help="manual, scheduled, backfill, asset_triggered")
    for name in ("tasks", "log"):
        cmd = sub.add_parser(name)
        cmd.add_argument("dag_id")
        cmd.add_argument("run_id")
    log = sub.choices["log"]
    log.add_argument("task_id")
    log.add_argument("--try", dest="try_number", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line: print the answer as JSON (a log as text); exit 1 for a failed run, 2 for an error."""
    args = _parser().parse_args(argv)
    try:
        api = _client(args)
        if args.command in ("unpause", "pause"):
            result: Any = api.set_paused(args.dag_id, args.command == "pause")
        elif args.command == "trigger":
            result = api.trigger(args.dag_id, args.conf, args.logical_date)
            if args.wait:
                result = api.wait_for_run(args.dag_id, result["dag_run_id"], timeout=args.timeout)
        elif args.command == "runs":
            result = api.runs(args.dag_id, args.run_type)
        elif args.command == "tasks":
            result = api.task_instances(args.dag_id, args.run_id)
        else:
            print(api.task_log(args.dag_id, args.run_id, args.task_id, args.try_number))
            return 0
    except (ApiException, OSError, TimeoutError, ValueError) as exc:  # ValueError: the client refused an argument
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str))
    return 1 if isinstance(result, dict) and result.get("state") == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
