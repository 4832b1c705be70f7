"""Notifications: one line to the stack's webhook (``gpu-train:notify``) when a run ends, fails, is
preempted, comes back or gives up. Slack and Discord incoming webhooks and ntfy-style topics (a plain
POST of the text) each get their own body. Delivery never affects the run: a short timeout, every
error swallowed, and the URL (a secret) is never printed, logged or put in an error. Standard library
only (the agent on the host, the recovery function in Google's cloud).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
import urllib.parse
from typing import IO, TYPE_CHECKING

from gpu_train.atomic import atomic_write

if TYPE_CHECKING:
    import urllib.request
    from http.client import HTTPMessage

NOTIFY_FILE = "notify.url"  # REMOTE_ROOT/notify.url on a host: the webhook, 0600, the login user's
TIMEOUT_S = 10


MENTIONS = re.compile(r"@(?=(channel|here|everyone)\b)", re.IGNORECASE)


def unmentioned(text: str) -> str:
    """``text`` with its @channel, @here, @everyone made plain text (a zero-width space after the @): a job's
    last line (anything it printed) must not page a whole channel."""
    return MENTIONS.sub("@\u200b", text)


def request_for(url: str, text: str) -> urllib.request.Request:
    """The POST the webhook at ``url`` expects for ``text``, with no way for the text to mention anyone:
    Slack's control characters escaped (``<!channel>``, ``<@U123>`` are links only when ``<`` is), Discord
    told to parse no mention (``allowed_mentions``), and @channel/@here/@everyone written out everywhere."""
    import urllib.request

    host = urllib.parse.urlsplit(url).hostname or ""
    text = unmentioned(text)
    if host == "hooks.slack.com":
        slack = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # Slack's own escaping
        body, kind = json.dumps({"text": slack}).encode(), "application/json"
    elif host in ("discord.com", "discordapp.com") or host.endswith(".discord.com"):
        doc = {"content": text[:2000], "allowed_mentions": {"parse": []}}  # Discord's limit; no pings
        body, kind = json.dumps(doc).encode(), "application/json"
    else:  # ntfy.sh and its kin: the message is the body
        body, kind = text.encode(), "text/plain; charset=utf-8"
    return urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": kind, "User-Agent": "gpu-train"})


_OPENER: list[urllib.request.OpenerDirector] = []  # made at the first send: urllib.request is 10 ms of a launch's start


def opener() -> urllib.request.OpenerDirector:
    """urllib's opener that follows no redirect: a redirect is an answer, not a place to go (urllib would
    follow it as a GET: a POST turned into a request to any address the answer names, an internal one too)."""
    if not _OPENER:
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(
                self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
            ) -> urllib.request.Request | None:
                return None

        _OPENER.append(urllib.request.build_opener(NoRedirect))
    return _OPENER[0]


def send(url: str | None, text: str, timeout: float = TIMEOUT_S) -> bool:
    """POST ``text``; True when the webhook took it (2xx; a redirect is not followed). Never raises, never
    names the URL."""
    if not url:
        return False
    try:
        with opener().open(request_for(url, text), timeout=timeout) as r:
            return 200 <= int(r.status) < 300
    except Exception:  # a notification must never fail its sender
        return False


def send_soon(url: str | None, text: str) -> threading.Thread | None:
    """``send`` on a daemon thread, so the caller never waits on a slow webhook."""
    if not url:
        return None
    thread = threading.Thread(target=send, args=(url, text), daemon=True)
    thread.start()
    return thread


def read_url(root: str) -> str | None:
    """REMOTE_ROOT/notify.url, only when it is the user's own file and no one else can read it (0600)."""
    return _private_url(os.path.join(root, NOTIFY_FILE))


def _private_url(path: str) -> str | None:
    """The webhook in ``path``, only when it is the user's own file and no one else can read it (0600)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if stat.S_IMODE(st.st_mode) & 0o077 or st.st_uid != os.getuid():
                return None
            url = f.read().strip()
            return url if url.startswith(("https://", "http://")) else None
    return None


# Each run's (and each sweep's) own webhook: REMOTE_ROOT/notify/NAME.url, 0600, empty when its stack has none.
# One REMOTE_ROOT serves every stack and project that reaches the host as this user, and a single notify.url
# (the last launch's) announced every run's end, its last log line included, to whichever stack launched last
# (another team's channel), or to none.
KEPT = "notify"


def keep(root: str, name: str, url: str | None) -> None:
    """The webhook of the run (or ``SWEEP.sweep``) ``name``, as its launch brings it ("" for none)."""
    folder = os.path.join(root, KEPT)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    atomic_write(os.path.join(folder, f"{name}.url"), (url or "").strip() + "\n", 0o600, keep_mode=False)


def kept(root: str, name: str) -> str | None:
    """The webhook kept for ``name``; for a run launched before each run kept its own (no file), the host's
    last one (REMOTE_ROOT/notify.url), as then."""
    path = os.path.join(root, KEPT, f"{name}.url")
    return _private_url(path) if os.path.lexists(path) else read_url(root)


def run_end_text(run_id: str, state: str, exit_code: int | None, duration_s: float | None, last_line: str, host: str = "") -> str:
    """The run-end message: exit code, duration, last line."""
    took = "" if duration_s is None else f" after {int(duration_s) // 3600}h{int(duration_s) % 3600 // 60:02d}m"
    code = "" if exit_code is None else f" (exit {exit_code})"
    where = f" on {host}" if host else ""
    tail = f": {last_line[:300]}" if last_line else ""
    return f"gpu-train: {run_id} {state}{code}{took}{where}{tail}"
