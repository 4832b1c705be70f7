"""Node pools: one cluster whose nodes have different shapes (a GPU chief and workers, CPU parameter servers).

AI Platform clusters had a master, workers and parameter servers of their own machine types; the
parameter servers usually had no GPU. A stack says so with ``pools``::

    gpu-train:pools:
      - {role: chief, machineType: n1-highcpu-16, gpuType: nvidia-tesla-t4, gpuCount: 4}
      - {role: worker, count: 9, machineType: n1-highcpu-16, gpuType: nvidia-tesla-t4, gpuCount: 4}
      - {role: ps, count: 3, machineType: n1-highmem-8}

Nodes are numbered chief first, then workers, then parameter servers: the order TF_CONFIG's roles
already follow (the last ``ps`` nodes are parameter servers), so every node-level task works on
pools as on ``nodes``. Pure: parsing, the rules each pool must meet, and the per-node shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpu_train.stack.problems import Problem
from gpu_train.stack.settings import StackConfig

if TYPE_CHECKING:  # (Compute Engine's rules load with a GCP stack's checks, never for an SSH stack's parse)
    from gpu_train.catalog.model import Catalog

ROLES = ("chief", "worker", "ps")
POOL_KEYS = {"role", "count", "machineType", "gpuType", "gpuCount"}
MAX_POOL_NODES = 1000  # a bound, so a typo cannot declare (or plan) 100,000 VMs
SHAPE_KEYS = ("machineType", "gpuType", "gpuCount")


@dataclass(frozen=True)
class Pool:
    role: str
    count: int
    machine_type: str
    gpu_type: str | None = None
    gpu_count: int | None = None


@dataclass(frozen=True)
class NodeShape:
    """What one node is: its pool's role and shape (gpu_count 0 for a CPU-only node)."""

    role: str
    machine_type: str
    gpu_type: str | None
    gpu_count: int


def parse_pools(raw: Any) -> tuple[tuple[Pool, ...], list[Problem]]:
    """The ``pools`` setting (YAML list, or JSON from `pulumi config set --path`): pools in node order."""
    if raw is None or raw == [] or raw == ():
        return (), []
    if not isinstance(raw, list | tuple):
        return (), [Problem("pools", "expected a list of pools", "e.g. [{role: chief, machineType: ...}, ...]")]
    pools, problems = [], []
    for i, item in enumerate(raw):
        where = f"pools[{i}]"
        if not isinstance(item, dict):
            problems.append(
                Problem(
                    where,
                    "expected a mapping with role, count, machineType, gpuType, gpuCount",
                    "write each pool as {role: worker, count: 2, machineType: ...}",
                )
            )
            continue
        unknown = sorted(set(item) - POOL_KEYS)
        if unknown:
            problems.append(Problem(where, f"unknown field {unknown[0]!r}", f"a pool takes {', '.join(sorted(POOL_KEYS))}"))
        role = item.get("role", "worker")
        if role not in ROLES:
            problems.append(Problem(f"{where}.role", f"must be one of {', '.join(ROLES)}", "e.g. role: worker", role))
            continue
        count, gpu_count = item.get("count", 1), item.get("gpuCount")
        bad_int = [
            (k, v)
            for k, v in (("count", count), ("gpuCount", gpu_count))
            if v is not None and (isinstance(v, bool) or not str(v).isdigit())
        ]
        for k, v in bad_int:
            problems.append(Problem(f"{where}.{k}", "expected a whole number", f"set {k} to a number", v))
        machine = item.get("machineType")
        if not isinstance(machine, str) or not machine.strip():
            problems.append(Problem(f"{where}.machineType", "is required", "e.g. machineType: n1-standard-8"))
            continue
        if bad_int:
            continue
        gpu = item.get("gpuType")
        pools.append(
            Pool(role, int(count), machine.strip(), str(gpu).strip() if gpu else None, int(gpu_count) if gpu_count is not None else None)
        )
    order = {r: i for i, r in enumerate(ROLES)}
    return tuple(sorted(pools, key=lambda p: order[p.role])), problems


def node_shapes(pools: tuple[Pool, ...], catalog: Catalog) -> list[NodeShape]:
    """One entry per node, in node order (chief, workers, parameter servers)."""
    out = []
    for p in pools:
        machine = catalog.parse_machine_type(p.machine_type)
        if machine is not None and machine.fixed is not None:
            shape = NodeShape(p.role, p.machine_type, machine.fixed.gpu_type, machine.fixed.gpu_count)
        else:
            shape = NodeShape(p.role, p.machine_type, p.gpu_type, p.gpu_count or 0 if p.gpu_type else 0)
        out += [shape] * p.count
    return out


