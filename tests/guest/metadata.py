"""A stand-in for Compute Engine's metadata server, on loopback, for the guest tier (see harness.py)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import socket
import threading
import time
import urllib.parse

from tests.loopback_http import LoopbackServer

METADATA_ADDRESS = "127.0.9.1"  # this tier's loopback addresses: 127.0.9.1 the metadata server, .10 and up the guests
METADATA_ENV = "GPU_TRAIN_METADATA_URL"  # the agent's metadata setting, as the guest's units see it


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


# -- the metadata server ----------------------------------------------------------------------
class MetadataServer:
    """The part of Compute Engine's metadata server the VM's software reads, on loopback.

    Like the real one it refuses requests without ``Metadata-Flavor: Google`` (403), answers with
    an ``ETag``, and with ``?wait_for_change=true`` holds the request until the value differs from
    ``last_etag`` (or ``timeout_sec`` passes), which is how a watcher learns of an event at once.
    """

    def __init__(self, address: str = METADATA_ADDRESS):
        self.address = address
        self.values: dict[str, str] = {
            "instance/preempted": "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/attributes/startup-script": "",
        }
        self.requests: list[str] = []
        self.stalled: dict[str, float] = {}  # path -> seconds a plain GET of it waits before its answer
        self._changed = threading.Condition()
        self._server = LoopbackServer((address, free_port(address)), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)  # stop() waits one poll

    @property
    def url(self) -> str:
        """The metadata base URL, as http://169.254.169.254/computeMetadata/v1/ is on a VM."""
        return f"http://{self.address}:{self._server.server_address[1]}/computeMetadata/v1/"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def set(self, path: str, value: str) -> None:
        """Change one value (``instance/preempted`` = ``TRUE``, say); waiting watchers are answered."""
        with self._changed:
            self.values[path] = value
            self._changed.notify_all()

    def stall(self, path: str, seconds: float) -> None:
        """Answer plain GETs of ``path`` only after ``seconds``, as a busy server does (a watcher's held
        request is not affected)."""
        self.stalled[path] = seconds

    @staticmethod
    def etag(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()[:16]

    def _answer(self, path: str, query: dict[str, list[str]]) -> str | None:
        with self._changed:
            if path not in self.values:
                return None
            if query.get("wait_for_change", [""])[0].lower() == "true":
                last = query.get("last_etag", [""])[0]
                deadline = time.monotonic() + float(query.get("timeout_sec", ["300"])[0])
                while self.etag(self.values[path]) == last and time.monotonic() < deadline:
                    self._changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return self.values[path]

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                server.requests.append(parsed.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, "Missing required header: Metadata-Flavor\n")
                    return
                prefix = "/computeMetadata/v1/"
                query = urllib.parse.parse_qs(parsed.query)
                if "wait_for_change" not in query:
                    time.sleep(server.stalled.get(parsed.path[len(prefix) :], 0))
                value = server._answer(parsed.path[len(prefix) :], query) if parsed.path.startswith(prefix) else None
                if value is None:
                    self._reply(404, "Not Found\n")
                else:
                    self._reply(200, value, {"ETag": server.etag(value)})

            def _reply(self, code: int, body: str, headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        return Handler
