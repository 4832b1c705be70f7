"""The catalog file's schema, and that its facts hang together."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gpu_train.catalog.loader import CATALOG_PATH, load_catalog, parse_catalog
from gpu_train.catalog.model import CatalogError


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(CATALOG_PATH.read_text())


def test_loads_with_every_table_sourced_and_dated(doc: dict) -> None:
    catalog = load_catalog()
    for table in ("accelerators", "n1", "fixedShapes", "zones", "prices", "images"):
        assert doc[table]["source"], table
        assert catalog.dates[table] == doc[table]["date"]
    assert {"S1", "S2", "S7"} <= set(catalog.sources)
    assert all(s["url"].startswith("https://") for s in catalog.sources.values())


def test_facts_are_consistent() -> None:
    catalog = load_catalog()
    for shape in catalog.fixed_shapes.values():
        acc = catalog.accelerators[shape.gpu_type]
        assert not acc.attachable_to_n1, shape.name
        assert shape.family.startswith(acc.series), (shape.name, acc.series)
        assert catalog.zones_for(shape.gpu_type) or shape.gpu_type in catalog.unverified_zones
    for gpu, limits in catalog.n1_limits.items():
        assert catalog.accelerators[gpu].attachable_to_n1
        assert [lim.count for lim in limits] == sorted(lim.count for lim in limits)
    assert catalog.default_image_family in catalog.image_families
    assert catalog.accelerator("nvidia-tesla-t4-vws").name == "nvidia-tesla-t4"
    assert catalog.accelerator("nvidia-tesla-v100-vws") is None  # V100 has no workstation variant


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("sources"), "missing 'sources'"),
        (lambda d: d["zones"].update(source=["S99"]), "unknown source 'S99'"),
        (lambda d: d["prices"].pop("date"), "prices: missing 'date'"),
        (lambda d: d["fixedShapes"]["types"]["g2-standard-4"].update(gpuType="nvidia-l5"), "'nvidia-l5' is not in accelerators"),
        (lambda d: d["fixedShapes"]["types"]["g2-standard-4"].update(vcpus="four"), "fixedShapes.types.g2-standard-4.vcpus"),
        (lambda d: d["zones"]["byAccelerator"]["nvidia-l4"].append("us-central1"), "'us-central1' is not a zone name"),
        (lambda d: d["n1"]["limits"].update({"nvidia-l4": []}), "n1.limits.nvidia-l4: not an N1 accelerator"),
        (lambda d: d["prices"]["perGpu"]["nvidia-l4"].update(spot="cheap"), "prices.perGpu.nvidia-l4.spot"),
        (lambda d: d["accelerators"]["types"]["nvidia-l4"].pop("series"), "missing 'series'"),
    ],
)
def test_schema_errors_name_the_place(doc: dict, mutate, message: str) -> None:
    bad = copy.deepcopy(doc)
    mutate(bad)
    with pytest.raises(CatalogError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_catalog(bad)


@pytest.mark.parametrize(
    ("name", "series", "vcpus", "memory"),
    [
        ("n1-standard-8", "n1", 8, 30),
        ("n1-highmem-16", "n1", 16, 104),
        ("n1-highcpu-96", "n1", 96, 86.4),
        ("n1-custom-12-46080", "n1", 12, 45),
        ("custom-4-15360-ext", "n1", 4, 15),
        ("g2-standard-24", "g2", 24, 96),
        ("a3-highgpu-8g", "a3", 208, 1872),
        ("e2-standard-4", "e2", 4, None),
        ("f1-micro", "f1", None, None),
    ],
)
def test_parse_machine_type(name: str, series: str, vcpus: int | None, memory: float | None) -> None:
    shape = load_catalog().parse_machine_type(name)
    assert (shape.series, shape.vcpus, shape.memory_gb) == (series, vcpus, memory)


@pytest.mark.parametrize("name", ["n1-standard-3", "n1-highmem-1", "N1-STANDARD-8", "", "standard"])
def test_parse_machine_type_rejects(name: str) -> None:
    assert load_catalog().parse_machine_type(name) is None


def test_a_bad_edit_of_the_file_fails_at_load_even_after_a_good_one_passed(tmp_path: Path) -> None:
    """The shape is checked once per version of the file (a stamp of the bytes that passed): other bytes
    are checked again, whatever passed before."""
    good = CATALOG_PATH.read_text(encoding="utf-8")
    load_catalog(CATALOG_PATH)  # passed (and stamped)
    bad = tmp_path / "gpu-catalog.yaml"
    bad.write_text(good.replace("memoryGb: 16, series: N1,", "memoryGb: 16,", 1), encoding="utf-8")
    assert bad.read_text() != good
    with pytest.raises(CatalogError, match=r"accelerators\.types\.nvidia-tesla-t4: missing 'series'"):
        load_catalog(bad)
