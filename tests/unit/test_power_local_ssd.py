"""`vm-stop` / `vm-start` of a shape with bundled Local SSD (A3 here): the provider's stop names no
discardLocalSsd, which the Compute API requires of such a VM (terraform-provider-google#26173), so the task
stops and starts it through the API (the fake refuses a stop without it, with Google's 400), then refreshes
the instances (a start brings a new ephemeral address)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.google_fake import FakeGoogle
from tests.unit.test_glance_tasks import STAND_IN, env, fab  # noqa: F401 (env: the fixture)

H100 = (
    "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:machineType: a3-highgpu-1g\n"
    "  gpu-train:spot: true\n  gpu-train:bootDiskSizeGb: 500\n"
    "  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:sshPublicKey: {key}\n"
)
URN = "urn:pulumi:h100::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu"


@pytest.fixture
def a3(env: dict, tmp_path: Path, public_key: Path):
    google = FakeGoogle("127.0.37.4")
    (Path(env["GPU_TRAIN_STACKS_DIR"]) / "Pulumi.h100.yaml").write_text(H100.format(key=public_key))
    outputs = {"externalIp": "127.0.37.9", "zone": "us-central1-a", "machineType": "a3-highgpu-1g", "sshUser": "trainer"}
    (tmp_path / "pulumi" / "outputs.json").write_text(json.dumps(outputs))
    (tmp_path / "pulumi" / "up-outcomes").write_text("ok\nok\n")
    (tmp_path / "pulumi" / "urns").write_text(URN + "\n")
    google.state["instances"]["proj-1"] = [
        {
            "name": "gpu-train-h100",
            "zone": "zones/us-central1-a",
            "status": "RUNNING",
            "labels": {"gpu-train-stack": "h100"},
            "labelFingerprint": "lf-0",
            "disks": [{"type": "PERSISTENT", "boot": True}, {"type": "SCRATCH", "interface": "NVME"}],
            "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "127.0.37.9"}]}],
            "lastStartTimestamp": "2026-11-22T06:00:00Z",
        }
    ]
    env.update(
        {
            "PATH": f"{STAND_IN}:{env['PATH']}",
            "PULUMI_STAND_IN_DIR": str(tmp_path / "pulumi"),
            "GOOGLE_APPLICATION_CREDENTIALS": str(google.adc_file(tmp_path / "adc.json")),
            "GPU_TRAIN_COMPUTE_ENDPOINT": google.url,
        }
    )
    yield google
    google.close()


def test_a_local_ssd_vm_is_stopped_and_started_through_the_compute_api(env: dict, a3: FakeGoogle, tmp_path: Path) -> None:
    inst = a3.state["instances"]["proj-1"][0]
    stopped = fab(env, "vm-stop", "--stack", "h100", "--force")
    assert stopped.returncode == 0, stopped.stderr
    assert inst["status"] == "TERMINATED" and inst["localSsdDiscarded"]
    stop = next(r for r in a3.state["requests"] if r[1].endswith("/stop"))
    assert stop[2] == {"discardLocalSsd": ["true"]} and stop[4] == []  # and the request is one compute.v1 describes
    calls = (tmp_path / "pulumi" / "calls").read_text().splitlines()
    assert f"refresh --yes --skip-preview --stack h100 --target {URN}" in calls
    assert "Local SSD was discarded" in stopped.stderr
    before = inst["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    started = fab(env, "vm-start", "--stack", "h100")
    assert started.returncode == 0, started.stderr
    assert inst["status"] == "RUNNING" and inst["networkInterfaces"][0]["accessConfigs"][0]["natIP"] != before
    assert (tmp_path / "pulumi" / "calls").read_text().splitlines().count(f"refresh --yes --skip-preview --stack h100 --target {URN}") == 2


def test_an_operation_is_asked_after_soon_then_less_often(env: dict, a3: FakeGoogle, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop or start done in a moment is seen then (each was read again only 2 s later: the wait of every
    vm-stop and vm-start); a long one is read at waits that double to ``poll_s``, never past the timeout."""
    import threading
    import time

    from gpu_train.environment import Environment
    from gpu_train.gcp import power
    from infra.ops import probes

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", env["GOOGLE_APPLICATION_CREDENTIALS"])
    _, creds = probes.read_adc()
    genv = Environment(compute_endpoint=a3.url)
    waits: list[float] = []
    sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (waits.append(s), sleep(s))[1])
    released = threading.Event()
    a3.state["on_stop"] = lambda name: released.wait(30)  # the stop goes on until released
    path, query = power.api_call("proj-1", "us-central1-a", "gpu-train-h100", False)
    with pytest.raises(RuntimeError, match=r"stop of gpu-train-h100 not done in 0\.6 s"):
        probes.operation_done(genv, creds, probes.post_json(creds, probes.compute_url(genv, path), query), 0.6, poll_s=0.2)
    assert waits[:2] == [0.1, 0.2] and max(waits) == 0.2 and sum(waits) <= 0.6, waits
    released.set()
    waits.clear()
    path, query = power.api_call("proj-1", "us-central1-a", "gpu-train-h100", True)
    assert probes.operation_done(genv, creds, probes.post_json(creds, probes.compute_url(genv, path), query), 60)["status"] == "DONE"
    assert waits[0] == 0.1 and sum(waits) < 2, waits  # the fake starts it at once


def test_without_credentials_the_stop_says_what_to_do(env: dict, a3: FakeGoogle, tmp_path: Path) -> None:
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "none.json")
    r = fab(env, "vm-stop", "--stack", "h100", "--force")
    assert r.returncode == 2 and "gcloud auth application-default login" in r.stderr and "26173" in r.stderr, r.stderr
    assert a3.state["instances"]["proj-1"][0]["status"] == "RUNNING"
    assert not (tmp_path / "pulumi" / "calls").exists()  # refused before the stack file or the state changed


@pytest.mark.parametrize(("settings", "owned"), [({"machineType": "a3-highgpu-1g", "spot": True}, False), ({}, True)])
def test_the_program_leaves_a_local_ssd_vms_power_to_the_api(public_key: Path, settings: dict, owned: bool) -> None:
    """Pulumi keeps `running` for a VM it can stop; for a Local SSD shape it ignores the power state (its
    stop would be the provider's 400) and creates it running; `plan` says the Local SSD is wiped at each stop."""
    from infra import program
    from infra.ops import plan, preview
    from tests.conftest import gcp_raw

    fixed = {"gpuType": None, "gpuCount": None, "bootDiskSizeGb": 500} if settings else {}
    raw = gcp_raw(**settings, **fixed, running=False)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None, result.error
    (inst,) = result.of_type("compute/instance:Instance")
    assert ("desiredStatus" in inst.ignore_changes) is not owned
    assert inst.inputs["desiredStatus"] == ("TERMINATED" if owned else "RUNNING")
    text, _ = plan.plan(raw, "s")
    assert ("Local SSD: the shape's bundled Local SSD is wiped at every stop" in text) is not owned, text
