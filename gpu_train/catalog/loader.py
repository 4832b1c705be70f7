"""Reading ``data/gpu-catalog.yaml`` into a ``Catalog``, checked against its schema and its own references.

A bad edit of the data fails loudly here, at load time, rather than as a wrong answer later: first the
file's shape against ``data/gpu-catalog.schema.yaml`` (a JSON Schema, checked by fastjsonschema), then
what a schema cannot say (a source, GPU or disk type named elsewhere in the file must exist). Only the
thin layers (entry points, tasks, scripts, tests) call ``load_catalog``: the decisions are given the
catalog.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import sys
from collections.abc import Callable
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
SCHEMA_PATH = CATALOG_PATH.with_name("gpu-catalog.schema.yaml")


@functools.lru_cache(maxsize=1)
def _validator() -> Callable[[Any], Any]:
    """The schema as fastjsonschema's Python code, compiled once per version of the schema (and of Python) and
    kept beside Python's own compiled modules: compiling it costs about 0.1 s, loading it a few ms, and every
    task loads the catalog. A folder that cannot be written only costs the compile."""
    import marshal

    import fastjsonschema

    from gpu_train.atomic import atomic_write

    source = SCHEMA_PATH.read_bytes()
    key = hashlib.sha256(source + f"{fastjsonschema.VERSION} {sys.version}".encode()).hexdigest()[:16]
    cached = Path(__file__).parent / "__pycache__" / f"catalog_schema-{key}.marshal"
    try:
        code = marshal.loads(cached.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        code = compile(fastjsonschema.compile_to_code(yaml.load(source, Loader=loader)), str(SCHEMA_PATH), "exec")
        with contextlib.suppress(OSError):
            atomic_write(cached, marshal.dumps(code), 0o644, keep_mode=False)
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    validate: Callable[[Any], Any] = namespace["validate"]
    return validate


def check_shape(doc: Any) -> None:
    """CatalogError naming the first place where ``doc`` does not have the schema's shape."""
    import fastjsonschema

    try:
        _validator()(doc)
    except fastjsonschema.JsonSchemaValueException as e:
        where = (e.name or "data").removeprefix("data").lstrip(".") or "catalog"
        what = e.message.removeprefix(e.name or "").strip() if e.message else str(e)
        if m := re.fullmatch(r"must contain \[(.*)\] properties", what):  # as the loader said it before
            what = f"missing {m.group(1)}"
        raise CatalogError(f"{where}: {what} (gpu_train/data/gpu-catalog.schema.yaml)") from None


def _table(doc: dict[str, Any], key: str, sources: dict[str, Any]) -> dict[str, Any]:
    """A top-level table; the sources it names must be in ``sources``."""
    table: dict[str, Any] = doc[key]
    for src in table["source"]:
        if src not in sources:
            raise CatalogError(f"{key}.source: unknown source {src!r}")
    return table


def _price(raw: dict[str, Any]) -> Price:
    return Price(raw.get("onDemand"), raw.get("spot"), raw["date"])


