"""Validation rules, table-driven: each case is settings -> the problems expected (key, words)."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import validate
from gpu_train.stack.config import ConfigError, parse
from tests.conftest import gcp_raw

CATALOG = load_catalog()

VALID = [
    {},  # 1 x T4 on n1-standard-8
    {"gpuCount": 4, "machineType": "n1-standard-96"},
    {"gpuType": "nvidia-tesla-t4-vws"},
    {"gpuType": "nvidia-tesla-v100", "gpuCount": 1, "machineType": "n1-standard-8"},
    {"gpuType": "nvidia-tesla-v100", "gpuCount": 8, "machineType": "n1-highmem-96", "zone": "us-central1-f"},
    {"gpuType": "nvidia-tesla-p4", "gpuCount": 2, "machineType": "n1-custom-12-46080", "zone": "us-east4-a"},
    {"machineType": "g2-standard-8", "gpuType": None, "gpuCount": None},
    {"machineType": "g2-standard-24", "gpuType": "nvidia-l4", "gpuCount": 2},
    {"machineType": "a2-highgpu-1g", "gpuType": None, "gpuCount": None, "zone": "us-central1-f"},
    {"machineType": "a2-megagpu-16g", "gpuType": None, "gpuCount": None, "zone": "europe-west4-b"},
    {"machineType": "a2-ultragpu-8g", "gpuType": None, "gpuCount": None, "zone": "us-east5-b"},
    {"machineType": "a3-highgpu-1g", "gpuType": None, "gpuCount": None, "spot": True},
    {"machineType": "a3-highgpu-8g", "gpuType": None, "gpuCount": None},
    {"machineType": "a3-ultragpu-8g", "gpuType": None, "gpuCount": None, "spot": True, "zone": "us-central1-b"},
    {"machineType": "a4-highgpu-8g", "gpuType": None, "gpuCount": None, "spot": True, "zone": "us-central1-b"},
    {"sshSourceRanges": ["0.0.0.0/0"], "allowSshFromAnywhere": True},
    {"sshSourceRanges": ["2001:db9::/32", "198.51.99.0/24"]},
    {"labels": {"team": "vision", "cost-center": "42"}},
    {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 1000},
    {"imageProject": "my-images", "imageFamily": "anything-goes"},
    {"nodes": 4, "machineType": "a3-highgpu-8g", "gpuType": None, "gpuCount": None},
    {"nodes": 150, "machineType": "g2-standard-8", "gpuType": None, "gpuCount": None},
    {"idleStopMinutes": 0, "maxRunHours": 24, "maxResumes": 0, "running": False},
    {"fallbackShapes": ["g2-standard-8", "n1-standard-8/nvidia-tesla-v100/1"], "spotFallback": True},
    {"quotaRequest": {"gpus": "8", "justification": "pretraining", "contactEmail": "me@example.com"}},
]

NO_GPU = {"gpuType": None, "gpuCount": None}  # a GPU shape's settings: the machine type alone
# (settings, [(key, words in message or fix), ...]): every problem expected, and nothing else.
INVALID = [
    # counts and N1 attach rules
    ({"gpuCount": 3}, [("gpuCount", "counts of 1, 2, 4 only")]),
    ({"gpuCount": 3}, [("gpuCount", "nearest valid count: 4")]),
    ({"gpuCount": 6, "gpuType": "nvidia-tesla-v100"}, [("gpuCount", "nearest valid count: 8")]),
    ({"gpuCount": 0}, [("gpuCount", "nearest valid count: 1")]),
    ({"gpuType": None}, [("gpuType", "required with an N1")]),
    ({"gpuCount": None}, [("gpuCount", "1, 2, 4 for nvidia-tesla-t4")]),
    ({"gpuType": "nvidia-tesla-t5"}, [("gpuType", "did you mean nvidia-tesla-t4")]),
    ({"gpuType": "nvidia-tesla-k80"}, [("gpuType", "end of support")]),
    (
        {"gpuType": "nvidia-tesla-p100", "gpuCount": 4, "machineType": "n1-standard-16", "zone": "us-central1-c"},
        [("gpuType", "end of support on 2026-09-15")],
    ),
    ({"gpuType": "P100"}, [("gpuType", "the nearest current GPU is nvidia-tesla-v100")]),
    ({"gpuType": "nvidia-tesla-v100-vws"}, [("gpuType", "is not a GPU type")]),
    # vCPU and memory ceilings
    ({"gpuType": "nvidia-tesla-v100", "machineType": "n1-standard-16"}, [("machineType", "over the ceiling of 12 vCPUs")]),
    ({"gpuType": "nvidia-tesla-v100", "machineType": "n1-standard-16"}, [("machineType", "e.g. machineType n1-highmem-8")]),
    ({"gpuType": "nvidia-tesla-v100", "machineType": "n1-standard-16"}, [("machineType", "gpuCount 2")]),
    ({"gpuType": "nvidia-tesla-v100", "machineType": "n1-highmem-32", "gpuCount": 2}, [("machineType", "24 vCPUs and 156 GB")]),
    ({"machineType": "n1-standard-64"}, [("machineType", "at most 48 vCPUs")]),
    # machine series
    ({"machineType": "n2-standard-32"}, [("machineType", "features are not compatible")]),
    ({"machineType": "n2-standard-32"}, [("machineType", "machineType n1-standard-32")]),
    ({"machineType": "e2-standard-4", "gpuType": "nvidia-l4"}, [("machineType", "g2-standard-4")]),
    ({"machineType": "f1-micro"}, [("machineType", "takes no GPUs")]),
    # a GPU series' size that does not exist: not "the G2 series takes no GPUs"
    ({"machineType": "g2-standard-3", **NO_GPU}, [("machineType", "is not a machine type of the G2 series that gpu-train knows")]),
    ({"machineType": "g2-standard-3", **NO_GPU}, [("machineType", "did you mean g2-standard-4? (G2 types: ")]),
    ({"machineType": "a2-highgpu-3g", **NO_GPU}, [("machineType", "A2 types: a2-highgpu-1g, a2-ultragpu-1g, a2-highgpu-2g")]),
    ({"machineType": "n1-standard-3"}, [("machineType", "did you mean")]),
    ({"machineType": "bogus"}, [("machineType", "not a machine type")]),
    # fixed shapes
    ({"gpuType": "nvidia-l4"}, [("gpuType", "machineType g2-standard-4")]),
    ({"gpuType": "nvidia-l4", "gpuCount": 2}, [("gpuType", "machineType g2-standard-24")]),
    ({"gpuType": "nvidia-h100-80gb", "gpuCount": 8}, [("gpuType", "a3-highgpu-8g")]),
    (
        {"machineType": "g2-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": None},
        [("gpuType", "g2-standard-8 comes with 1 x nvidia-l4")],
    ),
    ({"machineType": "g2-standard-8", "gpuType": None, "gpuCount": 2}, [("gpuCount", "use machineType g2-standard-24")]),
    ({"machineType": "a2-highgpu-1g", "gpuType": "nvidia-a100-80gb", "gpuCount": None}, [("gpuType", "use machineType a2-ultragpu-1g")]),
    ({"machineType": "a3-highgpu-1g", "gpuType": None, "gpuCount": None}, [("machineType", "set gpu-train:spot true")]),
    (
        {"machineType": "a4-highgpu-8g", "gpuType": None, "gpuCount": None, "zone": "us-central1-b"},
        [("machineType", "cannot be had on demand, only as spot, flex-start, reservation")],
    ),
    (
        {"machineType": "a4x-highgpu-4g", "gpuType": None, "gpuCount": None, "spot": True},
        [("machineType", "A4X is Arm (NVIDIA Grace)"), ("spot", "only as reservation")],
    ),
    # zones
    ({"zone": "us-central1-d"}, [("zone", "zones of us-central1 with T4: us-central1-a, us-central1-b, us-central1-c")]),
    ({"zone": "us-central1-d"}, [("zone", "(catalog snapshot, snapshot date unknown")]),  # not "snapshot of snapshot date unknown"
    ({"zone": "europe-north1-a"}, [("zone", "nearest regions with it: europe-")]),
    (
        {"zone": "us-west3-a", "machineType": "g2-standard-8", "gpuType": None, "gpuCount": None},
        [("zone", "us-west1 (us-west1-a, us-west1-b, us-west1-c)")],
    ),
    (
        {"machineType": "a2-megagpu-16g", "gpuType": None, "gpuCount": None, "zone": "us-east1-b"},
        [("zone", "A100 40GB as a2-megagpu-16g is not offered")],
    ),
    ({"zone": "us-central1"}, [("zone", "not a zone name")]),
    ({"zone": "Central"}, [("zone", "not a zone name")]),
    # disk and ssh
    ({"bootDiskSizeGb": 5}, [("bootDiskSizeGb", "between 10 and 65536")]),
    ({"bootDiskType": "pd-balance"}, [("bootDiskType", "did you mean pd-balanced")]),
    ({"sshUser": "root"}, [("sshUser", "other than root")]),
    ({"sshUser": "Bad User"}, [("sshUser", "Linux user name")]),
    ({"sshSourceRanges": ["0.0.0.0/0"]}, [("sshSourceRanges", "whole internet")]),
    ({"sshSourceRanges": ["::/0"]}, [("sshSourceRanges", "allowSshFromAnywhere")]),
    ({"sshSourceRanges": ["10.1.2.3/8"]}, [("sshSourceRanges", "network address: 10.0.0.0/8")]),
    ({"sshSourceRanges": ["10.1.2.3"]}, [("sshSourceRanges", "write 10.1.2.3/32")]),
    ({"sshSourceRanges": ["my-laptop"]}, [("sshSourceRanges", "not a CIDR range")]),
    ({"sshSourceRanges": "1.2.3.4/33"}, [("sshSourceRanges", "not a CIDR range")]),
    ({"sshSourceRanges": []}, [("sshSourceRanges", "lists no range")]),
    # labels
    ({"labels": {"Team": "x"}}, [("labels", "not a valid label key")]),
    ({"labels": {"team": "Vision Team"}}, [("labels", "not a valid label value")]),
    ({"labels": {"gpu-train-stack": "x"}}, [("labels", "set by gpu-train itself")]),
    # lifecycle and nodes
    ({"idleStopMinutes": -1}, [("idleStopMinutes", "0 (off) or more")]),
    ({"maxRunHours": 0}, [("maxRunHours", "between 1 and 2880")]),
    ({"maxRunHours": 0.5}, [("maxRunHours", "between 1 and 2880")]),
    ({"maxRunHours": 3000}, [("maxRunHours", "between 1 and 2880")]),
    ({"maxResumes": -2}, [("maxResumes", "0 (never resume)")]),
    ({"nodes": 0}, [("nodes", "1 or more")]),
    ({"nodes": 200, "machineType": "a2-highgpu-8g", "gpuType": None, "gpuCount": None}, [("nodes", "at most 150 VMs")]),
    # fallback shapes and quota requests
    ({"fallbackShapes": ["n1-standard-8/nvidia-tesla-t4/two"]}, [("fallbackShapes", "count must be a whole number")]),
    ({"fallbackShapes": ["n2-standard-8/nvidia-tesla-t4/1"]}, [("fallbackShapes", "features are not compatible")]),
    ({"fallbackShapes": ["n1-standard-8/nvidia-tesla-t4/3"]}, [("fallbackShapes", "nearest valid count: 4")]),
    ({"quotaRequest": {"gpus": "many", "justification": "x", "contactEmail": "a@b"}}, [("quotaRequest", "whole number")]),
    (
        {"quotaRequest": {"gpus": "2", "contactEmail": "nobody"}},
        [("quotaRequest", "needs a justification"), ("quotaRequest", "needs contactEmail")],
    ),
    (
        {"quotaRequest": {"gpus": "2", "justification": "x", "contactEmail": "a@b", "priority": "high"}},
        [("quotaRequest", "unknown field(s) priority")],
    ),
    # several at once: all reported
    (
        {"gpuCount": 3, "zone": "us-central1-d", "sshSourceRanges": ["0.0.0.0/0"], "bootDiskType": "ssd"},
        [
            ("gpuCount", "nearest valid count: 4"),
            ("zone", "us-central1-a"),
            ("bootDiskType", "did you mean pd-ssd"),
            ("sshSourceRanges", "whole internet"),
        ],
    ),
]

WARNINGS = [
    ({"nodes": 2}, [("nodes", "N1 takes no compact placement policy")]),
    ({"imageFamily": "pytorch-latest-gpu"}, [("imageFamily", "deprecated")]),
    ({"imageFamily": "tf-2-15-cu121-debian-11-py310"}, [("imageFamily", "deprecated")]),
    ({"imageFamily": "pytorch-3-0-cu130-ubuntu-2404-nvidia-590"}, [("imageFamily", "not among")]),
    ({"machineType": "g4-standard-48", "gpuType": None, "gpuCount": None, "zone": "us-east1-b"}, [("zone", "unverified for this GPU")]),
    # example values from the docs and `init`, still in the stack (gpu_train/stack/placeholders.py)
    ({"sshSourceRanges": ["203.0.113.7/32"]}, [("sshSourceRanges", "reserved for documentation")]),
    ({"sshSourceRanges": ["10.1.2.3/32", "198.51.100.0/24"]}, [("sshSourceRanges", "curl -s ifconfig.me")]),
    ({"sshSourceRanges": ["192.0.2.128/25"]}, [("sshSourceRanges", "reserved for documentation")]),
    ({"sshSourceRanges": ["2001:db8::1/128"]}, [("sshSourceRanges", "reserved for documentation")]),
    ({"gcp:project": "my-proj"}, [("gcp:project", "gcloud projects list")]),
    ({"gcp:project": "my-gcp-project"}, [("gcp:project", "example project id")]),
]


def deprecated_gpu(p) -> bool:
    """T4 and P4 (gcp_raw's T4 too) are warned about: tested on their own below."""
    return p.key == "gpuType" and p.severity == "warning" and "shuts it down on 2027-08-01" in p.message


def problems(settings: dict) -> list:
    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    return [p for p in validate.validate(cfg, CATALOG) if not deprecated_gpu(p)]


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({}, True),  # the default stack: N1 + T4
        ({"gpuType": "P4", "gpuCount": 2, "zone": "us-central1-c"}, True),
        ({"gpuType": "nvidia-tesla-v100"}, False),
        ({"machineType": "g2-standard-8", "gpuType": None, "gpuCount": None}, False),
    ],
)
def test_t4_and_p4_are_warned_with_their_shutdown_date(settings: dict, warned: bool) -> None:
    found = validate.validate(parse(gcp_raw(**settings), "s", CATALOG), CATALOG)
    assert [p for p in found if p.severity == "error"] == []
    assert any(deprecated_gpu(p) for p in found) == warned


