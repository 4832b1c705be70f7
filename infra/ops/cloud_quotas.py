"""Which quota preferences a project already has: Cloud Quotas' ``projects.locations.quotaPreferences.list``.

Pulumi adopts an existing resource only when the program says so as it declares it (the ``import``
resource option takes an id, not an output), so `quotaRequest` must know before it declares a
preference whether Cloud Quotas holds one: a preference outlives the stack that made it (Cloud Quotas
cannot delete one) and there is one per quota and dimensions, so creating it again fails with a 409.

One authorised GET per page with the Application Default Credentials the provider uses, and the
project as the quota project (``x-goog-user-project``: under user credentials Cloud Quotas refuses
calls without one, as for the provider's ``userProjectOverride``). A project whose Cloud Quotas API was
never enabled has no preferences: that is an empty answer, not an error.
"""

from __future__ import annotations

from typing import Any

from infra.lookups import CannotAsk
from infra.ops import probes

MAX_PAGES = 100  # a project holds a few preferences per GPU family; an endless listing is an API fault


def list_preferences(project: str, endpoint: str) -> list[dict[str, Any]]:
    """Every quota preference of ``project`` as Cloud Quotas lists them (name, service, quotaId,
    dimensions, quotaConfig, ...); [] when its API was never enabled. Raises CannotAsk. ``endpoint``:
    the Cloud Quotas API (Environment.cloudquotas_endpoint)."""
    adc, creds = probes.read_adc()
    if creds is None:
        raise CannotAsk(adc.error or f"no Application Default Credentials at {adc.path} (gcloud auth application-default login)")
    base = endpoint
    url = f"{base}/v1/projects/{project}/locations/global/quotaPreferences"
    found: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    seen: set[str] = set()
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(creds)
    for _ in range(MAX_PAGES):
        try:
            r = session.get(url, params=params, headers={"x-goog-user-project": project}, timeout=probes.TIMEOUT_S)
        except Exception as e:  # token refresh or network: both read the same to a user
            raise CannotAsk(f"{type(e).__name__}: {e}") from None
        if r.status_code != 200:
            message = _message(r)
            if r.status_code == 403 and ("SERVICE_DISABLED" in r.text or "has not been used" in message):
                return []  # never enabled: nothing was ever asked through it
            raise CannotAsk(f"HTTP {r.status_code}: {message}")
        try:
            doc = r.json()
        except ValueError:
            doc = None
        page = doc.get("quotaPreferences", []) if isinstance(doc, dict) else None
        if not isinstance(page, list) or not all(isinstance(p, dict) for p in page):
            raise CannotAsk(f"Cloud Quotas answered something that is not a list of preferences: {r.text[:200]!r}")
        found += page
        token = doc.get("nextPageToken") if isinstance(doc, dict) else None
        if not token:
            return found
        if not isinstance(token, str) or token in seen:
            raise CannotAsk("Cloud Quotas repeated a page of its preference list (its nextPageToken came back)")
        seen.add(token)
        params = {"pageToken": token}
    raise CannotAsk(f"Cloud Quotas listed more than {MAX_PAGES} pages of preferences")


def _message(response: Any) -> str:  # (a requests.Response: untyped)
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text: str = response.text
        return text[:200]
