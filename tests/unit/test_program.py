"""The real Pulumi program under Pulumi's mock runtime (the engine and Google Cloud are mocked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.contract import AgentSettings
from gpu_train.stack import config, stackfile
from gpu_train.stack.agentdoc import agent_settings
from infra import program
from infra.ops import preview
from tests.conftest import ROOT, gcp_raw

CATALOG = load_catalog()

STACKS = sorted(p for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def gcp_stacks() -> list[Path]:
    return [p for p in STACKS if stackfile.read_stack_file(p).get("gpu-train:target", "gcp") == "gcp"]


def run_stack(raw: dict, stack: str = "s", **kw) -> preview.Preview:  # kw: image_disk_gb, quota_values
    return preview.run(program.main, stack=stack, config=raw, **kw)


def test_examples_exist() -> None:
    names = {stackfile.stack_name_from_path(p) for p in gcp_stacks()}
    assert {"t4-spot", "l4", "a100", "h100-spot"} <= names


@pytest.mark.parametrize("path", gcp_stacks(), ids=lambda p: p.name)
def test_every_example_stack_declares_the_vm(path: Path, public_key: Path) -> None:
    raw = {**stackfile.read_stack_file(path), "gpu-train:sshPublicKey": str(public_key)}
    stack = stackfile.stack_name_from_path(path)
    result = run_stack(raw, stack)
    assert result.error is None, result.error
    cfg = config.parse(raw, stack, CATALOG)

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
        assert sched == {
            "onHostMaintenance": "TERMINATE",
            "provisioningModel": "SPOT",
            "preemptible": True,
            "automaticRestart": False,
            "instanceTerminationAction": "STOP",
        }
    elif cfg.flex_start:  # (tests/unit/test_provisioning.py checks the whole of it)
        assert sched["provisioningModel"] == "FLEX_START" and sched["maxRunDuration"]["seconds"] > 0
    else:  # the B200 example's DENSE reservation: reservation-bound, back by itself after maintenance
        assert sched["automaticRestart"] is True and sched["provisioningModel"] == (
            "RESERVATION_BOUND" if cfg.reservation_bound else "STANDARD"
        )
    init = i["bootDisk"]["initializeParams"]
    assert init["image"].endswith(f"/projects/deeplearning-platform-release/global/images/{cfg.image_family}-v20260416")
    assert (init["size"], init["type"]) == (cfg.boot_disk_size_gb, cfg.boot_disk_type)
    key = public_key.read_text().split()
    meta = dict(i["metadata"])
    script = meta.pop("startup-script")
    assert meta == {"ssh-keys": f"trainer:{key[0]} {key[1]} trainer", "block-project-ssh-keys": "TRUE", "enable-oslogin": "FALSE"}
    assert script.startswith("#!/bin/bash") and "gpu-train-shutdown.service" in script
    assert i["desiredStatus"] == "RUNNING" and ("maxRunDuration" in sched) == bool(cfg.max_run_hours)
    assert i["tags"] == [f"gpu-train-{stack}"]
    assert i["labels"] == {
        "gpu-train-stack": stack,
        "gpu-train-project": "gpu-train",
        "gpu-train-node": "0",
        **({"gpu-train-recover": "on"} if cfg.spot or cfg.flex_start else {}),
    }
    nic = i["networkInterfaces"][0]
    assert nic.get("nicType") == ("GVNIC" if cfg.machine_type.startswith(("a3-", "a4", "g4-")) else None)
    assert not i.get("resourcePolicies")

    (sa,) = [a for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-sa"]
    email = f"{sa.inputs['accountId']}@{cfg.project}.iam.gserviceaccount.com"
    assert i["serviceAccount"]["email"] == email
    assert not any("cloud-platform" in s for s in i["serviceAccount"]["scopes"])
    vm_grants = [m for m in result.of_type("projects/iAMMember:IAMMember") if m.inputs["member"] == f"serviceAccount:{email}"]
    assert sorted(m.inputs["role"] for m in vm_grants) == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]

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
    assert set(out) == {
        "instanceName",
        "zone",
        "externalIp",
        "internalIp",
        "sshUser",
        "machineType",
        "gpuType",
        "gpuCount",
        "spot",
        "image",
        "hourlyCostUsd",
        "nodes",
        "instanceNames",
        "externalIps",
        "internalIps",
        "nodeGpuCounts",
        "nodeRoles",
        "dataDisks",
        "dataDiskMonthlyCostUsd",
        "provisioning",
        "maxRunHours",
        "recoverHours",
    }
    assert out["recoverHours"] == (24 if cfg.spot or cfg.flex_start else 0)
    assert out["nodes"] == 1 and out["instanceNames"] == [out["instanceName"]] and out["externalIps"] == [out["externalIp"]]
    # every child is parented to the component
    assert result.resources[0].typ == "gpu-train:index:GpuVm"


def test_hourly_cost_output() -> None:
    assert run_stack(gcp_raw(spot=True)).outputs["hourlyCostUsd"] == pytest.approx(0.27946)
    assert run_stack(gcp_raw(machineType="a3-highgpu-1g", gpuType=None, gpuCount=None, spot=True)).outputs["hourlyCostUsd"] is None


def test_ipv6_ranges_get_their_own_rules() -> None:
    result = run_stack(gcp_raw(sshSourceRanges=["2001:db8::/32", "198.51.100.0/24"]))
    fw = {f.inputs["name"]: f.inputs["sourceRanges"] for f in result.of_type("Firewall")}
    assert fw == {
        "gpu-train-s-ssh-ipv4": ["198.51.100.0/24"],
        "gpu-train-s-ssh-deny-ipv4": ["0.0.0.0/0"],
        "gpu-train-s-ssh-ipv6": ["2001:db8::/32"],
        "gpu-train-s-ssh-deny-ipv6": ["::/0"],
    }


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


def startup_values(script: str, tmp_path: Path) -> dict[str, str]:
    """The startup script's variables as bash itself reads them (what the units are made of)."""
    import subprocess

    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("USER_NAME="))
    end = next(i for i, line in enumerate(lines) if line.startswith("TICK="))
    head = "\n".join(lines[start : end + 1])  # the assignments, nothing that acts
    (tmp_path / "head.sh").write_text(head + '\nprintf "%s\\0" "$USER_NAME" "$SETTINGS" "$PACKED" "$GRACE" "$TICK"\n')
    out = subprocess.run(["bash", str(tmp_path / "head.sh")], capture_output=True, text=True, check=True).stdout
    return dict(zip(["user", "settings", "packed", "grace", "tick"], out.split("\0"), strict=False))


