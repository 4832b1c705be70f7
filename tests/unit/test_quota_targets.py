"""Cloud Quotas targets of `quotaRequest`: which quota each GPU asks for, and which entry of a
QuotaInfo holds the limit in force (as Cloud Quotas lists them: a default entry covering many
regions by applicableLocations, plus entries for specific dimensions)."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import quota, validate
from gpu_train.stack.config import parse
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
FAMILY = "GPUS-PER-GPU-FAMILY-per-project-region"
FIXED = {"gpuType": None, "gpuCount": None}


@pytest.mark.parametrize(
    ("settings", "quota_id", "dimensions"),
    [
        ({}, "NVIDIA-T4-GPUS-per-project-region", {"region": "us-central1"}),
        ({"spot": True}, "PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region", {"region": "us-central1"}),
        # L4 has its own per-model quota, not a gpu_family one.
        ({"machineType": "g2-standard-8", **FIXED}, "NVIDIA-L4-GPUS-per-project-region", {"region": "us-central1"}),
        (
            {"machineType": "g2-standard-8", **FIXED, "spot": True},
            "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        ({"machineType": "a3-highgpu-8g", **FIXED}, FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}),
        # Spot H100: the preemptible per-model quota, often granted while the family quota is 0.
        (
            {"machineType": "a3-highgpu-1g", **FIXED, "spot": True},
            "PREEMPTIBLE-NVIDIA-H100-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        # Spot H200, B200, RTX PRO 6000: their preemptible per-model quotas (H200 and B200 have no on-demand one).
        (
            {"machineType": "a4-highgpu-8g", **FIXED, "spot": True, "zone": "us-central1-b"},
            "PREEMPTIBLE-NVIDIA-B200-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        (
            {"machineType": "a3-ultragpu-8g", **FIXED, "spot": True, "zone": "us-central1-b"},
            "PREEMPTIBLE-NVIDIA-H200-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        (
            {"machineType": "g4-standard-48", **FIXED, "spot": True, "zone": "us-central1-b"},
            "PREEMPTIBLE-NVIDIA-RTX-PRO-6000-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        # Flex-start uses preemptible quota first: it asks for the same quota as spot.
        (
            {"machineType": "a3-highgpu-2g", **FIXED, "flexStart": True, "maxRunHours": 4},
            "PREEMPTIBLE-NVIDIA-H100-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        (
            {"machineType": "a4-highgpu-8g", **FIXED, "flexStart": True, "maxRunHours": 24, "zone": "us-central1-b"},
            "PREEMPTIBLE-NVIDIA-B200-GPUS-per-project-region",
            {"region": "us-central1"},
        ),
        # A reservation runs on demand: the family quota.
        ({"machineType": "a3-highgpu-8g", **FIXED, "reservation": "res-1"}, FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}),
    ],
)
def test_preference_targets(settings: dict, quota_id: str, dimensions: dict) -> None:
    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    prefs = quota.preferences(cfg, validate.shape_of(cfg, CATALOG), 8, CATALOG)
    assert [(p["quota_id"], p["dimensions"]) for p in prefs] == [(quota_id, dimensions), ("GPUS-ALL-REGIONS-per-project", {})]


REGIONS = ["europe-west4", "us-central1", "us-east1", "us-west1"]
H100_INFOS = [
    {"dimensions": {"region": "us-east1", "gpu_family": "NVIDIA_H100"}, "applicableLocations": ["us-east1"], "values": [64]},
    {"dimensions": {}, "applicableLocations": REGIONS, "values": [8]},
    {"dimensions": {"region": "us-central1"}, "applicableLocations": ["us-central1"], "values": [16]},
    {"dimensions": {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, "applicableLocations": ["us-central1"], "values": [24]},
]


@pytest.mark.parametrize(
    ("entries", "dimensions", "limit"),
    [
        (H100_INFOS, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, 24),  # the most matching dimensions
        (H100_INFOS, {"region": "us-central1", "gpu_family": "NVIDIA_H200"}, 16),
        (H100_INFOS, {"region": "us-east1", "gpu_family": "NVIDIA_H100"}, 64),
        (H100_INFOS, {"region": "us-west1", "gpu_family": "NVIDIA_H100"}, 8),  # the default entry covers it
        (H100_INFOS, {"region": "asia-east2", "gpu_family": "NVIDIA_H100"}, 0),  # no entry covers it
        ([{"dimensions": {}, "applicableLocations": ["us-east1"], "values": [4]}], {"region": "us-central1"}, 0),
        ([{"dimensions": {}, "applicableLocations": ["global"], "values": [12]}], {}, 12),
        ([{"dimensions": {}, "applicableLocations": REGIONS, "values": []}], {"region": "us-central1"}, 0),  # no grant
    ],
)
def test_current_limit(entries: list, dimensions: dict, limit: int) -> None:
    assert quota.current_limit(entries, dimensions) == limit


def test_the_program_never_asks_below_the_region_limit_in_force() -> None:
    infos = [{"dimensions": e["dimensions"], "applicableLocations": e["applicableLocations"], "value": e["values"][0]} for e in H100_INFOS]
    raw = gcp_raw(
        machineType="a3-highgpu-8g", **FIXED, quotaRequest={"gpus": "8", "justification": "pretraining", "contactEmail": "me@example.com"}
    )
    result = preview.run(program.main, stack="s", config=raw, quota_values={FAMILY: infos})
    assert result.error is None, result.error
    prefs = {p.inputs["quotaId"]: p.inputs for p in result.of_type("SQuotaPreference")}
    assert prefs[FAMILY]["quotaConfig"] == {"preferredValue": "24"}  # not 8 (a decrease), nor the first entry's 64


def test_cloud_quotas_go_through_a_provider_with_a_quota_project() -> None:
    """Under user ADC Cloud Quotas needs a quota project: a provider with userProjectOverride and
    billingProject for the invoke and the preferences, and the cloudquotas API enabled first."""
    raw = gcp_raw(quotaRequest={"gpus": "2", "justification": "pretraining", "contactEmail": "me@example.com"})
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None, result.error
    (provider,) = result.of_type("pulumi:providers:gcp")
    assert provider.inputs["userProjectOverride"] in (True, "true")
    assert provider.inputs["billingProject"] == "proj-1" and provider.inputs["project"] == "proj-1"
    (api,) = result.of_type("projects/service:Service")
    assert api.inputs["service"] == "cloudquotas.googleapis.com" and api.inputs["disableOnDestroy"] is False
    assert api.provider.endswith(f"pulumi:providers:gcp::{provider.name}::{provider.name}-id")
    prefs = result.of_type("SQuotaPreference")
    assert len(prefs) == 2 and all(p.provider == api.provider for p in prefs)
    invokes = [prov for token, prov in result.calls if token.startswith("gcp:cloudquota/getSQuotaInfo")]
    assert len(invokes) == 2 and all(prov == api.provider for prov in invokes)
