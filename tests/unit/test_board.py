"""The dashboard's decisions as tables (gpu_train/views/board.py, the server's guards, the actions' words),
and its server's locks over real HTTP (no host: the e2e tier drives the page in a browser)."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path

import pytest

from gpu_train.errors import UsageError
from gpu_train.views import board
from remote.dashboard import actions, page
from remote.dashboard.server import COOKIE, HEADER, refusal
from remote.tasks.board import can_open_browser, loopback

H = 3600.0


@pytest.mark.parametrize(
    ("spans", "hours"),
    [
        ({"a": (0, H)}, {"a": 1.0}),
        ({"a": (0, H), "b": (0, H)}, {"a": 0.5, "b": 0.5}),  # two trials side by side: half the VM each
        ({"a": (0, 2 * H), "b": (H, 2 * H)}, {"a": 1.5, "b": 0.5}),
        ({"a": (0, H), "b": (2 * H, 3 * H)}, {"a": 1.0, "b": 1.0}),  # one after the other: the whole VM each
        ({}, {}),
    ],
)
def test_a_runs_hours_are_shared_with_the_runs_beside_it(spans: dict, hours: dict) -> None:
    assert board.shares(spans) == pytest.approx(hours)


@pytest.mark.parametrize(
    ("run", "span"),
    [
        ({"state": "running", "durationS": 600, "ended": None}, (1000 - 600, 1000)),
        ({"state": "succeeded", "durationS": 60, "ended": 500}, (440, 500)),
        ({"state": "interrupted", "durationS": 60, "ended": 500}, (440, 500)),
        ({"state": "starting", "durationS": None}, None),
    ],
)
def test_run_span(run: dict, span) -> None:
    assert board.run_span(run, 1000) == span


@pytest.mark.parametrize(
    ("run", "sweep"),
    [
        ({"id": "lr_t1_lr0p1_20261128_101010", "sweep": "lr"}, "lr"),
        ({"id": "lr_t1_lr0p1_20261128_101010"}, None),  # a name alone makes no trial
        ({"id": "train_20261128_101010", "sweep": None}, None),
    ],
)
def test_sweep_of(run: dict, sweep) -> None:
    assert board.sweep_of(run) == sweep


FILES = {"files": 2, "bytes": 10, "newestNs": 1}
NONE = {"files": 0, "bytes": 0, "newestNs": 0}


@pytest.mark.parametrize(
    ("run", "home", "only"),
    [
        ({"jobSummary": FILES, "workdirSummary": NONE}, False, True),
        ({"jobSummary": FILES, "workdirSummary": NONE}, True, False),
        ({"jobSummary": NONE, "workdirSummary": FILES}, False, True),
        ({"jobSummary": NONE, "workdirSummary": NONE}, False, False),
        ({"jobSummary": FILES, "bucket": {"final": True, "onlyHost": []}}, False, False),  # all of it verified in the bucket
        ({"jobSummary": FILES, "bucket": {"final": True, "onlyHost": ["ckpt"]}}, False, True),
    ],
)
def test_only_on_host(run: dict, home: bool, only: bool) -> None:
    assert board.only_on_host(run, home) is only


def stack(**over) -> dict:
    doc = {"stack": "t4", "billing": True, "idle": "idle 3 of 30 min", "hourlyNow": 0.28, "notes": [], "state": "RUNNING"}
    doc["nodes"] = [{"node": 0, "host": "1.2.3.4", "gpus": [{"index": 0, "name": "T4", "utilization": 0.0}], "error": None}]
    return {**doc, **over}


def run(**over) -> dict:
    return {"id": "r1", "state": "succeeded", "onlyHost": False, **over}


@pytest.mark.parametrize(
    ("s", "runs", "kinds", "words"),
    [
        (stack(), [], ["idle-gpu"], "1 GPU(s) idle while billed at $0.28/h: no run is using them; idle stop: idle 3 of 30 min"),
        (stack(), [run(state="running")], ["idle-gpu"], "r1 running but not using them"),
        (stack(billing=False), [], [], ""),  # a stopped VM bills no GPU
        (stack(nodes=[{"node": 0, "host": "h", "gpus": [{"index": 0, "name": "T4", "utilization": 97.0}], "error": None}]), [], [], ""),
        (stack(billing=False), [run(onlyHost=True)], ["only-host"], "outputs only on the host: r1 (fetch them before `down`)"),
        (stack(billing=False), [run(onlyHost=True, state="running")], [], ""),  # still writing: not yet a warning
        (stack(billing=False, notes=["preempted 14:02, coming back (attempt 3)"]), [], ["preempted"], "coming back (attempt 3)"),
        (
            stack(billing=False, nodes=[{"node": 0, "host": "h", "gpus": [], "error": "connection refused"}]),
            [],
            ["unreachable"],
            "node 0 (h) did not answer: connection refused",
        ),
        (stack(billing=False, state="TERMINATED", nodes=[{"node": 0, "host": "h", "gpus": [], "error": "timed out"}]), [], [], ""),
    ],
)
def test_warnings(s: dict, runs: list, kinds: list, words: str) -> None:
    found = board.warnings(s, runs)
    assert [w["kind"] for w in found] == kinds
    assert all(words in w["text"] for w in found)


def series(tag: str, lo: float, hi: float) -> dict:
    return {"tag": tag, "points": [[0, hi], [1, lo]], "min": [1, lo], "max": [0, hi]}


@pytest.mark.parametrize(
    ("tags", "chosen"),
    [
        (["train/loss", "val/loss", "lr"], "val/loss"),
        (["train/loss", "accuracy"], "train/loss"),
        (["eval/accuracy", "train/loss"], "eval/accuracy"),
        (["lr", "epoch"], None),
    ],
)
def test_the_tag_a_sweep_is_judged_by(tags: list, chosen) -> None:
    assert board.judged_by(tags) == chosen


def test_best_trial_by_the_direction_of_its_metric() -> None:
    runs = {"s_t0": [series("val/loss", 0.5, 2.0), series("acc", 0.6, 0.9)], "s_t1": [series("val/loss", 0.3, 2.5)], "s_t2": []}
    assert board.best_trial(runs) == {"run": "s_t1", "tag": "val/loss", "mode": "min", "value": 0.3}
    assert board.best_trial(runs, "acc") == {"run": "s_t0", "tag": "acc", "mode": "max", "value": 0.9}
    assert board.best_trial({"s_t0": [series("lr", 0.1, 0.2)]}) is None


# -- the server's guards ----------------------------------------------------------------------------
OWN, SECRET, TOKEN = "127.0.0.1:8765", "s3cret", "t0ken"
GOOD = {
    "host": OWN,
    "origin": f"http://{OWN}",
    "sec-fetch-site": "same-origin",
    "content-type": "application/json",
    "cookie": f"other=1; {COOKIE}={TOKEN}",
    HEADER.lower(): TOKEN,
}


def without(name: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != name}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", f"/{SECRET}/", {"host": OWN}, None),
        ("GET", f"/{SECRET}/api/board", {"host": OWN}, None),
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
        ("POST", f"/{SECRET}/api/action", without("cookie"), 403),
        ("POST", f"/{SECRET}/api/action", without(HEADER.lower()), 403),
        ("POST", f"/{SECRET}/api/action", {**GOOD, HEADER.lower(): "guess"}, 403),
        ("POST", "/api/action", GOOD, 404),
        ("DELETE", f"/{SECRET}/api/action", GOOD, 405),
    ],
)
def test_refusal(method: str, path: str, headers: dict, status) -> None:
    why = refusal(method, path, headers, SECRET, TOKEN, OWN)
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
        assert loopback(address) == address
    else:
        with pytest.raises(UsageError, match="loopback address only"):
            loopback(address)


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


def test_the_server_answers_its_page_only_behind_its_secret(served) -> None:
    d = served
    assert ask(d, "GET", "/").status == 404 and ask(d, "GET", "/api/board").status == 404
    assert ask(d, "GET", f"/{d.secret}/", {"Host": "rebound.example:80"}).status == 403
    res = ask(d, "GET", f"/{d.secret}/")
    assert res.status == 200
    cookie = res.getheader("Set-Cookie")
    assert f"{COOKIE}={d.token}" in cookie and "SameSite=Strict" in cookie and "HttpOnly" in cookie
    assert "frame-ancestors 'none'" in res.getheader("Content-Security-Policy") and res.getheader("Referrer-Policy") == "no-referrer"
    assert ask(d, "GET", f"/{d.secret}/assets/uPlot.iife.min.js").status == 200
    assert ask(d, "GET", f"/{d.secret}/assets/../server.py").status == 404


def test_a_cross_site_post_is_refused_and_the_pages_own_is_heard(served) -> None:
    d = served
    body = json.dumps({"action": "nope", "stack": "lab"}).encode()
    own = {"Origin": f"http://{d.own}", "Content-Type": "application/json", "Cookie": f"{COOKIE}={d.token}", HEADER: d.token}
    assert ask(d, "POST", f"/{d.secret}/api/action", {**own, "Origin": "http://evil.example"}, body).status == 403
    assert ask(d, "POST", f"/{d.secret}/api/action", {**own, "Content-Type": "text/plain"}, body).status == 403
    assert ask(d, "POST", f"/{d.secret}/api/action", {k: v for k, v in own.items() if k != HEADER}, body).status == 403
    assert ask(d, "POST", f"/{d.secret}/api/action", own, body).status == 400  # past the locks: an unknown action
    assert d.actions.started == []


@pytest.mark.parametrize(
    ("run", "local", "home"),
    [
        ({"jobSummary": FILES, "workdirSummary": NONE}, (FILES, NONE), True),
        ({"jobSummary": FILES, "workdirSummary": NONE}, ({**FILES, "newestNs": 2}, NONE), False),  # changed on the host since
        ({"jobSummary": FILES, "workdirSummary": FILES}, (FILES, NONE), False),  # its working directory's outputs not home
        ({"jobSummary": FILES, "workdirSummary": NONE}, None, False),  # never fetched
        ({"jobSummary": NONE, "workdirSummary": NONE}, (NONE, NONE), False),  # nothing to have home
        ({"state": "running"}, (FILES, NONE), False),  # no summaries: cannot say
    ],
)
def test_is_home(run: dict, local, home: bool) -> None:
    assert board.is_home(run, local) is home


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


def test_a_clusters_gpus_per_node_and_one_state_per_run() -> None:
    """Two nodes: each node's GPUs on the card, the run failed on the cluster when node 1's part failed."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.views import listing
    from remote.dashboard.poll import one_state_each

    def doc(state: str, util: float) -> dict:
        gpu = {"index": 0, "name": "NVIDIA L4", "utilization": util, "memoryUsedMiB": 100.0, "memoryTotalMiB": 23034.0}
        run = {"id": "r_20261128_101010", "state": state, "durationS": 3600, "ended": 7200, "exitCode": 0 if state == "succeeded" else 1}
        return {"runs": [run], "gpus": [gpu], "agent": {}, "uptimeS": 10.0, "now": 7200}

    nodes = (board.NodeLook(0, "10.0.0.2", doc("succeeded", 91.0)), board.NodeLook(1, "10.0.0.3", doc("failed", 0.0)))
    look = board.StackLook(listing.StackFacts("duo"), nodes, one_state_each(nodes), {}, 7200.0)
    stack, runs = board.stack_view(look, 7200.0, load_catalog())
    assert [(n["host"], [g["utilization"] for g in n["gpus"]]) for n in stack["nodes"]] == [("10.0.0.2", [91.0]), ("10.0.0.3", [0.0])]
    assert [(r["id"], r["state"]) for r in runs] == [("r_20261128_101010", "failed")]
    assert one_state_each((board.NodeLook(0, "h", error="refused"), nodes[1])) == ()  # node 0 keeps the runs: none without it


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


def test_another_projects_run_is_marked_with_its_name() -> None:
    from gpu_train.identity import Scope, name_of
    from gpu_train.views import listing

    scope = Scope("mnist-0123abcd", ("mnist-0123abcd",), legacy="mnist")
    runs = ({"id": "a", "project": "mnist-0123abcd"}, {"id": "b", "project": "nanogpt-89abcdef"}, {"id": "c"})  # c: before ids
    mine = frozenset(r["id"] for r in runs if scope.keeps(r.get("project")))
    look = board.StackLook(listing.StackFacts("lab"), (), runs, {}, 0.0, mine, {r["id"]: name_of(r.get("project")) for r in runs})
    assert [(r["id"], r["ours"], r["project"]) for r in board.runs_of(look, None, 0.0)] == [
        ("a", True, "mnist"),
        ("b", False, "nanogpt"),
        ("c", True, "?"),
    ]
