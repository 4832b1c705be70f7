"""The dashboard's local web server: the page, its data, and the guards in front of both.

It listens on one loopback address. Every request must name that address and port in its Host header
(a DNS-rebinding page's request names its own host: refused, 403) and start with the secret made at
start (``/SECRET/``; anything else is 404, as if nothing listened). The secret is a URL's, and URLs leak
(history, a screenshot, a process list), so it opens one session, once: the first GET of the page sets
a session cookie (a fresh random value, HttpOnly, SameSite=Strict) and every later request (the page,
its data, its logs, its actions) needs that cookie; the URL alone then reads nothing. Another browser
gets in by a fresh one-time link (``/SECRET/?pass=...``) that the dashboard prints on its own terminal
when the used one is asked again. Only the page itself can act: a POST must also come from it, Origin
and Sec-Fetch-Site saying so, as JSON (a cross-site form cannot send it without a preflight this
server never answers), carrying the per-start token the page got in a SameSite=Strict cookie both in
that cookie and in a header. Responses forbid framing, sniffing and any other origin (CSP), and send
no Referer.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import threading
import urllib.parse
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_train.contract import is_run_id
from gpu_train.errors import UsageError
from gpu_train.views.board import best_trial, sweep_of
from remote.dashboard import page
from remote.dashboard.actions import Actions
from remote.dashboard.curves import Curves
from remote.dashboard.logs import Logs
from remote.dashboard.poll import Watch

COOKIE = "gpu_train_csrf"
SESSION = "gpu_train_session"
HEADER = "X-GPU-Train-CSRF"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
LONG_POLL_S = 20.0  # a log request waits this long for new lines before it answers empty
MAX_BODY = 4096


NO_SESSION = 401


def cookie_values(header: str, name: str) -> list[str]:
    """Every value a Cookie header gives ``name``: another 127.0.0.1 port's page can set one of the same
    name (cookies are not port-scoped), so none of them hides ours."""
    pairs = (part.strip().split("=", 1) for part in header.split(";") if "=" in part)
    return [v.strip() for k, v in pairs if k.strip() == name]


def any_matches(sent: list[str], wanted: Collection[str]) -> bool:
    """Whether any value sent is one of ``wanted``, each compared in constant time."""
    return any(hmac.compare_digest(s.encode(), w.encode()) for s in sent for w in wanted if w)


def refusal(
    method: str, path: str, headers: dict[str, str], secret: str, token: str, own: str, sessions: Collection[str]
) -> tuple[int, str] | None:
    """Why a request is refused (status, reason), or None: ``own`` is this server's ``ADDRESS:PORT``;
    ``headers`` by lower-case name; ``sessions`` the session cookies given out (NO_SESSION: none sent
    matches, where a GET of the page may still open one with an unused link). Pure, so the table of cases
    in the tests is the policy."""
    if headers.get("host") != own:
        return 403, "the Host header is not this dashboard's address (a DNS-rebinding page?)"
    prefix = f"/{secret}/"
    if not hmac.compare_digest(path[: len(prefix)].encode(), prefix.encode()) and path != f"/{secret}":
        return 404, "not found"
    no_session = NO_SESSION, "no session: this dashboard's link opens one browser session, once; a fresh link is on its terminal"
    in_session = any_matches(cookie_values(headers.get("cookie", ""), SESSION), sessions)
    if method == "GET":
        return None if in_session else no_session
    if method != "POST":
        return 405, "method not allowed"
    if headers.get("origin") != f"http://{own}":
        return 403, "cross-site request refused (Origin is not this page)"
    if headers.get("sec-fetch-site", "same-origin") != "same-origin":
        return 403, "cross-site request refused (Sec-Fetch-Site)"
    if headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return 403, "an action is JSON from the page"
    if not in_session:
        return no_session
    said = headers.get(HEADER.lower(), "")
    if not (any_matches(cookie_values(headers.get("cookie", ""), COOKIE), [token]) and hmac.compare_digest(said.encode(), token.encode())):
        return 403, "cross-site request refused (no token, or not this dashboard's)"
    return None


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # (socketserver's: a socket and its address)
        """A page closed while its answer was on the way (a long-polled log) is no error of ours."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class Dashboard:
    """The server and what it serves: the pollers' shared answers, the log followers, the actions."""

    def __init__(self, watch: Watch, address: str = "127.0.0.1", port: int = 0, tell: Callable[[str], None] = print):
        self.watch = watch
        self.logs = Logs(watch.env)
        self.curves = Curves(watch.env)
        self.actions = Actions(watch.env, after=lambda a: self._kick(a.stack))
        self.secret = secrets.token_urlsafe(24)
        self.token = secrets.token_urlsafe(24)
        self.sessions: set[str] = set()
        self.passes: set[str] = {""}  # unused one-time links' passes: "" is the first URL's (no ?pass=)
        self.tell = tell  # how a fresh link reaches the user: the dashboard's own terminal
        self._lock = threading.Lock()
        self.stacks = [p.name for p in watch.pollers]
        handler = type("Handler", (Handler,), {"board": self})
        self.httpd = Server((address, port), handler)
        self.address, self.port = address, self.httpd.server_address[1]
        self.own = f"{address}:{self.port}"
        self.url = f"http://{self.own}/{self.secret}/"
        # stop() waits out one poll of serve_forever (socketserver's default: 0.5 s)
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="dashboard", daemon=True)

    def link(self, pass_: str) -> str:
        return self.url + (f"?pass={pass_}" if pass_ else "")

    def open_session(self, pass_: str) -> str | None:
        """A new session's cookie for an unused link's pass (the link is then used), or None. A used link
        asked again makes a fresh one, told on the terminal only (one unused at a time)."""
        with self._lock:
            used = next((p for p in self.passes if hmac.compare_digest(p.encode(), pass_.encode())), None)
            if used is not None:
                self.passes.discard(used)
                session = secrets.token_urlsafe(24)
                self.sessions.add(session)
                return session
            if not self.passes:
                fresh = secrets.token_urlsafe(24)
                self.passes.add(fresh)
                self.tell(f"the dashboard's link was used already (it opens one browser session); for another browser: {self.link(fresh)}")
        return None

    def _kick(self, stack: str) -> None:
        p = self.watch.poller(stack)
        if p is not None:
            p.kick()

    def start(self) -> Dashboard:
        self.watch.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.watch.stop()

    def document(self) -> dict[str, Any]:
        return {**self.watch.board(), "actions": self.actions.to_json(), "live": True}

    def curves_of(self, stack: str, run: str | None, sweep: str | None) -> dict[str, Any]:
        """A run's curves, or a sweep's trials' with the best one named."""
        runs = [r for r in self.watch.host_runs(stack) if (r["id"] == run if run else sweep_of(r) == sweep)]
        answer = self.curves.of(stack, runs)
        return {**answer, "best": best_trial(answer["runs"]) if sweep else None}


