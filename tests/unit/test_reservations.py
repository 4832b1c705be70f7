"""A stack that consumes a reservation: the reservation read against the VMs the stack declares (a table
over the API's reservations resource), and scripts/preflight with the user's credentials against a local
fake of the Compute API (tests/google_compute.py, served by tests/google_fake.py), which refuses a request without the token it issued."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment
from gpu_train.gcp import reservations, validate
from gpu_train.stack.config import parse
from infra.ops import preflight
from tests.conftest import gcp_raw
from tests.google_compute import DENSE as DENSE_TEXT
from tests.google_compute import insert_refusal, reservation
from tests.google_fake import FakeGoogle

CATALOG = load_catalog()
FIXED = {"gpuType": None, "gpuCount": None}


def shapes(**settings: object) -> list:
    return validate.node_shapes(parse(gcp_raw(**settings), "s", CATALOG), CATALOG)


A3 = dict(machineType="a3-highgpu-8g", **FIXED)


@pytest.mark.parametrize(
    ("doc", "settings", "errors", "warnings"),
    [
        (reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", count=2), A3, [], []),
        # Local SSD bundled with A3 may be listed by the reservation: it is the shape's own.
        (reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", local_ssds=[375] * 16), A3, [], []),
        (
            reservation("proj-1", "us-central1-a", "r", "a3-megagpu-8g"),
            A3,
            ["holds a3-megagpu-8g VMs, the stack declares a3-highgpu-8g"],
            [],
        ),
        (
            reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", accelerators=[("nvidia-h100-80gb", 4)]),
            A3,
            ["lists GPUs 4 x nvidia-h100-80gb; a3-highgpu-8g comes with 8 x nvidia-h100-80gb"],
            [],
        ),
        (reservation("proj-1", "us-central1-a", "r", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)]), {}, [], []),
        (reservation("proj-1", "us-central1-a", "r", "n1-standard-8"), {}, ["holds GPUs none, the stack attaches 1 x nvidia-tesla-t4"], []),
        (
            reservation("proj-1", "us-central1-a", "r", "n1-standard-8", accelerators=[("nvidia-tesla-t4", 1)], local_ssds=[375]),
            {},
            ["holds 1 Local SSD (375 GB) per VM; gpu-train's VMs attach none"],
            [],
        ),
        (
            reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", count=2, in_use=2),
            A3,
            [],
            ["holds 2 VMs, 2 in use: 0 free for the stack's 1"],
        ),
        (
            reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", count=2, in_use=1),
            {**A3, "nodes": 2},
            [],
            ["holds 2 VMs, 1 in use: 1 free for the stack's 2"],
        ),
        (reservation("proj-1", "us-central1-a", "r", "a3-highgpu-8g", status="CREATING"), A3, [], ["is CREATING, not READY"]),
    ],
)
def test_what_differs(doc: dict, settings: dict, errors: list[str], warnings: list[str]) -> None:
    fit = reservations.fit(doc, shapes(**settings), CATALOG)
    assert len(fit.errors) == len(errors) and all(w in e for w, e in zip(errors, fit.errors, strict=True)), fit.errors
    assert len(fit.warnings) == len(warnings) and all(w in e for w, e in zip(warnings, fit.warnings, strict=True))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("r1", ("proj-1", "r1")),
        ("projects/shared-proj/reservations/r1", ("shared-proj", "r1")),
        ("projects/shared-proj/reservations/r1/reservationBlocks/b1", ("shared-proj", "r1")),
    ],
)
def test_the_reservation_is_asked_of_its_own_project(text: str, where: tuple) -> None:
    assert reservations.where(text, "proj-1") == where


# -- scripts/preflight against the local Compute API ----------------------------------------------
STACK = (
    "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:machineType: a3-highgpu-8g\n"
    "  gpu-train:sshSourceRanges: [10.1.2.3/32]\n"
)
QUOTAS = {"CPUS": (24, 0), "NVIDIA_H100_GPUS": (8, 0), "SSD_TOTAL_GB": (1000, 0)}


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeGoogle("127.0.22.1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fake.adc_file(tmp_path / "adc.json")))
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    fake.state["compute"] = {"proj-1": {"region": dict(QUOTAS), "global": (16, 0), "offered": ["nvidia-h100-80gb"], "reservations": {}}}
    yield fake, Environment(compute_endpoint=fake.url, stacks_dir=stacks, cwd=tmp_path)
    fake.close()


def run(env: Environment, extra: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    (env.new_stacks_dir / "Pulumi.a3.yaml").write_text(STACK + extra)
    code = preflight.main(["--stack", "a3"], env)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_a3_stack_fits_a_project_with_24_cpus(google, capsys: pytest.CaptureFixture) -> None:
    """A3 needs GPU quota only: its 208 vCPUs are not judged against CPUS (a false shortfall stopped scripts/up)."""
    fake, env = google
    fake.state["compute"]["proj-1"]["reservations"]["us-central1-a"] = [
        reservation("proj-1", "us-central1-a", "h100-res", "a3-highgpu-8g", count=2)
    ]
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 0, out
    assert "The stack fits." in out and not any(line.strip().startswith("CPUS") for line in out.splitlines())
    assert "reservation h100-res (project proj-1, us-central1-a): READY, 0 of 2 VMs in use: matches the shape" in out
    assert ("GET", "/compute/v1/projects/proj-1/zones/us-central1-a/reservations/h100-res") in fake.state["calls"]
    assert ("POST", "/token") in fake.state["calls"]  # the user's credentials: the fake refuses anything else


def test_a_missing_reservation_fails_naming_it(google, capsys: pytest.CaptureFixture) -> None:
    _, env = google
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 1
    assert "reservation h100-res does not exist in us-central1-a (project proj-1)" in out
    assert "gcloud compute reservations list --project=proj-1" in out


def test_a_reservation_in_another_zone_is_named(google, capsys: pytest.CaptureFixture) -> None:
    fake, env = google
    fake.state["compute"]["proj-1"]["reservations"]["us-central1-b"] = [reservation("proj-1", "us-central1-b", "h100-res", "a3-highgpu-8g")]
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 1 and "has one of that name in us-central1-b: set gpu-train:zone to it" in out


def test_a_reservation_of_another_shape_fails_saying_what_differs(google, capsys: pytest.CaptureFixture) -> None:
    fake, env = google
    fake.state["compute"]["proj-1"]["reservations"]["us-central1-a"] = [reservation("proj-1", "us-central1-a", "h100-res", "a3-megagpu-8g")]
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 1 and "DIFFERS" in out
    assert "holds a3-megagpu-8g VMs, the stack declares a3-highgpu-8g" in out


def test_a_shared_reservation_is_read_from_its_own_project(google, capsys: pytest.CaptureFixture) -> None:
    fake, env = google
    fake.state["compute"]["shared-proj"] = {
        "reservations": {"us-central1-a": [reservation("shared-proj", "us-central1-a", "h100-res", "a3-highgpu-8g", count=4, in_use=1)]}
    }
    code, out = run(env, "  gpu-train:reservation: projects/shared-proj/reservations/h100-res\n", capsys)
    assert code == 0, out
    assert "reservation h100-res (project shared-proj, us-central1-a): READY, 1 of 4 VMs in use" in out


def test_without_credentials_preflight_says_so(
    google, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The fake refuses requests without its token: nothing is judged on an anonymous answer."""
    _, env = google
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 2 and "cannot read the project's quotas" in out  # (the fake answered 401; no token to refresh)


