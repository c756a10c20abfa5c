"""Print a connection URL with a password read from a Docker secret file, percent-encoded (issue #24 item 17).

Airflow reads its sensitive settings through `<option>_CMD` (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD, ...), so the
password never sits in a composed string in docker-compose.yml, where `/ @ % "` in a generated password would break
the URL (or the JSON around it):

    python /opt/recflow/deploy/secret_url.py 'postgresql+psycopg2://airflow@postgres/airflow' postgres_password

reads /run/secrets/postgres_password (RECFLOW_SECRETS_DIR overrides the folder, for tests) and prints
postgresql+psycopg2://airflow:<quoted password>@postgres/airflow. A user name may be given as a secret too
(`--user-secret NAME`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit


def read_secret(name: str) -> str:
    path = Path(os.environ.get("RECFLOW_SECRETS_DIR", "/run/secrets")) / name
    try:
        value = path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise SystemExit(f"secret {name!r} is not readable at {path}: {exc.strerror}") from None
    if not value:
        raise SystemExit(f"secret {name!r} at {path} is empty")
    return value


def url_with_secret(url: str, password: str, user: str | None = None) -> str:
    """`url` with its password (and user, when given) replaced by the percent-encoded values."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    name = quote(user if user is not None else (parts.username or ""), safe="")
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{name}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the URL without its password, e.g. postgresql+psycopg2://airflow@postgres/airflow")
    parser.add_argument("password_secret", help="file name under /run/secrets holding the password")
    parser.add_argument("--user-secret", help="file name under /run/secrets holding the user name")
    args = parser.parse_args(argv)
    user = read_secret(args.user_secret) if args.user_secret else None
    print(url_with_secret(args.url, read_secret(args.password_secret), user))
    return 0


if __name__ == "__main__":
    sys.exit(main())
