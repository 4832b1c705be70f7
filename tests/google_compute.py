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
    elif rest[:1] == ["aggregated"] and rest[1:] in (["machineTypes"], ["acceleratorTypes"]):  # zones offering a name
        kind, wanted = rest[1], query.get("filter", [""])[0].split("=")[-1].strip()
        zones = doc.get("offering", {}).get(wanted, [])
        scoped = {f"zones/{z}": {kind: [{"name": wanted, "zone": f"{BASE}/projects/{project}/zones/{z}"}]} for z in zones}
        handler._send(200, {"kind": f"compute#{kind[:-1]}AggregatedList", "items": scoped})
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


# Google's own words for the rules the fake enforces (each found in a public report of the real answer).
LOCAL_SSD_STOP = (  # instances.stop without discardLocalSsd on a VM with Local SSD (skypilot#2586, fog-google#621)
    "VM has a Local SSD attached but an undefined value for `discard-local-ssd`. If using gcloud, please add "
    "`--discard-local-ssd=false` or `--discard-local-ssd=true` to your command."
)
ACT_AS = "Required 'iam.serviceAccounts.actAs' permission for 'projects/{p}/serviceAccounts/{a}'"
DENSE = "Instances consuming DENSE reservations must use provisioningModel RESERVATION_BOUND"  # skypilot#9779
FINGERPRINT = "Supplied fingerprint does not match current metadata fingerprint."
LABEL_FINGERPRINT = "Labels fingerprint either invalid or resource labels have changed"


def has_local_ssd(inst: dict) -> bool:
    """Local SSD shows in instances.get as a disk of type SCRATCH (the bundled ones of A2 Ultra, A3, A4 too)."""
    return any(d.get("type") == "SCRATCH" for d in inst.get("disks") or [])


def _refuse(handler: Google, code: int, reason: str, message: str, location: str | None = None) -> None:
    err: dict = {"message": message, "domain": "global", "reason": reason}
    if location:
        err.update(location=location, locationType="header")
    handler._send(code, {"error": {"code": code, "message": message, "errors": [err]}})


def compute_post(handler: Google, parts: list[str], body: dict, query: dict[str, list[str]] | None = None) -> None:
    """instances.start / stop / setMetadata / setLabels on .../projects/P/zones/Z/instances/N/VERB, with the
    rules Google's documents state: a stop of a VM with Local SSD names discardLocalSsd; setMetadata on a VM
    that runs as a service account needs actAs on it (``state["act_as"]``: callers that have it); a fingerprint
    must match; a start gets a new ephemeral external IP."""
    state, query = handler.state, query or {}
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
    if verb == "setMetadata":
        accounts = [a.get("email") for a in inst.get("serviceAccounts") or []]
        if accounts and not state.get("act_as"):
            _refuse(handler, 403, "forbidden", ACT_AS.format(p=project, a=accounts[0]))
            return
        meta = inst.setdefault("metadata", {"kind": "compute#metadata", "fingerprint": "fp-0", "items": []})
        if body.get("fingerprint") != meta.get("fingerprint"):
            _refuse(handler, 412, "conditionNotMet", FINGERPRINT, "If-Match")
            return
        meta["items"] = body.get("items", [])
        meta["fingerprint"] = f"fp-{op['id']}"
    elif verb == "setLabels":
        if state.get("refuse_labels"):
            where = f"projects/{project}/zones/{zone}/instances/{name}"
            _refuse(handler, 403, "forbidden", f"Required 'compute.instances.setLabels' permission for '{where}'")
            return
        if body.get("labelFingerprint") != inst.setdefault("labelFingerprint", "lf-0"):
            _refuse(handler, 412, "conditionNotMet", LABEL_FINGERPRINT, "If-Match")
            return
        inst["labels"] = dict(body.get("labels") or {})
        inst["labelFingerprint"] = f"lf-{op['id']}"
    elif verb == "stop" and has_local_ssd(inst) and "discardLocalSsd" not in query:
        _refuse(handler, 400, "badRequest", LOCAL_SSD_STOP)
        return
    elif verb not in ("start", "stop"):
        handler._error(400, "INVALID_ARGUMENT", f"no such verb {verb}")
        return
    state["operations"][op["name"]] = op
    if verb in ("setMetadata", "setLabels"):
        op.update(status="DONE", progress=100)
        handler._send(200, op)
        return
    handler._send(200, dict(op))
    threading.Thread(target=_finish, args=(state, inst, op, project, zone), daemon=True).start()


_addresses = itertools.count(10)


def new_ephemeral_ip(inst: dict) -> None:
    """A start gives each ephemeral external address a new one (Compute Engine releases it at the stop)."""
    for nic in inst.get("networkInterfaces") or []:
        for access in nic.get("accessConfigs") or []:
            if "natIP" in access and not access.get("static"):
                n = next(_addresses)
                access["natIP"] = f"198.51.{100 + n // 250}.{n % 250 + 1}"


def _finish(state: dict, inst: dict, op: dict, project: str, zone: str) -> None:
    """What Compute Engine does after answering: power the VM on or off (the hooks boot or power off a
    guest), or fail a start for want of capacity (``start_answers``: per instance, "ok" or "capacity")."""
    verb, name = op["operationType"], inst["name"]
    if verb == "start" and inst["status"] == "TERMINATED":
        answers = state["start_answers"].get(name) or []
        if (answers.pop(0) if answers else "ok") == "capacity":
            time.sleep(state.get("capacity_delay_s", 0.2))
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
        new_ephemeral_ip(inst)
        state["on_start"](name)
        inst.update(status="RUNNING", lastStartTimestamp=rfc3339(time.time()))
    elif verb == "stop" and inst["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
        inst["status"] = "STOPPING"
        state["on_stop"](name)
        if has_local_ssd(inst):
            inst["localSsdDiscarded"] = True  # (not a field of the API: what the tests read)
        inst.update(status="TERMINATED", lastStopTimestamp=rfc3339(time.time()))
    op.update(status="DONE", progress=100, endTime=rfc3339(time.time()))


def insert_refusal(body: dict, reservations: list[dict]) -> tuple[int, str] | None:
    """What instances.insert answers for an instance ``body`` (the API's fields) that names a reservation:
    a STANDARD VM on a DENSE one is refused (skypilot#9779, Google's A4 / A3 Ultra pages)."""
    affinity = body.get("reservationAffinity") or {}
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return None
    names = {str(v).split("/reservations/")[-1].split("/")[0] for v in affinity.get("values") or []}
    model = (body.get("scheduling") or {}).get("provisioningModel", "STANDARD")
    for r in reservations:
        if r["name"] in names and r.get("deploymentType") == "DENSE" and model != "RESERVATION_BOUND":
            return 400, DENSE
    return None


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
    deployment: str | None = None,
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
        **({"deploymentType": deployment} if deployment else {}),
    }
