"""Quotas and capacity: the error classifier on real error texts, zone plans, scripts/up's failover
against scripted `pulumi up` outcomes (a stand-in CLI at the process boundary), and preflight
against a local HTTP server speaking the Compute REST API."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment
from gpu_train.gcp import capacity, quota, validate
from gpu_train.stack import config
from infra.ops import preflight
from tests.conftest import ROOT, gcp_raw
from tests.loopback_http import LoopbackServer

CATALOG = load_catalog()
STAND_IN = ROOT / "tests" / "stand_in"

# Error texts as Compute Engine sends them (reference section 9), wrapped as Pulumi prints them.
STOCKOUT = (
    "error: 1 error occurred:\n\t* Error waiting for instance to create: The zone "
    "'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the request.  "
    "Try a different zone, or try again later."
)
STOCKOUT_DETAILS = (
    "error: googleapi: Error 503: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone "
    "'projects/p/zones/us-central1-b' does not have enough resources available to fulfill the request. "
    "'(resource type:compute)'. Details: [{'@type': 'type.googleapis.com/google.rpc.ErrorInfo', "
    "'metadatas': {'zonesAvailable': 'us-central1-f,us-central1-c'}, 'reason': 'resource_availability'}]"
)
INSUFFICIENT = "error: googleapi: Error 503: insufficientCapacity, The zone does not have enough resources"
REGIONAL = "error: googleapi: Error 403: Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 1.0 in region us-central1., quotaExceeded"
GLOBAL = "error: googleapi: Error 403: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally., quotaExceeded"
INCOMPATIBLE = (
    "error: googleapi: Error 400: [n2-standard-32, nvidia-tesla-t4] features are not compatible for creating instance., badRequest"
)
WRAPPED_CONFIG = (
    "error: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: [n2-standard-32, nvidia-tesla-t4] features are not compatible for creating instance."
)
NOT_FOUND = (
    "error: googleapi: Error 400: Invalid value for field 'resource.guestAccelerators[0].acceleratorType': "
    "The resource 'projects/p/zones/us-west3-a/acceleratorTypes/nvidia-l4' was not found., invalid"
)
TRANSIENT = "error: googleapi: Error 503: RESOURCE_NOT_READY: the resource is not ready"
MACHINE_NOT_IN_ZONE = (
    "error: 1 error occurred:\n\t* Error creating instance: googleapi: Error 400: Invalid value for field "
    "'resource.machineType': 'projects/p/zones/us-west3-a/machineTypes/g2-standard-8'. Machine type "
    "with name 'g2-standard-8' does not exist in zone 'us-west3-a'., invalid"
)
UNAVAILABLE = (
    "error: 1 error occurred:\n\t* Error waiting for instance to create: The zone 'projects/p/zones/us-central1-a' "
    "does not have enough resources available to fulfill the request. '(resource type:compute)'. A "
    "g2-standard-8 VM instance is currently unavailable in the us-central1-a zone."
)


@pytest.mark.parametrize(
    ("text", "kind", "zones", "metric"),
    [
        (STOCKOUT, capacity.STOCKOUT, (), None),
        (STOCKOUT_DETAILS, capacity.STOCKOUT, ("us-central1-f", "us-central1-c"), None),
        (INSUFFICIENT, capacity.STOCKOUT, (), None),
        (REGIONAL, capacity.REGIONAL_QUOTA, (), "NVIDIA_T4_GPUS"),
        (GLOBAL, capacity.GLOBAL_QUOTA, (), "GPUS_ALL_REGIONS"),
        (INCOMPATIBLE, capacity.CONFIG, (), None),
        (WRAPPED_CONFIG, capacity.CONFIG, (), None),
        (NOT_FOUND, capacity.NOT_OFFERED, (), None),
        (MACHINE_NOT_IN_ZONE, capacity.NOT_OFFERED, (), None),
        (UNAVAILABLE, capacity.STOCKOUT, (), None),
        (TRANSIENT, capacity.TRANSIENT, (), None),
        ("error: something else entirely", capacity.UNKNOWN, (), None),
    ],
)
def test_classify(text: str, kind: str, zones: tuple, metric: str | None) -> None:
    failure = capacity.classify(text)
    assert (failure.kind, failure.zones_available, failure.metric) == (kind, zones, metric)
    assert failure.reason
    assert failure.moves_zone == (kind in (capacity.STOCKOUT, capacity.REGIONAL_QUOTA, capacity.NOT_OFFERED, capacity.TRANSIENT))


def test_zone_plan_and_next_zones() -> None:
    plan = capacity.zone_plan("us-central1-a", "nvidia-tesla-t4", CATALOG)
    assert plan[:4] == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert plan[4].startswith("us-") and len(plan) == len(set(plan)) == len(CATALOG.zones["nvidia-tesla-t4"])
    named = capacity.classify(STOCKOUT_DETAILS)
    after = capacity.next_zones(plan, {"us-central1-a", "us-central1-b"}, named, set())
    assert after[:3] == ["us-central1-f", "us-central1-c", plan[4]]  # the zones GCP named come first
    skipped = capacity.next_zones(plan, {"us-central1-a"}, capacity.classify(REGIONAL), {"us-central1"})
    assert not any(z.startswith("us-central1-") for z in skipped)


# -- preflight against a local Compute API -----------------------------------------------------
class ComputeApi(BaseHTTPRequestHandler):
    """Answers regions.get, projects.get and acceleratorTypes.list with the REST API's JSON."""

    state: ClassVar[dict] = {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        s = self.state
        if path == "/compute/v1/projects/proj-1/regions/us-central1":
            body = {"name": "us-central1", "quotas": [{"metric": m, "limit": lim, "usage": use} for m, (lim, use) in s["region"].items()]}
        elif path == "/compute/v1/projects/proj-1":
            body = {"name": "proj-1", "quotas": [{"metric": "GPUS_ALL_REGIONS", "limit": s["global"][0], "usage": s["global"][1]}]}
        elif path.startswith("/compute/v1/projects/proj-1/zones/us-central1-") and path.endswith("/acceleratorTypes"):
            items = [{"name": n, "zone": path.split("/")[-2]} for n in s["offered"]]
            size = s.get("pageSize") or len(items) or 1  # pages of this many, as the API cuts long lists
            start = int(parse_qs(urlparse(self.path).query).get("pageToken", ["0"])[0])
            body = {"items": items[start : start + size]}
            if start + size < len(items) or s.get("repeatToken"):
                body["nextPageToken"] = "0" if s.get("repeatToken") else str(start + size)
        elif path.startswith("/compute/v1/projects/proj-1/aggregated/"):  # zones offering a type, by name filter
            kind = path.rsplit("/", 1)[-1]  # machineTypes | acceleratorTypes
            query = parse_qs(urlparse(self.path).query)
            name = query.get("filter", [""])[0].split("=")[-1].strip()
            zones = s.get("zonesOffering", {}).get(name, [])
            # As the API answers: every scope, those without a match carrying a warning instead.
            body = {
                "items": {
                    f"zones/{z}": {kind: [{"name": name, "zone": z}]}
                    if z in zones
                    else {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{z}' on this page."}}
                    for z in sorted({*zones, "us-central1-a", "us-west1-b"})
                }
            }
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@dataclass
class Api:
    """The local Compute API's answers, and the Environment that points scripts/preflight at it."""

    state: dict
    env: Environment


@pytest.fixture
def compute_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    server = LoopbackServer(("127.0.0.1", 0), ComputeApi)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    # No ADC: this local API asks for none (tests/unit/test_reservations.py runs preflight with credentials).
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-adc.json"))
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.pf.yaml").write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: nvidia-tesla-t4\n"
        "  gpu-train:gpuCount: 2\n  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n"
    )
    env = Environment(compute_endpoint=f"http://127.0.0.1:{server.server_address[1]}", stacks_dir=stacks, cwd=tmp_path)
    ComputeApi.state = {
        "region": {"PREEMPTIBLE_NVIDIA_T4_GPUS": (4, 0), "NVIDIA_T4_GPUS": (0, 0), "CPUS": (24, 0), "SSD_TOTAL_GB": (500, 100)},
        "global": (8, 2),
        "offered": ["nvidia-tesla-t4", "nvidia-tesla-v100"],
    }
    yield Api(ComputeApi.state, env)
    server.shutdown()


def test_preflight_reads_every_page_of_the_zones_gpus(compute_api: Api, capsys: pytest.CaptureFixture) -> None:
    compute_api.state |= {"offered": ["nvidia-l4", "nvidia-tesla-v100", "nvidia-tesla-t4"], "pageSize": 1}
    assert preflight.main(["--stack", "pf"], compute_api.env) == 0
    assert "The stack fits." in capsys.readouterr().out


def test_preflight_stops_on_a_page_token_that_comes_back(compute_api: Api, capsys: pytest.CaptureFixture) -> None:
    compute_api.state |= {"repeatToken": True}
    assert preflight.main(["--stack", "pf"], compute_api.env) == 2  # an answer that would loop forever: said, not followed
    assert "nextPageToken came back" in capsys.readouterr().err


def test_preflight_enough(compute_api: Api, capsys: pytest.CaptureFixture) -> None:
    assert preflight.main(["--stack", "pf"], compute_api.env) == 0
    out = capsys.readouterr().out
    assert "PREEMPTIBLE_NVIDIA_T4_GPUS" in out and "The stack fits." in out
    row = next(line for line in out.splitlines() if line.strip().startswith("PREEMPTIBLE_NVIDIA_T4_GPUS"))
    assert row.split()[1:] == ["us-central1", "4", "0", "2", "ok"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"region": {"PREEMPTIBLE_NVIDIA_T4_GPUS": (1, 0), "CPUS": (24, 0), "SSD_TOTAL_GB": (500, 0)}},
            "PREEMPTIBLE_NVIDIA_T4_GPUS in us-central1: limit 1, in use 0, needs 2 -> ask for 2",
        ),
        ({"global": (0, 0)}, "GPUS_ALL_REGIONS globally: limit 0, in use 0, needs 2 -> ask for 2"),
        (
            {"region": {"PREEMPTIBLE_NVIDIA_T4_GPUS": (4, 0), "CPUS": (4, 0), "SSD_TOTAL_GB": (500, 0)}},
            "CPUS in us-central1: limit 4, in use 0, needs 8 -> ask for 8",
        ),
        (
            {"region": {"PREEMPTIBLE_NVIDIA_T4_GPUS": (4, 0), "CPUS": (24, 0), "SSD_TOTAL_GB": (250, 100)}},
            # the 200 GB boot disk and the 100 GB data disk, both pd-balanced
            "SSD_TOTAL_GB in us-central1: limit 250, in use 100, needs 300 -> ask for 400",
        ),
        ({"offered": ["nvidia-tesla-v100"]}, "nvidia-tesla-t4 is not offered in us-central1-a"),
    ],
)
def test_preflight_shortfalls(compute_api: Api, capsys: pytest.CaptureFixture, change: dict, words: str) -> None:
    compute_api.state.update(change)
    assert preflight.main(["--stack", "pf"], compute_api.env) == 1
    out = capsys.readouterr().out
    assert "The stack cannot fit:" in out and words in out
    assert ("iam-admin/quotas?project=p" in out) == ("->" in words)  # each short quota says where to raise it