def test_a_dense_reservation_needs_reservation_bound(google, capsys: pytest.CaptureFixture) -> None:
    """A DENSE reservation (calendar mode, future reservations: most A4 and A3 Ultra capacity) takes only
    RESERVATION_BOUND VMs: preflight reads its deploymentType and refuses before `up`, naming the setting."""
    fake, env = google
    fake.state["compute"]["proj-1"]["reservations"]["us-central1-a"] = [
        reservation("proj-1", "us-central1-a", "h100-res", "a3-highgpu-8g", deployment="DENSE")
    ]
    code, out = run(env, "  gpu-train:reservation: h100-res\n", capsys)
    assert code == 1 and DENSE_TEXT in out and "fix: pulumi config set gpu-train:reservationBound true" in out, out
    code, out = run(env, "  gpu-train:reservation: h100-res\n  gpu-train:reservationBound: true\n", capsys)
    assert code == 0 and "0 of 1 VMs in use, DENSE: matches the shape" in out, out
    # and the program then asks for what the API takes (the fake's instances.insert rule)
    dense = fake.state["compute"]["proj-1"]["reservations"]["us-central1-a"]
    body = {"reservationAffinity": {"consumeReservationType": "SPECIFIC_RESERVATION", "values": ["h100-res"]}}
    assert insert_refusal({**body, "scheduling": {"provisioningModel": "STANDARD"}}, dense) == (400, DENSE_TEXT)
    assert insert_refusal({**body, "scheduling": {"provisioningModel": "RESERVATION_BOUND"}}, dense) is None


def insert_body(inputs: dict) -> dict:
    """The instances.insert body the provider sends for the program's Instance inputs (the fields the
    DENSE rule reads: pulumi-gcp's reservationAffinity.{type, specificReservation.values} and
    scheduling.provisioningModel are the API's consumeReservationType, values, provisioningModel)."""
    affinity = inputs.get("reservationAffinity") or {}
    return {
        "scheduling": {"provisioningModel": (inputs.get("scheduling") or {}).get("provisioningModel", "STANDARD")},
        "reservationAffinity": {
            "consumeReservationType": affinity.get("type"),
            "values": (affinity.get("specificReservation") or {}).get("values", []),
        },
    }


@pytest.mark.parametrize(("bound", "refused"), [(False, True), (True, False)])
def test_the_b200_example_is_what_a_dense_reservation_takes(public_key: Path, bound: bool, refused: bool) -> None:
    """The example stack as shipped (reservationBound) is taken by the fake's instances.insert rule; without the
    setting (the example before issue 37) the API's 400 comes back."""
    import yaml

    from infra import program
    from infra.ops import preview
    from tests.conftest import ROOT

    raw = yaml.safe_load((ROOT / "stacks" / "Pulumi.b200-reserved.yaml").read_text())["config"]
    raw["gpu-train:sshPublicKey"] = str(public_key)
    if not bound:
        raw.pop("gpu-train:reservationBound")
    result = preview.run(program.main, stack="b200-reserved", config=raw)
    assert result.error is None, result.error
    (inst,) = result.of_type("compute/instance:Instance")
    dense = [reservation("my-gcp-project", "us-central1-b", "my-b200-reservation", "a4-highgpu-8g", deployment="DENSE")]
    assert (insert_refusal(insert_body(inst.inputs), dense) == (400, DENSE_TEXT)) is refused
