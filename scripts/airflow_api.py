"""A small client for Airflow 3's REST API (/api/v2): log in, unpause, trigger with conf, wait, list tasks, read logs.

Authentication is the simple auth manager's: `POST /auth/token` with a user and password returns a JWT that is
sent as `Authorization: Bearer ...` (the password of a user named in `[core] simple_auth_manager_users` is in the
JSON file `[core] simple_auth_manager_passwords_file`, by default `$AIRFLOW_HOME/simple_auth_manager_passwords.json
.generated`). Other auth managers issue tokens differently; pass one with --token / AIRFLOW_API_TOKEN.

  export AIRFLOW_API_URL=http://localhost:8080 AIRFLOW_API_USER=admin AIRFLOW_API_PASSWORD=...
  python scripts/airflow_api.py unpause criteo_ingest
  python scripts/airflow_api.py trigger criteo_ingest --conf '{"day": 0}' --wait    # prints the run, exit 1 if failed
  python scripts/airflow_api.py runs criteo_ingest [--run-type backfill]
  python scripts/airflow_api.py tasks criteo_ingest <run id>
  python scripts/airflow_api.py log criteo_ingest <run id> validate_raw [--try 1]

Params are validated by the API server when a run is triggered: a bad conf is refused with HTTP 400 and the
validation message, and no run is created (ApiError carries the status and the message).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests

FINISHED_RUN_STATES = frozenset({"success", "failed"})


class ApiError(RuntimeError):
    """A non-2xx answer: the HTTP status and the server's message (FastAPI's `detail`)."""

    def __init__(self, method: str, path: str, status: int, detail: Any):
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass
class AirflowApi:
    base_url: str
    token: str
    timeout: float = 30.0

    @classmethod
    def login(cls, base_url: str, username: str, password: str, timeout: float = 30.0) -> AirflowApi:
        """Get a JWT from the simple auth manager's token endpoint."""
        url = base_url.rstrip("/") + "/auth/token"
        response = requests.post(url, json={"username": username, "password": password}, timeout=timeout)
        if response.status_code >= 300:
            raise ApiError("POST", "/auth/token", response.status_code, _detail(response))
        return cls(base_url.rstrip("/"), response.json()["access_token"], timeout)

    def request(self, method: str, path: str, **kwargs) -> Any:
        """Call /api/v2<path>; returns the decoded JSON (None for an empty body), raises ApiError otherwise."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        response = requests.request(method, f"{self.base_url}/api/v2{path}", headers=headers,
                                    timeout=self.timeout, **kwargs)
        if response.status_code >= 300:
            raise ApiError(method, path, response.status_code, _detail(response))
        return response.json() if response.content else None

    def set_paused(self, dag_id: str, paused: bool) -> dict:
        return self.request("PATCH", f"/dags/{_q(dag_id)}", json={"is_paused": paused})

    def dag(self, dag_id: str) -> dict:
        return self.request("GET", f"/dags/{_q(dag_id)}")

    def import_errors(self) -> list[dict]:
        return self.request("GET", "/importErrors")["import_errors"]

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, logical_date: str | None = None,
                run_id: str | None = None, note: str | None = None) -> dict:
        """Create a manual run (logical_date None = a run without a logical date, keyed by its run_after)."""
        body: dict[str, Any] = {"logical_date": logical_date, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        if note:
            body["note"] = note
        return self.request("POST", f"/dags/{_q(dag_id)}/dagRuns", json=body)

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.request("GET", f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}")

    def runs(self, dag_id: str, run_type: str | None = None, limit: int = 100) -> list[dict]:
        params: dict[str, Any] = {"limit": limit, "order_by": "id"}
        if run_type:
            params["run_type"] = run_type
        return self.request("GET", f"/dags/{_q(dag_id)}/dagRuns", params=params)["dag_runs"]

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> dict:
        """Mark a run success / failed / queued (marking it failed also stops its running tasks)."""
        return self.request("PATCH", f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}", json={"state": state})

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
        path = f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/upstreamAssetEvents"
        return self.request("GET", path)["asset_events"]

    def backfills(self, dag_id: str) -> list[dict]:
        """Backfills of a DAG, oldest first (`completed_at` is set once all their runs finished)."""
        return self.request("GET", "/backfills", params={"dag_id": dag_id, "order_by": "id"})["backfills"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        path = f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances"
        return self.request("GET", path, params={"limit": 100})["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom value, deserialized (JSON-native values come back as they were returned)."""
        path = f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}/xcomEntries/{_q(key)}"
        return self.request("GET", path, params={"deserialize": "true"})["value"]

    def task_log_events(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[Any]:
        """The whole log of one try as structured events (dicts with timestamp, event, level, logger, ...)."""
        path = f"/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}/logs/{try_number}"
        return self.request("GET", path, params={"full_content": "true"})["content"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The whole log of one try as text: one line per event, '<level> <logger>: <event>' when known."""
        return "\n".join(_log_line(entry) for entry in self.task_log_events(dag_id, run_id, task_id, try_number))


def _q(part: str) -> str:
    return quote(part, safe="")


def _detail(response: requests.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except ValueError:
        return response.text[:2000]


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
        return AirflowApi(args.url.rstrip("/"), token)
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
    except (ApiError, requests.RequestException, TimeoutError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str))
    return 1 if isinstance(result, dict) and result.get("state") == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
