"""Reading ``data/gpu-catalog.yaml`` into a ``Catalog``, checked field by field.

A bad edit of the data fails loudly here, at load time, rather than as a wrong answer later. Only
the thin layers (entry points, tasks, scripts, tests) call ``load_catalog``: the decisions are
given the catalog.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from gpu_train.catalog.model import (
    ZONE_PATTERN,
    Accelerator,
    Catalog,
    CatalogError,
    DiskSeries,
    FixedShape,
    FlexStart,
    N1Limit,
    Price,
    RetiredGpu,
)

CATALOG_PATH = Path(__file__).parent.parent / "data" / "gpu-catalog.yaml"


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
            shutdown=a.get("shutdown"),
        )
    retired = {}
    for name, r in (acc_t.get("retired") or {}).items():
        where = f"accelerators.retired.{name}"
        replacement = _need(r, "replacement", str, where)
        if replacement not in accelerators:
            raise CatalogError(f"{where}.replacement: {replacement!r} is not in accelerators.types")
        retired[name] = RetiredGpu(name, _need(r, "note", str, where), replacement, r.get("short"))
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
            local_ssd=bool(s.get("localSsd", False)),
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
        row = DiskSeries(
            name,
            tuple(_need(d, "machineTypes", list, where)),
            _need(d, "default", str, where),
            tuple(_need(d, "boot", list, where)),
            tuple(_need(d, "data", list, where)),
        )
        for t in {row.default, *row.boot, *row.data}:
            if t not in disk_metrics:
                raise CatalogError(f"{where}: disk type {t!r} has no disks.quotaMetric")
        if row.default not in row.boot or row.default not in row.data:
            raise CatalogError(f"{where}.default: {row.default!r} must be among its boot and data types")
        disk_series.append(row)

    return Catalog(
        sources=sources,
        accelerators=accelerators,
        retired=retired,
        cpu_quota_series=frozenset(_need(acc_t, "cpuQuotaSeries", list, "accelerators")),
        flex_start=_flex_start(doc, sources, dates),
        prices_unknown_where=str(pt.get("unknownWhere", "")),
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


def _flex_start(doc: dict, sources: dict, dates: dict[str, str]) -> FlexStart:
    table = _table(doc, "provisioning", sources)
    dates["provisioning"] = table["date"]
    flex = _need(table, "flexStart", dict, "provisioning")
    return FlexStart(
        frozenset(_need(flex, "series", list, "provisioning.flexStart")),
        frozenset(flex.get("unverified") or ()),
        _need(flex, "minRunMinutes", int, "provisioning.flexStart"),
        _need(flex, "maxRunHours", int, "provisioning.flexStart"),
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
