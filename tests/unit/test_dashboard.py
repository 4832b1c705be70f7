"""The dashboard's server, pollers and page (remote/dashboard/, remote/tasks/board.py): its locks as a table and
over real HTTP, the actions' words, the report's self-containment, the pollers' asking (the e2e tier drives the
page in a browser: tests/e2e/test_dashboard.py)."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path

import pytest

from gpu_train.errors import UsageError
from remote.dashboard import actions, page
from remote.dashboard.server import COOKIE, HEADER, NO_SESSION, SESSION, refusal
from remote.tasks.board import can_open_browser
from remote.tasks.taskoptions import DashboardOptions

# -- the server's guards ----------------------------------------------------------------------------
OWN, SECRET, TOKEN, SID = "127.0.0.1:8765", "s3cret", "t0ken", "s3ssion"
IN = {"host": OWN, "cookie": f"{SESSION}={SID}"}


GOOD = {
    "host": OWN,
    "origin": f"http://{OWN}",
    "sec-fetch-site": "same-origin",
    "content-type": "application/json",
    "cookie": f"other=1; {COOKIE}={TOKEN}; {SESSION}={SID}",
    HEADER.lower(): TOKEN,
}


def without(name: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != name}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", f"/{SECRET}/", IN, None),
        ("GET", f"/{SECRET}/api/board", IN, None),
        # the URL's secret alone reads nothing: a session cookie given out is needed
        ("GET", f"/{SECRET}/", {"host": OWN}, NO_SESSION),
        ("GET", f"/{SECRET}/api/board", {"host": OWN}, NO_SESSION),
        ("GET", f"/{SECRET}/api/log", {**IN, "cookie": f"{SESSION}=guess"}, NO_SESSION),
        ("GET", f"/{SECRET}/api/board", {**IN, "cookie": f"{SESSION}="}, NO_SESSION),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "cookie": f"{COOKIE}={TOKEN}"}, NO_SESSION),
        # another 127.0.0.1 port's page set cookies of the same names: ours still count, wherever they are
        ("POST", f"/{SECRET}/api/action", {**GOOD, "cookie": f"{COOKIE}={TOKEN}; {SESSION}={SID}; {COOKIE}=x; {SESSION}=y"}, None),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "cookie": f"{COOKIE}=x; {SESSION}=y; {COOKIE}={TOKEN}; {SESSION}={SID}"}, None),
        ("GET", "/", {"host": OWN}, 404),
        ("GET", "/api/board", {"host": OWN}, 404),
        ("GET", f"/{SECRET[:-1]}/api/board", {"host": OWN}, 404),
        ("GET", f"/{SECRET}x/", {"host": OWN}, 404),
        ("GET", f"/{SECRET}/", {"host": "evil.example:8765"}, 403),  # DNS rebinding: the attacker's name
        ("GET", f"/{SECRET}/", {}, 403),
        ("POST", f"/{SECRET}/api/action", GOOD, None),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "origin": "https://evil.example"}, 403),
        ("POST", f"/{SECRET}/api/action", without("origin"), 403),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "sec-fetch-site": "cross-site"}, 403),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "content-type": "text/plain"}, 403),  # a form's: no preflight
        ("POST", f"/{SECRET}/api/action", without("cookie"), NO_SESSION),
        ("POST", f"/{SECRET}/api/action", {**GOOD, "cookie": f"{SESSION}={SID}"}, 403),
        ("POST", f"/{SECRET}/api/action", without(HEADER.lower()), 403),
        ("POST", f"/{SECRET}/api/action", {**GOOD, HEADER.lower(): "guess"}, 403),
        ("POST", "/api/action", GOOD, 404),
        ("DELETE", f"/{SECRET}/api/action", GOOD, 405),
    ],
)
def test_refusal(method: str, path: str, headers: dict, status) -> None:
    why = refusal(method, path, headers, SECRET, TOKEN, OWN, {SID})
    assert (why[0] if why else None) == status


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("stop", "lab", "r_1"), ["stop", "--stack", "lab", "--run", "r_1"]),
        (("fetch", "lab", "r_1"), ["fetch", "--stack", "lab", "--run", "r_1"]),
        (("vm-stop", "t4", None), ["vm-stop", "--stack", "t4"]),
        (("down", "t4", None), "no action 'down'"),
        (("stop", "other", "r_1"), "no stack 'other'"),
        (("stop", "lab", None), "stop needs a run id"),
        (("stop", "lab", "--all"), "stop needs a run id"),
        (("fetch", "lab", "../x"), "fetch needs a run id"),
    ],
)
def test_action_words(args: tuple, words) -> None:
    if isinstance(words, list):
        assert actions.command(*args, stacks=["lab", "t4"]) == words
    else:
        with pytest.raises(UsageError, match=words):
            actions.command(*args, stacks=["lab", "t4"])


@pytest.mark.parametrize(
    ("platform", "environ", "opens"),
    [
        ("darwin", {}, True),
        ("win32", {}, True),
        ("linux", {"DISPLAY": ":0"}, True),
        ("linux", {"WAYLAND_DISPLAY": "w"}, True),
        ("linux", {}, False),
    ],
)
def test_a_browser_is_opened_only_where_there_is_a_desktop(platform: str, environ: dict, opens: bool) -> None:
    assert can_open_browser(platform, environ) is opens


@pytest.mark.parametrize(
    ("address", "ok"), [("127.0.0.1", True), ("127.0.42.7", True), ("::1", True), ("0.0.0.0", False), ("10.0.0.1", False), ("x", False)]
)
def test_the_dashboard_listens_on_loopback_only(address: str, ok: bool) -> None:
    if ok:
        assert DashboardOptions(address=address).address == address
    else:
        with pytest.raises(UsageError, match="loopback address only"):
            DashboardOptions.read(address=address)


def test_the_report_carries_its_data_and_loads_nothing() -> None:
    text = page.report({"project": "p", "runs": [{"lastLine": "</script><script>alert(1)</script>"}]})
    assert "</script><script>alert(1)" not in text  # a host's text cannot end the data's element
    assert "default-src 'none'" in text
    assert all(url.startswith("data:") for url in re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="([^"]*)"', text))
    assert text.count("<script") == 3  # the data, uPlot, the page's script: all inline
    assert json.loads(text.split('id="board-data">')[1].split("</script>")[0])["runs"][0]["lastLine"].startswith("</script>")


def test_the_vendored_chart_library_keeps_its_license() -> None:
    assets = Path(page.ASSETS)
    assert "MIT License" in (assets / "uPlot.LICENSE").read_text()
    assert (assets / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


# -- the server itself, over HTTP -------------------------------------------------------------------
@pytest.fixture
def served(tmp_path: Path):
    """A dashboard over one SSH stack whose host does not answer (nothing listens on its port)."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.environment import Environment
    from remote.dashboard.poll import Watch
    from remote.dashboard.server import Dashboard

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.lab.yaml").write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@127.0.42.250:9]\n")
    env = Environment(stacks_dir=tmp_path / "stacks", home=tmp_path / "state", cwd=tmp_path, project=tmp_path)
    d = Dashboard(Watch(env, load_catalog(), 3600, "proj"), "127.0.0.1").start()
    yield d
    d.stop()


