"""`check` and `ls` against their real boundaries: the stand-in `pulumi`, a local fake of Google's APIs
(with a throwaway ADC key), cached outputs, and a real sshd for an SSH stack's agent."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpu_train.environment import Environment
from gpu_train.gcp.catalog_file import load_catalog
from gpu_train.views import checkup, listing
from remote.loopback import Sshd
from remote.tasks import gather as overview
from tests.google_fake import FakeGoogle

CATALOG = load_catalog()

STAND_IN = Path(__file__).parent / "stand_in"
VENV_BIN = str(Path(sys.executable).parent)
T4 = ("config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: T4\n  gpu-train:gpuCount: 1\n"
      "  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n")
L4 = ("config:\n  gcp:project: proj-1\n  gpu-train:zone: us-east1-b\n  gpu-train:machineType: g2-standard-8\n"
      "  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public_key: Path):
    """No Pulumi CLI, no credentials, no stack files: a machine with none of it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "stacks").mkdir()
    google = FakeGoogle()
    w = World(tmp_path, monkeypatch, google, public_key)
    yield w
    google.close()


class World:
    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, google: FakeGoogle, public_key: Path):
        self.tmp, self.mp, self.google, self.public_key = tmp, monkeypatch, google, public_key
        self.stacks, self.state, self.pulumi_dir = tmp / "stacks", tmp / "state", tmp / "pulumi"
        # What `check` and `ls` are handed: their stacks, their records, Google's APIs here.
        self.env = Environment(stacks_dir=self.stacks, home=self.state, compute_endpoint=google.url,
                               serviceusage_endpoint=google.url, cwd=tmp)

    def with_pulumi(self, stacks: list[dict] | None = None) -> World:
        self.pulumi_dir.mkdir(exist_ok=True)
        self.mp.setenv("PATH", f"{STAND_IN}:{os.environ['PATH']}")
        self.mp.setenv("PULUMI_STAND_IN_DIR", str(self.pulumi_dir))
        (self.pulumi_dir / "stacks.json").write_text(json.dumps(stacks or []))
        return self

    def with_adc(self) -> World:
        self.mp.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(self.google.adc_file(self.tmp / "adc.json")))
        return self

    def stack(self, name: str, text: str) -> World:
        (self.stacks / f"Pulumi.{name}.yaml").write_text(text.format(key=self.public_key))
        return self

    def outputs(self, name: str, doc: dict) -> World:
        (self.state / name).mkdir(parents=True, exist_ok=True)
        (self.state / name / "outputs.json").write_text(json.dumps(doc))
        return self

    def everything(self) -> World:
        self.with_pulumi([{"name": "t4", "current": True, "lastUpdate": "2026-11-20T10:00:00.000Z", "resourceCount": 7}])
        self.with_adc().stack("t4", T4)
        self.google.state["services"]["proj-1"] = {"compute.googleapis.com": "ENABLED", "cloudquotas.googleapis.com": "ENABLED"}
        return self


def by_what(findings: list[checkup.Finding]) -> dict[str, checkup.Finding]:
    return {f.what: f for f in findings}


def test_check_with_none_of_it_says_what_is_missing(world: World) -> None:
    found = by_what(overview.check_findings(world.env))
    assert found["Pulumi CLI"].ok is False and "not found on PATH" in found["Pulumi CLI"].detail
    assert found["Pulumi backend"].ok is None
    adc = found["Application Default Credentials"]
    assert adc.ok is False and "application-default login" in adc.fix and str(world.tmp / "home") in adc.detail
    assert found["Google APIs"].ok is None and found["stack files"].ok is None
    assert checkup.exit_code(list(found.values())) == 1 and world.google.state["calls"] == []


def test_check_with_everything(world: World) -> None:
    world.everything()
    findings = overview.check_findings(world.env)
    found = by_what(findings)
    assert [f.what for f in findings if f.ok is not True] == []
    assert found["Pulumi CLI"].detail == "v3.272.0" and "stand-in at file://~" in found["Pulumi backend"].detail
    assert "service_account" in found["Application Default Credentials"].detail
    assert found["Compute Engine API in proj-1"].detail == "enabled" and found["Cloud Quotas API in proj-1"].ok
    assert found["stack t4"].detail == "valid; deployed (backend)"
    assert ("POST", "/token") in world.google.state["calls"]  # the ADC key was really exchanged for a token
    assert checkup.exit_code(findings) == 0


def _logged_out(w: World) -> None:
    (w.pulumi_dir / "logged-out").write_text("")


