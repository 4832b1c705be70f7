"""Will the stack fit in the project's quotas? Pure decisions on quota names, needs and shortfalls.

Compute Engine counts a GPU VM against: the region's GPU metric, the region's CPU quota where the
series counts one (only N1: A2, A3, A4, A4X, G2 and G4 VMs need GPU quota only; catalog
``cpuQuotaSeries``), the region's quota for each of its disks' types (Hyperdisk has its
own; every node has a boot disk and a data disk, and the two may differ in type), and the project-wide
GPUS_ALL_REGIONS, often 0 on a new project. Reference section 5.

A spot VM counts against the PREEMPTIBLE_ twin of a GPU or CPU quota only where the project has
been granted some of it (limit above 0); otherwise it uses the standard quota, like an on-demand VM
(Compute Engine, "Create and use Spot VMs", before you begin). Judging spot by the preemptible quota
alone would call a project SHORT where the VM would in fact be created.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from gpu_train.catalog.disks import disk_quota_metric
from gpu_train.catalog.model import Catalog
from gpu_train.gcp.validate import GpuShape
from gpu_train.gcp.vm import data_disk_type
from gpu_train.stack.settings import StackConfig

SERVICE = "compute.googleapis.com"


@dataclass(frozen=True)
class Need:
    metric: str | None  # None: the catalog knows no metric for this GPU (a per-family quota)
    scope: str  # a region, or "global"
    amount: int
    what: str
    note: str = ""  # which quota was chosen and why (spot: preemptible or standard)


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


Quotas = Mapping[str, tuple[float, float]]  # metric -> (limit, usage), as regions.get lists them


def gpu_metric(gpu_type: str, catalog: Catalog) -> str | None:
    """The standard regional GPU metric (None: the catalog knows none, e.g. a per-family quota)."""
    acc = catalog.accelerator(gpu_type)
    return None if acc is None else acc.quota_metric


def spot_metric(standard: str, region_quotas: Quotas) -> tuple[str, str]:
    """The quota a spot VM counts against for ``standard``, and a sentence saying why."""
    twin = f"PREEMPTIBLE_{standard}"
    limit = region_quotas.get(twin, (0.0, 0.0))[0]
    if limit > 0:
        return twin, f"spot/flex-start: judged against {twin} (this project has {limit:g} of it)"
    granted = "0" if twin in region_quotas else "none"
    return standard, (
        f"spot/flex-start: judged against {standard}, since {twin} is {granted} here (spot and Flex-start VMs then use the standard quota)"
    )


def cpu_metric(machine_type: str, catalog: Catalog) -> str | None:
    """CPUS for the series Compute Engine counts vCPUs of (N1); None for the GPU series, which need GPU
    quota only (a CPU shortfall reported for them would be false, and stop scripts/up for nothing)."""
    return "CPUS" if catalog.series_of(machine_type) in catalog.cpu_quota_series else None


def needs(cfg: StackConfig, shape: GpuShape, region_quotas: Quotas, catalog: Catalog, nodes: list[GpuShape] | None = None) -> list[Need]:
    """What the stack's VMs take from each quota; ``region_quotas`` decides spot's (see the module).

    ``nodes`` is each node's shape when they differ (pools); by default every node has ``shape``.
    Needs of the same quota add up, so a pool of CPU-only parameter servers adds vCPUs, not GPUs.
    """
    boot_disk = disk_quota_metric(catalog, cfg.boot_disk_type)
    spot = " (spot)" if cfg.spot else " (flex-start)" if cfg.flex_start else ""
    totals: dict[tuple[str | None, str], dict[str, int]] = {}  # (metric, scope) -> {what: amount}
    notes: dict[tuple[str | None, str], str] = {}

    def add(metric: str | None, scope: str, amount: int, what: str, note: str = "") -> None:
        per = totals.setdefault((metric, scope), {})
        per[what] = per.get(what, 0) + amount
        notes[(metric, scope)] = notes.get((metric, scope)) or note

    for one in nodes or [shape] * cfg.nodes:
        cpu, cpu_note = cpu_metric(one.machine_type, catalog), ""
        if cfg.preemptible_quota and cpu is not None:
            cpu, cpu_note = spot_metric(cpu, region_quotas)
        if one.gpu_count:  # a CPU-only node (a parameter server pool) asks nothing of a GPU quota
            gpu, gpu_note = gpu_metric(one.gpu_type, catalog), ""
            if cfg.preemptible_quota and gpu is not None:
                gpu, gpu_note = spot_metric(gpu, region_quotas)
            add(gpu, cfg.region, one.gpu_count, f"x {one.gpu_type}{spot}", gpu_note)
        if cpu is not None:
            add(cpu, cfg.region, one.vcpus or 0, f"vCPUs of {one.machine_type}", cpu_note)
        add(boot_disk, cfg.region, cfg.boot_disk_size_gb, f"GB of {cfg.boot_disk_type}")
        data_type = data_disk_type(cfg, catalog, one.machine_type)  # the series' own unless dataDiskType says
        add(disk_quota_metric(catalog, data_type), cfg.region, cfg.data_disk_size_gb, f"GB of {data_type} (data disk)")
        add(catalog.global_quota_metric, "global", one.gpu_count, "GPUs in all regions")
    out = []
    for (metric, scope), per in totals.items():
        what = (
            "GPUs in all regions"
            if metric == catalog.global_quota_metric and scope == "global"
            else " + ".join(f"{amount} {label}" for label, amount in per.items())
        )
        out.append(Need(metric, scope, sum(per.values()), what, notes[(metric, scope)]))
    return out


def evaluate(wanted: list[Need], region_quotas: dict[str, tuple[float, float]], global_quotas: dict[str, tuple[float, float]]) -> list[Row]:
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
    return (
        f"{n.metric} {where}: limit {row.limit:g}, in use {row.usage:g}, needs {n.amount} -> ask for {target}: "
        f"https://console.cloud.google.com/iam-admin/quotas?project={project} (filter: {n.metric}), "
        "or set gpu-train:quotaRequest to request it from `pulumi up`"
    )


class Preference(TypedDict):
    """One Cloud Quotas preference: the quota, its dimensions (region, gpu_family), the limit asked."""

    quota_id: str
    dimensions: dict[str, str]
    preferred: int


def preferences(cfg: StackConfig, shape: GpuShape, gpus: int, catalog: Catalog) -> list[Preference]:
    """The Cloud Quotas preferences `quotaRequest` declares: the region's GPU quota and the project-wide
    GPUS-ALL-REGIONS.

    The region's GPU quota is, for spot and Flex-start (preemptible quota first), the GPU's preemptible
    per-model quota where the catalog knows one (spot H100: PREEMPTIBLE-NVIDIA-H100-GPUS-per-project-region;
    H200 and B200 have no standard on-demand quota at all); otherwise the per-family quota
    where the GPU has a family (H100, H200, B200) and else its per-model one (L4 has its own:
    NVIDIA-L4-GPUS-per-project-region, not a family).
    """
    acc = catalog.accelerator(shape.gpu_type)
    out: list[tuple[str, dict[str, str]]] = []  # (quota id, dimensions)
    if acc is not None and cfg.preemptible_quota and acc.spot_quota_id:
        out.append((acc.spot_quota_id, {"region": cfg.region}))
    elif acc is not None and acc.gpu_family:
        out.append((catalog.family_quota_id, {"region": cfg.region, "gpu_family": acc.gpu_family}))
    elif acc is not None and acc.quota_id:
        out.append((acc.quota_id, {"region": cfg.region}))
    out.append((catalog.global_quota_id, {}))
    return [{"quota_id": quota_id, "dimensions": dims, "preferred": gpus} for quota_id, dims in out]


def current_limit(entries: list[dict[str, Any]], dimensions: dict[str, str]) -> int:
    """The limit in force for ``dimensions``, from a QuotaInfo's dimensionsInfos (0 when none applies).

    Cloud Quotas lists a default entry (no dimensions, its applicableLocations naming every region
    it covers) and entries for specific dimensions. The one that applies is an entry whose own
    dimensions all match, whose applicableLocations include the region (or are global), and which
    matches the most dimensions: never simply the first, or a request below the real limit would be
    refused as a decrease. ``entries``: dicts with dimensions, applicableLocations and values.
    """
    region = dimensions.get("region")
    best: tuple[int, int] | None = None  # (matching dimensions, value)
    for entry in entries:
        own = entry.get("dimensions") or {}
        if any(dimensions.get(k) != v for k, v in own.items()):
            continue
        places = entry.get("applicableLocations") or []
        if region and places and region not in places and "global" not in places:
            continue
        values = [int(v) for v in entry.get("values", ()) if str(v).lstrip("-").isdigit()]
        if values and (best is None or len(own) > best[0]):
            best = (len(own), max(values))
    return 0 if best is None else best[1]


PREFERENCE_NAME = "{parent}/locations/global/quotaPreferences/{name}"  # the provider's id and import format
# A preference's own id as Cloud Quotas gives them out (ours, or the console's generated ones): it goes
# into the import id and a gcloud command shown to the user, so nothing else is taken from the API.
PREFERENCE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


@dataclass(frozen=True)
class Adoption:
    """An existing preference a stack takes over as it stands (Pulumi imports only what matches)."""

    name: str  # its own id: the last part of its resource name
    preferred: str  # its quotaConfig.preferredValue, as Cloud Quotas gives it (an int64 as a string)
    granted: str | None  # what Google granted so far, when it says
    short_by: int  # how much more the stack asks for than it does (0: it already asks for enough)


def existing_preference(found: list[dict[str, Any]], service: str, quota_id: str, dimensions: dict[str, str]) -> dict[str, Any] | None:
    """The preference Cloud Quotas holds for this quota and these dimensions, whatever its id (it allows
    one per quota and dimensions, so another made in the console blocks ours as our own would)."""
    for p in found:
        if p.get("service") == service and p.get("quotaId") == quota_id and (p.get("dimensions") or {}) == dimensions:
            if not PREFERENCE_ID_RE.fullmatch(str(p.get("name", "")).rsplit("/", 1)[-1]):
                raise ValueError(
                    f"Cloud Quotas lists a preference for {quota_id} named {str(p.get('name'))[:100]!r}, "
                    "not an id it gives out: look at it with `gcloud quotas preferences list`"
                )
            return p
    return None


def adoption(existing: dict[str, Any], want: int) -> Adoption:
    """How a stack that wants ``want`` adopts ``existing``: with its own values, never changed by the up."""
    config = existing.get("quotaConfig") or {}
    preferred = str(config.get("preferredValue", "0"))
    asked = int(preferred) if preferred.lstrip("-").isdigit() else 0
    unlimited = asked == -1  # Cloud Quotas' "unlimited"
    return Adoption(
        str(existing["name"]).rsplit("/", 1)[-1], preferred, config.get("grantedValue"), 0 if unlimited else max(0, want - asked)
    )


def preference_import_id(project: str, name: str) -> str:
    """The id pulumi-gcp gives a preference of ``projects/PROJECT`` (``{parent}/locations/global/quotaPreferences/
    {name}``), so an import and a create of ours name it alike: a later up finds it in the state, no import."""
    return PREFERENCE_NAME.format(parent=f"projects/{project}", name=name)
