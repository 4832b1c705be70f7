"""`gpu-train dashboard` and `report` in a real browser (Debian's Chromium driven by Playwright) against real
runs: an SSH stack on a loopback sshd, and a GCP stack whose "VM" is another loopback sshd on port 22 with
its stack outputs recorded and the Compute API a local fake of Google's (tests/google_fake.py). Its GPU is
a stand-in `nvidia-smi` answering the query the agent makes in nvidia-smi's own CSV form (no GPU here)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_train.recovery import record_labels
from remote.loopback import Sshd
from tests.conftest import FAB, ROOT, Lab, run_fab
from tests.google_fake import FakeGoogle

LAB_ADDRESS = "127.0.42.2"  # the conftest's `lab` (the SSH stack)
VM_ADDRESS, GOOGLE_ADDRESS, BOARD_ADDRESS, EVIL_ADDRESS = "127.0.42.3", "127.0.42.4", "127.0.42.5", "127.0.42.6"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip
PRICE = 0.35
LRS = {"t0": 0.001, "t1": 0.01, "t2": 0.1}  # the sweep's trials (NAME_tI_VALUES_...) and their learning rates
# The job: STEPS points of loss (lower for a learning rate nearer 0.01) and accuracy in JOB_DIR/metrics.jsonl,
# a line of log each; with HOLD, it then ticks until that file exists in its working directory.
JOB = """\
import json, math, os, pathlib, sys, time
steps, lr, pace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
hold = sys.argv[4] if len(sys.argv) > 4 else ""
final = 0.2 + abs(math.log10(lr) + 2) * (1.0 if lr < 0.01 else 0.6)
with open(pathlib.Path(os.environ["JOB_DIR"]) / "metrics.jsonl", "a") as f:
    for i in range(steps):
        loss = final + (2.5 - final) * math.exp(-5 * i / steps)
        f.write(json.dumps({"step": i, "loss": loss, "acc": 1 - loss / 3}) + "\\n")
        f.flush()
        print(f"step {i} loss {loss:.4f}", flush=True)
        time.sleep(pace)
tick = 0
while hold and not os.path.exists(hold):
    tick += 1
    print(f"waiting for more data: tick {tick}", flush=True)
    time.sleep(0.3)
print("done", flush=True)
"""
NVIDIA_SMI = """#!/bin/sh
# nvidia-smi's answer to the agent's query (agent/procs.py) in its own form, as an idle T4 VM prints it
# (a lent H100 printed "0, NVIDIA H100 80GB HBM3, 100, 1231, 81559" for the same query under load)
case "$*" in
  *--query-gpu=*) echo "0, Tesla T4, 0, 3, 15360" ;;
  *--query-compute-apps=*) ;;
  -L) echo "GPU 0: Tesla T4 (UUID: GPU-5e1b8a4e-0d6c-2f4b-9c1e-7a3f0b2d6c11)" ;;
