"""What GPUs can be had, on which shapes, where, and at what price: views of the catalog.

`gpu-train gpus` answers the first question anyone asks before a GPU VM ("which GPUs, where, how
much?") from the catalog alone, with no credentials: one row per GPU type, or every shape, region
and price of one type. Pure functions of the catalog; the task only prints them. Prices are the
catalog's (one region, with their date) and stay "n/a" where it has none rather than guessed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from gpu_train.catalog import gpunames
from gpu_train.catalog.model import FLEX_START, ON_DEMAND, RESERVATION, SPOT, Accelerator, Catalog, dated
from gpu_train.errors import UsageError
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.gcp.validate import GpuShape
from gpu_train.views.table import aligned


class OfferError(UsageError, ValueError):
    """A GPU or region the catalog does not know; the message says what it does know."""


@dataclass(frozen=True)
class ShapeOffer:
    """One way to get the GPU: an N1 VM with ``gpus`` attached, or a fixed shape."""

    machine: str  # a fixed shape's name, or "n1-*" for N1 with attached GPUs
    gpus: int
    max_vcpus: int  # N1: the most vCPUs allowed with that many GPUs; fixed: the shape's
    max_memory_gb: float
    obtain: tuple[str, ...]  # how it can be had: on-demand, spot, flex-start, reservation, ...
    on_demand: float | None  # USD/h: fixed shapes whole; N1: the GPUs only (the VM is extra)
    spot: float | None
    zones: tuple[str, ...]  # where a fixed shape is narrower than its GPU's zones
    price_date: str | None = None  # when the price row was read (spot prices may change daily)


@dataclass(frozen=True)
class GpuOffer:
    short: str
    api: str
    memory_gb: int
    series: str
    shapes: tuple[ShapeOffer, ...]
    regions: dict[str, tuple[str, ...]]  # region -> its zones offering the GPU
    on_demand_per_gpu: float | None
    spot_per_gpu: float | None
    obtain: tuple[str, ...]  # union over the shapes
    zones_verified: bool
    price_date: str | None = None  # the per-GPU price row's date

    @property
    def note(self) -> str:
        """spot-only / reservation-only, when on demand is not one of the ways."""
        if ON_DEMAND in self.obtain:
            return ""
        if "spot" in self.obtain:
            return "spot-only" if self.obtain == ("spot",) else "no on-demand: " + ", ".join(self.obtain)
        return "reservation-only" if self.obtain == ("reservation",) else "only: " + ", ".join(self.obtain)

    def to_json(self) -> dict[str, Any]:
        """camelCase keys, as in the other tasks' --json."""
        doc = _camel(asdict(self))
        doc["shapes"] = [_camel(asdict(s)) for s in self.shapes]
        doc["regions"] = {r: list(z) for r, z in self.regions.items()}
        doc["note"] = self.note
        return doc


def _camel(doc: dict[str, Any]) -> dict[str, Any]:
    return {re.sub(r"_(\w)", lambda m: m.group(1).upper(), k): v for k, v in doc.items()}


