"""scripts/plan: exit codes and output. One test runs the script as a user does; the others call its
main in the test's process (tests.conftest.in_process), the same program without a second of imports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra.ops.plan import main
from tests.conftest import ROOT, in_process

pytestmark = pytest.mark.slow  # the Pulumi program under mocks, a second or so each


def plan(*args: str, home: Path | None = None, process: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"HOME": str(home)} if home else {})}
    if process:
        return subprocess.run([str(ROOT / "scripts" / "plan"), *args], capture_output=True, text=True, env=env, timeout=60)
    return in_process(main, list(args), env)


@pytest.fixture(scope="module")
def home_with_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    return home


@pytest.mark.parametrize(
    ("stack", "words"),
    [
        (
            "t4-spot",
            [
                "would create 32 resources",  # the recovery: its build account and grants, each VM reading itself
                "Recovery: a preempted VM is started again",
                "1 x T4",
                "n1-standard-8",
                "$0.28",
                "$6.71",
                "$0.73",
                "$17.52",
                "<- this stack",
                "provisioningModel=SPOT",
                "Shutdown grace: spot VM: at a preemption, 30 s between the soft-off and a hard power-off",
                "then 25 s to checkpoint",
            ],
        ),
        (
            "l4",
            [
                "would create 8 resources",
                "1 x L4",
                "built into g2-standard-8",
                "$0.85",
                "$20.49",
                "provisioningModel=STANDARD",
                "Shutdown grace: standard VM: at any stop, 120 s between the soft-off and a hard power-off",
                "then 110 s to checkpoint",
            ],
        ),
        ("a100", ["would create 8 resources", "1 x A100 40GB", "a2-highgpu-1g", "$3.67", "$88.16", "500 GB pd-ssd"]),
        (
            "h100-spot",
            [
                "would create 32 resources",  # the recovery: its build account and grants, each VM reading itself
                "1 x H100",
                "a3-highgpu-1g",
                "unknown",
                "no trustworthy price",
                "cloud.google.com/compute/gpus-pricing",
            ],
        ),
        (
            "h100-flex",
            [
                "8 x H100",
                "a3-highgpu-8g",
                "Flex-start (Dynamic Workload Scheduler)",
                "provisioningModel=FLEX_START",
                "maxRunDuration={'seconds': 86400.0}",
                "onInstanceStopAction={'discardLocalSsd': True}",
                "reservationAffinity: NO_RESERVATION",
                "flex-start",
                "unknown  <- this stack",
                "Run-time cap: Compute Engine stops the VM 24 h after each start",
                "bundled Local SSD is discarded at that stop",
                "scripts/up tries, zone by zone: flex-start -> spot",
            ],
        ),
        (
            "b200-reserved",
            [
                "8 x B200",
                "in reservation my-b200-reservation",
                "provisioningModel=RESERVATION_BOUND",
                "reservationAffinity: SPECIFIC_RESERVATION (compute.googleapis.com/reservation-name = my-b200-reservation)",
                "reservation",
                "the on-demand rate, unless a commitment covers it",
            ],
        ),
    ],
)
def test_plan_of_each_example(stack: str, words: list[str], home_with_key: Path) -> None:
    result = plan("--stack", stack, home=home_with_key, process=stack == "t4-spot")  # one as a user runs it
    assert result.returncode == 0, result.stderr
    out = result.stdout
    common = [
        "gcp:compute/instance:Instance",
        "allow tcp:22 from 203.0.113.7/32",
        "deny tcp:22 from 0.0.0.0/0",
        "onHostMaintenance=TERMINATE",
        "NVIDIA driver: 580, installed in the image family (no first-boot install, no reboot)",
        "roles/logging.logWriter",
        f"instanceName: gpu-train-{stack}",
        *(
            ["Data disk: 100 GB pd-balanced: $10.00 a month", f"name gpu-train-{stack}-data: 100 GB pd-balanced"]
            if stack != "b200-reserved"
            else ["Data disk: 100 GB hyperdisk-balanced: price unknown"]
        ),
        f"gpu-train-{stack}-data as /dev/disk/by-id/google-gpu-train-data",
        "protected: `pulumi destroy` refuses it",
    ]
    for w in words + common:
        assert w in out, w
    # The examples hold example values (gpu_train/stack/placeholders.py): warned about, and nothing else is.
    warned = [line.strip() for line in out.split("Warnings:")[1].splitlines() if line.strip().startswith("- ")]
    t4 = ["- gpu-train:gpuType"] if stack == "t4-spot" else []  # T4: shut down 2027-08-01
    assert [w.split(" = ")[0] for w in warned] == [*t4, "- gcp:project", "- gpu-train:sshSourceRanges"], warned


def test_missing_key_is_a_warning_in_the_plan(tmp_path: Path) -> None:
    result = plan("--stack", "t4-spot", home=tmp_path)
    assert result.returncode == 0
    assert "no readable public key" in result.stdout and "pulumi up will stop here" in result.stdout


def test_invalid_stack_exits_2_with_every_problem_on_stderr(tmp_path: Path) -> None:
    f = tmp_path / "Pulumi.bad.yaml"
    f.write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-d\n  gpu-train:machineType: n1-standard-8\n"
        "  gpu-train:gpuType: nvidia-tesla-t4\n  gpu-train:gpuCount: 3\n  gpu-train:sshSourceRanges: [0.0.0.0/0]\n"
        "  gpu-train:spto: true\n"
    )
    result = plan("--file", str(f))
    assert result.returncode == 2 and result.stdout == ""
    for w in [
        "stack 'bad' is invalid (4 problems)",
        "did you mean 'gpu-train:spot'",
        "nearest valid count: 4",
        "zones of us-central1 with T4",
        "whole internet",
    ]:
        assert w in result.stderr, w


@pytest.mark.parametrize(("args", "words"), [(["--stack", "nope"], "no stack named"), ([], "one of the arguments")])
def test_bad_arguments(args: list[str], words: str) -> None:
    result = plan(*args)
    assert result.returncode == 2 and words in result.stderr


def test_ssh_stack_plans_nothing(tmp_path: Path) -> None:
    f = tmp_path / "Pulumi.lab.yaml"
    f.write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@127.0.0.2:2222]\n")
    result = plan("--file", str(f))
    assert result.returncode == 0 and "creates nothing" in result.stdout


def test_plan_of_a_cluster_with_a_quota_request(tmp_path: Path, home_with_key: Path) -> None:
    f = tmp_path / "Pulumi.duo.yaml"
    f.write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:machineType: a3-highgpu-8g\n"
        "  gpu-train:nodes: 2\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n"
        "  gpu-train:quotaRequest: {gpus: 16, justification: pretraining, contactEmail: me@example.com}\n"
    )
    result = plan("--file", str(f), home=home_with_key)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for words in [
        "would create 16 resources",
        "Data disks: 2 x 100 GB pd-balanced: $20.00 a month",
        "enable cloudquotas.googleapis.com",
        "for Cloud Quotas: userProjectOverride, billingProject p",
        "name gpu-train-duo-0",
        "name gpu-train-duo-1",
        "compact placement (collocation=COLLOCATED, vmCount=2)",
        "network: GVNIC, placement",
        "GPUS-PER-GPU-FAMILY-per-project-region (gpu_family=NVIDIA_H100, region=us-central1) = 16",
        "GPUS-ALL-REGIONS-per-project (project-wide) = 16",
        "name gpu-train-duo-internal",
    ]:
        assert words in out, words