esac
"""


def final_loss(lr: float) -> float:
    steps = 30
    final = 0.2 + abs(math.log10(lr) + 2) * (1.0 if lr < 0.01 else 0.6)
    return min(final + (2.5 - final) * math.exp(-5 * i / steps) for i in range(steps))


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


class World:
    """Two stacks with real runs on them, and the environment `fab` runs in."""

    def __init__(self, lab: Lab, vm: Sshd, google: FakeGoogle, tmp: Path):
        self.lab, self.vm, self.google, self.tmp = lab, vm, google, tmp
        self.project = tmp / "mnist-lab"
        self.project.mkdir()
        (self.project / "job.py").write_text(JOB)
        self.vm_root = tmp / "vmroot"
        self.env = {
            **lab.env,
            "GPU_TRAIN_STACK": "",
            "GPU_TRAIN_PROJECT": str(self.project),
            "GOOGLE_APPLICATION_CREDENTIALS": str(google.adc_file(tmp / "adc.json")),
            "GPU_TRAIN_COMPUTE_ENDPOINT": google.url,
            "PATH": f"{ROOT / 'tests' / 'stand_in'}:{lab.env['PATH']}",  # the stand-in `pulumi` for vm-stop
            "PULUMI_STAND_IN_DIR": str(tmp / "pulumi"),
        }

    def fab(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_fab(self.env, self.project, *args, check=check, timeout=180)

    def train(self, stack: str, name: str, *args: str) -> str:
        out = self.fab("train", "--stack", stack, "--script", "job.py", "--name", name, "--args", " ".join(args))
        return out.stdout.split()[1]

    def root(self, stack: str) -> Path:
        return self.lab.remote if stack == "lab" else self.vm_root

    def state(self, stack: str, run: str) -> str:
        try:
            return json.loads((self.root(stack) / "runs" / run / "state.json").read_text())["state"]
        except (OSError, ValueError):
            return ""

    def wait_state(self, stack: str, run: str, states=("succeeded", "failed", "stopped"), timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.state(stack, run) not in states:
            assert time.monotonic() < deadline, f"{run}: {self.state(stack, run)}"
            time.sleep(0.2)


def bind_22(address: str) -> bool:
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, 22))
        return True
    except OSError:
        return False


@pytest.fixture
def world(lab: Lab, tmp_path: Path, public_key: Path):
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium at /usr/bin/chromium (scripts/test installs Debian's)")
    if not bind_22(VM_ADDRESS):
        pytest.skip(f"port 22 on {VM_ADDRESS} is taken (or this user may not bind it): the GCP stack's VM logs in there")
    vm = Sshd(tmp_path / "vm", VM_ADDRESS, port=22, log_level="VERBOSE")  # VERBOSE: a line per session (agent call)
    fakebin = tmp_path / "vm" / "bin"
    fakebin.mkdir(parents=True)
    (fakebin / "nvidia-smi").write_text(NVIDIA_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    with open(tmp_path / "vm" / "home" / ".bashrc", "a") as rc:
        rc.write(f'export PATH="{fakebin}:$PATH"\n')
    vm.start()
    google = FakeGoogle(GOOGLE_ADDRESS)
    (tmp_path / "pulumi").mkdir()
    w = World(lab, vm, google, tmp_path)
    stacks = lab.stacks
    (stacks / "Pulumi.t4.yaml").write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: T4\n  gpu-train:gpuCount: 1\n"
        f"  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {vm.client_key}.pub\n"
        f"  gpu-train:remoteRoot: {w.vm_root}\n  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n"
    )
    (stacks / "Pulumi.l4.yaml").write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-east1-b\n  gpu-train:machineType: g2-standard-8\n"
        f"  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {public_key}\n"
    )
    l4 = {"zone": "us-east1-b", "machineType": "g2-standard-8", "externalIp": "127.0.42.9", "spot": True, "instanceName": "gpu-train-l4"}
    outputs = {"zone": "us-central1-a", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1, "spot": True}
    for name, doc in (
        ("t4", {**outputs, "externalIp": VM_ADDRESS, "sshUser": vm.user, "hourlyCostUsd": PRICE, "instanceName": "gpu-train-t4"}),
        ("l4", l4),
    ):
        (lab.home / name).mkdir(parents=True, exist_ok=True)
        (lab.home / name / "outputs.json").write_text(json.dumps(doc))
    pulumi = tmp_path / "pulumi"
    (pulumi / "outputs.json").write_text((lab.home / "t4" / "outputs.json").read_text())
    (pulumi / "up-outcomes").write_text("ok")
    (pulumi / "urns").write_text("urn:pulumi:t4::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu\n")
    now = time.time()
    coming_back = {
        "event": "preempted",
        "at": now - 600,
        "state": "coming back",
        "attempts": 2,
        "why": "zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED)",
    }
    google.state["instances"]["proj-1"] = [
        {
            "name": "gpu-train-t4",
            "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a",
            "status": "RUNNING",
            "labels": {"gpu-train-stack": "t4", "gpu-train-project": "gpu-train", "gpu-train-node": "0"},
            "creationTimestamp": iso(now - 86400),
            "lastStartTimestamp": iso(now - 3 * 3600),
        },
        {
            "name": "gpu-train-l4",
            "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-east1-b",
            "status": "TERMINATED",
            "labels": {"gpu-train-stack": "l4", "gpu-train-project": "gpu-train", "gpu-train-node": "0", **record_labels(coming_back)},
            "creationTimestamp": iso(now - 2 * 86400),
            "lastStartTimestamp": iso(now - 5 * 3600),
            "lastStopTimestamp": iso(now - 600),
        },
    ]
    yield w
    vm.stop()
    google.close()
    subprocess.run(["pkill", "-f", str(w.vm_root)], check=False)  # jobs left running by a failed test


class Dashboard:
    """`fab dashboard` as a user starts it, stopped by Ctrl-C."""

    def __init__(self, world: World, *args: str):
        self.proc = subprocess.Popen(
            [FAB, "--search-root", str(ROOT), "dashboard", "--no-browser", "--json", "--address", BOARD_ADDRESS, *args],
            env=world.env,
            cwd=world.project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("{"), self.proc.stderr.read() if self.proc.poll() is not None else line  # type: ignore[union-attr]
        self.url = json.loads(line)["url"]

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        return err


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def google_calls(google: FakeGoogle) -> tuple[int, int]:
    """(the ADC key exchanged for a token, the Compute API's instance lists) so far."""
    calls = google.state["calls"]
    return calls.count(("POST", "/token")), sum(1 for c in calls if c[1].endswith("/aggregated/instances"))


def sessions(sshd: Sshd) -> int:
    """The SSH sessions the host's sshd has started (its log at VERBOSE): each agent call is one."""
    return (sshd.dir / "sshd.log").read_text().count("Starting session:")


def status_of(url: str, method: str = "GET") -> int:
    try:
        return urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code


def evil_site(dashboard_url: str, run: str) -> ThreadingHTTPServer:
    """Another site the user has open: its page posts an action to the dashboard as a form would."""
    body = (
        f'<html><body><form id="f" method="POST" action="{dashboard_url}api/action" enctype="text/plain">'
        f'<input name=\'{{"action": "stop", "stack": "lab", "run": "{run}", "x": "\' value=\'"}}\'></form>'
        '<script>document.getElementById("f").submit()</script></body></html>'
    ).encode()

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((EVIL_ADDRESS, 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.long  # about a minute: started first under xdist
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
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(board.url)
        # every stack: the SSH host, the GCP VM with its GPU and price, the stopped one coming back
        page.wait_for_selector('article[data-stack="t4"] .gpu')
        t4 = page.locator('article[data-stack="t4"]').inner_text()
        assert "Tesla T4" in t4 and "$0.35" in t4 and "catalog price as of" in t4 and "RUNNING" in t4, t4
        page.wait_for_selector('article[data-stack="lab"] .pill.ok')
        assert "reachable" in page.locator('article[data-stack="lab"]').inner_text()
        warnings = page.locator("#warnings").inner_text()
        assert "idle while billed at $0.35/h" in warnings and "coming back (attempt 2, zone out of capacity" in warnings, warnings
        assert "outputs only on the host" in warnings
        # three tabs cost the host what one does: one agent call (an SSH session) per interval
        tabs = [browser.new_page() for _ in range(2)]
        for tab in tabs:
            tab.goto(board.url)
            tab.wait_for_selector('article[data-stack="t4"] .gpu')
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
            other = browser.new_page()
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
        assert status_of(board.url + "api/board") == 200
        assert not errors, errors
    finally:
        page.close()
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