@pytest.mark.parametrize(
    ("region", "metric", "status", "note"),
    [
        # A preemptible grant above 0: spot is judged against it.
        (
            {"PREEMPTIBLE_NVIDIA_T4_GPUS": (4, 0), "NVIDIA_T4_GPUS": (0, 0)},
            "PREEMPTIBLE_NVIDIA_T4_GPUS",
            "ok",
            "judged against PREEMPTIBLE_NVIDIA_T4_GPUS (this project has 4 of it)",
        ),
        # Preemptible listed at 0 (a project never granted any): the VM uses the standard quota, which fits.
        (
            {"PREEMPTIBLE_NVIDIA_T4_GPUS": (0, 0), "NVIDIA_T4_GPUS": (2, 0)},
            "NVIDIA_T4_GPUS",
            "ok",
            "judged against NVIDIA_T4_GPUS, since PREEMPTIBLE_NVIDIA_T4_GPUS is 0 here",
        ),
        ({"NVIDIA_T4_GPUS": (1, 0)}, "NVIDIA_T4_GPUS", "SHORT", "since PREEMPTIBLE_NVIDIA_T4_GPUS is none here"),
    ],
)
def test_preflight_judges_spot_by_the_quota_it_will_use(
    compute_api: Api, capsys: pytest.CaptureFixture, region: dict, metric: str, status: str, note: str
) -> None:
    compute_api.state["region"] = {**region, "CPUS": (24, 0), "SSD_TOTAL_GB": (500, 0)}
    assert preflight.main(["--stack", "pf"], compute_api.env) == (0 if status == "ok" else 1)
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(("NVIDIA_T4", "PREEMPTIBLE_NVIDIA_T4")))
    assert lines[at].split()[0] == metric and lines[at].split()[-1] == status
    assert note in lines[at + 1]