@pytest.mark.parametrize(
    ("change", "what", "words"),
    [
        (lambda w: (w.pulumi_dir / "version").write_text("v3.120.0\n"), "Pulumi CLI", "older than v3.200.0"),
        (_logged_out, "Pulumi backend", "PULUMI_ACCESS_TOKEN must be set"),
        (lambda w: w.google.state["services"]["proj-1"].update({"cloudquotas.googleapis.com": "DISABLED"}),
         "Cloud Quotas API in proj-1", "gcloud services enable cloudquotas.googleapis.com --project proj-1"),
        (lambda w: w.google.state["services"].pop("proj-1"), "Compute Engine API in proj-1", "Service Usage API has not been used"),
        (lambda w: (w.tmp / "adc.json").write_text("{not json"), "Application Default Credentials", "cannot be used"),
        (lambda w: w.stack("t4", T4.replace("{key}", "/nonexistent/id.pub")), "SSH key of t4", "no private key at /nonexistent/id"),
        (lambda w: w.stack("bad", "config:\n  gcp:project: proj-1\n  gpu-train:gpuType: T5\n"), "stack bad", "invalid"),
        (lambda w: (w.pulumi_dir / "stacks.json").write_text("[]"), "stack t4", "not deployed"),
    ],
)
def test_check_each_missing_piece(world: World, change, what: str, words: str) -> None:
    world.everything()
    change(world)
    findings = overview.check_findings(world.env)
    found = by_what(findings)
    assert what in found, [f.what for f in findings]
    f = found[what]
    assert words in f.detail + " " + f.fix
    if "not deployed" not in words:
        assert f.ok is False and checkup.exit_code(findings) == 1


# -- ls -------------------------------------------------------------------------------------------
def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def instance(stack: str, zone: str, status: str, started: float, stopped: float | None = None) -> dict:
    doc = {"name": f"gpu-train-{stack}", "zone": f"https://www.googleapis.com/compute/v1/projects/proj-1/zones/{zone}",
           "status": status, "labels": {"gpu-train-stack": stack, "gpu-train-project": "gpu-train", "gpu-train-node": "0"},
           "creationTimestamp": iso(started - 86400), "lastStartTimestamp": iso(started)}
    if stopped:
        doc["lastStopTimestamp"] = iso(stopped)
    return doc


@pytest.fixture
def lab(tmp_path: Path):
    sshd = Sshd(tmp_path / "sshd", "127.0.15.2").start()
    yield sshd
    sshd.stop()


def test_ls_over_gcp_and_ssh_stacks(world: World, lab: Sshd) -> None:
    now = time.time()
    world.with_adc().stack("t4", T4).stack("l4", L4)
    world.stack("a100", T4.replace("gpuType: T4\n  gpu-train:gpuCount: 1", "machineType: a2-highgpu-1g"))
    lab.stack_file(world.stacks, "lab", world.tmp / "remote", sys.executable)
    world.stack("broken", "config:\n  gpu-train:target: ssh\n")
    # t4 runs; its recorded outputs point at an address where nothing answers (a stale one)
    world.outputs("t4", {"externalIp": "127.0.15.9", "zone": "us-central1-a", "machineType": "n1-standard-8",
                         "gpuType": "nvidia-tesla-t4", "gpuCount": 1, "spot": True, "hourlyCostUsd": 0.28})
    world.outputs("l4", {"externalIp": "127.0.15.8", "zone": "us-east1-b", "machineType": "g2-standard-8",
                         "gpuType": "nvidia-l4", "gpuCount": 1, "spot": False, "hourlyCostUsd": 0.85362})
    world.google.state["instances"]["proj-1"] = [
        instance("t4", "us-central1-a", "RUNNING", now - 2 * 3600),
        instance("l4", "us-east1-b", "TERMINATED", now - 5 * 3600, now - 4 * 3600),
        {"name": "someone-elses", "zone": "zones/us-central1-a", "status": "RUNNING", "labels": {}},
    ]
    started = time.monotonic()
    facts = overview.ls_facts(world.env)
    took = time.monotonic() - started
    table = {r.stack: r for r in listing.rows(facts, time.time(), CATALOG)}
    order = [r.stack for r in listing.rows(facts, time.time(), CATALOG)]
    assert order[0] == "t4" and set(order) == {"t4", "l4", "a100", "lab", "broken"}
    t4, l4, a100, ssh, broken = (table[n] for n in ("t4", "l4", "a100", "lab", "broken"))
    assert (t4.state, t4.source, t4.hourly_now, t4.billing) == ("RUNNING", "compute api", 0.28, True)
    assert t4.spent_month == pytest.approx(2 * 0.28, abs=0.02) and t4.runs_running is None and t4.notes  # host: unreachable
    assert (l4.state, l4.hourly_now, l4.spent_month, l4.billing) == ("TERMINATED", 0.0, pytest.approx(0.85, abs=0.01), False)
    assert (a100.state, a100.source) == ("none", "compute api")
    assert (ssh.state, ssh.runs_running, ssh.idle) == ("reachable", 0, "off")
    assert broken.state == "invalid" and "hosts" in broken.notes[0]
    assert took < overview.ANSWER_S + 10, "ls must never wait long on a host"
    # the ledger keeps what it saw: t4's run is remembered for the month
    assert json.loads((world.state / "t4" / "uptime.json").read_text())["intervals"]
    text = listing.render(listing.rows(facts, time.time(), CATALOG))
    assert "billing now: $0.28/h across 1 stack(s)" in text


def test_ls_without_credentials_uses_last_known_outputs(world: World) -> None:
    world.stack("t4", T4).outputs("t4", {"externalIp": "127.0.15.9", "zone": "us-central1-a", "hourlyCostUsd": 0.28})
    facts = overview.ls_facts(world.env, ask_hosts=False)
    (r,) = listing.rows(facts, time.time(), CATALOG)
    assert (r.state, r.source) == ("RUNNING?", "last known outputs") and world.google.state["calls"] == []
