"""A webhook receiver on loopback (what Slack, Discord or ntfy.sh would be), for notification tests."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler

from tests.loopback_http import LoopbackServer


class Webhook:
    """Keeps every POST (path, content type, body); answers 200, or ``status`` when set."""

    def __init__(self, address: str = "127.0.15.9"):
        self.received: list[tuple[str, str, bytes]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.received.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = LoopbackServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/gpu-train-topic"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def texts(self) -> list[str]:
        return [body.decode() for _, _, body in self.received]

    def wait_for(self, word: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [t for t in self.texts() if word in t]
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no notification with {word!r}; got {self.texts()}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
