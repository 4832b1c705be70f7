"""`gpu-train dashboard` and `report` in a real browser (Debian's Chromium driven by Playwright) against real
runs on two stacks, an SSH host and a GCP stack (tests/dashboard_world.py builds them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import ConsoleMessage

from tests.conftest import run_fab
from tests.dashboard_world import (
    EVIL_ADDRESS,
    JOB,
    LRS,
    Dashboard,
    World,
    browser,  # noqa: F401 (fixtures)
    evil_site,
    final_loss,
    google_calls,
    sessions,
    status_of,
    world,  # noqa: F401 (fixtures)
)

LAB_ADDRESS = "127.0.42.2"  # the conftest's `lab` (the SSH stack)


@pytest.mark.long  # about a minute: started first under xdist
def favicon(message: ConsoleMessage) -> bool:
    """Chromium's own request for /favicon.ico, outside the dashboard's secret path (404, as for any
    stranger): it may ask before it has read the page's `<link rel="icon" href="data:,">`, at random
    (CI: 2 runs in 5). Playwright reports no response for a favicon, only this console line; the page asked
    nothing that failed. Anything else that failed, and this one on any other path, stays an error."""
    return "status of 404" in message.text and urlsplit(message.location.get("url") or "").path == "/favicon.ico"


def test_the_dashboard_live_and_the_report_offline(world: World, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    w = world
    # a sweep on the GCP stack: its one GPU is one slot, so the trials run one after the other
    out = w.fab(
        "sweep", "--stack", "t4", "--script", "job.py", "--args", "30 {lr} 0.05", "--values", "lr=0.001,0.01,0.1", "--name", "lrsweep"
    )
    assert "lrsweep: 3 trials over 1 slot(s)" in out.stdout, out.stdout
    baseline = w.train("lab", "baseline", "40", "0.03", "0")
    w.wait_state("lab", baseline)
    w.fab("fetch", "--stack", "lab", "--run", baseline)
    hold = w.tmp / "release"
    live = w.train("lab", "finetune", "20", "0.01", "0.05", str(hold))
    deadline = time.monotonic() + 120
    while len(trials := {p.name: LRS[p.name.split("_")[1]] for p in (w.vm_root / "runs").glob("lrsweep_t*")}) < 3:
        assert time.monotonic() < deadline, f"the sweep's trials: {sorted(trials)}"
        time.sleep(0.2)
    for run in trials:
        w.wait_state("t4", run)
    best = min(trials, key=lambda r: final_loss(trials[r]))

    other = w.tmp / "nanogpt"  # another project, on the same lab host
    other.mkdir()
    (other / "job.py").write_text(JOB)
    theirs = run_fab(
        {**w.env, "GPU_TRAIN_PROJECT": str(other)}, other, "train", "--stack", "lab", "--script", "job.py", "--args", "5 0.01 0", check=True
    )
    theirs_id = theirs.stdout.split()[1]
    longer = w.train("lab", "pretrain", "120", "0.003", "0.25", str(w.tmp / "release-pretrain"))  # 30 s of points
    tokens, lists = google_calls(w.google)
    board = Dashboard(w, "--interval", "1")
    yours = browser.new_context(viewport={"width": 1440, "height": 1000})  # the user's browser: its tabs share a session
    page = yours.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" and not favicon(m) else None)
    page.on("response", lambda r: errors.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 400 else None)  # (which one)
    try:
        page.goto(board.url)
        # every stack: the SSH host, the GCP VM with its GPU and price, the stopped one coming back
        page.wait_for_selector('article[data-stack="t4"] .gpu')
        t4 = page.locator('article[data-stack="t4"]').inner_text()
        assert "Tesla T4" in t4 and "$0.35" in t4 and "RUNNING" in t4, t4
        assert re.search(r"catalog price (as of \d{4}-\d{2}-\d{2}|\(.+\))", t4), t4  # a date, or its row's words (not "as of S2 snapshot")
        page.wait_for_selector('article[data-stack="lab"] .pill.ok')
        assert "reachable" in page.locator('article[data-stack="lab"]').inner_text()
        warnings = page.locator("#warnings").inner_text()
        assert "idle while billed at $0.35/h" in warnings and "coming back (attempt 2, zone out of capacity" in warnings, warnings
        assert "outputs only on the host" in warnings
        # three tabs cost the host what one does: one agent call (an SSH session) per interval
        tabs = [yours.new_page() for _ in range(2)]  # (tabs of the same browser: its session)
        for tab in tabs:
            tab.goto(board.url)
            tab.wait_for_selector('article[data-stack="t4"] .gpu')
        # another browser: the used URL is refused; the dashboard's terminal gives it a fresh one-time link
        stranger = browser.new_page()
        assert stranger.goto(board.url).status == 403
        told = board.told("for another browser: ")
        stranger.goto(told.split()[-1])
        stranger.wait_for_selector('article[data-stack="t4"] .gpu')
        stranger.close()
        before, started = sessions(w.vm), time.monotonic()
        time.sleep(5)
        while sessions(w.vm) == before and time.monotonic() - started < 60:  # (a loaded machine: a look takes long)
            time.sleep(0.1)
        calls, took = sessions(w.vm) - before, time.monotonic() - started
        assert 1 <= calls <= took / 1 + 1, f"{calls} agent calls in {took:.1f} s at a 1 s interval with 3 tabs"
        for tab in tabs:
            tab.close()
        # every run: finished and fetched, running, the sweep's trials with their costs
        row = page.locator(f'tr[data-run="{baseline}"]')
        assert "succeeded" in row.inner_text() and "fetched" in row.inner_text()
        page.wait_for_selector(f'tr[data-run="{live}"] .pill.ok')
        for run in trials:
            assert "$" in page.locator(f'tr[data-run="{run}"] td.num').last.inner_text()
        sweep = page.locator("button.sweep").inner_text()
        assert "lrsweep" in sweep and "3 trials on t4" in sweep and "$" in sweep
        # a running run's curve grows on the page with no reload
        page.locator(f'tr[data-run="{longer}"]').click()
        chart = page.locator('figure.chart[data-tag="loss"]')
        chart.locator("canvas").wait_for(timeout=60000)
        first = int(chart.get_attribute("data-points") or 0)
        assert 0 < first < 120, first
        expect(chart).not_to_have_attribute("data-points", str(first), timeout=60000)
        assert int(chart.get_attribute("data-points") or 0) > first
        # another project's run on the same host: shown, and marked with its project
        other_row = page.locator(f'#runs tr[data-run="{theirs_id}"]')
        expect(other_row.locator(".tag.other")).to_have_text("project nanogpt")
        assert "other" in (other_row.get_attribute("class") or "")
        assert page.locator(f'#runs tr[data-run="{baseline}"] .tag.other').count() == 0
        # a running run: its log grows on the page with no reload
        page.locator(f'tr[data-run="{live}"]').click()
        expect(page.locator("#log")).to_contain_text("waiting for more data: tick 2", timeout=60000)
        expect(page.locator("#log")).to_contain_text("waiting for more data: tick 6", timeout=60000)
        # a cross-site form POST to the dashboard is refused, and nothing was stopped
        evil = evil_site(board.url, live)
        try:
            other = yours.new_page()  # (the user's own browser, with the dashboard's session)
            other.goto(f"http://{EVIL_ADDRESS}:{evil.server_address[1]}/")
            expect(other.locator("body")).to_contain_text("cross-site request refused", timeout=30000)
            other.close()
        finally:
            evil.shutdown()
            evil.server_close()
        assert w.state("lab", live) == "running"
        # the page's own Stop: the run stops, and the table says so with no reload
        page.on("dialog", lambda d: d.accept())
        page.get_by_role("button", name="Stop run").click()
        page.wait_for_selector(f'tr[data-run="{live}"] .pill.off', timeout=90000)
        assert "stopped" in page.locator(f'tr[data-run="{live}"]').inner_text()
        assert w.state("lab", live) == "stopped"
        # a curve has the points the job logged
        page.locator(f'tr[data-run="{baseline}"]').click()
        page.wait_for_selector('figure.chart[data-tag="loss"][data-points="40"] canvas', timeout=60000)
        assert page.locator("figure.chart").count() == 2  # loss and acc, as the job wrote them
        # a sweep's curves overlaid, the best trial marked
        page.locator("button.sweep").click()
        page.wait_for_selector('figure.chart[data-tag="loss"][data-points="30,30,30"] canvas', timeout=60000)
        assert f"best trial: {best}" in page.locator("#curves .best").inner_text()
        shot = Path(os.environ.get("GPU_TRAIN_DASHBOARD_SHOT") or tmp_path / "dashboard.png")
        page.locator("header").scroll_into_view_if_needed()
        page.screenshot(path=str(shot), full_page=True)
        # the Compute API asked at every look, its key exchanged for a token once
        assert google_calls(w.google)[1] - lists > 5 and google_calls(w.google)[0] - tokens == 1
        # a trial's log, from the sweep's table of trials
        page.locator(f'table.trials tr[data-run="{best}"]').click()
        expect(page.locator("#log")).to_contain_text("step 29 loss", timeout=60000)
        # the page's Stop VM: every run of the stack fetched first (the table says so), then the VM stopped
        page.locator('article[data-stack="t4"] button', has_text="Stop VM").click()
        action = page.locator(".action", has_text="vm-stop")
        expect(action.locator(".pill")).not_to_have_text("running", timeout=180000)
        assert "done" in action.locator(".pill").inner_text(), action.inner_text()
        for run in trials:
            page.wait_for_selector(f'#runs tr[data-run="{run}"] .home.yes', timeout=60000)
        assert "config set gpu-train:running false --stack t4" in (w.tmp / "pulumi" / "calls").read_text()
        # a run that ends by itself: the table says so with no reload
        assert w.state("lab", longer) == "running"
        (w.tmp / "release-pretrain").write_text("")
        page.wait_for_selector(f'tr[data-run="{longer}"] .pill.done', timeout=90000)
        # the secret is required
        base = board.url.rsplit("/", 2)[0]
        assert status_of(f"{base}/") == 404 and status_of(f"{base}/api/board") == 404
        # the URL opened one session (the browser's); alone it now reads nothing
        assert status_of(board.url + "api/board") == 401 and status_of(board.url) == 403
        assert not errors, errors
    finally:
        yours.close()
        err = board.stop()
    assert "dashboard stopped" in err and "Traceback" not in err, err

    # the report: one file that opens with no network at all
    out = w.fab("report", "--output", str(tmp_path / "report.html"), "--json")
    path = Path(json.loads(out.stdout)["path"])
    context = browser.new_context(offline=True)
    asked: list[str] = []
    context.on("request", lambda r: asked.append(r.url))
    offline = context.new_page()
    offline.goto(path.as_uri())
    offline.wait_for_selector('article[data-stack="t4"] .gpu')
    assert "report of" in offline.locator("#freshness").inner_text()
    assert offline.locator("button", has_text="Stop").count() == 0  # a report acts on nothing
    offline.locator(f'tr[data-run="{baseline}"]').click()
    offline.wait_for_selector('figure.chart[data-tag="loss"][data-points="40"] canvas')
    assert "step 39 loss" in offline.locator("#log").inner_text()
    offline.locator("button.sweep").click()
    assert f"best trial: {best}" in offline.locator("#curves .best").inner_text()
    assert asked == [path.as_uri()], asked
    context.close()
    shutil.rmtree(w.vm_root / "runs", ignore_errors=True)


@pytest.mark.e2e  # (a real browser)
def test_the_browser_opened_on_the_private_file_gets_the_page_and_the_session(browser, tmp_path: Path) -> None:
    """What `dashboard` starts the browser on (a 0600 file, never the URL on a command line) brings it to the
    page with its session; after that the URL alone reads nothing."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.environment import Environment
    from remote.dashboard.poll import Watch
    from remote.dashboard.server import SESSION, Dashboard
    from remote.tasks.board import opener_file
    from tests.dashboard_world import status_of

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.lab.yaml").write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@127.0.42.250:9]\n")
    env = Environment(stacks_dir=tmp_path / "stacks", home=tmp_path / "state", cwd=tmp_path, project=tmp_path)
    d = Dashboard(Watch(env, load_catalog(), 3600, "proj"), "127.0.0.1", tell=lambda _: None).start()
    opener = opener_file(d.url)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(opener.as_uri())
        page.wait_for_selector('article[data-stack="lab"]')
        assert page.url == d.url
        assert any(c["name"] == SESSION and c["httpOnly"] and c["sameSite"] == "Strict" for c in context.cookies())
        assert status_of(d.url) == 403 and status_of(d.url + "api/board") == 401
    finally:
        context.close()
        d.stop()
        shutil.rmtree(opener.parent)
