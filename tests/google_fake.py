"""A local fake of the Google endpoints `check`, `ls`, the program and the recovery function use, on 127.0.15.x,
and a throwaway ADC file.

It answers as Google does: OAuth's token endpoint (a service-account JWT grant, which it checks), the
metadata server's service-account token, Service Usage ``services:batchGet``, Compute ``aggregated/instances``,
``instances.get``, ``instances.start``/``stop``/``setMetadata`` (operations that finish later, with the error
documents of a zone out of capacity; a fingerprint that must match) and ``zoneOperations.get``, what
`scripts/preflight` reads (``regions.get``, ``projects.get``, ``acceleratorTypes.list``, ``reservations.get``
and ``aggregated/reservations``, from ``state["compute"][project]``), Cloud Quotas
``quotaPreferences.list`` (paged; refused as a disabled API unless the project's services say it is
enabled), all refusing a request without the bearer token it issued, with Google's error documents.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "ya29.fake-token-for-tests"
BASE = "https://www.googleapis.com/compute/v1"  # the API's self links name this host, wherever it is asked
SERVICE_USAGE_DISABLED = (
    "Service Usage API has not been used in project {p} before or it is disabled. Enable it by "
    "visiting https://console.developers.google.com/apis/api/serviceusage.googleapis.com/overview"
    "?project={p} then retry."
)


class Google(BaseHTTPRequestHandler):
    state: dict  # set per server: services {project: {service: state}}, instances {project: [..]}, calls [..]

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, status: str, message: str) -> None:
        self._send(code, {"error": {"code": code, "message": message, "status": status}})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        form = urllib.parse.parse_qs(body)
        self.state["calls"].append(("POST", self.path))
        if self.path.startswith("/compute/"):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._error(401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
                return
            compute_post(self, self.path.strip("/").split("/"), json.loads(body or "{}"))
            return
        if self.path != "/token" or form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            self._send(400, {"error": "invalid_grant"})
            return
        payload = form["assertion"][0].split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        if claims.get("iss") != self.state["client_email"]:
            self._send(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
            return
        self._send(200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"})

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        self.state["calls"].append(("GET", url.path))
        if url.path == "/computeMetadata/v1/instance/service-accounts/default/token":  # the function's token
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, {"error": "Missing required header: Metadata-Flavor"})
            else:
                self._send(200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"})
            return
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._error(401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
            return
        parts = url.path.strip("/").split("/")
        if url.path.endswith("/services:batchGet") and parts[:2] == ["v1", "projects"]:
            project = parts[2]
            services = self.state["services"].get(project)
            if services is None:
                self._error(403, "PERMISSION_DENIED", SERVICE_USAGE_DISABLED.format(p=project))
                return
            found = []
            for name in query.get("names", []):
                service = name.rsplit("/", 1)[-1]
                found.append(
                    {
                        "name": f"projects/123456789/services/{service}",
                        "parent": "projects/123456789",
                        "state": services.get(service, "DISABLED"),
                    }
                )
            self._send(200, {"services": found})
        elif parts[:2] == ["v1", "projects"] and parts[3:] == ["locations", "global", "quotaPreferences"]:
            project = parts[2]
            self.state.setdefault("quota_projects", []).append(self.headers.get("x-goog-user-project"))
            if self.state["services"].get(project, {}).get("cloudquotas.googleapis.com") != "ENABLED":
                self._send(
                    403,
                    {
                        "error": {
                            "code": 403,
                            "status": "PERMISSION_DENIED",
                            "message": (
                                f"Cloud Quotas API has not been used in project {project} before or it is disabled. Enable it by "
                                "visiting https://console.developers.google.com/apis/api/cloudquotas.googleapis.com/overview"
                                f"?project={project} then retry."
                            ),
                            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED"}],
                        }
                    },
                )
                return
            if "quota_preferences_answer" in self.state:  # a faulty answer, as it is
                data = self.state["quota_preferences_answer"]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            found = self.state.get("quota_preferences", {}).get(project, [])
            start = int(query.get("pageToken", ["0"])[0])
            page = {"quotaPreferences": found[start : start + 2]}  # two a page: callers must follow nextPageToken
            if start + 2 < len(found):
                page["nextPageToken"] = str(start + 2)
            self._send(200, page)
        elif parts[:3] == ["compute", "v1", "projects"] and parts[4:] == ["aggregated", "instances"]:
            project = parts[3]
            wanted = query.get("filter", [""])[0]
            items: dict[str, dict] = {}
            for inst in self.state["instances"].get(project, []):
                if wanted == "labels.gpu-train-stack:*" and "gpu-train-stack" not in inst.get("labels", {}):
                    continue
                items.setdefault(f"zones/{inst['zone'].rsplit('/', 1)[-1]}", {"instances": []})["instances"].append(inst)
            items["zones/europe-west4-a"] = {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results"}}
            self._send(200, {"kind": "compute#instanceAggregatedList", "items": items})
        elif parts[:3] == ["compute", "v1", "projects"] and len(parts) == 8 and parts[4] == "zones" and parts[6] == "instances":
            project, zone, name = parts[3], parts[5], parts[7]  # instances.get
            for inst in self.state["instances"].get(project, []):
                if inst["name"] == name and inst["zone"].rsplit("/", 1)[-1] == zone:
                    self._send(200, inst)
                    return
            self._error(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        elif parts[:3] == ["compute", "v1", "projects"] and len(parts) == 8 and parts[6] == "operations":
            op = self.state["operations"].get(parts[7])  # zoneOperations.get
            if op is None:
                self._error(404, "NOT_FOUND", f"The resource '{'/'.join(parts[2:])}' was not found")
            else:
                self._send(200, op)
        elif parts[:3] == ["compute", "v1", "projects"] and self._preflight(parts, query):
            pass
        else:
            self._error(404, "NOT_FOUND", f"no such method {url.path}")

    def _preflight(self, parts: list[str], query: dict[str, list[str]]) -> bool:
        """What scripts/preflight reads, answered from ``state["compute"][project]``: {"region": {metric: (limit,
        usage)}, "global": (limit, usage), "offered": [accelerator type names], "reservations": {zone: [the
        reservations resource, as the API gives it]}}. False for a path it does not serve."""
        project = parts[3]
        doc = self.state.get("compute", {}).get(project)
        rest = parts[4:]
        if doc is None:
            if not rest or rest[0] in ("regions", "zones", "aggregated"):
                self._error(403, "PERMISSION_DENIED", f"Permission denied on resource project {project}.")
                return True
            return False

        def quotas(table: dict) -> list[dict]:
            return [{"metric": m, "limit": float(lim), "usage": float(use)} for m, (lim, use) in table.items()]

        if not rest:  # projects.get
            limit, usage = doc.get("global", (0, 0))
            self._send(200, {"kind": "compute#project", "name": project, "quotas": quotas({"GPUS_ALL_REGIONS": (limit, usage)})})
        elif len(rest) == 2 and rest[0] == "regions":  # regions.get
            self._send(200, {"kind": "compute#region", "name": rest[1], "quotas": quotas(doc.get("region", {}))})
        elif len(rest) == 3 and rest[0] == "zones" and rest[2] == "acceleratorTypes":
            self._send(
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
                self._send(200, found[0])
            else:
                self._error(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/reservations/{name}' was not found")
        elif rest == ["aggregated", "reservations"]:  # aggregatedList, filtered by name as the client asks
            wanted = query.get("filter", [""])[0].split("=")[-1].strip()
            items: dict[str, dict] = {}
            for zone, found in doc.get("reservations", {}).items():
                mine = [r for r in found if not wanted or r["name"] == wanted]
                items[f"zones/{zone}"] = (
                    {"reservations": mine}
                    if mine
                    else {
                        "warning": {"code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{zone}' on this page."}
                    }
                )
            self._send(200, {"kind": "compute#reservationAggregatedList", "items": items})
        else:
            return False
        return True

    def log_message(self, *args) -> None:
        pass


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


class FakeGoogle:
    def __init__(self, address: str = "127.0.15.1"):
        handler = type(
            "Handler",
            (Google,),
            {
                "state": {
                    "services": {},
                    "instances": {},
                    "calls": [],
                    "operations": {},
                    "start_answers": {},
                    "on_start": lambda name: None,
                    "on_stop": lambda name: None,
                    "client_email": "gpu-train-test@proj-1.iam.gserviceaccount.com",
                }
            },
        )
        self.server = ThreadingHTTPServer((address, 0), handler)
        self.state = handler.state
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll

    def adc_file(self, path: Path, project: str = "proj-1") -> Path:
        """A service-account key file whose token endpoint is this fake (a throwaway key)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": project,
                    "private_key_id": "0123abcd",
                    "private_key": pem,
                    "client_email": self.state["client_email"],
                    "client_id": "1234567890",
                    "token_uri": f"{self.url}/token",
                }
            )
        )
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
