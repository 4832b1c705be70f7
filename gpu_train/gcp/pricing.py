"""What a GPU shape costs per hour, from the catalog's price table (a pure decision).

Prices are list prices for one region (the catalog's ``prices.region``); a price the catalog
does not know stays ``None`` rather than being guessed, and callers say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_train.catalog.model import FLEX_START, SPOT, Catalog, Price
from gpu_train.gcp.validate import GpuShape


@dataclass(frozen=True)
class Cost:
    """USD per hour for one VM, on demand and spot; None where the catalog has no price."""

    on_demand: float | None
    spot: float | None
    region: str
    date: str

    def hourly(self, spot: bool) -> float | None:
        return self.spot if spot else self.on_demand

    def for_way(self, way: str) -> float | None:
        """The price of one way to have the VM: Flex-start bills its own (DWS) rate, which the catalog does not
        hold; a reservation's VM bills on demand unless a commitment covers it."""
        return {SPOT: self.spot, FLEX_START: None}.get(way, self.on_demand)


def _machine_price(machine_type: str, catalog: Catalog) -> Price | None:
    if machine_type in catalog.machine_prices:
        return catalog.machine_prices[machine_type]
    for prefix, (base, base_vcpus) in catalog.linear_series.items():
        size = machine_type.removeprefix(prefix + "-")
        if size != machine_type and size.isdigit() and base in catalog.machine_prices:
            p, factor = catalog.machine_prices[base], int(size) / base_vcpus
            return Price(_scale(p.on_demand, factor), _scale(p.spot, factor), p.date)
    return None


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a + b, 5)


def hourly_cost(shape: GpuShape, catalog: Catalog) -> Cost:
    """Machine plus attached GPUs; fixed shapes are priced whole (their price includes the GPUs)."""
    machine = _machine_price(shape.machine_type, catalog) or Price(None, None)
    dates = [machine.date]
    if shape.machine_type in catalog.machine_prices_include_gpus or shape.gpu_count == 0:
        gpus = Price(0.0, 0.0)  # priced whole, or a CPU-only node (a parameter server pool)
    elif shape.attached:
        acc = catalog.accelerator(shape.gpu_type)
        per_gpu = catalog.gpu_prices.get(acc.name if acc else "", Price(None, None))
        gpus = Price(_scale(per_gpu.on_demand, shape.gpu_count), _scale(per_gpu.spot, shape.gpu_count))
        dates.append(per_gpu.date)
    else:
        gpus = Price(None, None)  # a fixed shape whose whole price the catalog does not have
    return Cost(
        on_demand=_add(machine.on_demand, gpus.on_demand),
        spot=_add(machine.spot, gpus.spot),
        region=catalog.price_region,
        date=" and ".join(sorted({d for d in dates if d})) or catalog.dates["prices"],
    )