def _shapes(acc: Accelerator, catalog: Catalog) -> list[ShapeOffer]:
    per_gpu = catalog.gpu_prices.get(acc.name)
    out = []
    for lim in catalog.n1_limits.get(acc.name, ()):
        od = None if per_gpu is None or per_gpu.on_demand is None else round(per_gpu.on_demand * lim.count, 5)
        sp = None if per_gpu is None or per_gpu.spot is None else round(per_gpu.spot * lim.count, 5)
        out.append(
            ShapeOffer(
                "n1-*",
                lim.count,
                lim.max_vcpus,
                lim.max_memory_gb,
                catalog.ways("n1-standard-8"),
                od,
                sp,
                (),
                per_gpu.date if per_gpu else None,
            )
        )
    for s in catalog.shapes_with(acc.name):
        cost = hourly_cost(GpuShape(s.name, s.vcpus, s.memory_gb, s.gpu_type, s.gpu_count, attached=False), catalog)
        known = cost.on_demand is not None or cost.spot is not None
        out.append(
            ShapeOffer(
                s.name,
                s.gpu_count,
                s.vcpus,
                s.memory_gb,
                catalog.ways(s.name),
                cost.on_demand,
                cost.spot,
                s.zones,
                cost.date if known else None,
            )
        )
    return out


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _by_region(zones: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for z in sorted(zones):
        grouped[region_of(z)].append(z)
    return {r: tuple(zs) for r, zs in sorted(grouped.items())}


def known_regions(catalog: Catalog) -> list[str]:
    return sorted({region_of(z) for zs in catalog.zones.values() for z in zs})


def offers(catalog: Catalog, name: str | None = None, region: str | None = None, spot: bool = False) -> list[GpuOffer]:
    """The GPU types (or the one ``name`` means), narrowed to ``region`` and to what spot can get.

    Raises OfferError for a GPU or region the catalog does not know, with close names.
    """
    if name is not None:
        acc = gpunames.resolve(name, catalog)
        if acc is None:
            raise OfferError(f"no GPU called {name!r} in the catalog: {gpunames.describe_unknown(name, catalog)}")
        accs = [acc]
    else:
        accs = list(catalog.accelerators.values())
    if region is not None and region not in known_regions(catalog):
        import difflib

        close = difflib.get_close_matches(region, known_regions(catalog), n=3, cutoff=0.6)
        fix = f"did you mean {' or '.join(close)}?" if close else "`gpu-train gpus --json` lists every region"
        raise OfferError(f"no GPU is offered in a region called {region!r} (catalog snapshot): {fix}")
    out = []
    for acc in accs:
        shapes = _shapes(acc, catalog)
        if spot:
            shapes = [s for s in shapes if "spot" in s.obtain]
        zones = catalog.zones.get(acc.name, ())
        if region is not None:
            zones = tuple(z for z in zones if region_of(z) == region)
            shapes = [s for s in shapes if not s.zones or any(region_of(z) == region for z in s.zones)]
        if not shapes or (region is not None and not zones):
            continue
        per_gpu = catalog.gpu_prices.get(acc.name)
        obtain = tuple(dict.fromkeys(w for s in shapes for w in s.obtain))
        out.append(
            GpuOffer(
                short=gpunames.short_name(acc),
                api=acc.name,
                memory_gb=acc.memory_gb,
                series=acc.series,
                shapes=tuple(shapes),
                regions=_by_region(zones),
                on_demand_per_gpu=per_gpu.on_demand if per_gpu else None,
                spot_per_gpu=per_gpu.spot if per_gpu else None,
                obtain=obtain,
                zones_verified=acc.name not in catalog.unverified_zones,
                price_date=per_gpu.date if per_gpu else None,
            )
        )
    return out


# -- rendering ---------------------------------------------------------------------------------
def money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:.2f}"


def per_hour(value: float | None) -> str:
    return "n/a" if value is None else f"${value:.2f}/h"


def _shapes_summary(o: GpuOffer) -> str:
    n1 = [s.gpus for s in o.shapes if s.machine == "n1-*"]
    fixed = [s.machine for s in o.shapes if s.machine != "n1-*"]
    parts = [f"N1 + {'/'.join(map(str, n1))}"] if n1 else []
    if fixed:
        parts.append(fixed[0] if len(fixed) == 1 else f"{fixed[0]} .. {fixed[-1]} ({len(fixed)})")
    return ", ".join(parts)


def _regions_summary(o: GpuOffer) -> str:
    zones = sum(len(z) for z in o.regions.values())
    if not zones:
        return "no zones in the snapshot"
    text = f"{len(o.regions)} region{'s' * (len(o.regions) != 1)}, {zones} zone{'s' * (zones != 1)}"
    return text + ("" if o.zones_verified else " (unverified)")


def _dates(rows: list[GpuOffer]) -> list[str]:
    return sorted({d for o in rows for d in [o.price_date, *(s.price_date for s in o.shapes)] if d})