def boot_disk_type(cfg: StackConfig, machine_type: str, catalog: Catalog) -> str:
    """A node's boot disk type: the stack's when set, else its own series' (pools may mix series)."""
    from gpu_train.catalog import disks

    return cfg.boot_disk_type if "bootDiskType" in cfg.given else disks.default_disk_type(catalog, machine_type)


def pool_config(cfg: StackConfig, pool: Pool) -> StackConfig:
    """The stack as one pool sees it: the shape settings are the pool's."""
    given = (
        (cfg.given - set(SHAPE_KEYS))
        | {"machineType"}
        | ({"gpuType"} if pool.gpu_type else set())
        | ({"gpuCount"} if pool.gpu_count is not None else set())
    )
    return replace(
        cfg,
        machine_type=pool.machine_type,
        gpu_type=pool.gpu_type,
        gpu_count=pool.gpu_count,
        nodes=pool.count,
        pools=(),
        given=frozenset(given),
    )


def check_pools(cfg: StackConfig, catalog: Catalog, shape_rules: Callable[[StackConfig, Catalog], list[Problem]]) -> list[Problem]:
    """Every pool's own problems, named ``pools[i].KEY``; ``shape_rules(cfg, catalog)`` are validate's
    GPU rules (machine, GPUs, zone) for one shape, passed in to keep this module below validate."""
    from gpu_train.catalog import disks

    pools = cfg.pools
    if not pools:
        return []
    problems = []
    clash = sorted(k for k in (*SHAPE_KEYS, "nodes") if k in cfg.given)
    if clash:
        problems.append(
            Problem(
                clash[0],
                "is set together with pools: with pools, each pool has its own shape",
                f"remove {', '.join(clash)} from the stack, or remove pools",
            )
        )
    chiefs = [p for p in pools if p.role == "chief"]
    if len(chiefs) != 1 or chiefs[0].count != 1:
        problems.append(
            Problem(
                "pools",
                "needs exactly one chief pool with count 1 (node 0, which leads)",
                "e.g. - {role: chief, machineType: ..., gpuType: ..., gpuCount: ...}",
            )
        )
    total = sum(p.count for p in pools)
    if not 1 <= total <= MAX_POOL_NODES or any(p.count < 1 for p in pools):
        problems.append(
            Problem(
                "pools", f"each pool needs count 1 or more, and {MAX_POOL_NODES} nodes at most in all", "check the pools' counts", total
            )
        )
    for i, pool in enumerate(pools):
        where = f"pools[{i}]"
        machine = catalog.parse_machine_type(pool.machine_type)
        cpu_only = pool.gpu_type is None and (machine is None or machine.fixed is None)
        if cpu_only and pool.role != "ps":
            problems.append(
                Problem(
                    f"{where}.gpuType",
                    f"a {pool.role} pool needs GPUs",
                    "set gpuType and gpuCount, or use a GPU shape; only ps pools may be CPU only",
                )
            )
            continue
        if cpu_only:
            if machine is None or machine.vcpus is None or (machine.series == "n1" and machine.memory_gb is None):
                problems.append(
                    Problem(f"{where}.machineType", "is not a machine type gpu-train knows", "e.g. n1-highmem-8", pool.machine_type)
                )
            continue
        if "bootDiskType" in cfg.given and (why := disks.disk_type_problem(catalog, pool.machine_type, cfg.boot_disk_type)) is not None:
            problems.append(
                Problem(
                    "bootDiskType", f"{where}: {why}", "remove bootDiskType: each pool then gets its series' own type", cfg.boot_disk_type
                )
            )
        for p in shape_rules(pool_config(cfg, pool), catalog):
            key = p.key.removeprefix("gpu-train:")
            if key in SHAPE_KEYS:
                p = replace(p, key=f"{where}.{key}")
            elif key != "nodes":  # the zone's rules: say which pool they are about
                p = replace(p, message=f"{where} ({pool.machine_type}): {p.message}")
            if key != "nodes":  # the cluster's own node rules run once, on the whole stack
                problems.append(p)
    return _dedupe(problems)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            out.append(p)
    return out
