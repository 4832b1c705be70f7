"""vm-stop / vm-start: the URNs a targeted `pulumi up` names, checked against the program's own resources,
and the refusal rules shared with `fab down`."""

from __future__ import annotations

import pytest

from gpu_train.gcp import power
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw


@pytest.mark.parametrize(
    ("stack", "nodes", "urns"),
    [
        ("t4", 1, ["urn:pulumi:t4::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu"]),
        (
            "a100x2",
            2,
            [
                "urn:pulumi:a100x2::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu-0",
                "urn:pulumi:a100x2::gpu-train::gpu-train:index:GpuVm$gcp:compute/instance:Instance::gpu-1",
            ],
        ),
    ],
)
def test_instance_urns(stack: str, nodes: int, urns: list[str]) -> None:
    assert power.instance_urns(stack, nodes) == urns


@pytest.mark.parametrize("nodes", [1, 3])
def test_urns_name_the_programs_instances(nodes: int) -> None:
    raw = gcp_raw(nodes=nodes, machineType="g2-standard-8", gpuType=None, gpuCount=None) if nodes > 1 else gcp_raw()
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None
    declared = sorted(r.name for r in result.resources if r.typ == power.INSTANCE_TYPE)
    assert declared == sorted(u.rsplit("::", 1)[1] for u in power.instance_urns("s", nodes))


def test_commands() -> None:
    stop = power.commands("t4", False, 1)
    assert stop[0] == ["pulumi", "config", "set", "gpu-train:running", "false", "--stack", "t4"]
    assert stop[1][:7] == ["pulumi", "up", "--yes", "--skip-preview", "--refresh", "--stack", "t4"]
    assert stop[1][7:] == ["--target", power.instance_urns("t4", 1)[0]]
    assert power.commands("t4", True, 2)[0][4] == "true" and power.commands("t4", True, 2)[1].count("--target") == 2


@pytest.mark.parametrize(
    ("running", "unreachable", "force", "words"),
    [
        ([], [], False, None),
        (["r1"], [], False, "refusing: still running: r1"),
        (["r1"], [], True, None),
        ([], ["cannot reach 1.2.3.4"], False, "cannot check the runs"),
        ([], ["x"], True, None),
    ],
)
def test_refusal(running, unreachable, force, words) -> None:
    reason = power.refusal(running, unreachable, force, "t4", "gpu-train")
    assert (reason is None) == (words is None) and (words is None or words in reason)
