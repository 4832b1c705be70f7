"""Disk types by machine series (catalog `disks` table): defaults, allowed types, the validator's
check of a given bootDiskType, the quota each type counts against, and the program's boot disk."""

from __future__ import annotations

import pytest

from gpu_train.catalog import disks
from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import quota, validate
from gpu_train.stack import config
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
HD, PDB, PDS, PDSTD = "hyperdisk-balanced", "pd-balanced", "pd-ssd", "pd-standard"
FIXED = {"gpuType": None, "gpuCount": None}


@pytest.mark.parametrize(
    ("machine_type", "default", "boot"),
    [
        ("n1-standard-8", PDB, (PDSTD, PDB, PDS)),
        ("n1-custom-12-46080", PDB, (PDSTD, PDB, PDS)),
        ("g2-standard-8", PDB, (PDB, PDS)),  # G2 takes no pd-standard (reference, corrected 2026-11-25)
        ("a2-highgpu-1g", PDB, (PDSTD, PDB, PDS)),
        ("a3-highgpu-8g", PDB, (PDB, PDS, HD)),
        ("a3-megagpu-8g", PDB, (PDB, PDS, HD)),
        ("a3-edgegpu-8g", PDB, (PDB, PDS, HD)),
        ("a3-ultragpu-8g", HD, (HD,)),
        ("a4-highgpu-8g", HD, (HD,)),
        ("a4x-highgpu-4g", HD, (HD,)),
        ("g4-standard-48", HD, (HD,)),
        ("e2-standard-8", disks.FALLBACK_DEFAULT, ()),  # no GPU series: the validator reports the machine type
    ],
)
def test_disk_support_table(machine_type: str, default: str, boot: tuple) -> None:
    assert disks.default_disk_type(CATALOG, machine_type) == default
    assert disks.allowed_disk_types(CATALOG, machine_type) == boot
    assert disks.allowed_disk_types(CATALOG, machine_type, disks.DATA) == boot  # the same types as data disks today


def test_every_fixed_shape_has_a_disk_row() -> None:
    assert all(CATALOG.disks_of(name) is not None for name in CATALOG.fixed_shapes)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, PDB),
        ({"machineType": "a4-highgpu-8g", **FIXED, "spot": True, "zone": "us-central1-b"}, HD),
        ({"machineType": "a3-ultragpu-8g", **FIXED, "spot": True, "zone": "us-central1-b"}, HD),
        ({"machineType": "g4-standard-48", **FIXED, "zone": "us-central1-b"}, HD),
        ({"machineType": "a3-highgpu-8g", **FIXED}, PDB),
        ({"machineType": "a3-highgpu-8g", **FIXED, "bootDiskType": HD}, HD),
        ({"machineType": "g2-standard-8", **FIXED, "bootDiskType": PDS}, PDS),
    ],
)
def test_boot_disk_type_defaults_to_the_series_own(settings: dict, expected: str) -> None:
    cfg, _ = validate.check(gcp_raw(**settings), "s", CATALOG)
    assert cfg.boot_disk_type == expected


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (
            {"machineType": "a4-highgpu-8g", **FIXED, "spot": True, "zone": "us-central1-b", "bootDiskType": PDB},
            "A4 (a4-highgpu-8g) does not take pd-balanced as a boot disk; it takes hyperdisk-balanced",
        ),
        (
            {"machineType": "a3-ultragpu-8g", **FIXED, "spot": True, "zone": "us-central1-b", "bootDiskType": PDS},
            "A3 Ultra (a3-ultragpu-8g) does not take pd-ssd",
        ),
        ({"machineType": "a3-highgpu-8g", **FIXED, "bootDiskType": PDSTD}, "A3 High (a3-highgpu-8g) does not take pd-standard"),
        ({"bootDiskType": HD}, "N1 (n1-standard-8) does not take hyperdisk-balanced"),
        ({"machineType": "g2-standard-8", **FIXED, "bootDiskType": PDSTD}, "G2 (g2-standard-8) does not take pd-standard"),
        ({"fallbackShapes": ["a3-highgpu-8g"], "bootDiskType": PDSTD}, "'a3-highgpu-8g': A3 High"),
    ],
)
def test_a_given_type_the_series_does_not_take_is_refused(settings: dict, words: str) -> None:
    with pytest.raises(config.ConfigError) as e:
        validate.check(gcp_raw(**settings), "s", CATALOG)
    (problem,) = e.value.problems
    assert words in f"{problem.message} {problem.fix}"
    assert problem.key in ("bootDiskType", "fallbackShapes") and "bootDiskType" in f"{problem.key} {problem.fix}"


def test_g2_takes_no_pd_standard_data_disk() -> None:
    with pytest.raises(config.ConfigError) as e:
        validate.check(gcp_raw(machineType="g2-standard-8", **FIXED, dataDiskType=PDSTD), "s", CATALOG)
    (problem,) = e.value.problems
    assert problem.key == "dataDiskType" and "G2 (g2-standard-8) does not take pd-standard as a data disk" in problem.message


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, [("SSD_TOTAL_GB", 300, f"200 GB of {PDB} + 100 GB of {PDB} (data disk)")]),
        ({"bootDiskType": PDSTD}, [("DISKS_TOTAL_GB", 200, f"200 GB of {PDSTD}"), ("SSD_TOTAL_GB", 100, f"100 GB of {PDB} (data disk)")]),
        (
            {"dataDiskType": PDSTD, "dataDiskSizeGb": 500},
            [("SSD_TOTAL_GB", 200, f"200 GB of {PDB}"), ("DISKS_TOTAL_GB", 500, f"500 GB of {PDSTD} (data disk)")],
        ),
        (
            {"machineType": "a4-highgpu-8g", **FIXED, "spot": True, "zone": "us-central1-b"},
            [("HYPERDISK_BALANCED_TOTAL_GB", 300, f"200 GB of {HD} + 100 GB of {HD} (data disk)")],
        ),
        (
            {"machineType": "a3-highgpu-8g", **FIXED, "bootDiskType": HD},  # the data disk keeps the series' pd-balanced
            [("HYPERDISK_BALANCED_TOTAL_GB", 200, f"200 GB of {HD}"), ("SSD_TOTAL_GB", 100, f"100 GB of {PDB} (data disk)")],
        ),
        ({"nodes": 3}, [("SSD_TOTAL_GB", 900, f"600 GB of {PDB} + 300 GB of {PDB} (data disk)")]),  # a data disk per node
    ],
)
def test_disk_quota_follows_each_disks_type(settings: dict, expected: list) -> None:
    """Every node's boot disk and data disk count against the quota of their own type."""
    cfg, _ = validate.check(gcp_raw(**settings), "s", CATALOG)
    needs = quota.needs(cfg, validate.shape_of(cfg, CATALOG), {}, CATALOG)
    assert [(n.metric, n.amount, n.what) for n in needs if n.metric and n.metric.endswith("TOTAL_GB")] == expected


def test_program_gives_an_a4_a_hyperdisk_boot_disk() -> None:
    raw = gcp_raw(machineType="a4-highgpu-8g", gpuType=None, gpuCount=None, spot=True, zone="us-central1-b")
    result = preview.run(program.main, stack="a4", config=raw)
    assert result.error is None, result.error
    (inst,) = result.of_type("compute/instance:Instance")
    assert inst.inputs["bootDisk"]["initializeParams"]["type"] == HD
