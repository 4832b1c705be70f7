"""A local fake of the Google endpoints `check`, `ls`, the program and the recovery function use, on 127.0.15.x,
and a throwaway ADC file.

It answers as Google does: OAuth's token endpoint (a service-account JWT grant, which it checks), the
metadata server's service-account token, Service Usage ``services:batchGet``, Cloud Quotas
``quotaPreferences.list`` (paged; refused as a disabled API unless the project's services say it is
enabled) and the Compute API (tests/google_compute.py: instances, their operations, what
`scripts/preflight` reads), all refusing a request without the bearer token it issued, with Google's
error documents.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.google_compute import compute_get, compute_post
from tests.google_discovery import problems
from tests.loopback_http import LoopbackServer

TOKEN = "ya29.fake-token-for-tests"
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

    def _shape_refused(self, method: str, path: str, query: dict[str, list[str]], body: object = None) -> bool:
        """Google's 400 for a request its API does not describe (tests/google_discovery.py); every one is kept."""
        found = problems("compute.v1", method, path, query, body)
        self.state.setdefault("requests", []).append((method, path, query, body, found))
        if found:
            self._error(400, "INVALID_ARGUMENT", "; ".join(found))
        return bool(found)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        form = urllib.parse.parse_qs(body)
        url = urllib.parse.urlparse(self.path)
        self.state["calls"].append(("POST", url.path))
        if url.path.startswith("/compute/"):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._error(401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
                return
            doc = json.loads(body) if body else None
            query = urllib.parse.parse_qs(url.query)
            if not self._shape_refused("POST", url.path, query, doc):
                compute_post(self, url.path.strip("/").split("/"), doc or {}, query)
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
        elif parts[:3] == ["compute", "v1", "projects"]:
            if not self._shape_refused("GET", url.path, query) and not compute_get(self, parts, query):
                self._error(404, "NOT_FOUND", f"no such method {url.path}")
        else:
            self._error(404, "NOT_FOUND", f"no such method {url.path}")

    def log_message(self, *args) -> None:
        pass


@functools.cache
def throwaway_key() -> str:
    """A throwaway RSA key (PEM), made once a process: each fake's key file names its own token endpoint, and
    the fake takes any signature (a 2048-bit key took 0.03 to 0.3 s of CPU, in every test that used one)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


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
        self.server = LoopbackServer((address, 0), handler)
        self.state = handler.state
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll

    def adc_file(self, path: Path, project: str = "proj-1") -> Path:
        """A service-account key file whose token endpoint is this fake (a throwaway key)."""
        pem = throwaway_key()
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


class Trigger:
    """Eventarc's Pub/Sub trigger of a Cloud Run function with retries on, as Google documents it ("Enable
    event-driven function retries"): a delivery that fails is made again with exponential backoff of 10 s
    to 600 s, until it succeeds or the retry window, 24 hours after the event was published, expires; then
    the event is dropped. Time is simulated: ``function(data, now)`` is called at each delivery's time."""

    WINDOW_S, FIRST_BACKOFF_S, MAX_BACKOFF_S = 24 * 3600, 10.0, 600.0

    def __init__(self, function):
        self.function = function
        self.deliveries: list[tuple[float, str]] = []  # (seconds after publishing, "ok" or the error)

    def publish(self, data: dict, at: float) -> bool:
        """Deliver until done or dropped: True when a delivery succeeded."""
        t, backoff = 0.0, self.FIRST_BACKOFF_S
        while t < self.WINDOW_S:
            try:
                self.function(data, at + t)
            except Exception as e:  # an error to the trigger: again after the backoff
                self.deliveries.append((t, f"{type(e).__name__}: {e}"))
                t, backoff = t + backoff, min(backoff * 2, self.MAX_BACKOFF_S)
                continue
            self.deliveries.append((t, "ok"))
            return True
        return False
