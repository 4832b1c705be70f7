"""The e2e tier of tests/unit/test_overview.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpu_train.views import listing
from remote.loopback import Sshd
from remote.tasks import gather as overview
from tests.unit.test_overview import (
    CATALOG,
    T4,
    World,
    world,  # noqa: F401 (fixtures)
)

L4 = (
    "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-east1-b\n  gpu-train:machineType: g2-standard-8\n"
    "  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n"
)


# -- ls -------------------------------------------------------------------------------------------
def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def instance(stack: str, zone: str, status: str, started: float, stopped: float | None = None) -> dict:
    doc = {
        "name": f"gpu-train-{stack}",
        "zone": f"https://www.googleapis.com/compute/v1/projects/proj-1/zones/{zone}",
        "status": status,
        "labels": {"gpu-train-stack": stack, "gpu-train-project": "gpu-train", "gpu-train-node": "0"},
        "creationTimestamp": iso(started - 86400),
        "lastStartTimestamp": iso(started),
    }
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
    world.outputs(
        "t4",
        {
            "externalIp": "127.0.15.9",
            "zone": "us-central1-a",
            "machineType": "n1-standard-8",
            "gpuType": "nvidia-tesla-t4",
            "gpuCount": 1,
            "spot": True,
            "hourlyCostUsd": 0.28,
        },
    )
    world.outputs(
        "l4",
        {
            "externalIp": "127.0.15.8",
            "zone": "us-east1-b",
            "machineType": "g2-standard-8",
            "gpuType": "nvidia-l4",
            "gpuCount": 1,
            "spot": False,
            "hourlyCostUsd": 0.85362,
        },
    )
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