class Handler(BaseHTTPRequestHandler):
    board: Dashboard
    server_version = "gpu-train-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # (no line per request on the user's terminal)
        return

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in {
            "Content-Type": kind,
            "Content-Length": str(len(body)),
            "Cache-Control": "no-store",
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            "Cross-Origin-Resource-Policy": "same-origin",
            **(extra or {}),
        }.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, doc: object, status: int = 200) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _refused(self) -> tuple[str, dict[str, list[str]]] | None:
        """The request's path after the secret and its query, or None after refusing it."""
        b = self.board
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        why = refusal(self.command, url.path, self._headers(), b.secret, b.token, b.own, b.sessions)
        if why is not None and why[0] == NO_SESSION and self.command in ("GET", "HEAD") and url.path in (f"/{b.secret}", f"/{b.secret}/"):
            session = b.open_session(query.get("pass", [""])[0])
            if session is not None:
                # a page, not a redirect: the page's own navigation is same-site, so the Strict cookie goes along
                cookie = f"{SESSION}={session}; Path=/{b.secret}/; SameSite=Strict; HttpOnly"
                there = f'<!doctype html><meta http-equiv="refresh" content="0;url=/{b.secret}/"><a href="/{b.secret}/">dashboard</a>'
                self._send(200, there.encode(), "text/html; charset=utf-8", {"Set-Cookie": cookie})
                return None
            why = 403, "this dashboard's link was used already (it opens one browser session): a fresh one is on its terminal"
        if why is not None:
            self._send(why[0], why[1].encode(), "text/plain; charset=utf-8")
            return None
        return url.path[len(b.secret) + 2 :], query

    def do_GET(self) -> None:
        asked = self._refused()
        if asked is None:
            return
        rest, query = asked
        b = self.board
        if self.path.split("?")[0] == f"/{b.secret}":
            self._send(308, b"", "text/plain", {"Location": f"/{b.secret}/"})
        elif rest == "":
            cookie = f"{COOKIE}={b.token}; Path=/{b.secret}/; SameSite=Strict; HttpOnly"
            self._send(200, page.live(b.token).encode(), "text/html; charset=utf-8", {"Set-Cookie": cookie})
        elif rest.startswith("assets/") and (asset := page.asset(rest.removeprefix("assets/"))) is not None:
            self._send(200, asset[0], asset[1])
        elif rest == "api/board":
            self._json(b.document())
        elif rest == "api/log":
            stack, run = self._run_of(query)
            if stack is None or run is None:
                return
            start = _int(query, "from")
            wait = min(LONG_POLL_S, float(_int(query, "wait")))
            self._json(b.logs.of(stack, run).since(start, wait))
        elif rest == "api/curves":
            stack, sweep = (query.get(k, [""])[0] for k in ("stack", "sweep"))
            if sweep and stack in b.stacks and is_run_id(sweep):
                self._json(b.curves_of(stack, None, sweep))
                return
            stack, run = self._run_of(query)
            if stack is not None and run is not None:
                self._json(b.curves_of(stack, run, None))
        else:
            self._send(404, b"not found", "text/plain; charset=utf-8")

    do_HEAD = do_GET

    def _run_of(self, query: dict[str, list[str]]) -> tuple[str | None, str | None]:
        stack, run = (query.get(k, [""])[0] for k in ("stack", "run"))
        if stack not in self.board.stacks or not is_run_id(run):
            self._json({"error": "no such stack or run"}, 400)
            return None, None
        return stack, run

    def do_POST(self) -> None:
        asked = self._refused()
        if asked is None:
            return
        rest, _ = asked
        if rest != "api/action":
            self._send(404, b"not found", "text/plain; charset=utf-8")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._json({"error": "Content-Length: 0 to 4096 bytes"}, 400 if length < 0 else 413)
            return
        try:
            doc = json.loads(self.rfile.read(length) or b"{}")
            a = self.board.actions.start(str(doc.get("action")), str(doc.get("stack")), doc.get("run"), self.board.stacks)
        except (ValueError, AttributeError):
            self._json({"error": "an action is a JSON object"}, 400)
            return
        except UsageError as e:
            self._json({"error": str(e)}, 400)
            return
        self._json(a.to_json(), 202)

    def do_PUT(self) -> None:
        if self._refused() is not None:
            self._send(405, b"method not allowed", "text/plain; charset=utf-8")

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT


def _int(query: dict[str, list[str]], name: str) -> int:
    try:
        return max(0, int(query.get(name, ["0"])[0]))
    except ValueError:
        return 0
