"""Thin probes of the outside world for `check` and `ls`: the Pulumi CLI, the ADC file, two Google APIs.

Each probe is one process run or one HTTP round trip with a short timeout, and answers with plain
data or an error text (never a traceback): `check` and `ls` must work, and say what is missing,
on a machine that has none of it. Google's endpoints can be pointed elsewhere (tests run a local
fake of both APIs and of the OAuth token endpoint, which the ADC file names as ``token_uri``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.environment import Environment
from gpu_train.views.checkup import Adc

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.auth.transport.requests import AuthorizedSession

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
TIMEOUT_S = 10.0
REPO = Path(__file__).resolve().parents[2]


# -- the Pulumi CLI ------------------------------------------------------------------------------
def _pulumi(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    try:
        p = subprocess.run(["pulumi", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "", f"`pulumi {' '.join(args)}` did not answer in {timeout:g} s"
    return p.returncode, p.stdout, p.stderr


def pulumi_version() -> str | None:
    """``pulumi version``'s output; None when there is no ``pulumi`` on PATH."""
    if not shutil.which("pulumi"):
        return None
    code, out, err = _pulumi("version")
    return out if code == 0 else err or f"exit {code}"


def pulumi_whoami() -> tuple[int, str, str] | None:
    return _pulumi("whoami", "--verbose") if shutil.which("pulumi") else None


def pulumi_stacks() -> dict[str, dict[str, Any]] | None:
    """This project's stacks in the backend (``pulumi stack ls --json``) by name; None when unknown."""
    if not shutil.which("pulumi"):
        return None
    code, out, _ = _pulumi("stack", "ls", "--json")
    if code != 0:
        return None
    try:
        return {s["name"].rsplit("/", 1)[-1]: s for s in json.loads(out or "[]")}
    except (ValueError, KeyError, TypeError):
        return None


# -- Application Default Credentials ------------------------------------------------------------
def adc_path() -> Path:
    explicit = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud"
    return Path(config) / "application_default_credentials.json"


def read_adc() -> tuple[Adc, Credentials | None]:
    """What the ADC file is, and credentials made from it (None when it cannot be used)."""
    path = adc_path()
    if not path.is_file():
        return Adc(str(path), False), None
    try:
        info = json.loads(path.read_text())
        import google.auth

        creds, project = google.auth.default(scopes=SCOPES)  # the same file, read the way every Google client reads it
    except Exception as e:  # a malformed file, an unknown type: say which
        return Adc(str(path), True, error=f"{type(e).__name__}: {e}"), None
    project = project or info.get("quota_project_id") or os.environ.get("GOOGLE_CLOUD_PROJECT")
    return Adc(str(path), True, kind=info.get("type", "?"), project=project), creds


def _session(creds: Credentials) -> AuthorizedSession:
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(creds)


def get_json(creds: Credentials, url: str, params: dict[str, Any] | list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """One authorised GET; raises RuntimeError with Google's own error message."""
    return _answer(lambda: _session(creds).get(url, params=params, timeout=TIMEOUT_S))


def post_json(creds: Credentials, url: str, params: dict[str, Any] | None = None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One authorised POST; raises RuntimeError with Google's own error message."""
    return _answer(lambda: _session(creds).post(url, params=params, json=body, timeout=TIMEOUT_S))


def _answer(send: Callable[[], Any]) -> dict[str, Any]:  # (a requests.Response: untyped)
    """The JSON of a 200 answer to ``send()``; RuntimeError with Google's own error message otherwise."""
    try:
        r = send()
    except Exception as e:  # token refresh or network: both read the same to a user
        raise RuntimeError(f"{type(e).__name__}: {e}") from None
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        raise RuntimeError(f"HTTP {r.status_code}: {message}")
    doc: dict[str, Any] = r.json()
    return doc


def operation_done(env: Environment, creds: Credentials, operation: dict[str, Any], timeout: float, poll_s: float = 2.0) -> dict[str, Any]:
    """A zone operation as zoneOperations.get has it once DONE; RuntimeError with its error, or at ``timeout``.
    Asked again after 0.1 s, the waits doubling up to ``poll_s``: an operation done in a moment is seen then,
    not a whole ``poll_s`` later (a stop or start that takes a minute costs four more reads)."""
    import time

    from gpu_train.retry import Backoff

    backoff = Backoff.within(timeout, first=min(0.1, poll_s), cap=poll_s)
    while operation.get("status") != "DONE":
        if backoff.left() <= 0:
            raise RuntimeError(
                f"{operation.get('operationType')} of {operation.get('targetLink', '?').rsplit('/', 1)[-1]} not done in {timeout:g} s"
            )
        time.sleep(backoff.next())
        link = str(operation.get("selfLink", ""))
        operation = get_json(creds, compute_url(env, "/compute/v1/" + link.split("/compute/v1/", 1)[-1]))
    errors = (operation.get("error") or {}).get("errors") or []
    if errors:
        raise RuntimeError("; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors))
    return operation


def services_state(env: Environment, creds: Credentials, project: str, services: list[str]) -> dict[str, str]:
    """Service Usage ``services.batchGet``: each service's state (ENABLED, DISABLED) in one call."""
    base = env.serviceusage_endpoint
    names = [("names", f"projects/{project}/services/{s}") for s in services]
    doc = get_json(creds, f"{base}/v1/projects/{project}/services:batchGet", names)
    return {s["name"].rsplit("/", 1)[-1]: s.get("state", "STATE_UNSPECIFIED") for s in doc.get("services", [])}


def compute_url(env: Environment, path: str) -> str:
    """A Compute API URL for ``path`` (/compute/v1/...): GPU_TRAIN_COMPUTE_ENDPOINT points it elsewhere."""
    return env.compute_endpoint + path


def instance(env: Environment, vm: dict[str, Any]) -> dict[str, Any] | None:
    """A VM's Compute API document (instances.get; ``vm``: project, zone, name), or None when it cannot be asked."""
    _, creds = read_adc()
    if creds is None:
        return None
    try:
        return get_json(creds, compute_url(env, f"/compute/v1/projects/{vm['project']}/zones/{vm['zone']}/instances/{vm['name']}"))
    except RuntimeError:
        return None


def pages(creds: Credentials, url: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Each page of a Google list at ``url``, following nextPageToken; RuntimeError if a token comes back
    (an answer that would loop forever)."""
    params, seen = dict(params or {}), set()
    while True:
        doc = get_json(creds, url, params)
        yield doc
        token = doc.get("nextPageToken")
        if not token:
            return
        if token in seen:
            raise RuntimeError(f"{url} repeated a page (its nextPageToken came back)")
        seen.add(token)
        params["pageToken"] = token


def gpu_train_instances(env: Environment, creds: Credentials, project: str) -> list[dict[str, Any]]:
    """Every gpu-train VM of the project, in every zone, in one call (instances.aggregatedList
    filtered on the label the program puts on each VM). (No ``returnPartialSuccess``: compute.v1's
    discovery document, revision 20261106, lists no such parameter of aggregatedList.)"""
    params = {"filter": "labels.gpu-train-stack:*"}
    return [
        vm
        for page in pages(creds, compute_url(env, f"/compute/v1/projects/{project}/aggregated/instances"), params)
        for scoped in (page.get("items") or {}).values()
        for vm in scoped.get("instances", [])
    ]