def parse_catalog(doc: Any, shape_checked: bool = False) -> Catalog:
    """Build a Catalog from the parsed YAML document, checking its schema (unless ``shape_checked``: these
    very bytes passed it before) and its references."""
    if not shape_checked:
        check_shape(doc)
    sources = doc["sources"]
    dates: dict[str, str] = {}

    acc_t = _table(doc, "accelerators", sources)
    dates["accelerators"] = acc_t["date"]
    accelerators = {}
    for name, a in acc_t["types"].items():
        accelerators[name] = Accelerator(
            name=name,
            gpu=str(a["gpu"]),
            memory_gb=a["memoryGb"],
            series=a["series"],
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
        replacement = r["replacement"]
        if replacement not in accelerators:
            raise CatalogError(f"{where}.replacement: {replacement!r} is not in accelerators.types")
        retired[name] = RetiredGpu(name, r["note"], replacement, r.get("short"))
    glob = acc_t["globalQuota"]

    n1 = _table(doc, "n1", sources)
    dates["n1"] = n1["date"]
    n1_limits: dict[str, tuple[N1Limit, ...]] = {}
    for gpu, rows in n1["limits"].items():
        if gpu not in accelerators or not accelerators[gpu].attachable_to_n1:
            raise CatalogError(f"n1.limits.{gpu}: not an N1 accelerator in accelerators.types")
        limits = []
        for row in rows:
            zl = row.get("zoneLimits") or {}
            limits.append(
                N1Limit(
                    count=row["count"],
                    max_vcpus=row["maxVcpus"],
                    max_memory_gb=row["maxMemoryGb"],
                    zone_limit_zones=tuple(zl.get("zones", ())),
                    zone_max_vcpus=zl.get("maxVcpus"),
                    zone_max_memory_gb=zl.get("maxMemoryGb"),
                )
            )
        n1_limits[gpu] = tuple(sorted(limits, key=lambda lim: lim.count))

    fx = _table(doc, "fixedShapes", sources)
    dates["fixedShapes"] = fx["date"]
    fixed = {}
    for name, s in fx["types"].items():
        gpu_type = s["gpuType"]
        if gpu_type not in accelerators:
            raise CatalogError(f"fixedShapes.types.{name}.gpuType: {gpu_type!r} is not in accelerators.types")
        fixed[name] = FixedShape(
            name=name,
            vcpus=s["vcpus"],
            memory_gb=s["memoryGb"],
            gpu_type=gpu_type,
            gpu_count=s["gpuCount"],
            obtain=tuple(s.get("obtain", ())),
            zones=tuple(s.get("zones", ())),
            arch=s.get("arch", "x86_64"),
            local_ssd=bool(s.get("localSsd", False)),
        )

    zt = _table(doc, "zones", sources)
    dates["zones"] = zt["date"]
    zones = {}
    for gpu, zs in zt["byAccelerator"].items():
        if gpu not in accelerators:
            raise CatalogError(f"zones.byAccelerator.{gpu}: not in accelerators.types")
        for z in zs:
            if not re.fullmatch(ZONE_PATTERN, z):
                raise CatalogError(f"zones.byAccelerator.{gpu}: {z!r} is not a zone name")
        zones[gpu] = tuple(zs)

    pt = _table(doc, "prices", sources)
    dates["prices"] = pt["date"]
    machine_raw = pt["machine"]
    linear = {prefix: (v["from"], v["vcpus"]) for prefix, v in (pt.get("linearSeries") or {}).items()}

    it = _table(doc, "images", sources)
    dates["images"] = it["date"]
    pl = _table(doc, "placement", sources)
    net = _table(doc, "network", sources)
    dates["placement"], dates["network"] = pl["date"], net["date"]
    dk = _table(doc, "disks", sources)
    dates["disks"] = dk["date"]
    disk_metrics = dict(dk["quotaMetric"])
    disk_series = []
    for name, d in dk["series"].items():
        where = f"disks.series.{name}"
        row = DiskSeries(
            name,
            tuple(d["machineTypes"]),
            d["default"],
            tuple(d["boot"]),
            tuple(d["data"]),
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
        cpu_quota_series=frozenset(acc_t["cpuQuotaSeries"]),
        flex_start=_flex_start(doc, sources, dates),
        prices_unknown_where=str(pt.get("unknownWhere", "")),
        global_quota_metric=glob["metric"],
        global_quota_id=glob["quotaId"],
        family_quota_id=acc_t["familyQuotaId"],
        n1_memory_per_vcpu=dict(n1["memoryPerVcpuGb"]),
        n1_vcpus={k: tuple(v) for k, v in n1["vcpus"].items()},
        n1_limits=n1_limits,
        fixed_shapes=fixed,
        zones=zones,
        unverified_zones=frozenset(zt.get("unverified") or ()),
        price_region=pt["region"],
        gpu_prices={k: _price(v) for k, v in pt["perGpu"].items()},
        machine_prices={k: _price(v) for k, v in machine_raw.items()},
        machine_prices_include_gpus=frozenset(k for k, v in machine_raw.items() if v.get("includesGpus")),
        linear_series=linear,
        image_project=it["project"],
        default_image_family=it["default"],
        image_families=dict(it["families"]),
        image_series=dict(it.get("series") or {}),
        deprecated_image_patterns=tuple((p["pattern"], p["reason"]) for p in it.get("deprecatedPatterns") or ()),
        compact_series=frozenset(pl["compactSeries"]),
        max_vms_per_compact_policy=pl["maxVmsPerCompactPolicy"],
        gvnic_series=frozenset(net["gvnicSeries"]),
        disk_series=tuple(disk_series),
        disk_quota_metrics=disk_metrics,
        dates=dates,
        disk_prices=_disk_prices(doc, sources, dates),
    )


def _flex_start(doc: dict[str, Any], sources: dict[str, Any], dates: dict[str, str]) -> FlexStart:
    table = _table(doc, "provisioning", sources)
    dates["provisioning"] = table["date"]
    flex = table["flexStart"]
    return FlexStart(
        frozenset(flex["series"]),
        frozenset(flex.get("unverified") or ()),
        flex["minRunMinutes"],
        flex["maxRunHours"],
    )


def _disk_prices(doc: dict[str, Any], sources: dict[str, Any], dates: dict[str, str]) -> dict[str, float | None]:
    table = _table(doc, "diskPrices", sources)
    dates["diskPrices"] = table["date"]
    return dict(table["perGbMonth"])


@functools.lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    """Load and check the catalog file (cached: it is read-only data). Its shape is checked once per version
    of the file and the schema (a stamp beside Python's compiled modules says these bytes passed); the
    references every time (they cost nothing)."""
    # libyaml's parser where PyYAML has it: the same documents, about ten times faster (every task
    # validates its stack against the catalog, so this is on the path of `fab fetch` doing nothing).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = path.read_bytes()
    stamp = Path(__file__).parent / "__pycache__" / f"catalog-ok-{hashlib.sha256(data + SCHEMA_PATH.read_bytes()).hexdigest()[:32]}"
    checked = stamp.is_file()
    catalog = parse_catalog(yaml.load(data, Loader=loader), shape_checked=checked)
    if not checked:
        from gpu_train.atomic import atomic_write

        with contextlib.suppress(OSError):
            atomic_write(stamp, "", 0o644, keep_mode=False)
    return catalog