def ask(d, method: str, path: str, headers: dict | None = None, body: bytes | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request(method, path, body=body, headers={"Host": d.own, **(headers or {})})
    res = conn.getresponse()
    res.read()
    return res


def session_of(res: http.client.HTTPResponse) -> str:
    cookie = res.getheader("Set-Cookie") or ""
    assert cookie.startswith(f"{SESSION}=") and "SameSite=Strict" in cookie and "HttpOnly" in cookie, cookie
    return cookie.split(";")[0]


def test_the_server_answers_its_page_only_behind_its_secret(served) -> None:
    d = served
    assert ask(d, "GET", "/").status == 404 and ask(d, "GET", "/api/board").status == 404
    assert ask(d, "GET", f"/{d.secret}/", {"Host": "rebound.example:80"}).status == 403
    assert ask(d, "GET", f"/{d.secret}/api/board").status == 401  # the URL opens a session; it reads nothing
    first = ask(d, "GET", f"/{d.secret}/")
    assert first.status == 200 and b"csrf" not in first.read() and f"{d.token}" not in (first.getheader("Set-Cookie") or "")
    you = {"Cookie": session_of(first)}
    res = ask(d, "GET", f"/{d.secret}/", you)
    assert res.status == 200
    cookie = res.getheader("Set-Cookie")
    assert f"{COOKIE}={d.token}" in cookie and "SameSite=Strict" in cookie and "HttpOnly" in cookie
    assert "frame-ancestors 'none'" in res.getheader("Content-Security-Policy") and res.getheader("Referrer-Policy") == "no-referrer"
    assert ask(d, "GET", f"/{d.secret}/assets/uPlot.iife.min.js", you).status == 200
    assert ask(d, "GET", f"/{d.secret}/api/board", you).status == 200
    assert ask(d, "GET", f"/{d.secret}/assets/../server.py", you).status == 404


def test_the_url_opens_one_session_once_and_the_terminal_gets_a_fresh_link(served) -> None:
    d = served
    told: list[str] = []
    d.tell = told.append
    first = ask(d, "GET", f"/{d.secret}/")
    assert first.status == 200 and d.passes == set()
    # whoever reads the URL later (a process list, history) gets neither the page, its token, nor a session
    for path in (f"/{d.secret}/", f"/{d.secret}/api/board", f"/{d.secret}/api/log?stack=lab&run=r_1", f"/{d.secret}/?pass="):
        res = ask(d, "GET", path)
        assert res.status in (401, 403) and res.getheader("Set-Cookie") is None, path
    assert ask(d, "GET", f"/{d.secret}/?pass=guess").status == 403
    assert len(told) == 1 and d.url in told[0]  # one fresh link, on the terminal only
    fresh = told[0].split()[-1]
    again = ask(d, "GET", fresh.removeprefix(f"http://{d.own}"))
    assert again.status == 200 and session_of(again) != session_of(first)
    assert ask(d, "GET", fresh.removeprefix(f"http://{d.own}")).status == 403  # that one is used too
    assert ask(d, "GET", f"/{d.secret}/api/board", {"Cookie": session_of(again)}).status == 200


def test_a_cross_site_post_is_refused_and_the_pages_own_is_heard(served) -> None:
    d = served
    body = json.dumps({"action": "nope", "stack": "lab"}).encode()
    you = session_of(ask(d, "GET", f"/{d.secret}/"))
    own = {"Origin": f"http://{d.own}", "Content-Type": "application/json", "Cookie": f"{COOKIE}={d.token}; {you}", HEADER: d.token}
    assert ask(d, "POST", f"/{d.secret}/api/action", {**own, "Origin": "http://evil.example"}, body).status == 403
    assert ask(d, "POST", f"/{d.secret}/api/action", {**own, "Content-Type": "text/plain"}, body).status == 403
    assert ask(d, "POST", f"/{d.secret}/api/action", {k: v for k, v in own.items() if k != HEADER}, body).status == 403
    # a client that forges Origin and both tokens but has no session (it read the URL only) is refused
    assert ask(d, "POST", f"/{d.secret}/api/action", {**own, "Cookie": f"{COOKIE}={d.token}"}, body).status == 401
    assert ask(d, "POST", f"/{d.secret}/api/action", own, body).status == 400  # past the locks: an unknown action
    assert d.actions.started == []


@pytest.mark.parametrize("length", ["-1", "99999999999", "x"])
def test_a_negative_huge_or_bad_content_length_is_refused(served, length: str) -> None:
    d = served
    you = session_of(ask(d, "GET", f"/{d.secret}/"))
    own = {"Origin": f"http://{d.own}", "Content-Type": "application/json", "Cookie": f"{COOKIE}={d.token}; {you}", HEADER: d.token}
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    conn.putrequest("POST", f"/{d.secret}/api/action", skip_host=True)
    for k, v in {"Host": d.own, **own, "Content-Length": length}.items():
        conn.putheader(k, v)
    conn.endheaders()
    assert conn.getresponse().status in (400, 413)
    assert d.actions.started == []


def test_the_browser_is_started_on_a_private_file_not_the_url(tmp_path: Path) -> None:
    from remote.tasks.board import opener_file

    url = "http://127.0.0.1:8765/s3cret/"
    path = opener_file(url)
    try:
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert url in path.read_text() and "s3cret" not in path.as_uri()
    finally:
        path.unlink()
        path.parent.rmdir()


def test_the_pollers_ask_only_while_a_page_looks(tmp_path: Path) -> None:
    """No page for a while: no host is asked; the next page's request has every stack looked at again."""
    import time

    from gpu_train.catalog.loader import load_catalog
    from gpu_train.environment import Environment
    from remote.dashboard.poll import Watch

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.lab.yaml").write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@127.0.42.250:9]\n")
    env = Environment(stacks_dir=tmp_path / "stacks", home=tmp_path / "state", cwd=tmp_path, project=tmp_path)
    watch = Watch(env, load_catalog(), 0.05, "proj", idle_after=0.5).start()
    (poller,) = watch.pollers
    try:
        deadline = time.monotonic() + 10
        while poller.polls < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert poller.polls >= 2 and poller.look.nodes[0].error  # asked (and the host refused)
        time.sleep(1.0)  # past idle_after, with no page asking
        quiet = poller.polls
        time.sleep(0.5)
        assert poller.polls == quiet, "a poller asked its host with no page open"
        doc = watch.board()  # a page asks again
        assert [s["stack"] for s in doc["stacks"]] == ["lab"]
        while poller.polls == quiet and time.monotonic() < deadline + 10:
            time.sleep(0.02)
        assert poller.polls > quiet
    finally:
        watch.stop()


