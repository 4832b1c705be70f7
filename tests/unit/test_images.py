"""Images: the `image` output is the image the VM runs (pinned at first `up`), families with a
driver suffix install nothing at boot, Blackwell needs a recent driver, A4X is Arm."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import images, validate
from gpu_train.stack.config import ConfigError
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
FIXED = {"gpuType": None, "gpuCount": None}
PINNED = (
    "https://www.googleapis.com/compute/v1/projects/deeplearning-platform-release/global/images/"
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20251101"
)


def test_the_image_output_is_the_one_the_vm_runs() -> None:
    """After the first `up` the family's newest image moves on; the VM keeps booting the pinned one."""
    result = preview.run(program.main, stack="s", config=gcp_raw(), pinned_image=PINNED)
    assert result.error is None, result.error
    assert result.outputs["image"] == PINNED
    fresh = preview.run(program.main, stack="s", config=gcp_raw())
    (inst,) = fresh.of_type("compute/instance:Instance")
    assert fresh.outputs["image"] == inst.inputs["bootDisk"]["initializeParams"]["image"]


@pytest.mark.parametrize(
    ("family", "driver"),
    [
        ("pytorch-2-9-cu129-ubuntu-2204-nvidia-580", 580),
        ("common-cu128-ubuntu-2204-nvidia-570", 570),
        ("common-cu121-debian-11", None),
        ("", None),
    ],
)
def test_driver_of(family: str, driver: int | None) -> None:
    assert images.driver_of(family) == driver


@pytest.mark.parametrize(
    ("settings", "key", "words"),
    [
        (
            {"machineType": "a4x-highgpu-4g", **FIXED, "reservation": "gb200-res", "zone": "us-central1-b"},
            "machineType",
            "A4X is Arm (NVIDIA Grace): no x86 Deep Learning VM image boots on it",
        ),
        (
            {"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b", "imageFamily": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"},
            "imageFamily",
            "G4's GPUs need 575 or later",
        ),
    ],
)
def test_images_that_cannot_boot_on_the_gpu_are_refused(settings: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate.check(gcp_raw(**settings), "s", CATALOG)
    assert [(p.key, words in p.message) for p in e.value.problems] == [(key, True)]


@pytest.mark.parametrize(
    "settings",
    [
        {
            "machineType": "a4-highgpu-8g",
            **FIXED,
            "spot": True,
            "zone": "us-central1-b",
            "imageFamily": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
        },  # 570 serves B200
        {
            "machineType": "a4x-highgpu-4g",
            **FIXED,
            "reservation": "gb200-res",
            "zone": "us-central1-b",
            "imageProject": "my-arm-images",
            "imageFamily": "ubuntu-2404-arm64-cuda",
        },  # an Arm image of one's own
        {"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b"},  # the default family, 580
    ],
)
def test_images_that_boot_pass(settings: dict) -> None:
    validate.check(gcp_raw(**settings), "s", CATALOG)


NEWEST = (
    "https://www.googleapis.com/compute/v1/projects/deeplearning-platform-release/global/images/"
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20260416"
)  # the mock family's newest


@pytest.mark.parametrize(
    ("case", "pinned", "pinned_gb", "newest_gb", "image", "refused"),
    [
        # first `up`: no instance yet (the data source's 404), the family's newest is checked and booted
        ("first up fits", None, 50, 60, NEWEST, None),
        ("first up too small", None, 50, 150, None, "the image family pytorch-2-9-cu129-ubuntu-2204-nvidia-580"),
        # a later `up`: the family moved on to a bigger image; the VM still boots its smaller pinned one
        ("pinned older, newest bigger", PINNED, 50, 300, PINNED, None),
        # the pinned image itself needs more than bootDiskSizeGb (the setting was lowered since)
        (
            "pinned bigger than the setting",
            PINNED,
            150,
            50,
            None,
            "the image pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20251101 that gpu-train-s runs",
        ),
    ],
)
def test_the_boot_disk_is_checked_against_the_image_the_vm_boots(
    case: str, pinned: str | None, pinned_gb: int, newest_gb: int, image: str | None, refused: str | None
) -> None:
    result = preview.run(
        program.main,
        stack="s",
        config=gcp_raw(bootDiskSizeGb=100, imageFamily=images_family()),
        image_disk_gb=newest_gb,
        pinned_image=pinned,
        pinned_image_disk_gb=pinned_gb,
    )
    if refused is None:
        assert result.error is None, (case, result.error)
        assert result.outputs["image"] == image
        (inst,) = result.of_type("compute/instance:Instance")
        assert inst.inputs["bootDisk"]["initializeParams"]["size"] == 100
        return
    message = str(result.error)
    assert refused in message, (case, message)
    assert "gpu-train:bootDiskSizeGb = 100" in message and "fix: pulumi config set gpu-train:bootDiskSizeGb 200" in message
    assert result.of_type("compute/instance:Instance") == []


def images_family() -> str:
    return "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"


def test_each_node_is_checked_against_its_own_instance() -> None:
    """A pool looks up every node by its own name; all pinned to the smaller image: no refusal."""
    raw = gcp_raw(nodes=2, machineType="a2-highgpu-8g", gpuType=None, gpuCount=None, bootDiskSizeGb=100)
    result = preview.run(program.main, stack="big", config=raw, image_disk_gb=300, pinned_image=PINNED)
    assert result.error is None, result.error
    looked_up = [token for token, _ in result.calls if token == "gcp:compute/getInstance:getInstance"]
    assert len(looked_up) == 2
    assert {i.inputs["bootDisk"]["initializeParams"]["image"] for i in result.of_type("compute/instance:Instance")} == {PINNED}