def test_preflight_counts_hyperdisk_against_its_own_quota(compute_api: Api, capsys: pytest.CaptureFixture) -> None:
    (compute_api.env.new_stacks_dir / "Pulumi.a4.yaml").write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-b\n  gpu-train:machineType: a4-highgpu-8g\n"
        "  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n  gpu-train:bootDiskSizeGb: 400\n"
    )
    compute_api.state.update(
        region={"CPUS": (300, 0), "SSD_TOTAL_GB": (10000, 0), "HYPERDISK_BALANCED_TOTAL_GB": (300, 0)}, offered=["nvidia-b200"]
    )
    assert preflight.main(["--stack", "a4"], compute_api.env) == 1
    out = capsys.readouterr().out
    # the 400 GB boot disk and the 100 GB data disk, both Hyperdisk (A4 takes nothing else)
    assert "HYPERDISK_BALANCED_TOTAL_GB in us-central1: limit 300, in use 0, needs 500" in out
    assert not any(line.strip().startswith("SSD_TOTAL_GB") for line in out.splitlines())


def test_preflight_unreachable_api(compute_api: Api, capsys) -> None:
    nowhere = compute_api.env.replace(compute_endpoint="http://127.0.0.1:9")  # nothing listens there
    assert preflight.main(["--stack", "pf"], nowhere) == 2
    assert "cannot read the project's quotas" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "metrics", "expected"),
    [
        ({}, set(), ["NVIDIA_T4_GPUS", "CPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"]),
        (
            {"spot": True, "bootDiskType": "pd-standard"},
            {"PREEMPTIBLE_NVIDIA_T4_GPUS", "PREEMPTIBLE_CPUS"},
            # the pd-standard boot disk against DISKS_TOTAL_GB, the data disk (the series' pd-balanced) against SSD
            ["PREEMPTIBLE_NVIDIA_T4_GPUS", "PREEMPTIBLE_CPUS", "DISKS_TOTAL_GB", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),
        ({"spot": True}, set(), ["NVIDIA_T4_GPUS", "CPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"]),  # none granted
        # Only N1 counts vCPUs: A2, A3, A4, G2 need GPU quota only (no CPUS row, A2_CPUS listed or not).
        (
            {"machineType": "a2-highgpu-1g", "gpuType": None, "gpuCount": None},
            {"A2_CPUS"},
            ["NVIDIA_A100_GPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),
        (
            {"machineType": "g2-standard-8", "gpuType": None, "gpuCount": None},
            set(),
            ["NVIDIA_L4_GPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),
        (
            {"machineType": "a3-ultragpu-8g", "gpuType": None, "gpuCount": None, "spot": True, "zone": "us-central1-b"},
            set(),
            [None, "HYPERDISK_BALANCED_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),  # Hyperdisk: its own quota
        # Flex-start: preemptible quota first, as spot.
        (
            {"machineType": "a2-highgpu-1g", "gpuType": None, "gpuCount": None, "flexStart": True, "maxRunHours": 2},
            {"PREEMPTIBLE_NVIDIA_A100_GPUS"},
            ["PREEMPTIBLE_NVIDIA_A100_GPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),
        (
            {"machineType": "a2-highgpu-1g", "gpuType": None, "gpuCount": None, "flexStart": True, "maxRunHours": 2},
            set(),
            ["NVIDIA_A100_GPUS", "SSD_TOTAL_GB", "GPUS_ALL_REGIONS"],
        ),
    ],
)
def test_quota_needs(settings: dict, metrics: set, expected: list) -> None:
    cfg = config.parse(gcp_raw(**settings), "s", CATALOG)
    shape = validate.shape_of(cfg, CATALOG)
    assert [n.metric for n in quota.needs(cfg, shape, dict.fromkeys(metrics, (1.0, 0.0)), CATALOG)] == expected
