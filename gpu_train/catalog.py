"""The GPU catalog: Compute Engine facts read from ``data/gpu-catalog.yaml``.

Facts live in the YAML file (with their sources and dates); this module only loads them into
typed, immutable objects and checks the file's shape, so that a bad edit of the data fails loudly
at load time rather than as a wrong answer later. It also parses machine-type names, since that
is a pure reading of the catalog's naming rules.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_train.errors import GpuTrainError

CATALOG_PATH = Path(__file__).parent / "data" / "gpu-catalog.yaml"
# A zone: REGION-LETTER (us-central1-a), or an AI zone, REGION-aiN[LETTER] (us-central1-ai1,
# us-south1-ai1b), which holds accelerator capacity. The AI form comes first so that a search in
# text never stops at "us-central1-a" inside "us-central1-ai1".
ZONE_PATTERN = r"[a-z]+-[a-z]+\d+-(?:ai\d+[a-z]?|[a-z])(?![a-z0-9])"
AI_ZONE_PATTERN = r"[a-z]+-[a-z]+\d+-ai\d+[a-z]?"


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
    short: str | None = None  # the name people say: T4, A100-80GB (gpu_train.gpunames reads it)

    @property
    def attachable_to_n1(self) -> bool:
        return self.series == "N1"


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
    retired: dict[str, str]
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

    def image_deprecation(self, family: str) -> str | None:
        for pattern, reason in self.deprecated_image_patterns:
            if fnmatch.fnmatchcase(family, pattern):
                return reason
        return None

    def disks_of(self, machine_type: str) -> DiskSeries | None:
        """The disk-support row of the series ``machine_type`` belongs to (None: not a GPU series)."""
        return next((d for d in self.disk_series
                     if any(fnmatch.fnmatchcase(machine_type, p) for p in d.machine_types)), None)

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
        shapes = [
            self.parse_machine_type(f"n1-{kind}-{v}")
            for kind, sizes in self.n1_vcpus.items()
            for v in sizes
        ]
        return sorted((s for s in shapes if s), key=lambda s: (s.vcpus, s.memory_gb))


# -- loading ----------------------------------------------------------------------------------
def _need(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise CatalogError(f"{where}: missing '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        raise CatalogError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def _table(doc: dict, key: str, sources: dict) -> dict:
    """A top-level table; each must name known sources and a date."""
    table = _need(doc, key, dict, "catalog")
    for src in _need(table, "source", list, key):
        if src not in sources:
            raise CatalogError(f"{key}.source: unknown source {src!r}")
    _need(table, "date", str, key)
    return table


def _price(raw: dict, where: str) -> Price:
    for k in ("onDemand", "spot"):
        if raw.get(k) is not None and not isinstance(raw[k], (int, float)):
            raise CatalogError(f"{where}.{k}: expected a number or null")
    return Price(raw.get("onDemand"), raw.get("spot"), _need(raw, "date", str, where))


def parse_catalog(doc: Any) -> Catalog:
    """Build a Catalog from the parsed YAML document, checking its schema."""
    if not isinstance(doc, dict):
        raise CatalogError("catalog: expected a mapping at the top level")
    sources = _need(doc, "sources", dict, "catalog")
    for sid, src in sources.items():
        for k in ("title", "url", "date"):
            _need(src, k, str, f"sources.{sid}")
    dates: dict[str, str] = {}

    acc_t = _table(doc, "accelerators", sources)
    dates["accelerators"] = acc_t["date"]
    accelerators = {}
    for name, a in _need(acc_t, "types", dict, "accelerators").items():
        where = f"accelerators.types.{name}"
        accelerators[name] = Accelerator(
            name=name,
            gpu=str(_need(a, "gpu", (str, int), where)),
            memory_gb=_need(a, "memoryGb", int, where),
            series=_need(a, "series", str, where),
            quota_metric=a.get("quotaMetric"),
            quota_id=a.get("quotaId"),
            gpu_family=a.get("gpuFamily"),
            vws=bool(a.get("vws", False)),
            spot_quota_id=a.get("spotQuotaId"),
            short=a.get("short"),
        )
    glob = _need(acc_t, "globalQuota", dict, "accelerators")

    n1 = _table(doc, "n1", sources)
    dates["n1"] = n1["date"]
    n1_limits: dict[str, tuple[N1Limit, ...]] = {}
    for gpu, rows in _need(n1, "limits", dict, "n1").items():
        if gpu not in accelerators or not accelerators[gpu].attachable_to_n1:
            raise CatalogError(f"n1.limits.{gpu}: not an N1 accelerator in accelerators.types")
        limits = []
        for row in rows:
            zl = row.get("zoneLimits") or {}
            limits.append(
                N1Limit(
                    count=_need(row, "count", int, f"n1.limits.{gpu}"),
                    max_vcpus=_need(row, "maxVcpus", int, f"n1.limits.{gpu}"),
                    max_memory_gb=_need(row, "maxMemoryGb", (int, float), f"n1.limits.{gpu}"),
                    zone_limit_zones=tuple(zl.get("zones", ())),
                    zone_max_vcpus=zl.get("maxVcpus"),
                    zone_max_memory_gb=zl.get("maxMemoryGb"),
                )
            )
        n1_limits[gpu] = tuple(sorted(limits, key=lambda lim: lim.count))

    fx = _table(doc, "fixedShapes", sources)
    dates["fixedShapes"] = fx["date"]
    fixed = {}
    for name, s in _need(fx, "types", dict, "fixedShapes").items():
        where = f"fixedShapes.types.{name}"
        gpu_type = _need(s, "gpuType", str, where)
        if gpu_type not in accelerators:
            raise CatalogError(f"{where}.gpuType: {gpu_type!r} is not in accelerators.types")
        fixed[name] = FixedShape(
            name=name,
            vcpus=_need(s, "vcpus", int, where),
            memory_gb=_need(s, "memoryGb", (int, float), where),
            gpu_type=gpu_type,
            gpu_count=_need(s, "gpuCount", int, where),
            obtain=tuple(s.get("obtain", ())),
            zones=tuple(s.get("zones", ())),
            arch=s.get("arch", "x86_64"),
        )

    zt = _table(doc, "zones", sources)
    dates["zones"] = zt["date"]
    zones = {}
    for gpu, zs in _need(zt, "byAccelerator", dict, "zones").items():
        if gpu not in accelerators:
            raise CatalogError(f"zones.byAccelerator.{gpu}: not in accelerators.types")
        for z in zs:
            if not re.fullmatch(ZONE_PATTERN, z):
                raise CatalogError(f"zones.byAccelerator.{gpu}: {z!r} is not a zone name")
        zones[gpu] = tuple(zs)

    pt = _table(doc, "prices", sources)
    dates["prices"] = pt["date"]
    machine_raw = _need(pt, "machine", dict, "prices")
    linear = {
        prefix: (_need(v, "from", str, f"prices.linearSeries.{prefix}"), _need(v, "vcpus", int, prefix))
        for prefix, v in (pt.get("linearSeries") or {}).items()
    }

    it = _table(doc, "images", sources)
    dates["images"] = it["date"]
    pl = _table(doc, "placement", sources)
    net = _table(doc, "network", sources)
    dates["placement"], dates["network"] = pl["date"], net["date"]
    dk = _table(doc, "disks", sources)
    dates["disks"] = dk["date"]
    disk_metrics = dict(_need(dk, "quotaMetric", dict, "disks"))
    disk_series = []
    for name, d in _need(dk, "series", dict, "disks").items():
        where = f"disks.series.{name}"
        row = DiskSeries(name, tuple(_need(d, "machineTypes", list, where)), _need(d, "default", str, where),
                         tuple(_need(d, "boot", list, where)), tuple(_need(d, "data", list, where)))
        for t in {row.default, *row.boot, *row.data}:
            if t not in disk_metrics:
                raise CatalogError(f"{where}: disk type {t!r} has no disks.quotaMetric")
        if row.default not in row.boot or row.default not in row.data:
            raise CatalogError(f"{where}.default: {row.default!r} must be among its boot and data types")
        disk_series.append(row)

    return Catalog(
        sources=sources,
        accelerators=accelerators,
        retired=dict(acc_t.get("retired") or {}),
        global_quota_metric=_need(glob, "metric", str, "accelerators.globalQuota"),
        global_quota_id=_need(glob, "quotaId", str, "accelerators.globalQuota"),
        family_quota_id=_need(acc_t, "familyQuotaId", str, "accelerators"),
        n1_memory_per_vcpu=dict(_need(n1, "memoryPerVcpuGb", dict, "n1")),
        n1_vcpus={k: tuple(v) for k, v in _need(n1, "vcpus", dict, "n1").items()},
        n1_limits=n1_limits,
        fixed_shapes=fixed,
        zones=zones,
        unverified_zones=frozenset(zt.get("unverified") or ()),
        price_region=_need(pt, "region", str, "prices"),
        gpu_prices={k: _price(v, f"prices.perGpu.{k}") for k, v in _need(pt, "perGpu", dict, "prices").items()},
        machine_prices={k: _price(v, f"prices.machine.{k}") for k, v in machine_raw.items()},
        machine_prices_include_gpus=frozenset(k for k, v in machine_raw.items() if v.get("includesGpus")),
        linear_series=linear,
        image_project=_need(it, "project", str, "images"),
        default_image_family=_need(it, "default", str, "images"),
        image_families=dict(_need(it, "families", dict, "images")),
        image_series=dict(it.get("series") or {}),
        deprecated_image_patterns=tuple(
            (_need(p, "pattern", str, "images.deprecatedPatterns"), _need(p, "reason", str, "images.deprecatedPatterns"))
            for p in it.get("deprecatedPatterns") or ()
        ),
        compact_series=frozenset(_need(pl, "compactSeries", list, "placement")),
        max_vms_per_compact_policy=_need(pl, "maxVmsPerCompactPolicy", int, "placement"),
        gvnic_series=frozenset(_need(net, "gvnicSeries", list, "network")),
        disk_series=tuple(disk_series),
        disk_quota_metrics=disk_metrics,
        dates=dates,
        disk_prices=_disk_prices(doc, sources, dates),
    )


def _disk_prices(doc: dict, sources: dict, dates: dict[str, str]) -> dict[str, float | None]:
    table = _table(doc, "diskPrices", sources)
    dates["diskPrices"] = table["date"]
    prices = dict(_need(table, "perGbMonth", dict, "diskPrices"))
    for kind, value in prices.items():
        if value is not None and not isinstance(value, (int, float)):
            raise CatalogError(f"diskPrices.perGbMonth.{kind}: expected a number or null")
    return prices


@functools.lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    """Load and check the catalog file (cached: it is read-only data)."""
    # libyaml's parser where PyYAML has it: the same documents, about ten times faster (every task
    # validates its stack against the catalog, so this is on the path of `fab fetch` doing nothing).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return parse_catalog(yaml.load(f, Loader=loader))
