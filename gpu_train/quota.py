"""Will the stack fit in the project's quotas? Pure decisions on quota names, needs and shortfalls.

Compute Engine counts a GPU VM against: the region's GPU metric (its PREEMPTIBLE_ twin for spot),
the region's CPU quota (CPUS, or the series' own such as A2_CPUS), the region's disk quota, and the
project-wide GPUS_ALL_REGIONS, often 0 on a new project. Reference section 5.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_train.catalog import Catalog
from gpu_train.config import StackConfig
from gpu_train.disks import disk_quota_metric
from gpu_train.validate import GpuShape

SERVICE = "compute.googleapis.com"


@dataclass(frozen=True)
class Need:
    metric: str | None  # None: the catalog knows no metric for this GPU (a per-family quota)
    scope: str  # a region, or "global"
    amount: int
    what: str


@dataclass(frozen=True)
class Row:
    need: Need
    limit: float | None
    usage: float | None

    @property
    def free(self) -> float | None:
        return None if self.limit is None or self.usage is None else self.limit - self.usage

    @property
    def ok(self) -> bool | None:
        return None if self.free is None else self.free >= self.need.amount


def gpu_metric(gpu_type: str, spot: bool, catalog: Catalog) -> str | None:
    acc = catalog.accelerator(gpu_type)
    if acc is None or acc.quota_metric is None:
        return None
    return f"PREEMPTIBLE_{acc.quota_metric}" if spot else acc.quota_metric


def cpu_metric(machine_type: str, region_metrics: set[str], catalog: Catalog) -> str:
    """N1 counts against CPUS; other series against their own (A2_CPUS, G2_CPUS, ...) where listed."""
    series = catalog.series_of(machine_type)
    own = f"{series}_CPUS"
    return own if series != "N1" and own in region_metrics else "CPUS"


def needs(cfg: StackConfig, shape: GpuShape, region_metrics: set[str], catalog: Catalog) -> list[Need]:
    n = cfg.nodes
    disk = disk_quota_metric(catalog, cfg.boot_disk_type)
    return [
        Need(gpu_metric(shape.gpu_type, cfg.spot, catalog), cfg.region, shape.gpu_count * n,
             f"{shape.gpu_count * n} x {shape.gpu_type}" + (" (spot)" if cfg.spot else "")),
        Need(cpu_metric(shape.machine_type, region_metrics, catalog), cfg.region, (shape.vcpus or 0) * n,
             f"{(shape.vcpus or 0) * n} vCPUs of {shape.machine_type}"),
        Need(disk, cfg.region, cfg.boot_disk_size_gb * n, f"{cfg.boot_disk_size_gb * n} GB of {cfg.boot_disk_type}"),
        Need(catalog.global_quota_metric, "global", shape.gpu_count * n, "GPUs in all regions"),
    ]


def evaluate(wanted: list[Need], region_quotas: dict[str, tuple[float, float]],
             global_quotas: dict[str, tuple[float, float]]) -> list[Row]:
    """Each need beside its quota's (limit, usage); a metric the project does not list stays unknown."""
    rows = []
    for need in wanted:
        table = global_quotas if need.scope == "global" else region_quotas
        limit, usage = table.get(need.metric, (None, None)) if need.metric else (None, None)
        rows.append(Row(need, limit, usage))
    return rows


def advice(row: Row, project: str) -> str:
    """How to raise a short quota, naming it exactly."""
    n = row.need
    target = int((row.usage or 0) + n.amount)
    where = "globally" if n.scope == "global" else f"in {n.scope}"
    return (f"{n.metric} {where}: limit {row.limit:g}, in use {row.usage:g}, needs {n.amount} -> ask for {target}: "
            f"https://console.cloud.google.com/iam-admin/quotas?project={project} (filter: {n.metric}), "
            "or set gpu-train:quotaRequest to request it from `pulumi up`")


def preferences(cfg: StackConfig, shape: GpuShape, gpus: int, catalog: Catalog) -> list[dict[str, object]]:
    """The Cloud Quotas preferences `quotaRequest` declares: the region's GPU quota (per family where
    the GPU has one, else per model) and the project-wide GPUS-ALL-REGIONS."""
    acc = catalog.accelerator(shape.gpu_type)
    out = []
    if acc is not None and acc.gpu_family:
        out.append({"quota_id": catalog.family_quota_id, "dimensions": {"region": cfg.region, "gpu_family": acc.gpu_family}})
    elif acc is not None and acc.quota_id:
        quota_id = f"PREEMPTIBLE-{acc.quota_id}" if cfg.spot else acc.quota_id
        out.append({"quota_id": quota_id, "dimensions": {"region": cfg.region}})
    out.append({"quota_id": catalog.global_quota_id, "dimensions": {}})
    return [{**p, "preferred": gpus} for p in out]
