"""AI zones (us-central1-ai1, us-south1-ai1b) hold GPU capacity: the validator, the catalog loader
and the error parser accept them, and the region is read from them correctly."""

from __future__ import annotations

import copy

import pytest
import yaml

from gpu_train.catalog.loader import CATALOG_PATH, load_catalog, parse_catalog
from gpu_train.catalog.model import CatalogError
from gpu_train.gcp import capacity, validate
from gpu_train.stack.config import ConfigError, parse
from tests.conftest import gcp_raw

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("zone", "region"), [("us-central1-ai1", "us-central1"), ("us-south1-ai1b", "us-south1"), ("us-central1-a", "us-central1")]
)
def test_the_validator_takes_ai_zones(zone: str, region: str) -> None:
    raw = gcp_raw(zone=zone, machineType="a3-highgpu-8g", gpuType=None, gpuCount=None)
    cfg, warnings = validate.check(raw, "s", CATALOG)
    assert cfg.region == region
    if "ai" in zone:  # not in the catalog's snapshot: said, not refused
        assert [w.key for w in warnings if w.key == "zone"] == ["zone"]


@pytest.mark.parametrize("zone", ["us-central1", "us-central1-", "us-central1-ai", "us-central1-aix1", "US-central1-a"])
def test_the_validator_refuses_what_is_no_zone(zone: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate.check(gcp_raw(zone=zone), "s", CATALOG)
    assert any(p.key == "zone" and "is not a zone name" in p.message for p in e.value.problems)


def test_the_catalog_loader_takes_ai_zones_and_refuses_junk() -> None:
    doc = yaml.safe_load(CATALOG_PATH.read_text())
    good = copy.deepcopy(doc)
    good["zones"]["byAccelerator"]["nvidia-b200"] += ["us-central1-ai1", "us-south1-ai1b"]
    assert "us-south1-ai1b" in parse_catalog(good).zones["nvidia-b200"]
    bad = copy.deepcopy(doc)
    bad["zones"]["byAccelerator"]["nvidia-b200"] += ["us-central1-ai"]
    with pytest.raises(CatalogError):
        parse_catalog(bad)


def test_the_error_parser_reads_ai_zones() -> None:
    text = (
        "error: googleapi: Error 503: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone "
        "'projects/p/zones/us-central1-b' does not have enough resources available to fulfill the request. "
        "Details: [{'metadatas': {'zonesAvailable': 'us-central1-ai1,us-south1-ai1b,us-central1-c'}}]"
    )
    failure = capacity.classify(text)
    assert failure.kind == capacity.STOCKOUT
    assert failure.zones_available == ("us-central1-ai1", "us-south1-ai1b", "us-central1-c")


def test_parse_keeps_the_region_of_an_ai_zone() -> None:
    assert parse(gcp_raw(zone="us-south1-ai1b"), "s", CATALOG).region == "us-south1"
