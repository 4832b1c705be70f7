"""The real Pulumi program under Pulumi's mock runtime (the engine and Google Cloud are mocked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_train import config
from infra import preview, program
from tests.conftest import ROOT, gcp_raw

STACKS = sorted(p for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def gcp_stacks() -> list[Path]:
    return [p for p in STACKS if config.read_stack_file(p).get("gpu-train:target", "gcp") == "gcp"]


def run_stack(raw: dict, stack: str = "s", **kw) -> preview.Preview:  # kw: image_disk_gb, quota_values
    return preview.run(program.main, stack=stack, config=raw, **kw)


def test_examples_exist() -> None:
    names = {config.stack_name_from_path(p) for p in gcp_stacks()}
    assert {"t4-spot", "l4", "a100", "h100-spot"} <= names


@pytest.mark.parametrize("path", gcp_stacks(), ids=lambda p: p.name)
def test_every_example_stack_declares_the_vm(path: Path, public_key: Path) -> None:
    raw = {**config.read_stack_file(path), "gpu-train:sshPublicKey": str(public_key)}
    stack = config.stack_name_from_path(path)
    result = run_stack(raw, stack)
    assert result.error is None, result.error
    cfg = config.parse(raw, stack)

    (inst,) = result.of_type("compute/instance:Instance")
    i = inst.inputs
    assert i["name"] == f"gpu-train-{stack}" and i["zone"] == cfg.zone and i["machineType"] == cfg.machine_type
    if cfg.machine_type.startswith("n1-"):
        assert i["guestAccelerators"] == [{"type": cfg.gpu_type, "count": cfg.gpu_count}]
    else:
        assert not i.get("guestAccelerators")
    sched = i["scheduling"]
    assert sched["onHostMaintenance"] == "TERMINATE"
    if cfg.spot:
        assert sched == {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT", "preemptible": True,
                         "automaticRestart": False, "instanceTerminationAction": "STOP"}
    else:
        assert sched["automaticRestart"] is True and sched["provisioningModel"] == "STANDARD"
    init = i["bootDisk"]["initializeParams"]
    assert init["image"].endswith(f"/projects/deeplearning-platform-release/global/images/{cfg.image_family}-v20260416")
    assert (init["size"], init["type"]) == (cfg.boot_disk_size_gb, cfg.boot_disk_type)
    key = public_key.read_text().split()
    meta = dict(i["metadata"])
    script = meta.pop("startup-script")
    assert meta == {"ssh-keys": f"trainer:{key[0]} {key[1]} trainer",
                    "block-project-ssh-keys": "TRUE", "enable-oslogin": "FALSE"}
    assert script.startswith("#!/bin/bash") and "gpu-train-shutdown.service" in script
    assert i["desiredStatus"] == "RUNNING" and "maxRunDuration" not in sched
    assert i["tags"] == [f"gpu-train-{stack}"]
    assert i["labels"] == {"gpu-train-stack": stack, "gpu-train-project": "gpu-train", "gpu-train-node": "0"}
    nic = i["networkInterfaces"][0]
    assert nic.get("nicType") == ("GVNIC" if cfg.machine_type.startswith(("a3-", "a4", "g4-")) else None)
    assert not i.get("resourcePolicies")

    (sa,) = result.of_type("serviceaccount/account:Account")
    email = f"{sa.inputs['accountId']}@{cfg.project}.iam.gserviceaccount.com"
    assert i["serviceAccount"]["email"] == email
    assert not any("cloud-platform" in s for s in i["serviceAccount"]["scopes"])
    roles = sorted(m.inputs["role"] for m in result.of_type("IAMMember"))
    assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    assert {m.inputs["member"] for m in result.of_type("IAMMember")} == {f"serviceAccount:{email}"}

    fw = {f.inputs["name"]: f.inputs for f in result.of_type("Firewall")}
    allow, deny = fw[f"gpu-train-{stack}-ssh-ipv4"], fw[f"gpu-train-{stack}-ssh-deny-ipv4"]
    assert allow["sourceRanges"] == list(cfg.ssh_source_ranges) and allow["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert allow["targetTags"] == deny["targetTags"] == i["tags"]
    assert deny["sourceRanges"] == ["0.0.0.0/0"] and allow["priority"] < deny["priority"] < 65534

    out = result.outputs
    assert out["instanceName"] == f"gpu-train-{stack}" and out["zone"] == cfg.zone
    assert out["externalIp"] == preview.MOCK_EXTERNAL_IP and out["internalIp"] == preview.MOCK_INTERNAL_IP
    assert (out["sshUser"], out["machineType"], out["spot"]) == ("trainer", cfg.machine_type, cfg.spot)
    assert out["gpuCount"] >= 1 and out["gpuType"].startswith("nvidia-")
    assert out["image"] == init["image"]
    assert set(out) == {"instanceName", "zone", "externalIp", "internalIp", "sshUser", "machineType", "gpuType",
                        "gpuCount", "spot", "image", "hourlyCostUsd", "nodes", "instanceNames", "externalIps", "internalIps",
                        "nodeGpuCounts", "nodeRoles", "dataDisks", "dataDiskMonthlyCostUsd"}
    assert out["nodes"] == 1 and out["instanceNames"] == [out["instanceName"]] and out["externalIps"] == [out["externalIp"]]
    # every child is parented to the component
    assert result.resources[0].typ == "gpu-train:index:GpuVm"


def test_hourly_cost_output() -> None:
    assert run_stack(gcp_raw(spot=True)).outputs["hourlyCostUsd"] == pytest.approx(0.27946)
    assert run_stack(gcp_raw(machineType="a3-highgpu-1g", gpuType=None, gpuCount=None, spot=True)).outputs["hourlyCostUsd"] is None


def test_ipv6_ranges_get_their_own_rules() -> None:
    result = run_stack(gcp_raw(sshSourceRanges=["2001:db8::/32", "198.51.100.0/24"]))
    fw = {f.inputs["name"]: f.inputs["sourceRanges"] for f in result.of_type("Firewall")}
    assert fw == {"gpu-train-s-ssh-ipv4": ["198.51.100.0/24"], "gpu-train-s-ssh-deny-ipv4": ["0.0.0.0/0"],
                  "gpu-train-s-ssh-ipv6": ["2001:db8::/32"], "gpu-train-s-ssh-deny-ipv6": ["::/0"]}


@pytest.mark.parametrize(
    "raw",
    [
        gcp_raw(gpuCount=3),
        gcp_raw(machineType="n2-standard-8"),
        gcp_raw(sshSourceRanges=["0.0.0.0/0"]),
        gcp_raw(gpuCount="many"),
        gcp_raw(zone=None),
        gcp_raw(sshPublicKey="/nonexistent/id.pub"),
    ],
)
def test_an_invalid_stack_declares_nothing(raw: dict) -> None:
    result = run_stack(raw)
    assert result.resources == []
    assert "invalid" in str(result.error) and "fix:" in str(result.error)


def test_disk_smaller_than_the_image_fails_before_the_instance() -> None:
    result = run_stack(gcp_raw(bootDiskSizeGb=30), image_disk_gb=60)
    assert "needs at least 60 GB" in str(result.error) and "bootDiskSizeGb" in str(result.error)
    assert result.of_type("compute/instance:Instance") == []


def test_ssh_stack_creates_nothing() -> None:
    result = run_stack({"gpu-train:target": "ssh", "gpu-train:hosts": ["me@127.0.0.2:2222"]})
    assert result.error is None and result.resources == [] and result.outputs == {"target": "ssh"}


def test_max_run_hours_caps_the_vm_and_running_false_stops_it() -> None:
    (inst,) = run_stack(gcp_raw(maxRunHours=12, running=False)).of_type("compute/instance:Instance")
    sched = inst.inputs["scheduling"]
    assert sched["maxRunDuration"] == {"seconds": 43200} and sched["instanceTerminationAction"] == "STOP"
    assert sched["provisioningModel"] == "STANDARD" and inst.inputs["desiredStatus"] == "TERMINATED"
    (spot,) = run_stack(gcp_raw(maxRunHours=2, spot=True)).of_type("compute/instance:Instance")
    assert spot.inputs["scheduling"]["maxRunDuration"] == {"seconds": 7200}
    assert spot.inputs["scheduling"]["provisioningModel"] == "SPOT"


def test_startup_script_installs_this_agent_with_the_stack_settings(tmp_path: Path) -> None:
    import base64
    import gzip
    import json
    import re
    import subprocess

    from remote.agent import bundle

    (inst,) = run_stack(gcp_raw(idleStopMinutes=45, maxResumes=3, sshUser="alice")).of_type("compute/instance:Instance")
    script = inst.inputs["metadata"]["startup-script"]
    (tmp_path / "s.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "s.sh")]).returncode == 0  # valid bash
    packed = re.search(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d \| gunzip", script).group(1)
    assert gzip.decompress(base64.b64decode(packed)) == bundle.payload()
    settings = json.loads(re.search(r"echo '(\{.*\})' > ", script).group(1))
    assert settings["idleStopMinutes"] == 45 and settings["maxResumes"] == 3 and settings["gcp"] is True
    # agent.json is seeded on the first boot only: a later boot keeps what `fab train`/`fab setup` wrote.
    (seed,) = [line for line in script.splitlines() if "agent.json.new" in line]
    root = tmp_path / "root"
    root.mkdir()
    boot = lambda: subprocess.run(["bash", "-c", seed], env={"ROOT": str(root)}, check=True)  # noqa: E731
    boot()
    assert json.loads((root / "agent.json").read_text()) == settings
    (root / "agent.json").write_text(json.dumps({**settings, "maxResumes": 7}))  # as fab setup would
    boot()
    assert json.loads((root / "agent.json").read_text())["maxResumes"] == 7
    assert 'ROOT="$HOME_DIR/gpu-train"' in script and "User=alice" in script and "wait_for_user alice" in script
    for unit in ("gpu-train-boot.service", "gpu-train-shutdown.service", "gpu-train-tick.timer"):
        assert unit in script
    assert "ExecStop=$RUN shutdown --grace 25" in script and "OnUnitActiveSec=1min" in script


def test_idle_stop_defaults() -> None:
    assert config.parse(gcp_raw(), "s").idle_stop_minutes == 30
    ssh = config.parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h"]}, "s")
    assert ssh.idle_stop_minutes == 0 and ssh.agent_settings()["gcp"] is False


def test_a_cluster_of_nodes() -> None:
    result = run_stack(gcp_raw(nodes=3, machineType="a2-highgpu-8g", gpuType=None, gpuCount=None), stack="big")
    assert result.error is None, result.error
    instances = sorted(result.of_type("compute/instance:Instance"), key=lambda r: r.name)
    assert [r.inputs["name"] for r in instances] == ["gpu-train-big-0", "gpu-train-big-1", "gpu-train-big-2"]
    assert {r.inputs["zone"] for r in instances} == {"us-central1-a"}
    assert {r.inputs["machineType"] for r in instances} == {"a2-highgpu-8g"}
    assert [r.inputs["labels"]["gpu-train-node"] for r in instances] == ["0", "1", "2"]
    (policy,) = result.of_type("compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 3}
    assert policy.inputs["region"] == "us-central1"
    link = "https://www.googleapis.com/compute/v1/projects/proj-1/regions/us-central1/resourcePolicies/gpu-train-big-placement"
    assert all(r.inputs["resourcePolicies"] == link for r in instances)
    fw = {f.inputs["name"]: f.inputs for f in result.of_type("Firewall")}
    internal = fw["gpu-train-big-internal"]
    assert internal["sourceTags"] == internal["targetTags"] == ["gpu-train-big"] and "sourceRanges" not in internal
    assert [a["protocol"] for a in internal["allows"]] == ["tcp", "udp", "icmp"]
    assert fw["gpu-train-big-ssh-ipv4"]["sourceRanges"] == ["203.0.113.7/32"]  # nothing new from outside
    out = result.outputs
    assert out["nodes"] == 3 and len(out["externalIps"]) == 3 and len(out["internalIps"]) == 3
    assert out["instanceName"] == "gpu-train-big-0" and out["hourlyCostUsd"] is None


def test_an_n1_cluster_has_no_placement_policy_and_costs_per_node() -> None:
    result = run_stack(gcp_raw(nodes=2, spot=True))
    assert result.error is None and result.of_type("ResourcePolicy") == []
    assert len(result.of_type("compute/instance:Instance")) == 2
    assert result.outputs["hourlyCostUsd"] == pytest.approx(2 * 0.27946)


def test_too_many_nodes_for_a_placement_policy_declares_nothing() -> None:
    result = run_stack(gcp_raw(nodes=151, machineType="g2-standard-8", gpuType=None, gpuCount=None))
    assert result.resources == [] and "at most 150 VMs" in str(result.error)


QUOTA = {"gpus": "8", "justification": "training a vision model", "contactEmail": "me@example.com"}


def test_quota_request_declares_cloud_quota_preferences() -> None:
    result = run_stack(gcp_raw(quotaRequest=QUOTA, machineType="a3-highgpu-8g", gpuType=None, gpuCount=None),
                       quota_values={"GPUS-ALL-REGIONS-per-project": 16})
    assert result.error is None, result.error
    prefs = {p.inputs["quotaId"]: p.inputs for p in result.of_type("SQuotaPreference")}
    family = prefs["GPUS-PER-GPU-FAMILY-per-project-region"]
    assert family["dimensions"] == {"region": "us-central1", "gpu_family": "NVIDIA_H100"}
    assert family["quotaConfig"] == {"preferredValue": "8"} and family["service"] == "compute.googleapis.com"
    assert family["parent"] == "projects/proj-1" and family["contactEmail"] == "me@example.com"
    assert family["justification"] == "training a vision model"
    glob = prefs["GPUS-ALL-REGIONS-per-project"]
    assert glob["quotaConfig"] == {"preferredValue": "16"} and "dimensions" not in glob  # never lowered


def test_quota_request_per_model_and_spot() -> None:
    result = run_stack(gcp_raw(quotaRequest=QUOTA, spot=True))
    ids = sorted(p.inputs["quotaId"] for p in result.of_type("SQuotaPreference"))
    assert ids == ["GPUS-ALL-REGIONS-per-project", "PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region"]
    (model,) = [p for p in result.of_type("SQuotaPreference") if p.inputs["quotaId"].startswith("PREEMPTIBLE")]
    assert model.inputs["dimensions"] == {"region": "us-central1"}


def test_no_quota_request_no_preference() -> None:
    assert run_stack(gcp_raw()).of_type("SQuotaPreference") == []
