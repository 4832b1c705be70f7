"""Pure decisions behind the VM's resources, and the hourly cost of a shape."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import names, vm
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.gcp.validate import GpuShape
from gpu_train.stack.config import parse
from tests.conftest import gcp_raw

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("stack", "instance", "account"),
    [
        ("dev", "gpu-train-dev", "gpu-train-dev"),
        ("Alice_Exp.1", "gpu-train-alice-exp-1", "gpu-train-alice-exp-1"),
        ("a" * 80, None, None),
    ],
)
def test_names_follow_gce_rules(stack: str, instance: str | None, account: str | None) -> None:
    name, sa = names.instance_name(stack), names.service_account_id(stack)
    assert instance is None or name == instance
    assert account is None or sa == account
    assert len(name) <= 63 and name[0].isalpha() and name[-1] != "-"
    assert 6 <= len(sa) <= 30 and sa[0].isalpha()
    assert names.instance_name("a" * 80) != names.instance_name("a" * 81)  # cut names stay distinct


def test_metadata_locks_ssh_to_our_key() -> None:
    cfg = parse(gcp_raw(sshUser="alice"), "s", CATALOG)
    meta = vm.metadata(cfg, "ssh-ed25519 AAAAkey bob@laptop", b"PK agent", vm.read_startup_template())
    assert meta.pop("startup-script").startswith("#!/bin/bash")
    assert meta == {"ssh-keys": "alice:ssh-ed25519 AAAAkey alice", "block-project-ssh-keys": "TRUE", "enable-oslogin": "FALSE"}


@pytest.mark.parametrize(
    ("family", "install"),
    [
        ("pytorch-2-9-cu129-ubuntu-2204-nvidia-580", False),
        ("common-cu128-ubuntu-2204-nvidia-570", False),
        ("common-cu121-debian-11", True),
        ("my-family", True),
    ],
)
def test_the_driver_is_installed_at_boot_only_for_families_without_one(family: str, install: bool) -> None:
    cfg = parse(gcp_raw(imageFamily=family), "s", CATALOG)
    assert ("install-nvidia-driver" in vm.metadata(cfg, "ssh-ed25519 AAAAkey k", b"PK agent", vm.read_startup_template())) == install


@pytest.mark.parametrize(
    ("ranges", "split"),
    [
        (("203.0.113.7/32",), {"ipv4": ["203.0.113.7/32"]}),
        (("2001:db8::/32", "198.51.100.0/24"), {"ipv6": ["2001:db8::/32"], "ipv4": ["198.51.100.0/24"]}),
    ],
)
def test_ssh_ranges_by_family(ranges: tuple, split: dict) -> None:
    assert vm.ssh_ranges_by_family(ranges) == split


def test_labels_add_stack_and_project() -> None:
    cfg = parse(gcp_raw(labels={"team": "nlp"}), "My.Stack", CATALOG)
    assert vm.labels(cfg, "gpu-train") == {"team": "nlp", "gpu-train-stack": "my-stack", "gpu-train-project": "gpu-train"}


def shape(machine: str, gpu: str, count: int, attached: bool = True) -> GpuShape:
    return GpuShape(machine, None, None, gpu, count, attached)


@pytest.mark.parametrize(
    ("gpu_shape", "on_demand", "spot"),
    [
        (shape("n1-standard-8", "nvidia-tesla-t4", 1), 0.73, 0.27946),
        (shape("n1-standard-8", "nvidia-tesla-t4", 4), 1.78, 0.80446),
        (shape("n1-standard-16", "nvidia-tesla-v100", 2), 0.76 + 4.96, 0.20892 + 2.177),
        (shape("n1-standard-8", "nvidia-tesla-t4-vws", 1), 0.73, 0.27946),
        (shape("g2-standard-8", "nvidia-l4", 1, False), 0.85362, 0.34057),
        (shape("a2-highgpu-1g", "nvidia-tesla-a100", 1, False), 3.67339, 1.80385),
        (shape("n1-highmem-8", "nvidia-tesla-t4", 1), None, None),  # no price for the VM part
        (shape("a3-highgpu-1g", "nvidia-h100-80gb", 1, False), None, None),  # the reference's rows look wrong
        (shape("g2-standard-24", "nvidia-l4", 2, False), None, None),
    ],
)
def test_hourly_cost(gpu_shape: GpuShape, on_demand: float | None, spot: float | None) -> None:
    cost = hourly_cost(gpu_shape, CATALOG)
    assert cost.on_demand == (None if on_demand is None else pytest.approx(on_demand))
    assert cost.spot == (None if spot is None else pytest.approx(spot))
    assert cost.region == "us-central1" and cost.date
