"""The fake's Compute Engine API (tests/google_fake.py serves it, on the same address and token).

Its own module because Compute is the one API of the fake with state that changes: ``instances.get`` and
``aggregated/instances``, ``instances.start``/``stop``/``setMetadata`` (operations that finish later,
with the error documents of a zone out of capacity; a fingerprint that must match), ``zoneOperations.get``,
and what `scripts/preflight` reads (``regions.get``, ``projects.get``, ``acceleratorTypes.list``,
``reservations.get`` and ``aggregated/reservations``, from ``state["compute"][project]``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.google_fake import Google

BASE = "https://www.googleapis.com/compute/v1"  # the API's self links name this host, wherever it is asked


def compute_get(handler: Google, parts: list[str], query: dict[str, list[str]]) -> bool:
    """A GET of .../compute/v1/projects/P/...: instances, operations, then what preflight reads.
    False for a path it does not serve."""
    if parts[4:] == ["aggregated", "instances"]:
        project = parts[3]
        wanted = query.get("filter", [""])[0]
        items: dict[str, dict] = {}
        for inst in handler.state["instances"].get(project, []):
            if wanted == "labels.gpu-train-stack:*" and "gpu-train-stack" not in inst.get("labels", {}):
                continue
            items.setdefault(f"zones/{inst['zone'].rsplit('/', 1)[-1]}", {"instances": []})["instances"].append(inst)
        items["zones/europe-west4-a"] = {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results"}}
        handler._send(200, {"kind": "compute#instanceAggregatedList", "items": items})
    elif len(parts) == 8 and parts[4] == "zones" and parts[6] == "instances":
        project, zone, name = parts[3], parts[5], parts[7]  # instances.get
        for inst in handler.state["instances"].get(project, []):
            if inst["name"] == name and inst["zone"].rsplit("/", 1)[-1] == zone:
                handler._send(200, inst)
                return True
        handler._error(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
    elif len(parts) == 8 and parts[6] == "operations":
        op = handler.state["operations"].get(parts[7])  # zoneOperations.get
        if op is None:
            handler._error(404, "NOT_FOUND", f"The resource '{'/'.join(parts[2:])}' was not found")
        else:
            handler._send(200, op)
    else:
        return preflight(handler, parts, query)
    return True


def preflight(handler: Google, parts: list[str], query: dict[str, list[str]]) -> bool:
    """What scripts/preflight reads, answered from ``state["compute"][project]``: {"region": {metric: (limit,
    usage)}, "global": (limit, usage), "offered": [accelerator type names], "reservations": {zone: [the
    reservations resource, as the API gives it]}}. False for a path it does not serve."""
    project = parts[3]
    doc = handler.state.get("compute", {}).get(project)
    rest = parts[4:]
    if doc is None:
        if not rest or rest[0] in ("regions", "zones", "aggregated"):
            handler._error(403, "PERMISSION_DENIED", f"Permission denied on resource project {project}.")
            return True
        return False

    def quotas(table: dict) -> list[dict]:
        return [{"metric": m, "limit": float(lim), "usage": float(use)} for m, (lim, use) in table.items()]

    if not rest:  # projects.get
        limit, usage = doc.get("global", (0, 0))
        handler._send(200, {"kind": "compute#project", "name": project, "quotas": quotas({"GPUS_ALL_REGIONS": (limit, usage)})})
    elif len(rest) == 2 and rest[0] == "regions":  # regions.get
        handler._send(200, {"kind": "compute#region", "name": rest[1], "quotas": quotas(doc.get("region", {}))})
    elif len(rest) == 3 and rest[0] == "zones" and rest[2] == "acceleratorTypes":
        handler._send(
            200,
            {
                "kind": "compute#acceleratorTypeList",
                "items": [
                    {"kind": "compute#acceleratorType", "name": n, "zone": f"{BASE}/projects/{project}/zones/{rest[1]}"}
                    for n in doc.get("offered", [])
                ],
            },
        )
    elif len(rest) == 4 and rest[0] == "zones" and rest[2] == "reservations":  # reservations.get
        zone, name = rest[1], rest[3]
        found = [r for r in doc.get("reservations", {}).get(zone, []) if r["name"] == name]
        if found:
            handler._send(200, found[0])
        else:
            handler._error(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/reservations/{name}' was not found")
    elif rest == ["aggregated", "reservations"]:  # aggregatedList, filtered by name as the client asks
        wanted = query.get("filter", [""])[0].split("=")[-1].strip()
        items: dict[str, dict] = {}
        for zone, found in doc.get("reservations", {}).items():
            mine = [r for r in found if not wanted or r["name"] == wanted]
            items[f"zones/{zone}"] = (
                {"reservations": mine}
                if mine
                else {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{zone}' on this page."}}
            )
        handler._send(200, {"kind": "compute#reservationAggregatedList", "items": items})
    else:
        return False
    return True


# -- Compute's state changes ----------------------------------------------------------------------------
CAPACITY_ERROR = {
    "errors": [
        {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "message": (
                "The zone 'projects/{p}/zones/{z}' does not have enough resources available to fulfill the request.  "
                "Try a different zone, or try again later."
            ),
        }
    ]
}
_op_numbers = itertools.count(1)


def rfc3339(at: float) -> str:
    """A timestamp as Compute Engine writes one (Pacific time, milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at - 8 * 3600)) + f".{int(at * 1000) % 1000:03d}-08:00"


