"""A static HTTP file server on 127.0.0.1 for tests: answers Range requests and can cut a transfer short.

http.server answers Range only from Python 3.12 on, and a resumable download has to be tested against partial
content (206), servers that ignore Range (200) and connections that die mid-body. The knobs are attributes of the
server object, so a test can change them between calls:

  server.honour_range      False: answer every request with the whole file (200), as servers without Range do
  server.drop_after_bytes  close the connection abruptly after this many body bytes, on the first response only
                           (setting it again re-arms it for the next response)
  server.requests          every request seen, as (path, Range header or None)
  server.write_delay_s     seconds to sleep after each 64 KiB written (a slow source; default 0)
  server.send_validators   False: send neither ETag nor Last-Modified (a source whose version cannot be named)
  server.redirects         {path: location}: answer GET path with 302 Location (a redirecting source)

Every file is served with an ETag (its size and mtime) and Last-Modified, and If-Range is honoured as RFC 9110 says:
a Range whose If-Range does not name the current ETag / date is ignored (200, the whole file).
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from email.utils import formatdate
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_WRITE_BYTES = 64 << 10


def etag_of(path: Path) -> str:
    """The ETag the server sends for a file: its size and modification time (a new version, a new tag)."""
    stat = Path(path).stat()
    return f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'


class RangeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, honour_range: bool, drop_after_bytes: int | None) -> None:
        self._lock = threading.Lock()
        self.root = root.resolve()
        self.honour_range = honour_range
        self.requests: list[tuple[str, str | None]] = []
        self.drop_after_bytes = drop_after_bytes
        self.write_delay_s = 0.0
        self.send_validators = True
        self.redirects: dict[str, str] = {}
        super().__init__(("127.0.0.1", 0), _RangeHandler)

    @property
    def drop_after_bytes(self) -> int | None:
        return self._drop_after_bytes

    @drop_after_bytes.setter
    def drop_after_bytes(self, value: int | None) -> None:
        with self._lock:
            self._drop_after_bytes = value
            self._drop_armed = value is not None

    def record(self, path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests.append((path, range_header))

    def take_drop(self) -> int | None:
        """Body bytes after which to cut this response, or None; a drop fires once per setting."""
        with self._lock:
            if not self._drop_armed:
                return None
            self._drop_armed = False
            return self._drop_after_bytes

    @property
    def port(self) -> int:
        return self.server_address[1]

    def handle_error(self, request, client_address) -> None:
        """A client killed mid-request (the fault-injection tests kill downloads) resets its connection wherever the
        handler is, e.g. reading the next request line: no fault of the server's. Anything else prints as usual."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class _RangeHandler(BaseHTTPRequestHandler):
    server: RangeHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, Content-Length framed: a short body is detectable by the client

    def do_GET(self) -> None:
        range_header = self.headers.get("Range")
        self.server.record(self.path, range_header)
        if self.path in self.server.redirects:
            self.send_response(302)
            self.send_header("Location", self.server.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        file = self._resolve()
        if file is None:
            self.send_error(404)
            return
        stat = file.stat()
        size = stat.st_size
        etag, modified = etag_of(file), formatdate(stat.st_mtime, usegmt=True)
        first, last, status = 0, size - 1, 200
        match = _RANGE.match(range_header or "")
        if_range = self.headers.get("If-Range")
        if match and if_range is not None and if_range not in (etag, modified):
            match = None  # the file changed since the client's copy began: send all of it
        if match and self.server.honour_range:
            first = int(match.group(1))
            last = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            if first >= size or first > last:
                self._send_unsatisfiable(size)
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes" if self.server.honour_range else "none")
        self.send_header("Content-Length", str(last - first + 1))
        if self.server.send_validators:
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", modified)
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        self._send_body(file, first, last - first + 1, self.server.take_drop())

    def _resolve(self) -> Path | None:
        relative = unquote(urlsplit(self.path).path).lstrip("/")
        candidate = (self.server.root / relative).resolve()
        if not candidate.is_relative_to(self.server.root) or not candidate.is_file():
            return None
        return candidate

    def _send_unsatisfiable(self, size: int) -> None:
        self.send_response(416)
        self.send_header("Content-Range", f"bytes */{size}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_body(self, file: Path, first: int, length: int, drop_after: int | None) -> None:
        to_send = length if drop_after is None else min(length, drop_after)
        try:
            with open(file, "rb") as f:
                f.seek(first)
                while to_send > 0:
                    chunk = f.read(min(_WRITE_BYTES, to_send))
                    self.wfile.write(chunk)
                    to_send -= len(chunk)
                    if self.server.write_delay_s:
                        self.wfile.flush()
                        time.sleep(self.server.write_delay_s)
            self.wfile.flush()
            if drop_after is not None:
                # An abrupt close mid-body: the client sees fewer bytes than Content-Length announced.
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; nothing to answer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass  # tests read server.requests instead of stderr noise


def start_range_server(
    root: Path, *, honour_range: bool = True, drop_after_bytes: int | None = None
) -> tuple[RangeHTTPServer, str]:
    """Serve the files under `root` on 127.0.0.1 (a free port) from a daemon thread; returns (server, base URL).

    Stop it with server.shutdown(); server.server_close().
    """
    server = RangeHTTPServer(Path(root), honour_range, drop_after_bytes)
    # A short poll interval keeps shutdown() quick at fixture teardown (the default waits up to 0.5 s).
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name=f"range-http-{server.port}", daemon=True
    )
    thread.start()
    return server, f"http://127.0.0.1:{server.port}"
