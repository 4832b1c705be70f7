"""scripts/up and scripts/plan against the Pulumi CLI's boundary: the stand-in `pulumi` (tests/stand_in/pulumi)
keeps a stack's state like the engine (export, protect, targeted destroy, config files) and answers
`up` with real provider error texts; a local HTTP server speaks the Compute REST API.

What is checked: nothing that existed before is destroyed, nothing moves unasked, the stack file
changes only when an attempt succeeded, and a change that replaces the VM is shown and asked about.
The scripts' main runs in the test's process (tests.conftest.in_process: the same program, its `pulumi`
calls real processes of the stand-in); one test runs scripts/up itself, as a user does. Quota preferences
across attempts and destroys: tests/slow/test_up_quotas.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

import infra.ops.plan
import infra.ops.up
from gpu_train.catalog.loader import load_catalog
from gpu_train.stack import stackfile
from infra import program
from infra.ops import preview, pulumi_cli
from tests.conftest import ROOT, in_process
from tests.loopback_http import LoopbackServer
from tests.unit.test_capacity import ComputeApi

CATALOG = load_catalog()
STAND_IN = ROOT / "tests" / "stand_in"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests user@host"

pytestmark = pytest.mark.slow  # each test runs scripts/up (infra.ops.up) against the stand-in pulumi, seconds
SCRIPTS = {"up": infra.ops.up.main, "plan": infra.ops.plan.main}


def provider_error(message: str, resource: str = "gpu") -> str:
    """An error as `pulumi up` prints it for a pulumi-gcp resource (the provider passes the message on)."""
    return f"  gcp:compute:Instance ({resource}):\n    error: 1 error occurred:\n\t* {message}\n"


ERRORS = {
    "stockout": provider_error(
        "Error waiting for instance to create: The zone 'projects/proj-1/zones/us-central1-a' does not "
        "have enough resources available to fulfill the request.  Try a different zone, or try "
        "again later."
    ),
    "regional": provider_error("Error waiting for instance to create: Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 1.0 in region us-central1."),
    "global": provider_error(
        "Error waiting for instance to create: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 "
        "globally.\n\tmetric name = compute.googleapis.com/gpus_all_regions"
    ),
    "machine": provider_error(
        "Error creating instance: googleapi: Error 400: Invalid value for field "
        "'resource.machineType': 'projects/proj-1/zones/us-central1-a/machineTypes/n1-standard-8'. "
        "Machine type with name 'n1-standard-8' does not exist in zone 'us-central1-a'., invalid"
    ),
    "accelerator": provider_error(
        "Error creating instance: googleapi: Error 400: Invalid value for field "
        "'resource.guestAccelerators[0].acceleratorType': 'projects/proj-1/zones/us-central1-a/"
        "acceleratorTypes/nvidia-tesla-t4'. The resource 'projects/proj-1/zones/us-central1-a/"
        "acceleratorTypes/nvidia-tesla-t4' was not found., invalid"
    ),
    "config": provider_error(
        "Error creating instance: googleapi: Error 400: [n1-standard-8, nvidia-tesla-t4] features "
        "are not compatible for creating instance., badRequest"
    ),
    "preference": provider_error(
        "Error creating QuotaPreference: googleapi: Error 409: Requested entity already exists", "quota-gpus-all-regions-per-project"
    ),
    "permission": provider_error(
        "Error creating instance: googleapi: Error 403: Required 'compute.instances.create' "
        "permission for 'projects/proj-1/zones/us-central1-a/instances/gpu-train-t4', forbidden"
    ),
}
STACK = {"gcp:project": "proj-1", "gpu-train:zone": "us-central1-a", "gpu-train:gpuType": "nvidia-tesla-t4",
         "gpu-train:gpuCount": 1, "gpu-train:spot": True, "gpu-train:sshSourceRanges": ["203.0.113.7/32"],
         "gpu-train:sshPublicKey": KEY}  # fmt: skip


def deployed_state(raw: dict, stack: str) -> dict:
    """A `pulumi stack export` document of the stack as the real program declares it, with what the engine
    adds: URNs under the component, provider ids, protect flags, and the provider's defaults (__defaults)."""
    result = preview.run(program.main, stack=stack, config=raw)
    assert result.error is None, result.error
    comp = "gpu-train:index:GpuVm"
    resources = [
        {
            "urn": f"urn:pulumi:{stack}::gpu-train::pulumi:pulumi:Stack::gpu-train-{stack}",
            "type": "pulumi:pulumi:Stack",
            "custom": False,
            "outputs": result.outputs,
        }
    ]
    for r in result.resources:
        if r.typ == comp:
            resources.append({"urn": f"urn:pulumi:{stack}::gpu-train::{comp}::{r.name}", "type": comp, "custom": False})
            continue
        inputs = json.loads(json.dumps(r.inputs, default=lambda o: type(o).__name__))  # (an asset archive)
        if r.typ == "gcp:compute/instance:Instance":  # what tfbridge's Check fills in, and lists as defaults
            inputs |= {"canIpForward": False, "deletionProtection": False, "__defaults": ["canIpForward", "deletionProtection"]}
            inputs["bootDisk"] |= {"mode": "READ_WRITE", "__defaults": ["mode"]}
        where = inputs.get("zone") or inputs.get("region") or "global"
        resources.append(
            {
                "urn": f"urn:pulumi:{stack}::gpu-train::{comp}${r.typ}::{r.name}",
                "type": r.typ,
                "custom": True,
                "id": f"projects/proj-1/{where}/{r.name}",
                "inputs": inputs,
                "protect": r.protect,
            }
        )
    return {"version": 3, "deployment": {"manifest": {"version": "3.200.0"}, "resources": resources}}


