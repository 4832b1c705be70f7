"""Why did `pulumi up` fail, and where to try next: pure decisions about GCP capacity errors.

The classifier reads the error messages Compute Engine sends, as Pulumi prints them (the provider
passes on messages only: no error codes, no `zonesAvailable`), and says what kind of failure it
is; the planner orders the zones to try. See the reference's section 9.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpu_train.catalog.model import ZONE_PATTERN, Catalog
from gpu_train.gcp.shape_rules import nearest_regions

STOCKOUT, REGIONAL_QUOTA, GLOBAL_QUOTA, NOT_OFFERED, CONFIG, TRANSIENT, PREFERENCE_EXISTS, UNKNOWN = (
    "stockout", "regional-quota", "global-quota", "not-offered", "config", "transient", "preference-exists",
    "unknown")  # fmt: skip
ZONE_RE = ZONE_PATTERN


@dataclass(frozen=True)
class Failure:
    kind: str
    reason: str
    zones_available: tuple[str, ...] = field(default=())
    metric: str | None = None

    @property
    def moves_zone(self) -> bool:
        return self.kind in (STOCKOUT, REGIONAL_QUOTA, NOT_OFFERED, TRANSIENT)


def classify(text: str) -> Failure:
    """Sort an error into stockout / quota (regional or global) / not offered in the zone /
    configuration / transient.

    Configuration errors win even when wrapped in a _WITH_DETAILS code: retrying elsewhere cannot
    fix "features are not compatible". A machine or accelerator type the zone does not offer is
    fixed by another zone.
    """
    if m := re.search(r"\[[^\]]*\] features are not compatible[^\n]*", text):
        return Failure(CONFIG, m.group(0).strip())
    if m := re.search(r"Error creating QuotaPreference: [^\n]*(already exists|Error 409)[^\n]*", text):
        return Failure(PREFERENCE_EXISTS, m.group(0).strip())
    if m := re.search(r"The resource '[^']*acceleratorTypes/[^']*' was not found", text):
        return Failure(NOT_OFFERED, m.group(0))
    if m := re.search(r"Machine type with name '[^']*' does not exist in zone '[^']*'", text):
        return Failure(NOT_OFFERED, m.group(0))
    if m := re.search(r"Quota '([A-Z0-9_]+)' exceeded\.\s*Limit: ([\d.]+) globally", text):
        return Failure(GLOBAL_QUOTA, m.group(0), metric=m.group(1))
    if m := re.search(r"Quota '([A-Z0-9_]+)' exceeded\.\s*Limit: ([\d.]+) in region ([a-z0-9-]+)", text):
        return Failure(REGIONAL_QUOTA, m.group(0), metric=m.group(1))
    if re.search(r"QUOTA_EXCEEDED|quotaExceeded", text):
        return Failure(REGIONAL_QUOTA, "quota exceeded")
    stockout = (
        r"ZONE_RESOURCE_POOL_EXHAUSTED|insufficientCapacity|does not have enough resources available|"
        r"is currently unavailable in the"
    )
    if re.search(stockout, text):
        return Failure(STOCKOUT, _first_line_with(text, stockout), zones_available=_zones_available(text))
    if m := re.search(r"RESOURCE_NOT_READY|RESOURCE_OPERATION_RATE_EXCEEDED|UNSUPPORTED_OPERATION", text):
        return Failure(TRANSIENT, m.group(0))
    return Failure(UNKNOWN, _first_line_with(text, r"error|Error") or text.strip()[:300])


def _first_line_with(text: str, pattern: str) -> str:
    return next((line.strip() for line in text.splitlines() if re.search(pattern, line)), "")


def _zones_available(text: str) -> tuple[str, ...]:
    """The zones the _WITH_DETAILS form names under errorInfo.metadatas.zonesAvailable."""
    m = re.search(r"zonesAvailable['\"]?\s*[:=]\s*['\"]?([a-z0-9,\s-]+)", text)
    if not m:
        return ()
    return tuple(z for z in re.findall(ZONE_RE, m.group(1)))


def zone_plan(zone: str, gpu_type: str, catalog: Catalog, machine_zones: tuple[str, ...] = ()) -> list[str]:
    """Every zone to try, in order: the stack's zone, its region's other zones with the GPU, then the
    nearest regions' zones (same geography first)."""
    zones = machine_zones or catalog.zones_for(gpu_type)
    region = zone.rsplit("-", 1)[0]
    order = [zone] + [z for z in zones if z.rsplit("-", 1)[0] == region and z != zone]
    for _, rz in nearest_regions(region, tuple(z for z in zones if z.rsplit("-", 1)[0] != region), n=50):
        order += rz
    return order


def next_zones(plan: list[str], tried: set[str], failure: Failure, skipped_regions: set[str]) -> list[str]:
    """The remaining plan after a failure: zones GCP named first, then the rest; regions out of quota skipped."""
    rest = [z for z in plan if z not in tried and z.rsplit("-", 1)[0] not in skipped_regions]
    named = [z for z in failure.zones_available if z not in tried and z.rsplit("-", 1)[0] not in skipped_regions]
    return named + [z for z in rest if z not in named]
