"""The GPU catalog: Compute Engine facts as typed, immutable objects.

Facts live in ``data/gpu-catalog.yaml`` (with their sources and dates); ``catalog_file`` reads and
checks that file into these objects, and the thin layers (entry points, tasks, scripts) pass the
one ``Catalog`` to the decisions, which never load it themselves. This module also parses
machine-type names, since that is a pure reading of the catalog's naming rules.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from gpu_train.errors import GpuTrainError

# A zone: REGION-LETTER (us-central1-a), or an AI zone, REGION-aiN[LETTER] (us-central1-ai1,
# us-south1-ai1b), which holds accelerator capacity. The AI form comes first so that a search in
# text never stops at "us-central1-a" inside "us-central1-ai1".
ZONE_PATTERN = r"[a-z]+-[a-z]+\d+-(?:ai\d+[a-z]?|[a-z])(?![a-z0-9])"
AI_ZONE_PATTERN = r"[a-z]+-[a-z]+\d+-ai\d+[a-z]?"


def dated(date: str) -> str:
    """`` of DATE`` for a catalog date, or ``, WORDS`` where its source has none ("snapshot date unknown, 2025-era
    or later", "derived from S2's g2-standard-8 and L4 rows"): "list prices of 2026-11-01", "list prices, derived ..."."""
    return f" of {date}" if date[:4].isdigit() else f", {date}"


class CatalogError(GpuTrainError, ValueError):
    """The catalog file does not have the expected shape."""


@dataclass(frozen=True)
class Accelerator:
    name: str
    gpu: str
    memory_gb: int
    series: str  # "N1" when attached to N1 VMs, else the fixed-shape family (G2, A2, ...)
    quota_metric: str | None = None
    quota_id: str | None = None
    gpu_family: str | None = None
    vws: bool = False
    spot_quota_id: str | None = None
    short: str | None = None  # the name people say: T4, A100-80GB (gpu_train.catalog.gpunames reads it)
    shutdown: str | None = None  # deprecated: the date Compute Engine shuts it down (T4, P4: 2027-08-01)

    @property
    def attachable_to_n1(self) -> bool:
        return self.series == "N1"


@dataclass(frozen=True)
class RetiredGpu:
    """A GPU Compute Engine no longer creates: why, and the nearest current GPU to use instead."""

    name: str
    note: str
    replacement: str
    short: str | None = None

    def gpu_name(self) -> str:
        return self.short or self.name


@dataclass(frozen=True)
class FlexStart:
    """Flex-start (Dynamic Workload Scheduler): the series that take it and its run-time bounds."""

    series: frozenset[str] = frozenset()
    unverified: frozenset[str] = frozenset()  # allowed with a warning: no source says yes or no
    min_run_minutes: int = 10
    max_run_hours: int = 168


# The ways a VM may be had, as `plan`, `gpus` and the stack settings name them.
ON_DEMAND, SPOT, FLEX_START, RESERVATION = "on-demand", "spot", "flex-start", "reservation"


@dataclass(frozen=True)
class N1Limit:
    count: int
    max_vcpus: int
    max_memory_gb: float
    # A stricter ceiling that applies in a few zones only.
    zone_limit_zones: tuple[str, ...] = ()
    zone_max_vcpus: int | None = None
    zone_max_memory_gb: float | None = None

    def ceilings(self, zone: str) -> tuple[int, float]:
        if zone in self.zone_limit_zones and self.zone_max_vcpus is not None:
            return self.zone_max_vcpus, self.zone_max_memory_gb or self.max_memory_gb
        return self.max_vcpus, self.max_memory_gb


@dataclass(frozen=True)
class FixedShape:
    name: str
    vcpus: int
    memory_gb: float
    gpu_type: str
    gpu_count: int
    obtain: tuple[str, ...] = ()  # empty: on-demand and spot both allowed
    zones: tuple[str, ...] = ()  # empty: every zone of the accelerator
    arch: str = "x86_64"  # arm64: A4X (NVIDIA Grace)
    local_ssd: bool = False  # comes with Local SSD (a STOP at maxRunDuration must discard it)

    @property
    def family(self) -> str:
        return self.name.split("-")[0].upper()


@dataclass(frozen=True)
class Price:
    on_demand: float | None
    spot: float | None
    date: str | None = None  # when this row's figures were read (spot prices may change daily)


@dataclass(frozen=True)
class DiskSeries:
    """The disk types one machine series accepts (boot disk, data disks) and its default type."""

    name: str  # "A3 Ultra", "N1", ...
    machine_types: tuple[str, ...]  # fnmatch patterns of its machine-type names
    default: str
    boot: tuple[str, ...]
    data: tuple[str, ...]


@dataclass(frozen=True)
class MachineShape:
    """What a machine-type name says: series, size and, for fixed shapes, the GPUs."""

    name: str
    series: str  # "n1", "g2", "e2", ...
    vcpus: int | None
    memory_gb: float | None
    fixed: FixedShape | None = None


@dataclass(frozen=True)
class Catalog:
    sources: dict[str, dict[str, str]]
    accelerators: dict[str, Accelerator]
    retired: dict[str, RetiredGpu]
    global_quota_metric: str
    global_quota_id: str
    family_quota_id: str
    n1_memory_per_vcpu: dict[str, float]
    n1_vcpus: dict[str, tuple[int, ...]]
    n1_limits: dict[str, tuple[N1Limit, ...]]
    fixed_shapes: dict[str, FixedShape]
    zones: dict[str, tuple[str, ...]]
    unverified_zones: frozenset[str]
    price_region: str
    gpu_prices: dict[str, Price]
    machine_prices: dict[str, Price]
    machine_prices_include_gpus: frozenset[str]
    linear_series: dict[str, tuple[str, int]]
    image_project: str
    default_image_family: str
    image_families: dict[str, dict[str, str]]
    deprecated_image_patterns: tuple[tuple[str, str], ...]
    image_series: dict[str, dict[str, Any]] = field(default_factory=dict)  # minDriver, arch per series
    compact_series: frozenset[str] = frozenset()
    max_vms_per_compact_policy: int = 0
    gvnic_series: frozenset[str] = frozenset()
    disk_series: tuple[DiskSeries, ...] = ()
    disk_quota_metrics: dict[str, str] = field(default_factory=dict)
    dates: dict[str, str] = field(default_factory=dict)
    disk_prices: dict[str, float | None] = field(default_factory=dict)  # USD per GB-month; None: unknown
    cpu_quota_series: frozenset[str] = frozenset({"N1"})  # the series whose VMs count against CPUS
    flex_start: FlexStart = FlexStart()
    prices_unknown_where: str = ""  # where a reader finds the prices the catalog does not know

    # -- lookups -------------------------------------------------------------------------------
    def accelerator(self, name: str) -> Accelerator | None:
        """The accelerator for an API name; ``-vws`` variants map to their base type."""
        if name in self.accelerators:
            return self.accelerators[name]
        if name.endswith("-vws"):
            base = self.accelerators.get(name.removesuffix("-vws"))
            if base is not None and base.vws:
                return base
        return None

    def zones_for(self, gpu_type: str, machine: MachineShape | None = None) -> tuple[str, ...]:
        acc = self.accelerator(gpu_type)
        zones = self.zones.get(acc.name, ()) if acc else ()
        if machine is not None and machine.fixed is not None and machine.fixed.zones:
            zones = tuple(z for z in zones if z in machine.fixed.zones) or machine.fixed.zones
        return zones

    def shapes_with(self, gpu_type: str) -> list[FixedShape]:
        """Fixed shapes carrying ``gpu_type``, smallest first."""
        acc = self.accelerator(gpu_type)
        if acc is None:
            return []
        shapes = [s for s in self.fixed_shapes.values() if s.gpu_type == acc.name]
        return sorted(shapes, key=lambda s: (s.gpu_count, s.vcpus, s.memory_gb))

    def ways(self, machine_type: str) -> tuple[str, ...]:
        """How a VM of ``machine_type`` may be had: on-demand, spot, flex-start, reservation (in that order).

        A fixed shape's ``obtain`` says it where it is restricted; otherwise on demand and spot, Flex-start
        where the series takes it (or may: unverified), and a reservation (any GPU shape can be reserved).
        """
        machine = self.parse_machine_type(machine_type)
        if machine is not None and machine.fixed is not None and machine.fixed.obtain:
            found = set(machine.fixed.obtain)
        else:
            series = self.series_of(machine_type)
            found = {ON_DEMAND, SPOT, RESERVATION}
            if series in self.flex_start.series | self.flex_start.unverified:
                found.add(FLEX_START)
        return tuple(w for w in (ON_DEMAND, SPOT, FLEX_START, RESERVATION) if w in found)

    def image_deprecation(self, family: str) -> str | None:
        for pattern, reason in self.deprecated_image_patterns:
            if fnmatch.fnmatchcase(family, pattern):
                return reason
        return None

    def disks_of(self, machine_type: str) -> DiskSeries | None:
        """The disk-support row of the series ``machine_type`` belongs to (None: not a GPU series)."""
        return next((d for d in self.disk_series if any(fnmatch.fnmatchcase(machine_type, p) for p in d.machine_types)), None)

    def series_of(self, machine_type: str) -> str:
        """A2, A3, G2, N1, ... (fixed shapes by their family; everything else by its prefix)."""
        return machine_type.split("-")[0].upper()

    def parse_machine_type(self, name: str) -> MachineShape | None:
        """Read a machine-type name; None when it is not of a known form.

        N1 sizes come from the catalog's per-vCPU memory; custom N1 types
        (``n1-custom-V-M`` or ``custom-V-M``, M in MB) are read from the name.
        """
        if name in self.fixed_shapes:
            s = self.fixed_shapes[name]
            return MachineShape(name, name.split("-")[0], s.vcpus, s.memory_gb, s)
        m = re.fullmatch(r"n1-(standard|highmem|highcpu)-(\d+)", name)
        if m:
            kind, vcpus = m.group(1), int(m.group(2))
            if vcpus not in self.n1_vcpus[kind]:
                return None
            return MachineShape(name, "n1", vcpus, round(vcpus * self.n1_memory_per_vcpu[kind], 2))
        m = re.fullmatch(r"(?:n1-)?custom-(\d+)-(\d+)(?:-ext)?", name)
        if m:
            return MachineShape(name, "n1", int(m.group(1)), int(m.group(2)) / 1024)
        if name in ("f1-micro", "g1-small"):
            return MachineShape(name, name.split("-")[0], None, None)
        m = re.fullmatch(r"([a-z][a-z0-9]*)-[a-z0-9-]+?(?:-(\d+))?", name)
        if m:  # another series (e2, n2, c3, ...): read its vCPUs from a trailing size, if any
            return MachineShape(name, m.group(1), int(m.group(2)) if m.group(2) else None, None)
        return None

    def n1_types(self) -> list[MachineShape]:
        """Every predefined N1 type, smallest (vCPUs, then memory) first."""
        shapes = [self.parse_machine_type(f"n1-{kind}-{v}") for kind, sizes in self.n1_vcpus.items() for v in sizes]
        return sorted((s for s in shapes if s), key=lambda s: (s.vcpus, s.memory_gb))
