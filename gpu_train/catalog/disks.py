"""Which disk types a machine series takes, and which quota a disk counts against (pure lookups).

Compute Engine refuses a boot or data disk whose type the series does not support (A4, A3 Ultra,
A4X and G4 take Hyperdisk only; A3 High/Mega/Edge take no pd-standard), and only at `pulumi up`.
The facts are the catalog's `disks` table; these functions are what the validator, the Pulumi
program and the quota check ask of it, so a default and a check can never disagree.
"""

from __future__ import annotations

from gpu_train.catalog.model import Catalog

BOOT, DATA = "boot", "data"
FALLBACK_DEFAULT = "pd-balanced"  # a machine type the table does not know (validation reports it)


def default_disk_type(catalog: Catalog, machine_type: str) -> str:
    """The disk type gpu-train gives a series' disks when none is set: the series' own."""
    row = catalog.disks_of(machine_type)
    return row.default if row is not None else FALLBACK_DEFAULT


def allowed_disk_types(catalog: Catalog, machine_type: str, role: str = BOOT) -> tuple[str, ...]:
    """The types a ``role`` (boot or data) disk may have on ``machine_type``; () when the series is unknown."""
    row = catalog.disks_of(machine_type)
    if row is None:
        return ()
    return row.boot if role == BOOT else row.data


def disk_type_problem(catalog: Catalog, machine_type: str, disk_type: str, role: str = BOOT) -> str | None:
    """Why ``disk_type`` cannot be a ``role`` disk of ``machine_type`` (None: it can, or the series is unknown)."""
    row = catalog.disks_of(machine_type)
    allowed = allowed_disk_types(catalog, machine_type, role)
    if row is None or disk_type in allowed:
        return None
    return (
        f"{row.name} ({machine_type}) does not take {disk_type} as a {role} disk; it takes "
        f"{', '.join(allowed)} (catalog of {catalog.dates['disks']})"
    )


def disk_quota_metric(catalog: Catalog, disk_type: str) -> str:
    """The regional quota a disk of this type counts against (Hyperdisk: its own, not SSD_TOTAL_GB)."""
    return catalog.disk_quota_metrics.get(disk_type, "DISKS_TOTAL_GB" if disk_type == "pd-standard" else "SSD_TOTAL_GB")
