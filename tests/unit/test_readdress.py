"""A VM stopped and started has a new ephemeral address (the fake does as Compute Engine does): the tasks
find it in the Compute API instead of dialling the recorded one for ever."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_train.environment import Environment
from infra.ops import probes
from remote.ssh import readdress
from tests.google_fake import FakeGoogle


def inst(ip: str | None) -> dict:
    return {"networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT", **({"natIP": ip} if ip else {})}]}]}


ONE = {"instanceName": "gpu-train-s", "externalIp": "203.0.113.5", "zone": "us-central1-a"}
TWO = {"instanceNames": ["a", "b"], "externalIp": "203.0.113.5", "externalIps": ["203.0.113.5", "203.0.113.6"]}


@pytest.mark.parametrize(
    ("outputs", "found", "now"),
    [
        (ONE, {"gpu-train-s": inst("203.0.113.5")}, None),  # unchanged
        (ONE, {"gpu-train-s": inst("198.51.100.7")}, ["198.51.100.7"]),
        (ONE, {"gpu-train-s": inst(None)}, None),  # stopped: no address to dial
        (ONE, {"gpu-train-s": None}, None),  # the API could not be asked
        (TWO, {"a": inst("203.0.113.5"), "b": inst("198.51.100.8")}, ["203.0.113.5", "198.51.100.8"]),
        ({"externalIp": "203.0.113.5"}, {}, None),  # outputs of an older program: no instance name
    ],
)
def test_the_addresses_the_api_has_now(outputs: dict, found: dict, now: list | None) -> None:
    got = readdress.with_addresses(outputs, found)
    assert (got and got["externalIps"]) == now
    if now:
        assert got["externalIp"] == now[0]


def test_a_stop_and_start_moves_the_vm_and_the_cache_follows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeGoogle("127.0.37.5")
    try:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fake.adc_file(tmp_path / "adc.json")))
        env = Environment(compute_endpoint=fake.url, home=tmp_path / "state", cwd=tmp_path)
        doc = {"name": "gpu-train-s", "zone": "zones/us-central1-a", "status": "RUNNING", **inst("203.0.113.5")}
        fake.state["instances"]["proj-1"] = [doc]
        (tmp_path / "state" / "s").mkdir(parents=True)
        (tmp_path / "state" / "s" / "outputs.json").write_text(json.dumps(ONE))
        ask = lambda vm: probes.instance(env, vm)  # noqa: E731
        assert not readdress.rediscover(env, "s", "proj-1", ask)  # where it was recorded: nothing to change
        _, creds = probes.read_adc()
        for verb in ("stop", "start"):
            path = f"/compute/v1/projects/proj-1/zones/us-central1-a/instances/gpu-train-s/{verb}"
            probes.operation_done(env, creds, probes.post_json(creds, probes.compute_url(env, path)), 10, poll_s=0.05)
        moved = readdress.nat_ip(doc)
        assert moved and moved != "203.0.113.5"
        assert readdress.rediscover(env, "s", "proj-1", ask)
        assert json.loads((tmp_path / "state" / "s" / "outputs.json").read_text())["externalIp"] == moved
    finally:
        fake.close()
