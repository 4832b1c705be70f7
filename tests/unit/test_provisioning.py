"""How a VM is had: the rules of flexStart, reservation, provisioningFallback and maxRunHours (tables),
the instance's scheduling and reservationAffinity (pure), and the program under mocks, whose inputs are
checked against pulumi-gcp 10.2's own names (InstanceSchedulingArgsDict, InstanceReservationAffinityArgsDict)."""

from __future__ import annotations

import pytest
from pulumi_gcp.compute import _inputs as gcp_inputs

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import provisioning, validate
from gpu_train.stack.config import parse
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
FIXED = {"gpuType": None, "gpuCount": None}
A3 = {"machineType": "a3-highgpu-8g", **FIXED}
A3_2G = {"machineType": "a3-highgpu-2g", **FIXED}
A4 = {"machineType": "a4-highgpu-8g", **FIXED, "zone": "us-central1-b"}
G2 = {"machineType": "g2-standard-8", **FIXED}
A2 = {"machineType": "a2-highgpu-1g", **FIXED}
G4 = {"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b"}
A4X = {"machineType": "a4x-highgpu-4g", **FIXED, "zone": "us-central1-b"}


def problems(settings: dict) -> list:
    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    return [
        p
        for p in validate.validate(cfg, CATALOG)
        if not (p.key == "gpuType" and "2027-08-01" in p.message)  # T4's own warning (test_validate)
        and not (p.key == "zone" and p.severity == "warning")  # G4's zones are unverified (test_validate)
        and not (p.key == "machineType" and "Arm" in p.message)  # A4X is Arm (test_images)
        and not (p.key == "pools" and "placement" in p.message)
    ]  # N1 pools' placement (test_pools)


VALID = [
    {**A3, "flexStart": True, "maxRunHours": 24},
    {**A3_2G, "flexStart": True, "maxRunHours": 1 / 6},  # 10 minutes, the least
    {**A4, "flexStart": True, "maxRunHours": 168},  # 7 days, the most
    {**G2, "flexStart": True, "maxRunHours": 0.5},
    {**A2, "flexStart": True, "maxRunHours": 2.25},
    {**A3, "reservation": "my-res"},
    {**A4, "reservation": "projects/other-proj/reservations/my-res"},
    {**A4, "reservation": "projects/other-proj/reservations/my-res/reservationBlocks/block-1", "reservationBound": True},
    {**A4X, "reservation": "gb200-res"},
    {"reservation": "t4-res"},  # N1 can consume a reservation too
    {**A3_2G, "spot": True, "provisioningFallback": ["flex-start"], "maxRunHours": 8},
    {**A3, "provisioningFallback": ["spot", "flex-start"], "maxRunHours": 8},
    {**G2, "spot": True, "provisioningFallback": ["on-demand"]},
]

