"""Which image a stack boots, and whether it can boot on the stack's GPUs (pure rules).

Deep Learning VM families named ``*-nvidia-DRIVER`` ship that NVIDIA driver installed, so the VM
needs no first-boot install and no reboot; older families without the suffix install it on first
boot when the metadata asks (``install-nvidia-driver``). Blackwell GPUs (A4's B200, G4's RTX PRO
6000) need a recent driver, and A4X is Arm (NVIDIA Grace): no x86 DLVM image boots on it. The
facts are the catalog's ``images`` table.
"""

from __future__ import annotations

import re

from gpu_train.catalog.model import Catalog
from gpu_train.stack.problems import Problem
from gpu_train.stack.settings import NAMESPACE, StackConfig

DRIVER_RE = re.compile(r"-nvidia-(\d+)$")


def driver_of(family: str | None) -> int | None:
    """The NVIDIA driver a DLVM family ships with (580 for ...-nvidia-580); None: installed at first boot."""
    m = DRIVER_RE.search(family or "")
    return int(m.group(1)) if m else None


def needs_driver_install(cfg: StackConfig, catalog: Catalog) -> bool:
    """Whether the VM must install the driver at first boot (a DLVM family without a driver suffix)."""
    return cfg.image_project == catalog.image_project and driver_of(cfg.image_family) is None


def driver_note(cfg: StackConfig, catalog: Catalog) -> str:
    """One line for `plan`: where the NVIDIA driver comes from."""
    driver = driver_of(cfg.image_family)
    if cfg.image_project != catalog.image_project:
        return f"NVIDIA driver: from your image {cfg.image_project}/{cfg.image_family} (gpu-train installs none)"
    if driver is not None:
        return f"NVIDIA driver: {driver}, installed in the image family (no first-boot install, no reboot)"
    return "NVIDIA driver: installed at first boot (install-nvidia-driver; a reboot, 3-5 minutes)"


def check(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """The image's problems: an x86 DLVM on an Arm series, a driver too old for the GPU, a deprecated
    or unknown family (warnings)."""
    machine = catalog.parse_machine_type(cfg.machine_type)
    series = catalog.series_of(cfg.machine_type)
    facts = catalog.image_series.get(series, {})
    arm = (machine is not None and machine.fixed is not None and machine.fixed.arch == "arm64") or facts.get("arch") == "arm64"
    if cfg.image_project != catalog.image_project:
        return []  # the user's own image: nothing the catalog can say about it
    family = cfg.image_family or ""
    if arm:
        return [
            Problem(
                "machineType",
                f"{series} is Arm (NVIDIA Grace): no x86 Deep Learning VM image boots on it",
                f"set {NAMESPACE}:imageProject and imageFamily to an Arm image of your own, or use an x86 GPU shape such as a4-highgpu-8g",
                cfg.machine_type,
            )
        ]
    driver, least = driver_of(family), facts.get("minDriver")
    if driver is not None and least is not None and driver < int(least):
        newer = [f for f in catalog.image_families if (driver_of(f) or 0) >= int(least)]
        return [
            Problem(
                "imageFamily",
                f"ships NVIDIA driver {driver}; {series}'s GPUs need {least} or later",
                f"use {newer[0] if newer else catalog.default_image_family}",
                family,
            )
        ]
    if (reason := catalog.image_deprecation(family)) is not None:
        return [
            Problem(
                "imageFamily",
                f"is deprecated ({reason}; catalog of {catalog.dates['images']})",
                f"use {catalog.default_image_family}",
                family,
                "warning",
            )
        ]
    if family not in catalog.image_families:
        return [
            Problem(
                "imageFamily",
                "is not among the Deep Learning VM families the catalog knows",
                f"current families: {', '.join(catalog.image_families)}",
                family,
                "warning",
            )
        ]
    return []