def compute_post(handler: Google, parts: list[str], body: dict) -> None:
    """instances.start / stop / setMetadata on .../projects/P/zones/Z/instances/N/VERB."""
    state = handler.state
    if len(parts) != 9 or parts[:3] != ["compute", "v1", "projects"] or parts[6] != "instances":
        handler._error(404, "NOT_FOUND", "no such method")
        return
    project, zone, name, verb = parts[3], parts[5], parts[7], parts[8]
    inst = next((i for i in state["instances"].get(project, []) if i["name"] == name), None)
    if inst is None:
        handler._error(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        return
    target = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{name}"
    op = {
        "kind": "compute#operation",
        "id": str(next(_op_numbers)),
        "operationType": verb,
        "targetLink": target,
        "targetId": inst.get("id", "1"),
        "status": "RUNNING",
        "progress": 0,
        "insertTime": rfc3339(time.time()),
        "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
    }
    op["name"] = f"operation-{op['id']}-{verb}"
    op["selfLink"] = f"{op['zone']}/operations/{op['name']}"
    state["operations"][op["name"]] = op
    if verb == "setMetadata":
        meta = inst.setdefault("metadata", {"kind": "compute#metadata", "fingerprint": "fp-0", "items": []})
        if body.get("fingerprint") != meta.get("fingerprint"):
            handler._send(
                412,
                {
                    "error": {
                        "code": 412,
                        "message": "Supplied fingerprint does not match current metadata fingerprint.",
                        "errors": [
                            {
                                "message": "Supplied fingerprint does not match current metadata fingerprint.",
                                "domain": "global",
                                "reason": "conditionNotMet",
                                "location": "If-Match",
                                "locationType": "header",
                            }
                        ],
                    }
                },
            )
            return
        meta["items"] = body.get("items", [])
        meta["fingerprint"] = f"fp-{op['id']}"
        op.update(status="DONE", progress=100)
        handler._send(200, op)
        return
    if verb not in ("start", "stop"):
        handler._error(400, "INVALID_ARGUMENT", f"no such verb {verb}")
        return
    handler._send(200, dict(op))
    threading.Thread(target=_finish, args=(state, inst, op, project, zone), daemon=True).start()


def _finish(state: dict, inst: dict, op: dict, project: str, zone: str) -> None:
    """What Compute Engine does after answering: power the VM on or off (the hooks boot or power off a
    guest), or fail a start for want of capacity (``start_answers``: per instance, "ok" or "capacity")."""
    verb, name = op["operationType"], inst["name"]
    if verb == "start" and inst["status"] == "TERMINATED":
        answers = state["start_answers"].get(name) or []
        if (answers.pop(0) if answers else "ok") == "capacity":
            time.sleep(0.2)
            error = json.loads(json.dumps(CAPACITY_ERROR).replace("{p}", project).replace("{z}", zone))
            op.update(
                status="DONE",
                progress=100,
                error=error,
                httpErrorStatusCode=503,
                httpErrorMessage="SERVICE UNAVAILABLE",
                endTime=rfc3339(time.time()),
            )
            return
        inst["status"] = "STAGING"
        state["on_start"](name)
        inst.update(status="RUNNING", lastStartTimestamp=rfc3339(time.time()))
    elif verb == "stop" and inst["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
        inst["status"] = "STOPPING"
        state["on_stop"](name)
        inst.update(status="TERMINATED", lastStopTimestamp=rfc3339(time.time()))
    op.update(status="DONE", progress=100, endTime=rfc3339(time.time()))


def reservation(
    project: str,
    zone: str,
    name: str,
    machine_type: str,
    count: int = 1,
    in_use: int = 0,
    accelerators: list[tuple[str, int]] | None = None,
    local_ssds: list[int] | None = None,
    status: str = "READY",
) -> dict:
    """A ``compute#reservation`` as reservations.get gives it (int64 fields as strings, as the API's JSON has
    them): a specific reservation of ``count`` VMs of ``machine_type``."""
    props: dict = {"machineType": machine_type}
    if accelerators:
        props["guestAccelerators"] = [{"acceleratorType": t, "acceleratorCount": c} for t, c in accelerators]
    if local_ssds:
        props["localSsds"] = [{"diskSizeGb": str(gb), "interface": "NVME"} for gb in local_ssds]
    link = f"{BASE}/projects/{project}/zones/{zone}/reservations/{name}"
    return {
        "kind": "compute#reservation",
        "id": "1234567890123456789",
        "creationTimestamp": "2026-11-01T08:00:00.000-07:00",
        "selfLink": link,
        "zone": f"{BASE}/projects/{project}/zones/{zone}",
        "name": name,
        "specificReservation": {"instanceProperties": props, "count": str(count), "inUseCount": str(in_use)},
        "specificReservationRequired": True,
        "status": status,
        "shareSettings": {"shareType": "LOCAL"},
    }