INVALID = [
    ({**A3, "flexStart": True}, [("maxRunHours", "is required with flexStart")]),
    ({**A3, "flexStart": True, "maxRunHours": 0.1}, [("maxRunHours", "between 0.167 (10 minutes) and 168")]),
    ({**A3, "flexStart": True, "maxRunHours": 169}, [("maxRunHours", "168 (7 days) with flexStart")]),
    ({**A3, "flexStart": True, "spot": True, "maxRunHours": 2}, [("flexStart", "cannot be combined with spot")]),
    ({"flexStart": True, "maxRunHours": 2}, [("flexStart", "n1-standard-8 cannot be had as Flex-start (N1)")]),
    ({**A4X, "flexStart": True, "maxRunHours": 2}, [("flexStart", "only as reservation")]),
    ({**A4X, "spot": True}, [("spot", "only as reservation")]),
    ({**A4X}, [("machineType", "cannot be had on demand, only as reservation")]),
    ({**A3_2G}, [("machineType", "only as spot, flex-start")]),
    ({**A3_2G, "reservation": "r"}, [("reservation", "a3-highgpu-2g cannot be had as a reservation")]),
    ({**A3, "reservation": "r", "spot": True}, [("reservation", "cannot be combined with spot")]),
    ({**A3, "reservation": "r", "flexStart": True, "maxRunHours": 3}, [("reservation", "cannot be combined with flexStart")]),
    ({**A3, "reservation": "My Reservation"}, [("reservation", "not a reservation's name or path")]),
    ({**A3, "reservation": "projects/p/reservations"}, [("reservation", "not a reservation's name or path")]),
    ({**A3, "reservationBound": True}, [("reservationBound", "needs a reservation")]),
    (
        {**A4, "reservation": "r", "reservationBound": True, "maxRunHours": 2},
        [("maxRunHours", "cannot be combined with reservationBound")],
    ),
    # Google's Flex-start page excludes G4: refused, no longer a warning
    ({**G4, "flexStart": True, "maxRunHours": 4}, [("flexStart", "g4-standard-48 cannot be had as Flex-start (G4)")]),
    (
        {
            "reservation": "r",
            "pools": [{"role": "chief", "machineType": "a3-highgpu-8g"}, {"role": "ps", "count": 2, "machineType": "n1-highmem-8"}],
            "machineType": None,
            "gpuType": None,
            "gpuCount": None,
        },
        [("reservation", "holds VMs of one machine type; the pools have a3-highgpu-8g, n1-highmem-8")],
    ),
    ({**A3, "spot": True, "provisioningFallback": ["flex-start"]}, [("provisioningFallback", "flex-start: maxRunHours")]),
    ({**A3, "spot": True, "provisioningFallback": ["dws"]}, [("provisioningFallback", "'dws' is not a way")]),
    (
        {**A3_2G, "spot": True, "provisioningFallback": ["on-demand"]},
        [("provisioningFallback", "a3-highgpu-2g cannot be had as on-demand")],
    ),
    (
        {**A3, "reservation": "r", "provisioningFallback": ["spot"]},
        [("provisioningFallback", "does not apply to a stack that consumes a reservation")],
    ),
    ({"maxRunHours": 0.9}, [("maxRunHours", "between 1 and 2880 (fractions allowed)")]),
]

WARNINGS: list[tuple[dict, list[tuple[str, str]]]] = []


@pytest.mark.parametrize("settings", VALID, ids=str)
def test_valid(settings: dict) -> None:
    assert problems(settings) == []


@pytest.mark.parametrize(("settings", "expected"), INVALID + WARNINGS, ids=str)
def test_invalid(settings: dict, expected: list[tuple[str, str]]) -> None:
    found = problems(settings)
    assert [p.key for p in found] == [k for k, _ in expected], [str(p) for p in found]
    for p, (_, words) in zip(found, expected, strict=True):
        assert words in f"{p.message} {p.fix}", str(p)
    assert {p.severity for p in found} == {"warning" if (settings, expected) in WARNINGS else "error"}


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("r1", (None, "r1", None)),
        ("projects/my-proj/reservations/r1", ("my-proj", "r1", None)),
        ("projects/my-proj/reservations/r1/reservationBlocks/b-2", ("my-proj", "r1", "b-2")),
        ("r1/reservationBlocks/b", (None, "r1", "b")),
        ("zones/us-central1-a/reservations/r1", None),
        ("R1", None),
    ],
)
def test_parse_reservation(text: str, parts: tuple | None) -> None:
    assert provisioning.parse_reservation(text) == parts


STD = {"on_host_maintenance": "TERMINATE"}