def test_ended_logs_kept_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEEP_FOLLOWERS ended logs, those no page asked for longest go; the one asked for stays."""
    import time

    from gpu_train.environment import Environment
    from remote.dashboard import logs

    monkeypatch.setattr(logs, "KEEP_FOLLOWERS", 2)
    (tmp_path / "stacks").mkdir()
    kept = logs.Logs(Environment(stacks_dir=tmp_path / "stacks", home=tmp_path / "state", cwd=tmp_path, project=tmp_path))
    for i in range(4):
        f = kept.of("nowhere", f"r{i}")
        deadline = time.monotonic() + 10
        while not f.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert f.error and "nowhere" in f.error  # no such stack: said on the page
    assert sorted(run for _, run in kept.followers) == ["r2", "r3"]


def test_a_host_that_does_not_answer_is_asked_later_and_later(tmp_path: Path) -> None:
    import time

    from gpu_train.environment import Environment
    from remote.dashboard.poll import BACK_OFF_S, Google, StackPoller

    env = Environment(stacks_dir=tmp_path, home=tmp_path / "state", cwd=tmp_path, project=tmp_path)
    p = StackPoller(env, tmp_path / "Pulumi.lab.yaml", 5.0, lambda: True, None, Google())
    waits = []
    for answered in (False, False, False, False, False, True, False):
        p._back_off(answered)
        waits.append(round(p._retry_at - time.monotonic()))
    assert waits == [10, 20, 40, 80, BACK_OFF_S, 0, 10]
    p._back_off(False)
    p.kick()  # an action, or the first page after a quiet while: asked at once
    assert p._retry_at == 0.0


# -- the report: what a hostile host streams is bounded ---------------------------------------------
def test_a_report_keeps_a_bounded_tail_of_a_log() -> None:
    from remote.tasks.board import Tail

    kept = Tail(10)
    for i in range(1000):
        kept.write(f"{i:04d}\n".encode())
        assert len(kept._kept) <= 20
    assert kept.value() == b"0998\n0999\n"
    kept.write(b"x" * 100)
    assert kept.value() == b"x" * 10


def test_a_log_stream_that_never_ends_is_given_up_at_its_deadline() -> None:
    """A host that streams without end, faster than it is read: the stream stops at its deadline."""
    import socket
    import time
    from types import SimpleNamespace

    from remote.ssh import agentcall
    from remote.tasks.board import Tail

    ours, theirs = socket.socketpair()
    theirs.send(b"!")  # always readable

    class Endless:
        closed = False

        def fileno(self) -> int:
            return ours.fileno()

        def exec_command(self, command: str) -> None:
            pass

        def recv_ready(self) -> bool:
            return True

        def recv(self, n: int) -> bytes:
            return b"y" * n

        def recv_stderr_ready(self) -> bool:
            return False

        def exit_status_ready(self) -> bool:
            return False

        def close(self) -> None:
            self.closed = True

    chan = Endless()
    conn = SimpleNamespace(
        client=SimpleNamespace(get_transport=lambda: SimpleNamespace(open_session=lambda: chan)),
        transport=SimpleNamespace(is_active=lambda: True),
    )
    kept = Tail(1 << 20)
    began = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            agentcall.stream(conn, "logs", kept.write, deadline=began + 0.5)
    finally:
        ours.close()
        theirs.close()
    assert time.monotonic() - began < 5 and chan.closed and len(kept.value()) == 1 << 20
