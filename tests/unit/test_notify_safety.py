"""Notifications a job's words or a webhook's answer cannot turn: no redirect followed, no mention made,
the URL on node 0 only (agent/notify.py, remote/tasks/launching.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent import notify
from gpu_train.contract import JobSpec
from remote.tasks.launching import notifying_node0
from tests.loopback_http import LoopbackServer


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = LoopbackServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    return server


def test_a_redirect_is_not_followed() -> None:
    """A webhook's 30x turned the POST into a GET at any address it named (an internal one too)."""
    reached: list[str] = []

    class Inside(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            reached.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args) -> None:
            pass

    inside = serve(Inside)

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{inside.server_address[1]}/computeMetadata/v1/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    hook = serve(Hook)
    try:
        assert notify.send(f"http://127.0.0.1:{hook.server_address[1]}/topic", "gpu-train: r_1 succeeded") is False
        assert reached == []
    finally:
        for s in (hook, inside):
            s.shutdown()
            s.server_close()


def test_a_jobs_words_mention_no_one() -> None:
    line = "loss 0.1 @channel @Here <!everyone> <@U123ABC> a&b"
    slack = json.loads(notify.request_for("https://hooks.slack.com/services/T/B/X", line).data)["text"]
    assert "<" not in slack and "@channel" not in slack and "@Here" not in slack
    assert "&lt;!everyone&gt;" in slack and "&lt;@U123ABC&gt;" in slack and "a&amp;b" in slack
    discord = json.loads(notify.request_for("https://discord.com/api/webhooks/1/x", line).data)
    assert discord["allowed_mentions"] == {"parse": []} and "@channel" not in discord["content"]
    ntfy = notify.request_for("https://ntfy.sh/topic", line).data.decode()
    assert "@\u200bchannel" in ntfy and "@\u200bHere" in ntfy and "@everyone" not in ntfy
    assert notify.unmentioned("mail me@channels.example") == "mail me@channels.example"  # not a mention


def test_the_webhook_goes_to_node_0_only() -> None:
    specs = [JobSpec(run_id="r_1", base="r", notify="https://ntfy.sh/secret") for _ in range(3)]
    assert [s.notify for s in notifying_node0(specs)] == ["https://ntfy.sh/secret", None, None]