@pytest.mark.parametrize(
    ("settings", "machine", "expected", "affinity"),
    [
        ({}, "n1-standard-8", {**STD, "provisioning_model": "STANDARD", "automatic_restart": True}, None),
        (
            {"spot": True},
            "n1-standard-8",
            {**STD, "provisioning_model": "SPOT", "preemptible": True, "automatic_restart": False, "instance_termination_action": "STOP"},
            None,
        ),
        (
            {"maxRunHours": 3},
            "n1-standard-8",
            {
                **STD,
                "provisioning_model": "STANDARD",
                "automatic_restart": True,
                "max_run_duration": {"seconds": 10800},
                "instance_termination_action": "STOP",
            },
            None,
        ),
        # Bundled Local SSD: a STOP at maxRunDuration must discard it, or Compute Engine refuses the create.
        (
            {**A3, "spot": True, "maxRunHours": 1.5},
            "a3-highgpu-8g",
            {
                **STD,
                "provisioning_model": "SPOT",
                "preemptible": True,
                "automatic_restart": False,
                "instance_termination_action": "STOP",
                "max_run_duration": {"seconds": 5400},
                "on_instance_stop_action": {"discard_local_ssd": True},
            },
            None,
        ),
        (
            {**A3, "flexStart": True, "maxRunHours": 24},
            "a3-highgpu-8g",
            {
                **STD,
                "provisioning_model": "FLEX_START",
                "automatic_restart": False,
                "instance_termination_action": "STOP",
                "max_run_duration": {"seconds": 86400},
                "on_instance_stop_action": {"discard_local_ssd": True},
            },
            {"type": "NO_RESERVATION"},
        ),
        (
            {**G2, "flexStart": True, "maxRunHours": 0.5},
            "g2-standard-8",  # G2 has no Local SSD: nothing to discard
            {
                **STD,
                "provisioning_model": "FLEX_START",
                "automatic_restart": False,
                "instance_termination_action": "STOP",
                "max_run_duration": {"seconds": 1800},
            },
            {"type": "NO_RESERVATION"},
        ),
        (
            {**A3, "reservation": "res-1"},
            "a3-highgpu-8g",
            {**STD, "provisioning_model": "STANDARD", "automatic_restart": True},
            {
                "type": "SPECIFIC_RESERVATION",
                "specific_reservation": {"key": "compute.googleapis.com/reservation-name", "values": ["res-1"]},
            },
        ),
        (
            {**A4, "reservation": "projects/proj-22/reservations/r/reservationBlocks/b", "reservationBound": True},
            "a4-highgpu-8g",
            # Google's A4 / A3 Ultra sample: back by itself after host maintenance
            {**STD, "provisioning_model": "RESERVATION_BOUND", "automatic_restart": True, "instance_termination_action": "STOP"},
            {
                "type": "SPECIFIC_RESERVATION",
                "specific_reservation": {
                    "key": "compute.googleapis.com/reservation-name",
                    "values": ["projects/proj-22/reservations/r/reservationBlocks/b"],
                },
            },
        ),
    ],
)
def test_scheduling_and_affinity(settings: dict, machine: str, expected: dict, affinity: dict | None) -> None:
    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    assert provisioning.scheduling(cfg, CATALOG, machine) == expected
    assert provisioning.reservation_affinity(cfg) == affinity


def _names(typed_dict: type) -> set[str]:
    return set(typed_dict.__annotations__)


def test_the_inputs_are_pulumi_gcps_own_names() -> None:
    """Every key the decisions produce is a field of the SDK's typed dicts (no guessed names)."""
    sched = _names(gcp_inputs.InstanceSchedulingArgsDict)
    for settings, machine in (
        (dict(A3, flexStart=True, maxRunHours=2), "a3-highgpu-8g"),
        (dict(A3, spot=True, maxRunHours=2), "a3-highgpu-8g"),
        (dict(A4, maxRunHours=2, spot=True), "a4-highgpu-8g"),
        (dict(A4, reservation="r", reservationBound=True), "a4-highgpu-8g"),
    ):
        cfg = parse(gcp_raw(**settings), "s", CATALOG)
        out = provisioning.scheduling(cfg, CATALOG, machine)
        assert set(out) <= sched
        assert set(out.get("max_run_duration", {})) <= _names(gcp_inputs.InstanceSchedulingMaxRunDurationArgsDict)
        assert set(out.get("on_instance_stop_action", {})) <= _names(gcp_inputs.InstanceSchedulingOnInstanceStopActionArgsDict)
        aff = provisioning.reservation_affinity(cfg) or {}
        assert set(aff) <= _names(gcp_inputs.InstanceReservationAffinityArgsDict)
        assert set(aff.get("specific_reservation", {})) <= _names(gcp_inputs.InstanceReservationAffinitySpecificReservationArgsDict)


