"""Every request to Google the code sends, checked against Google's own machine-readable truth: the
Compute API calls of the laptop (preflight, `ls`, a VM's probe, vm-stop/vm-start of Local SSD shapes,
a moved address), of the recovery function and of the booted agent, against compute.v1's discovery
document (tests/google_discovery.py); the Pulumi program's resource inputs against pulumi-gcp 10.2's typed
inputs (its Args classes). A negative control shows the checks can fail."""

from __future__ import annotations

import json
import re
import sys
import time
import typing
from pathlib import Path

import pulumi
import pytest

from gpu_train import recovery
from gpu_train.contract import AgentSettings
from gpu_train.environment import Environment
from tests.google_compute import reservation
from tests.google_discovery import method_of, problems
from tests.google_fake import TOKEN, FakeGoogle

# Each Compute method the code calls, and who calls it.
CALLED = {
    "compute.regions.get": "preflight",
    "compute.projects.get": "preflight",
    "compute.acceleratorTypes.list": "preflight",
    "compute.reservations.get": "preflight",
    "compute.reservations.aggregatedList": "preflight (a reservation in another zone)",
    "compute.machineTypes.aggregatedList": "scripts/up (zones offering the shape)",
    "compute.acceleratorTypes.aggregatedList": "scripts/up (zones offering the GPU)",
    "compute.instances.aggregatedList": "ls, vm-stop's check",
    "compute.instances.get": "a VM's probe, a moved address, the function, the booted agent",
    "compute.instances.stop": "vm-stop of a Local SSD shape, the function's group stop",
    "compute.instances.start": "vm-start of a Local SSD shape, the function",
    "compute.instances.setLabels": "the function's record",
    "compute.zoneOperations.get": "vm-stop/vm-start, the function",
}


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeGoogle("127.0.37.6")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fake.adc_file(tmp_path / "adc.json")))
    fake.state["compute"] = {
        "proj-1": {
            "region": {"NVIDIA_H100_GPUS": (8, 0)},
            "global": (16, 0),
            "offered": ["nvidia-h100-80gb"],
            "reservations": {"us-central1-b": [reservation("proj-1", "us-central1-b", "r", "a3-highgpu-8g", deployment="DENSE")]},
        }
    }
    fake.state["instances"]["proj-1"] = [
        {
            "name": "gpu-train-s",
            "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a",
            "status": "RUNNING",
            "labels": {"gpu-train-stack": "s", recovery.LABEL: "on"},
            "labelFingerprint": "lf-0",
            "disks": [{"type": "SCRATCH"}],
            "networkInterfaces": [{"accessConfigs": [{"natIP": "203.0.113.5"}]}],
        }
    ]
    yield fake, Environment(compute_endpoint=fake.url, home=tmp_path / "state", cwd=tmp_path)
    fake.close()


