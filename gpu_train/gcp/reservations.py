"""Does a reservation fit the stack? A pure reading of the Compute API's ``reservations`` resource.

`scripts/preflight` fetches the reservation the stack names (reservations.get, with the user's
credentials) and this says what differs from the VMs the stack declares: the machine type, the GPUs,
Local SSD, how many VMs it still holds, its status, and whether it is DENSE (``deploymentType``: calendar
mode, future reservations), which takes only reservation-bound VMs. Field names are the v1 API's (``specificReservation
.instanceProperties.{machineType, guestAccelerators[].{acceleratorType, acceleratorCount},
localSsds[].{diskSizeGb, interface}}``, ``count``/``inUseCount`` as int64 strings, ``status``,
``deploymentType`` DENSE or DEPLOYMENT_TYPE_UNSPECIFIED).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_train.catalog.model import Catalog
from gpu_train.gcp.provisioning import parse_reservation
from gpu_train.gcp.validate import GpuShape

DENSE = "DENSE"
DENSE_REFUSAL = "Instances consuming DENSE reservations must use provisioningModel RESERVATION_BOUND"  # the API's 400


@dataclass
class Fit:
    """What differs (the VM will not consume it: errors) and what to watch (warnings)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def where(reservation: str, stack_project: str) -> tuple[str, str]:
    """(project, name) to ask the API for: the reservation's own project (a shared one) or the stack's."""
    parts = parse_reservation(reservation)
    assert parts is not None, "validate the stack first"
    return parts[0] or stack_project, parts[1]


def fit(doc: dict[str, Any], shapes: list[GpuShape], catalog: Catalog, bound: bool = False) -> Fit:
    """Compare a reservation with each node's shape (every node consumes one of its VMs); ``bound``: the stack's
    reservationBound."""
    out = Fit()
    name = doc.get("name", "?")
    if doc.get("deploymentType") == DENSE and not bound:
        out.errors.append(
            f"reservation {name} is DENSE (calendar mode or a future reservation): Compute Engine refuses a standard VM on it "
            f'("{DENSE_REFUSAL}"); fix: pulumi config set gpu-train:reservationBound true'
        )
    elif bound and doc.get("deploymentType") != DENSE:
        out.warnings.append(
            f"reservation {name} is not DENSE: gpu-train:reservationBound makes the VM RESERVATION_BOUND, meant for calendar-mode "
            "and future reservations; remove it unless Google's page for your reservation asks for it"
        )
    specific = doc.get("specificReservation") or {}
    props = specific.get("instanceProperties") or {}
    machine = str(props.get("machineType", "")).rsplit("/", 1)[-1]
    shape = shapes[0]
    if machine != shape.machine_type:
        out.errors.append(
            f"reservation {name} holds {machine or 'no machine type'} VMs, the stack declares "
            f"{shape.machine_type}: a VM consumes a reservation only of its own machine type"
        )
    wanted = {shape.gpu_type: shape.gpu_count} if shape.attached else {}
    held: dict[str, int] = {}
    for acc in props.get("guestAccelerators") or []:
        kind = str(acc.get("acceleratorType", "")).rsplit("/", 1)[-1]
        held[kind] = held.get(kind, 0) + int(acc.get("acceleratorCount", 0))
    fixed = catalog.parse_machine_type(shape.machine_type)
    implied = fixed is not None and fixed.fixed is not None
    if held and implied and held != {shape.gpu_type: shape.gpu_count}:
        out.errors.append(
            f"reservation {name} lists GPUs {_gpus(held)}; {shape.machine_type} comes with {shape.gpu_count} x {shape.gpu_type}"
        )
    elif not implied and held != wanted:
        out.errors.append(f"reservation {name} holds GPUs {_gpus(held) or 'none'}, the stack attaches {_gpus(wanted) or 'none'}")
    ssds = props.get("localSsds") or []
    bundled = implied and fixed is not None and fixed.fixed is not None and fixed.fixed.local_ssd
    if ssds and not bundled:
        total = sum(int(str(s.get("diskSizeGb", 0))) for s in ssds)
        out.errors.append(
            f"reservation {name} holds {len(ssds)} Local SSD ({total} GB) per VM; gpu-train's VMs attach none, so they do not match it"
        )
    count, in_use = int(str(specific.get("count", 0))), int(str(specific.get("inUseCount", 0)))
    if count - in_use < len(shapes):
        out.warnings.append(f"reservation {name} holds {count} VMs, {in_use} in use: {count - in_use} free for the stack's {len(shapes)}")
    if doc.get("status", "READY") != "READY":
        out.warnings.append(f"reservation {name} is {doc.get('status')}, not READY")
    return out


def _gpus(held: dict[str, int]) -> str:
    return ", ".join(f"{n} x {t}" for t, n in sorted(held.items()))
