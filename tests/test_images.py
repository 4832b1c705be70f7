"""Images: the `image` output is the image the VM runs (pinned at first `up`), families with a
driver suffix install nothing at boot, Blackwell needs a recent driver, A4X is Arm."""

from __future__ import annotations

import pytest

from gpu_train import images, validate
from gpu_train.catalog import load_catalog
from gpu_train.config import ConfigError
from infra import preview, program
from tests.conftest import gcp_raw

CATALOG = load_catalog()
FIXED = {"gpuType": None, "gpuCount": None}
PINNED = ("https://www.googleapis.com/compute/v1/projects/deeplearning-platform-release/global/images/"
          "pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20251101")


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
    [("pytorch-2-9-cu129-ubuntu-2204-nvidia-580", 580), ("common-cu128-ubuntu-2204-nvidia-570", 570),
     ("common-cu121-debian-11", None), ("", None)],
)
def test_driver_of(family: str, driver: int | None) -> None:
    assert images.driver_of(family) == driver


@pytest.mark.parametrize(
    ("settings", "key", "words"),
    [
        ({"machineType": "a4x-highgpu-4g", **FIXED, "spot": True, "zone": "us-central1-b"}, "machineType",
         "A4X is Arm (NVIDIA Grace): no x86 Deep Learning VM image boots on it"),
        ({"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b",
          "imageFamily": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"}, "imageFamily", "G4's GPUs need 575 or later"),
    ],
)
def test_images_that_cannot_boot_on_the_gpu_are_refused(settings: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate.check(gcp_raw(**settings), "s", CATALOG)
    assert [(p.key, words in p.message) for p in e.value.problems] == [(key, True)]


@pytest.mark.parametrize(
    "settings",
    [
        {"machineType": "a4-highgpu-8g", **FIXED, "spot": True, "zone": "us-central1-b",
         "imageFamily": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"},  # 570 serves B200
        {"machineType": "a4x-highgpu-4g", **FIXED, "spot": True, "zone": "us-central1-b",
         "imageProject": "my-arm-images", "imageFamily": "ubuntu-2404-arm64-cuda"},  # an Arm image of one's own
        {"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b"},  # the default family, 580
    ],
)
def test_images_that_boot_pass(settings: dict) -> None:
    validate.check(gcp_raw(**settings), "s", CATALOG)