def render_table(rows: list[GpuOffer], catalog: Catalog, spot: bool = False) -> str:
    """One line per GPU type."""
    price_head = "spot $/h/GPU" if spot else "$/h/GPU"
    head = ["GPU", "API name", "memory", "shapes", "where", price_head, "" if spot else "spot", "note"]
    body = [
        [
            o.short,
            o.api,
            f"{o.memory_gb} GB",
            _shapes_summary(o),
            _regions_summary(o),
            money(o.spot_per_gpu if spot else o.on_demand_per_gpu),
            "" if spot else money(o.spot_per_gpu),
            o.note,
        ]
        for o in rows
    ]
    lines = aligned([head, *body])
    lines.append("")
    lines.append(_footer(catalog, _dates(rows)))
    lines.append("`gpu-train gpus NAME` shows one GPU's shapes, zones and prices; short names work in stacks (gpuType: T4).")
    return "\n".join(lines)


def _footer(catalog: Catalog, dates: list[str]) -> str:
    when = "; ".join(dates) or catalog.dates["prices"]
    return (
        f"prices: {catalog.price_region} list prices{dated(when)} (other regions differ; spot prices change; "
        f"n/a = not in the catalog: see {catalog.prices_unknown_where}); zones: a snapshot{dated(catalog.dates['zones'])}"
    )


def render_detail(o: GpuOffer, catalog: Catalog, spot: bool = False) -> str:
    """Every shape, region and price of one GPU type."""
    lines = [
        f"{o.short} ({o.api}): {o.memory_gb} GB, series {o.series}" + (f"; {o.note}" if o.note else ""),
        f"  per GPU: {per_hour(o.on_demand_per_gpu)} on demand, {per_hour(o.spot_per_gpu)} spot"
        + (f" (prices{dated(o.price_date)})" if o.price_date else ""),
        "",
        "  shapes:",
    ]
    for s in o.shapes:
        if s.machine == "n1-*":
            what = f"    n1-* + {s.gpus} x {o.short}".ljust(34) + f"up to {s.max_vcpus} vCPUs, {s.max_memory_gb:g} GB"
            price = f"GPUs {per_hour(s.on_demand)}, spot {per_hour(s.spot)}, plus the N1 VM"
        else:
            what = f"    {s.machine}".ljust(34) + f"{s.gpus} GPU, {s.max_vcpus} vCPUs, {s.max_memory_gb:g} GB"
            price = f"{per_hour(s.on_demand)}, spot {per_hour(s.spot)}"
        ways = f" [{ways_priced(s)}]"
        zones = f" (zones: {', '.join(s.zones)})" if s.zones else ""
        own_date = f" ({s.price_date})" if s.price_date and s.price_date != o.price_date else ""
        lines.append(f"{what.ljust(70)}{price}{own_date}{ways}{zones}")
    lines += ["", f"  zones ({'snapshot' if o.zones_verified else 'snapshot, unverified'}):"]
    lines += [f"    {r}: {', '.join(z.rsplit('-', 1)[1] for z in zs)}" for r, zs in o.regions.items()]
    lines += [
        "",
        _footer(catalog, _dates([o])),
        f"use it: gpu-train:gpuType: {o.short}"
        if o.series == "N1"
        else f"use it: gpu-train:machineType: {o.shapes[0].machine if o.shapes else '?'}",
    ]
    if spot:
        lines.append("(--spot: shapes that cannot be had as spot are left out)")
    return "\n".join(lines)


def ways_priced(s: ShapeOffer) -> str:
    """Each way the shape may be had, with its price where the catalog knows one: Flex-start bills its own
    (Dynamic Workload Scheduler) rate, a reservation the on-demand rate unless a commitment covers it."""
    price = {ON_DEMAND: per_hour(s.on_demand), SPOT: per_hour(s.spot), FLEX_START: "DWS rate n/a", RESERVATION: "on-demand rate"}
    return ", ".join(f"{w} {price[w]}" if w in price else w for w in s.obtain)


def to_json(rows: list[GpuOffer], catalog: Catalog) -> dict[str, Any]:
    return {
        "priceRegion": catalog.price_region,
        "priceDate": catalog.dates["prices"],
        "zonesDate": catalog.dates["zones"],
        "gpus": [o.to_json() for o in rows],
    }