@pytest.mark.parametrize("settings", VALID, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_valid(settings: dict) -> None:
    assert problems(settings) == []


@pytest.mark.parametrize(("settings", "expected"), INVALID + WARNINGS)
def test_invalid(settings: dict, expected: list[tuple[str, str]]) -> None:
    found = problems(settings)
    assert [p.key for p in found] == [k for k, _ in expected], [str(p) for p in found]
    for p, (_, words) in zip(found, expected, strict=True):
        assert words in f"{p.message} {p.fix}", str(p)
        assert p.fix, str(p)
    severity = "warning" if (settings, expected) in WARNINGS else "error"
    assert {p.severity for p in found} == {severity}


def test_check_reports_type_and_rule_problems_together() -> None:
    raw = gcp_raw(gpuCount="three", machineType="n2-standard-8", sshSourceRanges=["0.0.0.0/0"], spto=True)
    with pytest.raises(ConfigError) as e:
        validate.check(raw, "s", CATALOG)
    assert [p.key for p in e.value.problems] == ["gpuCount", "spto", "machineType", "sshSourceRanges"]
    text = str(e.value)
    assert "stack 's' is invalid (4 problems)" in text and "did you mean 'gpu-train:spot'" in text


def test_check_returns_warnings_for_a_valid_stack() -> None:
    cfg, warnings = validate.check(gcp_raw(imageFamily="pytorch-latest-gpu"), "s", CATALOG)
    assert cfg.image_family == "pytorch-latest-gpu" and [w.key for w in warnings if not deprecated_gpu(w)] == ["imageFamily"]


@pytest.mark.parametrize(
    ("settings", "shape"),
    [
        ({}, ("n1-standard-8", "nvidia-tesla-t4", 1, True)),
        ({"machineType": "g2-standard-48", "gpuType": None, "gpuCount": None}, ("g2-standard-48", "nvidia-l4", 4, False)),
        (
            {"machineType": "a3-highgpu-1g", "gpuType": None, "gpuCount": None, "spot": True},
            ("a3-highgpu-1g", "nvidia-h100-80gb", 1, False),
        ),
    ],
)
def test_shape_of(settings: dict, shape: tuple) -> None:
    s = validate.shape_of(parse(gcp_raw(**settings), "s", CATALOG), CATALOG)
    assert (s.machine_type, s.gpu_type, s.gpu_count, s.attached) == shape


def test_count_of_cases() -> None:
    """The note on the issue quotes this number."""
    assert len(VALID) + len(INVALID) + len(WARNINGS) >= 70
