"""Resource names derived from the stack name fit Google Cloud's limits, stay stable and distinct,
and validation says when they were shortened (and would stop a name Google refuses)."""

from __future__ import annotations

import re

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import names, validate
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

RFC1035 = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
SERVICE_ACCOUNT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
LONG = "experiment-" + "x" * 60


@pytest.mark.parametrize(
    ("stack", "firewall", "placement"),
    [
        ("dev", "gpu-train-dev-ssh-deny-ipv4", "gpu-train-dev-placement"),  # short names are unchanged
        (LONG, None, None),
        ("a" * 52, None, None),  # fits as an instance name, not with a suffix
        ("Alice_Exp.1", "gpu-train-alice-exp-1-ssh-deny-ipv4", "gpu-train-alice-exp-1-placement"),
    ],
)
def test_every_derived_name_fits(stack: str, firewall: str | None, placement: str | None) -> None:
    got = names.derived(stack, nodes=12)
    for kind, values in got.items():
        pattern = SERVICE_ACCOUNT if kind == "service account id" else RFC1035
        assert all(pattern.fullmatch(v) for v in values), (kind, values)
    assert firewall is None or firewall in got["firewall rule"]
    assert placement is None or got["placement policy"] == [placement]
    assert got["firewall rule"][1].endswith("-ssh-deny-ipv4") and got["instance"][11].endswith("-11")
    assert names.derived(stack, 12) == got  # stable


def test_long_names_stay_distinct() -> None:
    a, b = names.derived(LONG + "a"), names.derived(LONG + "b")
    assert all(set(a[k]).isdisjoint(b[k]) for k in a)


def test_validation_notes_a_shortened_name() -> None:
    catalog = load_catalog()
    _, warnings = validate.check(gcp_raw(), LONG, catalog)
    (note,) = [w for w in warnings if w.key == "stack"]
    assert note.severity == "warning" and names.resource_name(LONG) in note.message
    _, warnings = validate.check(gcp_raw(), "dev", catalog)
    assert not [w for w in warnings if w.key == "stack"]


def test_the_program_under_mocks_names_everything_within_limits() -> None:
    raw = gcp_raw(nodes=2, machineType="g2-standard-8", gpuType=None, gpuCount=None, sshSourceRanges=["203.0.113.7/32", "2001:db8::/32"])
    result = preview.run(program.main, stack=LONG, config=raw)
    assert result.error is None, result.error
    named = [(r.typ, r.inputs["name"]) for r in result.resources if "name" in r.inputs]
    assert len(named) >= 8  # 2 instances, 4 SSH rules, the internal rule, the placement policy
    assert all(RFC1035.fullmatch(n) for _, n in named), named
    (account,) = result.of_type("serviceaccount/account:Account")
    assert SERVICE_ACCOUNT.fullmatch(account.inputs["accountId"])


@pytest.mark.parametrize("network", [None, "my-vpc"])
def test_the_network_setting_reaches_the_nic_and_every_firewall_rule(network: str | None) -> None:
    """Projects without a `default` VPC set `network`; everything the VM uses is on it."""
    result = preview.run(
        program.main, stack="s", config=gcp_raw(network=network, nodes=2, machineType="g2-standard-8", gpuType=None, gpuCount=None)
    )
    assert result.error is None, result.error
    want = network or "default"
    rules = result.of_type("compute/firewall:Firewall")
    assert rules and all(r.inputs["network"] == want for r in rules)
    assert all(i.inputs["networkInterfaces"][0]["network"] == want for i in result.of_type("compute/instance:Instance"))
