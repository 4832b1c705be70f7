"""Node pools: the rules each pool meets, and the program under mocks (instances per pool, one
placement policy where every pool's series takes one, the firewall between the pools' nodes)."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import validate
from gpu_train.stack import config
from infra import program
from infra.ops import plan, preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
T4 = {"machineType": "n1-standard-16", "gpuType": "nvidia-tesla-t4", "gpuCount": 4}
AIP = [
    {"role": "ps", "count": 2, "machineType": "n1-highmem-8"},  # order given need not be node order
    {"role": "chief", **T4},
    {"role": "worker", "count": 3, **T4},
]


def pools_raw(pools: list, **over: object) -> dict:
    return gcp_raw(**{"machineType": None, "gpuType": None, "gpuCount": None, "pools": pools, **over})


def problems(raw: dict) -> list[str]:
    try:
        _, warnings = validate.check(raw, "p", CATALOG)
    except config.ConfigError as e:
        return [str(p) for p in e.problems]
    return [str(w) for w in warnings]


def test_pools_parse_into_node_order() -> None:
    cfg, warnings = validate.check(pools_raw(AIP), "p", CATALOG)
    assert [p.role for p in cfg.pools] == ["chief", "worker", "ps"]
    assert cfg.nodes == 6 and (cfg.machine_type, cfg.gpu_type, cfg.gpu_count) == ("n1-standard-16", "nvidia-tesla-t4", 4)
    shapes = validate.node_shapes(cfg, CATALOG)
    assert [s.gpu_count for s in shapes] == [4, 4, 4, 4, 0, 0]
    assert [s.machine_type for s in shapes][-2:] == ["n1-highmem-8", "n1-highmem-8"]
    assert any("no compact placement" in str(w) for w in warnings)  # N1: placed anywhere in the zone


@pytest.mark.parametrize(
    "pools, over, words",
    [
        ([{"role": "worker", **T4}], {}, "exactly one chief"),
        ([{"role": "chief", "count": 2, **T4}], {}, "exactly one chief"),
        ([{"role": "chief", **T4}, {"role": "worker", "count": 2, "machineType": "n1-standard-8"}], {}, "needs GPUs"),
        ([{"role": "chief", **T4}, {"role": "boss", **T4}], {}, "must be one of chief, worker, ps"),
        ([{"role": "chief", **T4, "gpuCount": 3}], {}, "counts of 1, 2, 4 only"),
        ([{"role": "chief", **T4}, {"role": "ps", "machineType": "n1-mega-8"}], {}, "not a machine type"),
        ([{"role": "chief", **T4}], {"nodes": 3}, "set together with pools"),
        ([{"role": "chief", **T4}], {"machineType": "n1-standard-8"}, "set together with pools"),
        ([{"role": "chief", **T4}, {"role": "worker", "count": 5000, **T4}], {}, "1000 nodes at most"),
        ([{"role": "chief", **T4}, {"role": "worker", "count": "two", **T4}], {}, "whole number"),
        ([{"role": "chief", **T4, "gpus": 4}], {}, "unknown field 'gpus'"),
        (
            [
                {"role": "chief", "machineType": "a2-highgpu-1g"},
                {"role": "worker", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-v100", "gpuCount": 1},
            ],
            {"zone": "us-central1-b"},
            None,
        ),
        (
            [
                {"role": "chief", "machineType": "g2-standard-8"},
                {"role": "worker", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-p100", "gpuCount": 1},
            ],
            {"zone": "us-central1-a"},
            "pools[1].gpuType = 'nvidia-tesla-p100': reached end of support on 2026-09-15",
        ),
    ],
)
def test_pool_rules(pools, over, words) -> None:
    found = problems(pools_raw(pools, **over))
    errors = [p for p in found if "placement" not in p]
    if words is None:
        assert errors == []
    else:
        assert any(words in p for p in errors), found


def test_pools_under_mocks(public_key) -> None:
    raw = pools_raw(
        [
            {"role": "chief", "machineType": "g2-standard-24"},
            {"role": "worker", "count": 2, "machineType": "g2-standard-24"},
            {"role": "ps", "count": 1, "machineType": "n1-highmem-8"},
        ],
        sshPublicKey=str(public_key),
    )
    result = preview.run(program.main, stack="p", config=raw)
    assert result.error is None, result.error
    instances = sorted(result.of_type("compute/instance:Instance"), key=lambda r: r.inputs["name"])
    assert [i.inputs["machineType"] for i in instances] == ["g2-standard-24"] * 3 + ["n1-highmem-8"]
    assert all(not i.inputs.get("guestAccelerators") for i in instances)  # G2 carries its GPUs; the ps has none
    # N1 takes no compact placement, so neither does the cluster; the nodes still talk to each other.
    assert not result.of_type("compute/resourcePolicy:ResourcePolicy")
    (internal,) = [f for f in result.of_type("compute/firewall:Firewall") if f.inputs["name"].endswith("-internal")]
    assert internal.inputs["sourceTags"] == internal.inputs["targetTags"]
    assert result.outputs["nodeGpuCounts"] == [2, 2, 2, 0]
    assert result.outputs["nodeRoles"] == ["chief", "worker", "worker", "ps"]
    assert len(result.outputs["externalIps"]) == 4


def test_one_placement_when_every_pool_takes_one(public_key) -> None:
    raw = pools_raw(
        [{"role": "chief", "machineType": "a2-highgpu-2g"}, {"role": "worker", "count": 2, "machineType": "a2-highgpu-1g"}],
        sshPublicKey=str(public_key),
    )
    result = preview.run(program.main, stack="p", config=raw)
    assert result.error is None, result.error
    (policy,) = result.of_type("compute/resourcePolicy:ResourcePolicy")
    assert policy.inputs["groupPlacementPolicy"]["vmCount"] == 3
    instances = result.of_type("compute/instance:Instance")
    region = "https://www.googleapis.com/compute/v1/projects/proj-1/regions/us-central1"
    link = f"{region}/resourcePolicies/{policy.inputs['name']}"
    assert [i.inputs["resourcePolicies"] for i in instances] == [link] * 3  # every node names the one policy


def test_plan_shows_cost_per_pool() -> None:
    raw = pools_raw(
        [
            {"role": "chief", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1},
            {"role": "worker", "count": 2, "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1},
            {"role": "ps", "count": 2, "machineType": "n1-standard-8"},
        ]
    )
    text, code = plan.plan(raw, "p")
    assert code == 0, text
    # n1-standard-8 $0.38/h + one T4 $0.35/h; the parameter servers pay the machine only.
    assert "chief  node 0       1 x n1-standard-8 (1 x nvidia-tesla-t4): $0.73/h" in text
    assert "worker nodes 1-2    2 x n1-standard-8 (1 x nvidia-tesla-t4): $1.46/h" in text
    assert "ps     nodes 3-4    2 x n1-standard-8 (no GPU): $0.76/h" in text
    assert "all 5 nodes: $2.95/h" in text
    assert "GPUs: none (CPU only)" in text


def test_quota_needs_add_up_over_pools() -> None:
    from gpu_train.gcp import quota

    cfg, _ = validate.check(
        pools_raw(
            [{"role": "chief", **T4}, {"role": "worker", "count": 2, **T4}, {"role": "ps", "count": 3, "machineType": "n1-highmem-8"}]
        ),
        "p",
        CATALOG,
    )
    nodes = validate.node_shapes(cfg, CATALOG)
    region = {"NVIDIA_T4_GPUS": (100.0, 0.0), "CPUS": (1000.0, 0.0)}
    by_metric = {(n.metric, n.scope): n for n in quota.needs(cfg, nodes[0], region, CATALOG, nodes)}
    assert by_metric[("NVIDIA_T4_GPUS", "us-central1")].amount == 12  # 3 GPU nodes x 4; the ps add none
    cpus = by_metric[("CPUS", "us-central1")]
    assert cpus.amount == 3 * 16 + 3 * 8 and cpus.what == "48 vCPUs of n1-standard-16 + 24 vCPUs of n1-highmem-8"
    assert by_metric[("GPUS_ALL_REGIONS", "global")].amount == 12
    # each of the 6 nodes: its 200 GB boot disk and its 100 GB data disk
    assert sum(n.amount for n in by_metric.values() if n.metric and "TOTAL_GB" in n.metric) == 6 * (200 + 100)


def test_the_target_knows_each_nodes_gpus_and_role(tmp_path) -> None:
    from remote.ssh.target import target_from

    cfg, _ = validate.check(
        pools_raw([{"role": "chief", **T4}, {"role": "worker", **T4}, {"role": "ps", "machineType": "n1-highmem-8"}]), "p", CATALOG
    )
    outputs = {
        "sshUser": "trainer",
        "externalIps": ["198.51.100.1", "198.51.100.2", "198.51.100.3"],
        "internalIps": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        "gpuCount": 4,
        "nodeGpuCounts": [4, 4, 0],
        "nodeRoles": ["chief", "worker", "ps"],
    }
    t = target_from(cfg, outputs, tmp_path)
    assert t.parameter_servers == 1 and t.master_addr == "10.0.0.1"
    assert [(n.expect_gpus, n.gpus_per_node, n.host.host) for n in map(t.for_node, range(3))] == [
        (4, 4, "198.51.100.1"),
        (4, 4, "198.51.100.2"),
        (0, None, "198.51.100.3"),
    ]


@pytest.mark.parametrize("option, pools, expected", [(None, 0, 0), (None, 3, 3), ("2", 0, 2), ("3", 3, 3), ("", 1, 1)])
def test_parameter_servers(option, pools, expected) -> None:
    from gpu_train import jobs

    assert jobs.parameter_servers(option, pools) == expected


@pytest.mark.parametrize("option, pools, words", [("2", 3, "pools make the last 3"), ("x", 0, "whole number")])
def test_parameter_servers_refused(option, pools, words) -> None:
    from gpu_train import jobs

    with pytest.raises(jobs.JobError, match=words):
        jobs.parameter_servers(option, pools)


def test_per_node_gpus() -> None:
    from gpu_train import jobs
    from gpu_train.contract import JobSpec

    specs = [JobSpec(run_id="r", base="r", script="t.py", launcher="torchrun", nproc=None)] * 3
    out = jobs.per_node_gpus(specs, [2, 1, 1], "torchrun", nproc_given=False)
    assert [(s.expect_gpus, s.nproc) for s in out] == [(2, 2), (1, 1), (1, 1)]  # torchrun over unequal nodes
    given = [JobSpec(run_id="r", base="r", script="t.py", launcher="torchrun", nproc=1)] * 3
    assert [s.nproc for s in jobs.per_node_gpus(given, [2, 1, 1], "torchrun", nproc_given=True)] == [1, 1, 1]
    assert jobs.per_node_gpus(specs, [], "torchrun", False) == specs  # no pools: as before
    with pytest.raises(jobs.JobError, match=r"node 2 .*no GPU"):
        jobs.per_node_gpus(specs, [2, 1, 0], "torchrun", nproc_given=False)
    commands = [JobSpec(run_id="r", base="r", command="python -m t")] * 3
    assert [s.expect_gpus for s in jobs.per_node_gpus(commands, [4, 4, 0], "none", False)] == [4, 4, 0]
