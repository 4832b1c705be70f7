"""`check` and `ls` against their real boundaries: the stand-in `pulumi`, a local fake of Google's APIs
(with a throwaway ADC key), cached outputs, and a real sshd for an SSH stack's agent."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment
from gpu_train.views import checkup, listing
from remote.tasks import gather as overview
from tests.google_fake import FakeGoogle

CATALOG = load_catalog()

STAND_IN = Path(__file__).parents[1] / "stand_in"
VENV_BIN = str(Path(sys.executable).parent)
T4 = (
    "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: T4\n  gpu-train:gpuCount: 1\n"
    "  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n"
)


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
        self.env = Environment(
            stacks_dir=self.stacks, home=self.state, compute_endpoint=google.url, serviceusage_endpoint=google.url, cwd=tmp
        )

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
        (
            lambda w: w.google.state["services"]["proj-1"].update({"cloudquotas.googleapis.com": "DISABLED"}),
            "Cloud Quotas API in proj-1",
            "gcloud services enable cloudquotas.googleapis.com --project proj-1",
        ),
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


def test_ls_without_credentials_uses_last_known_outputs(world: World) -> None:
    world.stack("t4", T4).outputs("t4", {"externalIp": "127.0.15.9", "zone": "us-central1-a", "hourlyCostUsd": 0.28})
    facts = overview.ls_facts(world.env, ask_hosts=False)
    (r,) = listing.rows(facts, time.time(), CATALOG)
    assert (r.state, r.source) == ("RUNNING?", "last known outputs") and world.google.state["calls"] == []
