"""The tasks as a user runs them (the `fab` executable, same collection as `gpu-train`): gpus, check, ls,
vm-stop/vm-start through the stand-in `pulumi`, ssh-config, and tensorboard stopped by Ctrl-C."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.google_fake import FakeGoogle

FAB = str(Path(sys.executable).parent / "fab")
STAND_IN = ROOT / "tests" / "stand_in"
T4 = (
    "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: T4\n  gpu-train:gpuCount: 1\n"
    "  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n"
)


@pytest.fixture
def env(tmp_path: Path, public_key: Path):
    stacks, pulumi = tmp_path / "stacks", tmp_path / "pulumi"
    stacks.mkdir()
    pulumi.mkdir()
    (tmp_path / "home").mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "GPU_TRAIN_"))}
    e.update(
        {
            "HOME": str(tmp_path / "home"),
            "GPU_TRAIN_STACKS_DIR": str(stacks),
            "GPU_TRAIN_HOME": str(tmp_path / "state"),
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
        }
    )
    (stacks / "Pulumi.t4.yaml").write_text(T4.format(key=public_key))
    return e


def fab(env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """The task from the user's HOME, as a user runs it; tmp_path holds stacks/, so it is the project
    (the nearest directory up with stacks/) and fetched runs land in tmp_path/runs/STACK/RUN."""
    return subprocess.run(
        [FAB, "--search-root", str(ROOT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=env["HOME"],
    )


def test_gpus(env: dict) -> None:
    table = fab(env, "gpus")
    assert table.returncode == 0 and "A100-80GB" in table.stdout and "nvidia-h200-141gb" in table.stdout
    one = json.loads(fab(env, "gpus", "t4", "--region", "us-central1", "--json").stdout)
    assert [g["api"] for g in one["gpus"]] == ["nvidia-tesla-t4"] and list(one["gpus"][0]["regions"]) == ["us-central1"]
    bad = fab(env, "gpus", "T5")
    assert bad.returncode == 2 and "did you mean T4 (nvidia-tesla-t4)?" in bad.stderr and "Traceback" not in bad.stderr


def test_check_with_nothing_then_everything(env: dict, tmp_path: Path) -> None:
    bare = fab(env, "check")
    assert bare.returncode == 1 and "FAIL  Pulumi CLI: not found on PATH" in bare.stdout and "Traceback" not in bare.stderr
    google = FakeGoogle("127.0.15.4")
    try:
        google.state["services"]["proj-1"] = {"compute.googleapis.com": "ENABLED", "cloudquotas.googleapis.com": "ENABLED"}
        env.update(
            {
                "PATH": f"{STAND_IN}:{env['PATH']}",
                "PULUMI_STAND_IN_DIR": str(tmp_path / "pulumi"),
                "GOOGLE_APPLICATION_CREDENTIALS": str(google.adc_file(tmp_path / "adc.json")),
                "GPU_TRAIN_SERVICEUSAGE_ENDPOINT": google.url,
                "GPU_TRAIN_COMPUTE_ENDPOINT": google.url,
            }
        )
        (tmp_path / "pulumi" / "stacks.json").write_text('[{"name": "t4", "resourceCount": 7}]')
        full = fab(env, "check", "--json")
        doc = json.loads(full.stdout)
        assert full.returncode == 0 and doc["ok"], full.stdout
        assert {f["what"] for f in doc["findings"]} >= {"Pulumi CLI", "Compute Engine API in proj-1", "stack t4"}
    finally:
        google.close()


@pytest.fixture
def gcp(env: dict, tmp_path: Path):
    """The t4 stack deployed (recorded outputs at an address where nothing answers), the Compute API saying
    RUNNING, and the stand-in pulumi."""
    google = FakeGoogle("127.0.15.5")
    outputs = {
        "externalIp": "127.0.15.9",
        "zone": "us-central1-a",
        "machineType": "n1-standard-8",
        "gpuType": "nvidia-tesla-t4",
        "gpuCount": 1,
        "hourlyCostUsd": 0.73,
        "sshUser": "trainer",
    }
    (tmp_path / "state" / "t4").mkdir(parents=True)
    (tmp_path / "state" / "t4" / "outputs.json").write_text(json.dumps(outputs))
    (tmp_path / "pulumi" / "outputs.json").write_text(json.dumps({**outputs, "externalIp": "127.0.15.10"}))
    (tmp_path / "pulumi" / "up-outcomes").write_text("ok")
    (tmp_path / "pulumi" / "urns").write_text("urn:pulumi:t4::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu\n")
    google.state["instances"]["proj-1"] = [
        {
            "name": "gpu-train-t4",
            "zone": "zones/us-central1-a",
            "status": "RUNNING",
            "labels": {"gpu-train-stack": "t4"},
            "lastStartTimestamp": "2026-11-22T06:00:00Z",
        }
    ]
    env.update(
        {
            "PATH": f"{STAND_IN}:{env['PATH']}",
            "PULUMI_STAND_IN_DIR": str(tmp_path / "pulumi"),
            "GOOGLE_APPLICATION_CREDENTIALS": str(google.adc_file(tmp_path / "adc.json")),
            "GPU_TRAIN_SERVICEUSAGE_ENDPOINT": google.url,
            "GPU_TRAIN_COMPUTE_ENDPOINT": google.url,
        }
    )
    yield google
    google.close()


def test_ls_json(env: dict, gcp: FakeGoogle) -> None:
    doc = json.loads(fab(env, "ls", "--json", "--offline").stdout)
    (t4,) = doc["stacks"]
    assert (t4["stack"], t4["state"], t4["hourlyNow"], t4["runsRunning"], t4["billing"]) == ("t4", "RUNNING", 0.73, None, True)


def test_vm_stop_refuses_unchecked_runs_then_force_then_start(env: dict, gcp: FakeGoogle, tmp_path: Path) -> None:
    calls = tmp_path / "pulumi" / "calls"
    refused = fab(env, "vm-stop", "--stack", "t4", "--wait", "0.2", timeout=120)  # (default: 10 s of retries)
    assert refused.returncode == 1 and "refusing: cannot check the runs" in refused.stderr
    assert calls.read_text().splitlines() == ["stack output --json --show-secrets --stack t4"]  # the VM's address; no `up`
    forced = fab(env, "vm-stop", "--stack", "t4", "--force")
    assert forced.returncode == 0, forced.stderr
    lines = calls.read_text().splitlines()
    assert "config set gpu-train:running false --stack t4" in lines
    assert (
        "up --yes --skip-preview --refresh --stack t4 --target "
        "urn:pulumi:t4::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu"
    ) in lines
    stack = yaml.safe_load((tmp_path / "stacks" / "Pulumi.t4.yaml").read_text())["config"]
    assert stack["gpu-train:running"] == "false"
    # the Compute API now says it is stopped: a second stop needs no guard
    gcp.state["instances"]["proj-1"][0]["status"] = "TERMINATED"
    again = fab(env, "vm-stop", "--stack", "t4")
    assert again.returncode == 0 and "no VM of t4 is running" in again.stderr
    started = fab(env, "vm-start", "--stack", "t4")
    assert started.returncode == 0 and "started t4 at 127.0.15.10" in started.stdout
    assert yaml.safe_load((tmp_path / "stacks" / "Pulumi.t4.yaml").read_text())["config"]["gpu-train:running"] == "true"
    assert json.loads((tmp_path / "state" / "t4" / "outputs.json").read_text())["externalIp"] == "127.0.15.10"


def test_vm_stop_on_an_ssh_stack_says_so(env: dict) -> None:
    (Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.lab.yaml").write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@h:22]\n")
    r = fab(env, "vm-stop", "--stack", "lab")
    assert r.returncode == 2 and "SSH stack" in r.stderr


def test_a_vm_that_does_not_answer_is_named_from_the_compute_api(env: dict, gcp: FakeGoogle, tmp_path: Path) -> None:
    """The session hands the SSH wait its Compute call (infra/ops/probes.instance): a stopped VM is said at once."""
    for where in (tmp_path / "state" / "t4" / "outputs.json", tmp_path / "pulumi" / "outputs.json"):
        where.write_text(json.dumps({**json.loads(where.read_text()), "instanceName": "gpu-train-t4"}))
    gcp.state["instances"]["proj-1"][0].update(status="TERMINATED", lastStopTimestamp="2026-11-22T07:00:00Z")
    result = fab(env, "status", "--stack", "t4", timeout=120)
    said = result.stdout + result.stderr
    assert (
        result.returncode != 0
        and "the VM gpu-train-t4 is TERMINATED" in said
        and "Start it: gcloud compute instances start gpu-train-t4 --zone us-central1-a --project proj-1" in said
    ), said
    assert any("/instances/gpu-train-t4" in path for _, path in gcp.state["calls"])