def test_every_compute_call_of_the_code_is_one_googles_api_describes(google, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import recovery_call, watch
    from gpu_train.gcp import power
    from infra.ops import preflight, probes
    from remote.ssh import readdress

    fake, env = google
    _, creds = probes.read_adc()
    # the laptop
    preflight.read_quotas(env, "proj-1", "us-central1", "us-central1-a")
    preflight.read_reservation(env, "proj-1", "us-central1-a", "r")  # not there: the aggregated list says where
    preflight.offering_zones(env, "proj-1", "a3-highgpu-8g", "nvidia-h100-80gb")
    probes.gpu_train_instances(env, creds, "proj-1")
    for running in (False, True):
        path, query = power.api_call("proj-1", "us-central1-a", "gpu-train-s", running)
        probes.operation_done(env, creds, probes.post_json(creds, probes.compute_url(env, path), query), 10, poll_s=0.05)
    (env.state_home / "s").mkdir(parents=True)
    (env.state_home / "s" / "outputs.json").write_text(
        json.dumps({"instanceName": "gpu-train-s", "zone": "us-central1-a", "externalIp": "x"})
    )
    assert readdress.rediscover(env, "s", "proj-1", lambda v: probes.instance(env, v))
    # the recovery function
    api = recovery_call.Compute("proj-1", "us-central1-a", fake.url, fake.url + "/computeMetadata/v1/", poll_s=0.05)
    inst = api.get("gpu-train-s")
    assert inst is not None
    ev = recovery.Event("preempted", "proj-1", "us-central1-a", "gpu-train-s", time.time())
    api.set_record("gpu-train-s", inst, recovery.updated_record({}, ev, "coming back", time.time(), "starting"))
    api.stop("gpu-train-s", inst)
    deadline = time.time() + 10
    while inst.get("status") != "TERMINATED" and time.time() < deadline:
        inst = api.get("gpu-train-s") or {}
        time.sleep(0.05)
    status, op = api.call("POST", "/instances/gpu-train-s/start")
    assert status == 200 and api.wait(op, time.time() + 10)["status"] == "DONE"
    # the booted agent reads its own labels
    from tests.guest.metadata import MetadataServer

    server = MetadataServer("127.0.37.7").start()
    try:
        for path, value in (
            ("project/project-id", "proj-1"),
            ("instance/zone", "projects/9/zones/us-central1-a"),
            ("instance/name", "gpu-train-s"),
        ):
            server.set(path, value)
        server.set("instance/service-accounts/default/token", json.dumps({"access_token": TOKEN}))
        monkeypatch.setenv(recovery.COMPUTE_URL_ENV, fake.url)
        assert recovery.record_of(watch.own_instance(AgentSettings(gcp=True, metadata_url=server.url)) or {})["state"] == "coming back"
    finally:
        server.stop()

    sent = fake.state["requests"]
    assert [r for r in sent if r[4]] == []  # every request is one the discovery document describes
    called = {method_of("compute.v1", m, p)[0] for m, p, *_ in sent}  # type: ignore[index]  # (every request sent is one of compute.v1's)
    assert called == set(CALLED), called ^ set(CALLED)


@pytest.mark.parametrize(
    ("method", "path", "query", "body", "words"),
    [
        ("GET", "compute/v1/projects/p/aggregated/instances", {"returnPartialSuccess": ["true"]}, None, "Cannot bind query parameter"),
        ("POST", "compute/v1/projects/p/zones/z/instances/i/stop", {"discardLocalSSD": ["true"]}, None, "discardLocalSSD"),
        (
            "POST",
            "compute/v1/projects/p/zones/z/instances/i/setLabels",
            {},
            {"labels": {}, "fingerprint": "x"},
            'Unknown name "fingerprint"',
        ),
        ("POST", "compute/v1/projects/p/zones/z/instances/i/setLabels", {}, {"labels": {"a": 1}}, "is not a string"),
        ("POST", "compute/v1/projects/p/zones/z/instances/i/resetLabels", {}, None, "no method"),
    ],
)
def test_the_checker_refuses_what_google_would(method: str, path: str, query: dict, body, words: str) -> None:
    assert any(words in p for p in problems("compute.v1", method, path, query, body)), problems("compute.v1", method, path, query, body)


# -- the program's inputs against pulumi-gcp's typed inputs ---------------------------------------------------
def _args_class(typ: str):
    """The Args class of a resource type token (gcp:compute/instance:Instance -> pulumi_gcp.compute.instance.InstanceArgs)."""
    import importlib

    if not typ.startswith("gcp:"):
        return None
    package, name = typ.split(":")[1].split("/")[0], typ.split(":")[2]
    return getattr(importlib.import_module(f"pulumi_gcp.{package}"), f"{name}Args", None)


def _names(cls) -> dict[str, object]:
    """{Pulumi property name: its type} of an Args class."""
    out = {}
    for attr, prop in vars(cls).items():
        if isinstance(prop, property) and prop.fget is not None:
            name = getattr(prop.fget, "_pulumi_name", attr)
            out[name] = typing.get_type_hints(prop.fget, vars(sys.modules[cls.__module__])).get("return")
    return out


def _nested(hint, owner: type) -> type | None:
    """The Args class inside an input's type (Input[Optional[XArgs]], Sequence[Input[XArgs]], ...), from the
    owner's own package (cloudfunctions and cloudfunctionsv2 both have a FunctionEventTriggerArgs)."""
    found = re.findall(r"(\w+Args)\b", repr(hint))
    package = sys.modules[owner.__module__.rsplit(".", 1)[0]]
    for name in found:
        cls = getattr(package, name, None) or getattr(sys.modules.get(f"{package.__name__}._inputs"), name, None)
        if isinstance(cls, type):
            return cls
    return None


def _check(cls, inputs: dict, where: str) -> list[str]:
    names = _names(cls)
    out = []
    for key, value in inputs.items():
        if key not in names:
            out.append(f"{where}.{key}: not an input of {cls.__name__}")
            continue
        inner = _nested(names[key], cls)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, dict) and inner is not None:
                out += _check(inner, v, f"{where}.{key}")
    return out


@pytest.mark.parametrize(
    "settings",
    [
        {
            "spot": True,
            "nodes": 2,
            "notify": "https://ntfy.sh/x",
            "preemptionNoticeSeconds": 60,
            "bucket": "gs://b-runs/p",
            "bucketCreate": True,
        },
        {
            "machineType": "a4-highgpu-8g",
            "gpuType": None,
            "gpuCount": None,
            "zone": "us-central1-b",
            "reservation": "r",
            "reservationBound": True,
        },
        {"machineType": "a3-highgpu-8g", "gpuType": None, "gpuCount": None, "flexStart": True, "maxRunHours": 8, "bootDiskSizeGb": 500},
    ],
)
def test_every_input_the_program_declares_is_one_pulumi_gcp_types(public_key: Path, settings: dict) -> None:
    from infra import program
    from infra.ops import preview
    from tests.conftest import gcp_raw

    raw = gcp_raw(**settings)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None, result.error
    checked, found = 0, []
    for r in result.resources:
        cls = _args_class(r.typ)
        if cls is None:
            continue
        checked += 1
        found += _check(cls, r.inputs, f"{r.typ} {r.name}")
    assert checked >= 7 and found == [], found
    assert pulumi is not None


def test_the_typed_input_check_refuses_a_name_pulumi_gcp_does_not_have() -> None:
    from pulumi_gcp.compute import InstanceArgs

    ok = {"scheduling": {"preemptionNoticeDuration": {"seconds": 60}, "onInstanceStopAction": {"discardLocalSsd": True}}}
    assert _check(InstanceArgs, ok, "i") == []
    bad = {"scheduling": {"preemptionNotice": {"seconds": 60}, "onInstanceStopAction": {"discardLocalSSD": True}}, "desired": "x"}
    assert sorted(_check(InstanceArgs, bad, "i")) == [
        "i.desired: not an input of InstanceArgs",
        "i.scheduling.onInstanceStopAction.discardLocalSSD: not an input of InstanceSchedulingOnInstanceStopActionArgs",
        "i.scheduling.preemptionNotice: not an input of InstanceSchedulingArgs",
    ]
