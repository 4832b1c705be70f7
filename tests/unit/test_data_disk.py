"""The data disk under Pulumi's mock runtime (the real program), and the replace-only table that says
what a settings change does to a deployed VM (tables of cases)."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import changes, names, vm
from gpu_train.stack import config
from infra import program
from infra.ops import plan, preview, pulumi_cli
from tests.conftest import gcp_raw

CATALOG = load_catalog()
INSTANCE, DISK = changes.INSTANCE, changes.DISK


def declared(**settings: object) -> preview.Preview:
    result = preview.run(program.main, stack="s", config=gcp_raw(**settings))
    assert result.error is None, result.error
    return result


def as_deployed(result: preview.Preview) -> list[pulumi_cli.Resource]:
    return [
        pulumi_cli.Resource(f"urn:pulumi:s::gpu-train::x${r.typ}::{r.name}", r.typ, r.inputs, protect=r.protect) for r in result.resources
    ]


def test_one_protected_data_disk_attached_by_a_stable_device_name() -> None:
    result = declared()
    (disk,) = result.of_type("compute/disk:Disk")
    (inst,) = result.of_type("compute/instance:Instance")
    d = disk.inputs
    assert (d["name"], d["zone"], d["size"], d["type"]) == ("gpu-train-s-data", "us-central1-a", 100, "pd-balanced")
    assert disk.protect and not inst.protect
    assert d["labels"]["gpu-train-stack"] == "s" and d["labels"]["gpu-train-node"] == "0"
    (attached,) = inst.inputs["attachedDisks"]
    assert attached == {
        "source": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a/disks/gpu-train-s-data",
        "deviceName": vm.DATA_DEVICE_NAME,
        "mode": "READ_WRITE",
    }
    assert inst.inputs["bootDisk"]["autoDelete"] is True  # the boot disk goes with the VM; the data disk does not
    assert "autoDelete" not in attached  # an attached disk is never deleted with the instance
    assert result.outputs["dataDisks"] == ["gpu-train-s-data"] and result.outputs["dataDiskMonthlyCostUsd"] == 10.0


def test_one_data_disk_per_node() -> None:
    result = declared(machineType="a2-highgpu-1g", gpuType=None, gpuCount=None, nodes=3, dataDiskSizeGb=500, dataDiskType="pd-ssd")
    disks = {r.inputs["name"]: r for r in result.of_type("compute/disk:Disk")}
    assert set(disks) == {"gpu-train-s-0-data", "gpu-train-s-1-data", "gpu-train-s-2-data"}
    assert all(d.protect and d.inputs["size"] == 500 and d.inputs["type"] == "pd-ssd" for d in disks.values())
    for inst in result.of_type("compute/instance:Instance"):
        node = inst.inputs["labels"]["gpu-train-node"]
        assert inst.inputs["attachedDisks"][0]["source"].endswith(f"/disks/gpu-train-s-{node}-data")
    assert result.outputs["dataDiskMonthlyCostUsd"] == 255.0  # 3 x 500 GB x $0.17


@pytest.mark.parametrize(
    ("settings", "kind"),
    [
        ({}, "pd-balanced"),
        ({"machineType": "g2-standard-8", "gpuType": None, "gpuCount": None}, "pd-balanced"),
        ({"machineType": "a3-ultragpu-8g", "gpuType": None, "gpuCount": None, "zone": "us-central1-b"}, "hyperdisk-balanced"),
        ({"dataDiskType": "pd-standard"}, "pd-standard"),
    ],
)
def test_data_disk_type_defaults_to_what_the_series_takes(settings: dict, kind: str) -> None:
    cfg = config.parse(gcp_raw(**settings), "s", CATALOG)
    assert vm.data_disk_type(cfg, CATALOG) == kind


def test_data_disk_names_fit_compute_engine() -> None:
    long = "x" * 80
    assert len(names.data_disk_name(long)) <= 63 and names.data_disk_name(long).endswith("-data")
    assert len(names.data_disk_name(long, 12)) <= 63 and names.data_disk_name(long, 12).endswith("-12-data")
    assert names.data_disk_name(long, 1) != names.data_disk_name(long, 2)


@pytest.mark.parametrize(
    ("settings", "effect", "path"),
    [
        ({"bootDiskSizeGb": 300}, changes.REPLACE, "bootDisk.initializeParams.size"),
        ({"spot": True}, changes.REPLACE, "scheduling.provisioningModel"),
        ({"gpuCount": 2}, changes.REPLACE, "guestAccelerators[0].count"),
        ({"maxRunHours": 4}, changes.REPLACE, "scheduling.maxRunDuration.seconds"),
        ({"reservation": "res-1"}, changes.REPLACE, "reservationAffinity.type"),
        ({"machineType": "n1-standard-16"}, changes.RESTART, "machineType"),
        ({"labels": {"team": "a"}}, changes.IN_PLACE, "labels.team"),
        ({"running": False}, changes.IN_PLACE, "desiredStatus"),
    ],
)
def test_a_replaced_instance_keeps_the_same_data_disk(settings: dict, effect: str, path: str) -> None:
    """The deployed stack vs the same stack with one setting changed: the VM's fate comes from the table,
    and the data disk's inputs (hence the disk, and the instance's reference to it) do not change."""
    before, after = declared(), declared(**settings)
    found = plan.changes_against(after, as_deployed(before))
    assert all(c.effect == changes.IN_PLACE for c in found if c.typ == DISK)  # at most its labels
    mine = next(c for c in found if c.typ == INSTANCE and c.path == path)
    assert mine.effect == effect and changes.worst(found) == effect
    old, new = ({k: v for k, v in r.of_type("compute/disk:Disk")[0].inputs.items() if k != "labels"} for r in (before, after))
    assert old == new
    src = [r.of_type("compute/instance:Instance")[0].inputs["attachedDisks"] for r in (before, after)]
    assert src[0] == src[1]


@pytest.mark.parametrize(
    ("settings", "effect"),
    [
        ({"zone": "us-central1-b"}, changes.REPLACE_DISK),
        ({"dataDiskType": "pd-ssd"}, changes.REPLACE_DISK),
        ({"dataDiskSizeGb": 50}, changes.REPLACE_DISK),  # a disk cannot shrink
        ({"dataDiskSizeGb": 200}, changes.IN_PLACE),  # it grows in place
        ({"nodes": 2, "machineType": "a2-highgpu-1g", "gpuType": None, "gpuCount": None}, changes.REPLACE_DISK),
    ],
)
def test_changes_that_touch_the_data_disk(settings: dict, effect: str) -> None:
    base = {k: v for k, v in settings.items() if k in ("machineType", "gpuType", "gpuCount")}
    before, after = declared(**base), declared(**settings)
    found = plan.changes_against(after, as_deployed(before))
    assert changes.worst(found) == effect
    assert changes.replaces_anything(found) == (effect != changes.IN_PLACE)


def test_every_input_the_program_sets_has_a_row_in_the_table() -> None:
    """No input of the VM's resources falls through to the table's "unknown: replace" default."""
    rules = changes.load_rules()
    for result in (declared(maxRunHours=2, labels={"a": "b"}), declared(machineType="a3-highgpu-8g", gpuType=None, gpuCount=None, nodes=2)):
        for r in result.resources:
            if r.typ not in rules:
                continue
            for path in changes.flatten(r.inputs):
                bare = ".".join(p.split("[")[0] for p in path.split("."))
                assert changes._longest_prefix(bare, rules[r.typ]) is not None, (r.typ, bare)


@pytest.mark.parametrize(
    ("typ", "path", "old", "new", "effect"),
    [
        (INSTANCE, "zone", "a", "b", changes.REPLACE),
        (INSTANCE, "networkInterfaces.nicType", None, "GVNIC", changes.REPLACE),
        (INSTANCE, "networkInterfaces.accessConfigs.natIp", "1", "2", changes.IN_PLACE),
        (INSTANCE, "scheduling.automaticRestart", True, False, changes.IN_PLACE),
        (INSTANCE, "scheduling.preemptible", False, True, changes.REPLACE),
        (INSTANCE, "serviceAccount.email", "a", "b", changes.RESTART),
        (INSTANCE, "resourcePolicies", None, "p", changes.RESTART),
        (INSTANCE, "somethingNew", 1, 2, changes.REPLACE),  # not in the table: assume the worst
        (DISK, "size", 100, 100.0, changes.IN_PLACE),
        (DISK, "size", 100, 99, changes.REPLACE_DISK),
        (DISK, "labels.x", "1", "2", changes.IN_PLACE),
    ],
)
def test_effect_of(typ: str, path: str, old: object, new: object, effect: str) -> None:
    assert changes.effect_of(typ, path, old, new, changes.load_rules()) == effect


def test_flatten_leaves_out_the_providers_defaults_and_empty_values() -> None:
    deployed = {
        "canIpForward": False,
        "__defaults": ["canIpForward"],
        "labels": {},
        "tags": ["t"],
        "bootDisk": {"mode": "READ_WRITE", "size": 200.0, "__defaults": ["mode"]},
    }
    assert changes.flatten(deployed) == {"tags[0]": "t", "bootDisk.size": 200}


def test_render_names_the_setting_and_what_survives() -> None:
    before, after = declared(), declared(spot=True)
    text = changes.render(plan.changes_against(after, as_deployed(before)), "s", "fab")
    assert "replaces the VM (data disk kept)" in text and "[spot]" in text and "data disk, which is kept" in text
    assert changes.render([], "s", "fab").startswith("The deployed stack s already matches")


@pytest.mark.parametrize(
    ("root", "rendered"),
    [
        ("~/gpu-train", "DATA_ROOT='~/'gpu-train\n"),
        ("~/my runs/x", "DATA_ROOT='~/''my runs/x'\n"),
        ("/data/gpu train/", "DATA_ROOT='/data/gpu train'\n"),
    ],
)
def test_the_startup_script_mounts_the_data_disk_on_remote_root(root: str, rendered: str) -> None:
    """The data-disk block gets REMOTE_ROOT shell-quoted (the script expands ~/ to the user's home)."""
    script = vm.startup_script(config.parse(gcp_raw(remoteRoot=root), "s", CATALOG), b"agent", vm.read_startup_template())
    assert rendered in script and "DATA_USER=trainer\n" in script
    assert f"DATA_DEV=/dev/disk/by-id/google-{vm.DATA_DEVICE_NAME}\n" in script
    assert script.index("# --- gpu-train: the data disk") < script.index("gpu-train-boot.service <<UNIT")


def test_quota_preferences_have_fixed_ids_and_outlive_a_destroy() -> None:
    """Cloud Quotas cannot delete a preference: each is declared retain_on_delete, under an id that every
    `up` (of any stack of the project) gives it again, so a re-up never makes a second one."""
    request = {"gpus": "8", "justification": "training", "contactEmail": "me@example.com"}
    raw = dict(quotaRequest=request, machineType="a3-highgpu-8g", gpuType=None, gpuCount=None)
    runs = [preview.run(program.main, stack=stack, config=gcp_raw(**raw)) for stack in ("s", "other")]
    ids = [sorted(p.inputs["name"] for p in r.of_type("SQuotaPreference")) for r in runs]
    assert ids[0] == ids[1] == ["gpu-train-gpus-all-regions-per-project", "gpu-train-gpus-per-gpu-family-per-project-region-us-cent-52eece"]
    assert all(p.retain_on_delete and not p.protect for p in runs[0].of_type("SQuotaPreference"))
    assert not any(r.retain_on_delete for r in runs[0].resources if not r.typ.endswith("SQuotaPreference"))