def instance(raw: dict) -> preview.Declared:
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None, result.error
    (inst,) = result.of_type("compute/instance:Instance")
    return inst


def test_the_program_declares_a_flex_start_vm() -> None:
    inst = instance(gcp_raw(**A3, flexStart=True, maxRunHours=36))
    assert inst.inputs["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "provisioningModel": "FLEX_START",
        "automaticRestart": False,
        "instanceTerminationAction": "STOP",
        "maxRunDuration": {"seconds": 129600},
        "onInstanceStopAction": {"discardLocalSsd": True},
    }
    assert inst.inputs["reservationAffinity"] == {"type": "NO_RESERVATION"}


def test_the_program_declares_a_vm_in_a_reservation_and_never_the_reservation() -> None:
    result = preview.run(program.main, stack="s", config=gcp_raw(**A4, reservation="projects/proj-22/reservations/r1"))
    assert result.error is None, result.error
    assert not [r for r in result.resources if r.typ.endswith("compute/reservation:Reservation")]
    (inst,) = result.of_type("compute/instance:Instance")
    assert inst.inputs["reservationAffinity"] == {
        "type": "SPECIFIC_RESERVATION",
        "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["projects/proj-22/reservations/r1"]},
    }
    assert inst.inputs["scheduling"]["provisioningModel"] == "STANDARD"
    assert result.outputs["provisioning"] == "reservation"


def test_an_on_demand_vm_says_nothing_of_reservations() -> None:
    """The provider's default (ANY_RESERVATION) stays: nothing is sent that the user did not ask for."""
    assert "reservationAffinity" not in instance(gcp_raw()).inputs


@pytest.mark.parametrize(
    ("settings", "tried"),
    [
        ({}, ["n1-standard-8 + 1 x nvidia-tesla-t4"]),
        ({"spot": True, "spotFallback": True}, ["n1-standard-8 + 1 x nvidia-tesla-t4 (spot)", "n1-standard-8 + 1 x nvidia-tesla-t4"]),
        (
            {**A3_2G, "spot": True, "maxRunHours": 4, "provisioningFallback": ["flex-start"]},
            ["a3-highgpu-2g (spot)", "a3-highgpu-2g (flex-start)"],
        ),
        (
            {**A3, "flexStart": True, "maxRunHours": 4, "provisioningFallback": ["spot", "on-demand"], "fallbackShapes": ["a3-highgpu-4g"]},
            ["a3-highgpu-8g (flex-start)", "a3-highgpu-8g (spot)", "a3-highgpu-8g", "a3-highgpu-4g (flex-start)", "a3-highgpu-4g (spot)"],
        ),  # a3-highgpu-4g is not had on demand: left out
    ],
)
def test_what_scripts_up_tries_in_order(settings: dict, tried: list[str]) -> None:
    from infra.ops.up import shapes_to_try

    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    assert [str(s) for s in shapes_to_try(cfg, CATALOG)] == tried
    flex = [s.settings() for s in shapes_to_try(cfg, CATALOG) if s.way == "flex-start"]
    assert all(x["flexStart"] == "true" and x["spot"] == "false" for x in flex)


@pytest.mark.parametrize(
    ("settings", "cost"),
    [
        ({}, 0.85362),
        ({"spot": True}, 0.34057),
        ({"reservation": "l4-res"}, 0.85362),  # the on-demand rate, unless a commitment covers it
        ({"flexStart": True, "maxRunHours": 3}, None),  # the DWS rate: not in the catalog, never the on-demand one
    ],
)
def test_the_cost_the_stack_exports_is_its_ways(settings: dict, cost: float | None) -> None:
    result = preview.run(program.main, stack="s", config=gcp_raw(**G2, **settings))
    assert result.error is None, result.error
    assert result.outputs["hourlyCostUsd"] == cost
