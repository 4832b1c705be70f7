"""The dashboard's e2e world (tests/e2e/test_dashboard.py): an SSH stack on a loopback sshd (the conftest's
`lab`, at the test module's LAB_ADDRESS) and a GCP stack whose "VM" is another loopback sshd on port 22
with its stack outputs recorded and the Compute API a local fake of Google's (tests/google_fake.py); its
GPU a stand-in `nvidia-smi` answering the agent's query in nvidia-smi's own CSV form (no GPU here); the
stand-in `pulumi` for `vm-stop`; Debian's Chromium driven by Playwright; a cross-site page."""

from __future__ import annotations

import json
import math
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
from tests.loopback_http import LoopbackServer

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
        line = self.proc.stdout.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
        assert line.startswith("{"), self.proc.stderr.read() if self.proc.poll() is not None else line  # type: ignore[union-attr]  # (a PIPE: never None)
        self.url = json.loads(line)["url"]

        self.said: list[str] = []

    def told(self, words: str) -> str:
        """The dashboard's next line on its terminal (stderr) that holds ``words``."""
        while (line := self.proc.stderr.readline()) and words not in line:  # type: ignore[union-attr]  # (a PIPE: never None)
            self.said.append(line)
        assert words in line, "".join(self.said)
        self.said.append(line)
        return line

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        return "".join(self.said) + err


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

    server = LoopbackServer((EVIL_ADDRESS, 0), Evil)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    return server