@pytest.fixture
def env(tmp_path: Path):
    """Stack t4 (spot T4 in us-central1-a), the stand-in's folder, and a local Compute API."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.t4.yaml").write_text(json.dumps({"config": STACK}, indent=1))  # JSON is YAML
    for name, text in ERRORS.items():
        (tmp_path / name).write_text(text)
    server = LoopbackServer(("127.0.0.1", 0), ComputeApi)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    ComputeApi.state = {
        "zonesOffering": {
            "n1-standard-8": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-c"],
            "nvidia-tesla-t4": ["us-central1-a", "us-central1-b", "us-central1-f", "us-east1-c", "us-east1-d"],
        }
    }
    yield {
        **os.environ,
        "PATH": f"{STAND_IN}:{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
        "PULUMI_STAND_IN_DIR": str(tmp_path),
        "GPU_TRAIN_STACKS_DIR": str(stacks),
        "GPU_TRAIN_COMPUTE_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-adc.json"),
    }  # this local API asks for none
    server.shutdown()


def with_settings(**settings: object) -> dict:
    """STACK with these settings changed (None removes one)."""
    raw = {**STACK, **{f"gpu-train:{k}": v for k, v in settings.items()}}
    return {k: v for k, v in raw.items() if v is not None}


def deploy(env: dict, **settings: object) -> None:
    """The stack as deployed earlier, with these settings (the stack file may since say otherwise)."""
    raw = with_settings(**settings)
    (Path(env["PULUMI_STAND_IN_DIR"]) / "state.json").write_text(json.dumps(deployed_state(raw, "t4")))


def edit_stack(env: dict, **settings: object) -> None:
    path = Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.t4.yaml"
    path.write_text(json.dumps({"config": with_settings(**settings)}, indent=1))


def run(env: dict, script: str, outcomes: str, *args: str, process: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    d = Path(env["PULUMI_STAND_IN_DIR"])
    (d / "up-outcomes").write_text(outcomes)
    (d / "calls").unlink(missing_ok=True)
    if process:
        result = subprocess.run(
            [str(ROOT / "scripts" / script), "--stack", "t4", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    else:
        result = in_process(SCRIPTS[script], ["--stack", "t4", *args], env)
    calls = (d / "calls").read_text().splitlines() if (d / "calls").exists() else []
    return result, calls


def up(env: dict, outcomes: str, *args: str, process: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    return run(env, "up", outcomes, "--skip-preflight", *args, process=process)


def state(env: dict) -> dict:
    path = Path(env["PULUMI_STAND_IN_DIR"]) / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def stack_text(env: dict) -> str:
    return (Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.t4.yaml").read_text()


def names(doc: dict, suffix: str = "") -> set[str]:
    return {r["urn"].rsplit("::", 1)[-1] for r in doc.get("deployment", {}).get("resources", []) if r["type"].endswith(suffix)}


# -- a stack with a VM ------------------------------------------------------------------------
def test_existing_stack_stockout_destroys_nothing_and_moves_nothing(env: dict) -> None:
    deploy(env, running=False)  # a stopped spot VM, idle-stopped; now started again
    edit_stack(env, running=True)
    before, stack_before = state(env), stack_text(env)
    result, calls = up(env, "stockout")
    assert result.returncode == 1, result.stdout + result.stderr
    assert state(env) == before and stack_text(env) == stack_before
    assert not [c for c in calls if c.startswith(("destroy", "config set", "state"))]
    assert sum(c.startswith("up ") for c in calls) == 1 and "--config-file" not in calls[-1]
    out = result.stdout
    assert "Nothing was destroyed and nothing moved" in out
    assert "--retry-until-up" in out and "--move" in out and "only the runs you fetched home" in out
    # The zones came from the Compute API (machine type and GPU both offered), not from the error text.
    assert "zones offering n1-standard-8 + nvidia-tesla-t4: us-central1-a, us-central1-b, us-central1-f, us-east1-c" in out
    assert "in place" in out and "desiredStatus" in out  # running: false -> true starts the VM in place


def test_existing_stack_retry_until_up_stays_in_its_zone(env: dict) -> None:
    deploy(env)
    result, calls = up(env, "stockout stockout ok", "--retry-until-up", "--retry-delay", "0")
    assert result.returncode == 0, result.stdout
    assert "trying again in 0 s (--retry-until-up)" in result.stdout
    assert sum(c.startswith("up ") for c in calls) == 3
    assert not [c for c in calls if c.startswith(("destroy", "config set", "state"))]


@pytest.mark.parametrize(
    ("setting", "value", "path"),
    [
        ("spot", False, "scheduling.provisioningModel"),
        ("bootDiskSizeGb", 300, "bootDisk.initializeParams.size"),
        ("gpuCount", 2, "guestAccelerators[0].count"),
        ("maxRunHours", 8, "scheduling.maxRunDuration.seconds"),
    ],
)
def test_a_replacing_change_is_listed_and_refused_without_yes(env: dict, setting: str, value: object, path: str) -> None:
    deploy(env)
    edit_stack(env, **{setting: value})
    result, calls = up(env, "ok")
    assert result.returncode == 1
    line = next(line for line in result.stdout.splitlines() if path in line)
    assert "replaces the VM (data disk kept)" in line and setting in line.replace("gpuType/gpuCount", "gpuCount")
    assert "needs a yes, and there is no terminal to ask (pass --yes" in result.stdout
    assert not [c for c in calls if c.startswith(("up ", "destroy", "config set"))]
    plan, _ = run(env, "plan", "ok")  # scripts/plan --stack shows the same, from the same table
    assert plan.returncode == 0 and any(path in ln and "replaces the VM (data disk kept)" in ln for ln in plan.stdout.splitlines())
    result, calls = up(env, "ok", "--yes")
    assert result.returncode == 0 and sum(c.startswith("up ") for c in calls) == 1
    assert "gpu-data" in names(state(env), "Disk")  # the same data disk, still there


def test_in_place_and_restart_changes_go_ahead_without_asking(env: dict) -> None:
    deploy(env)
    edit_stack(env, labels={"team": "vision"}, machineType="n1-standard-16")
    result, _ = up(env, "ok")
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "restarts the VM" in out and "machineType" in out and "in place" in out and "labels.team" in out
    assert "replaces" not in out


def test_move_asks_then_replaces_elsewhere(env: dict) -> None:
    deploy(env)
    result, calls = up(env, "ok", "--move")
    assert result.returncode == 1 and "only what you fetched home (runs/) survives" in result.stdout
    assert not [c for c in calls if c.startswith(("up ", "destroy", "state"))]
    result, calls = up(env, "ok", "--move", "--yes")
    assert result.returncode == 0, result.stdout
    assert any(
        c.startswith("state unprotect urn:pulumi:t4::gpu-train::gpu-train:index:GpuVm$gcp:compute/disk:Disk::gpu-data") for c in calls
    )
    assert "gpu-train:zone: us-central1-b" in stack_text(env)  # the first other zone offering both


# -- a new stack: zone failover ---------------------------------------------------------------
def test_new_stack_stockout_then_success_removes_only_what_the_attempt_made(env: dict) -> None:
    edit_stack(env, nodes=2, machineType="g2-standard-8", gpuType=None, gpuCount=None)
    ComputeApi.state["zonesOffering"] |= {
        "g2-standard-8": ["us-central1-a", "us-central1-b", "us-central1-c"],
        "nvidia-l4": ["us-central1-a", "us-central1-b", "us-central1-c"],
    }
    stack_before = stack_text(env)
    result, calls = up(env, "stockout ok", process=True)  # scripts/up itself, as a user runs it
    assert result.returncode == 0, result.stdout + result.stderr
    destroys = [c for c in calls if c.startswith("destroy")]
    assert len(destroys) == 1 and "--target" in destroys[0]
    targets = {t.rsplit("::", 1)[-1] for t in destroys[0].split() if t.startswith("urn:")}
    assert targets == {"gpu-0", "gpu-0-data", "gpu-1-data", "gpu-placement"}  # node 0 came up before node 1 failed
    # Attempts ran on a copy of the stack file; the real one was written once, after the success.
    first_up = next(i for i, c in enumerate(calls) if c.startswith("up "))
    assert all("--config-file" in c for c in calls[:first_up] if c.startswith("config set"))
    real_sets = [i for i, c in enumerate(calls) if c.startswith("config set") and "--config-file" not in c]
    assert real_sets and min(real_sets) > max(i for i, c in enumerate(calls) if c.startswith("up "))
    assert stack_text(env) != stack_before and "gpu-train:zone: us-central1-b" in stack_text(env)
    assert stackfile.read_stack_file(Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.t4.yaml")["gpu-train:nodes"] == 2
    now = state(env)
    assert {"gpu-sa", "gpu-ssh-ipv4", "gpu-ssh-deny-ipv4", "gpu-0", "gpu-1", "gpu-0-data"} <= names(now)


def test_new_stack_gives_up_with_the_stack_file_as_it_was(env: dict) -> None:
    stack_before = stack_text(env)
    result, calls = up(env, "stockout", "--max-attempts", "3")
    assert result.returncode == 1 and "stopping after 3 attempts" in result.stdout
    assert stack_text(env) == stack_before
    assert not [c for c in calls if c.startswith("destroy") and "--target" not in c]
    # What stays: the service account and firewall rules (made by the attempts, needed by the next up).
    assert names(state(env)) >= {"gpu-sa", "gpu-ssh-ipv4"} and not names(state(env), "Instance")


@pytest.mark.parametrize(
    ("outcome", "moves", "words"),
    [
        ("stockout", True, "attempt 2: n1-standard-8 + 1 x nvidia-tesla-t4 (spot) in us-central1-b"),
        ("machine", True, "attempt 1 failed: not-offered"),
        ("accelerator", True, "attempt 1 failed: not-offered"),
        ("regional", True, "skipping region us-central1 (quota)"),
        ("global", False, "global GPU quota is exhausted: no zone helps"),
        ("config", False, "the shape itself is invalid: no zone helps"),
        ("permission", False, "not a capacity problem: no other zone will help"),
        ("preference", False, "this project already asked Cloud Quotas for that quota"),
    ],
)
def test_each_error_kind_has_its_next_step(env: dict, outcome: str, moves: bool, words: str) -> None:
    result, calls = up(env, f"{outcome} ok")
    assert words in result.stdout, result.stdout
    ups = [c for c in calls if c.startswith("up ")]
    assert result.returncode == (0 if moves else 1) and len(ups) == (2 if moves else 1)
    if not moves:
        assert "The stack file is as it was" in result.stdout


def test_a_plain_destroy_is_refused_until_the_data_disks_are_released(env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pulumi destroy` by hand cannot delete a data disk (protected); `fab down`, after fetching every run,
    releases them (pulumi_cli.release_data_disks) and then destroys."""
    deploy(env, nodes=2, machineType="a2-highgpu-1g", gpuType=None, gpuCount=None)
    before = state(env)
    plain = subprocess.run(["pulumi", "destroy", "--yes", "--stack", "t4"], env=env, capture_output=True, text=True)
    assert plain.returncode != 0 and "marked for protection" in plain.stdout and state(env) == before
    for key in ("PATH", "PULUMI_STAND_IN_DIR", "GPU_TRAIN_STACKS_DIR"):
        monkeypatch.setenv(key, env[key])
    assert sorted(pulumi_cli.release_data_disks("t4")) == ["gpu-0-data", "gpu-1-data"]
    assert pulumi_cli.release_data_disks("t4") == []  # released once
    done = subprocess.run(["pulumi", "destroy", "--yes", "--stack", "t4"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and not names(state(env), "Disk")


# -- provisioningFallback: other ways, zone by zone ---------------------------------------------
def test_spot_then_flex_start_zone_by_zone(env: dict) -> None:
    """Spot in each zone first, then Flex-start in each: the way that got capacity is written back."""
    edit_stack(env, machineType="a3-highgpu-2g", gpuType=None, gpuCount=None, maxRunHours=8, provisioningFallback=["flex-start"])
    result, _ = up(env, "stockout stockout ok", "--zones", "us-central1-a,us-central1-b")
    assert result.returncode == 0, result.stdout
    tried = [
        line.split(": ", 1)[1]
        for line in result.stdout.splitlines()
        if line.startswith("[up] attempt ") and " in " in line and "failed" not in line
    ]
    assert tried == [
        "a3-highgpu-2g (spot) in us-central1-a",
        "a3-highgpu-2g (spot) in us-central1-b",
        "a3-highgpu-2g (flex-start) in us-central1-a",
    ]
    written = yaml.safe_load(stack_text(env))["config"]
    assert (str(written["gpu-train:flexStart"]), str(written["gpu-train:spot"])) == ("true", "false"), written


def test_a_stack_with_a_bucket_gets_its_own_area_with_the_up_that_succeeds(env: dict) -> None:
    """Two GCP stacks named t4 (two projects of a team) on one bucket had one grant's prefix: each VM could
    overwrite and delete the other's runs. `up` gives the stack its own area (gpu-train:bucketArea), on the
    copies each attempt runs on and, once one succeeded, in the stack file; a stack already up gets it too."""
    path = Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.t4.yaml"
    edit_stack(env, bucket="gs://team-ckpt/exp", bucketCreate=True)
    stack_before = stack_text(env)
    result, calls = up(env, "global")  # no zone helps: the stack file as it was
    assert result.returncode == 1 and stack_text(env) == stack_before
    (made,) = [c.split()[3] for c in calls if c.startswith("config set gpu-train:bucketArea") and "--config-file" in c]
    assert made.startswith("t4@") and len(made) == len("t4@") + 8
    result, calls = up(env, "ok")
    assert result.returncode == 0, result.stdout
    area = stackfile.read_stack_file(path)["gpu-train:bucketArea"]
    assert area.startswith("t4@") and "runs now go to their own folder of its bucket" in result.stdout and "commit it" in result.stdout
    assert [c for c in calls if c.startswith("config set gpu-train:bucketArea") and "--config-file" not in c]  # written back
    result, calls = up(env, "ok", "--yes")  # made once
    assert result.returncode == 0 and stackfile.read_stack_file(path)["gpu-train:bucketArea"] == area
    assert not [c for c in calls if "bucketArea" in c]

    deploy(env, bucket="gs://team-ckpt/exp", bucketCreate=True)  # a stack up before areas: the next up gives it one
    edit_stack(env, bucket="gs://team-ckpt/exp", bucketCreate=True)
    result, calls = up(env, "ok")
    assert result.returncode == 0, result.stdout
    (up_call,) = [c for c in calls if c.startswith("up ")]
    assert "--config-file" in up_call and stackfile.read_stack_file(path)["gpu-train:bucketArea"].startswith("t4@")
