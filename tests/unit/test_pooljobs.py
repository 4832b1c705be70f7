"""`train --pools`: each pool's own job (gpu_train/pooljobs.py), read and checked, given to its nodes by
their place in the cluster; the agent refuses a pool's job on a node of another pool. (Imported from a
Vertex job with pools of different images: test_import_containers.py; end to end on a real dockerd:
tests/e2e/test_container_vertex.py.)"""

from __future__ import annotations

import pytest
import yaml

from agent.launch import check_pool
from agent.store import AgentError
from gpu_train import jobs, pooljobs
from gpu_train.containerspec import ContainerSpec
from gpu_train.contract import JobSpec, node_roles
from gpu_train.jobargs import JobError

POOLS = """
worker:
  image: reg.example/w:2
  entrypoint: [/bin/prog, b]
  args: "--lr 0.2"
  env: {GREETING: hello worker, N: 3}
ps:
  image: reg.example/ps:1
  command: python -m trainer.ps --steps 9
"""


def chief(**kw) -> JobSpec:
    base = dict(run_id="r_1", base="r", container=ContainerSpec("reg.example/c:1", own_program=True), env={"GREETING": "chief"})
    return JobSpec(**{**base, **kw})


@pytest.mark.parametrize(
    ("nnodes", "ps", "roles"),
    [(1, 0, ["chief"]), (2, 0, ["chief", "worker"]), (4, 1, ["chief", "worker", "worker", "ps"]), (2, 1, ["chief", "ps"])],
)
def test_node_roles(nnodes, ps, roles):
    assert node_roles(nnodes, ps) == roles


def test_each_node_runs_its_pools_job():
    pools = pooljobs.read_pools(yaml.safe_load(POOLS), "p.yaml")
    env = {"GREETING": "chief", "GPU_TRAIN_REGISTRY_TOKEN": "t"}
    specs = jobs.node_specs(chief(env=env), ["a", "b", "c", "d"], "a", 29500, ps=1)
    out = pooljobs.apply(specs, pools, ps=1)
    assert [s.pool for s in out] == [None, "worker", "worker", "ps"]
    assert out[0] == specs[0]
    w = out[1]
    assert w.container == ContainerSpec("reg.example/w:2", own_program=True, entrypoint=("/bin/prog", "b"), args=("--lr", "0.2"))
    assert w.env == {"GREETING": "hello worker", "N": "3", "GPU_TRAIN_REGISTRY_TOKEN": "t"}  # its own env, the pull's token kept
    assert w.node == specs[1].node  # its place in the cluster: TF_CONFIG's worker 0
    p = out[3]
    assert (p.container, p.command) == (ContainerSpec("reg.example/ps:1"), "python -m trainer.ps --steps 9")
    assert p.env == {"GPU_TRAIN_REGISTRY_TOKEN": "t"}
    assert all("hello worker" not in line for line in pooljobs.describe(pools))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("chief: {image: a}", "not a pool"),
        ("worker: {entrypoint: [x]}", "worker.image: missing"),
        ("worker: {image: 'Bad Image'}", "worker.image: 'Bad Image'"),
        ("worker: {image: a, command: x, args: [y]}", "give one"),
        ("worker: {image: a, env: {1X: v}}", "worker.env"),
        ("worker: {image: a, envs: {}}", "unknown key 'envs'"),
        ("worker: {image: a, args: {a: b}}", "worker.args: expected a list"),
        ("[a]", "expected a mapping of pools"),
        ("worker: {image: a, env: {JOB_DIR: x}}", "gpu-train sets JOB_DIR itself"),
    ],
)
def test_a_bad_pools_file_is_refused_naming_the_field(text, words):
    with pytest.raises(JobError, match=None) as e:
        pooljobs.read_pools(yaml.safe_load(text), "p.yaml")
    assert words in str(e.value) and "--pools p.yaml" in str(e.value)


def test_every_problem_at_once():
    with pytest.raises(JobError) as e:
        pooljobs.read_pools(yaml.safe_load("worker: {}\nps: {image: 'X'}"), "p.yaml")
    assert "worker" in str(e.value) and "ps.image" in str(e.value)


@pytest.mark.parametrize(
    ("hosts", "ps", "pools", "words"),
    [
        (["a"], 0, "worker: {image: w}", "names the worker pool, but this cluster has none (1 node(s): 1 chief)"),
        (["a", "b"], 0, "ps: {image: p}", "names the ps pool, but this cluster has none (2 node(s): 1 chief, 1 worker)"),
    ],
)
def test_a_pool_the_cluster_lacks_is_refused(hosts, ps, pools, words):
    specs = jobs.node_specs(chief(), hosts, "a", 29500, ps)
    with pytest.raises(JobError, match=None) as e:
        pooljobs.apply(specs, pooljobs.read_pools(yaml.safe_load(pools), "p"), ps)
    assert words in str(e.value)


def test_torchrun_cannot_mix_jobs():
    specs = jobs.node_specs(chief(launcher="torchrun", container=None, script="t.py"), ["a", "b"], "a", 29500, 0)
    with pytest.raises(JobError, match="--launcher none"):
        pooljobs.apply(specs, pooljobs.read_pools({"worker": {"image": "w"}}, "p"), 0)


@pytest.mark.parametrize(
    ("pool", "rank", "ps", "ok"),
    [("worker", 1, 0, True), ("ps", 1, 1, True), ("worker", 0, 0, False), ("ps", 1, 0, False), ("worker", 5, 0, False)],
)
def test_the_agent_runs_a_pools_job_on_that_pools_nodes_only(pool, rank, ps, ok):
    spec = chief(pool=pool, node={"rank": rank, "nnodes": 2, "ps": ps})
    if ok:
        check_pool(spec)
    else:
        with pytest.raises(AgentError, match=f"the {pool} pool's job"):
            check_pool(spec)


def test_the_pool_crosses_the_contract():
    spec = chief(pool="worker", node={"rank": 1, "nnodes": 2})
    assert JobSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="pool"):
        JobSpec.from_json({**spec.to_json(), "pool": 3})