def test_startup_script_installs_this_agent_with_the_stack_settings(tmp_path: Path) -> None:
    import base64
    import gzip
    import json
    import subprocess

    from agent import bundle

    (inst,) = run_stack(gcp_raw(idleStopMinutes=45, maxResumes=3, sshUser="alice")).of_type("compute/instance:Instance")
    script = inst.inputs["metadata"]["startup-script"]
    (tmp_path / "s.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "s.sh")]).returncode == 0  # valid bash
    values = startup_values(script, tmp_path)
    assert gzip.decompress(base64.b64decode(values["packed"])) == bundle.payload()
    settings = json.loads(values["settings"])
    assert settings["idleStopMinutes"] == 45 and settings["maxResumes"] == 3 and settings["gcp"] is True
    assert settings["user"] == "alice" and settings["remoteRoot"] == "~/gpu-train" and "poweroffCommand" not in settings
    assert AgentSettings.from_json(settings).shutdown_grace_s == 110  # what the VM's units decode
    assert values["user"] == "alice" and values["grace"] == "110" and values["tick"] == "60"
    # REMOTE_ROOT/agent.json has one writer, the laptop: the script never writes it.
    assert "agent.json.new" not in script and 'wait_for_user "$USER_NAME"' in script
    for unit in ("gpu-train-boot.service", "gpu-train-shutdown.service", "gpu-train-watch.service", "gpu-train-tick.timer"):
        assert unit in script
    # The units run the root-owned copy with the root-owned settings, never the user's.
    assert 'AGENT="/usr/bin/python3 $LIB/gpu-train-agent --settings $CONF"' in script and "User=$USER_NAME" in script
    assert "RemainAfterExit=yes" in script.split("gpu-train-boot.service <<UNIT", 1)[1].split("UNIT\n", 1)[0]


def test_startup_script_grace_and_idle_check_follow_the_stack(tmp_path: Path) -> None:
    from gpu_train.gcp import vm

    spot = config.parse(gcp_raw(spot=True, idleStopMinutes=1), "s", CATALOG)
    values = startup_values(vm.startup_script(spot, b"agent", vm.read_startup_template()), tmp_path)
    assert values["grace"] == "25" and values["tick"] == "12"  # 30 s on spot; a fifth of a minute
    assert [vm.tick_interval_s(m) for m in (0, 0.1, 1, 5, 30)] == [60, 10, 12, 60, 60]


def test_startup_script_values_are_quoted_whatever_they_hold(tmp_path: Path) -> None:
    """Validation refuses such a remoteRoot first; the script still never lets a value out of its quotes."""
    import dataclasses
    import json

    from gpu_train.gcp import vm

    hostile = "~/a b/'c\"$(touch /tmp/gpu-train-pwned)`x`;\n[Service]\nExecStart=/bin/sh"
    cfg = dataclasses.replace(config.parse(gcp_raw(), "s", CATALOG), remote_root=hostile)
    values = startup_values(vm.startup_script(cfg, b"agent", vm.read_startup_template()), tmp_path)
    assert json.loads(values["settings"])["remoteRoot"] == hostile
    assert not Path("/tmp/gpu-train-pwned").exists()
    with pytest.raises(ValueError, match="login name"):
        vm.startup_script(dataclasses.replace(cfg, ssh_user="x\nExecStart=/bin/sh"), b"agent", vm.read_startup_template())


def test_idle_stop_defaults() -> None:
    assert config.parse(gcp_raw(), "s", CATALOG).idle_stop_minutes == 30
    ssh = config.parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h"]}, "s", CATALOG)
    assert ssh.idle_stop_minutes == 0 and agent_settings(ssh).gcp is False


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
    # SSH between nodes (the code node 0 passes on) is not caught by the deny rule closing port 22:
    # the rule of lowest priority number applies, and a deny wins a tie.
    deny = fw["gpu-train-big-ssh-deny-ipv4"]
    assert internal.get("priority", 1000) < deny["priority"]  # 1000: Compute Engine's default
    assert fw["gpu-train-big-ssh-ipv4"]["sourceRanges"] == ["10.1.2.3/32"]  # nothing new from outside
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
    result = run_stack(
        gcp_raw(quotaRequest=QUOTA, machineType="a3-highgpu-8g", gpuType=None, gpuCount=None),
        quota_values={"GPUS-ALL-REGIONS-per-project": 16},
    )
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
