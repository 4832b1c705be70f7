"""What the Pulumi program asks Google itself, outside the provider's invokes: handed in, never looked up.

The provider's invokes (getImage, getSQuotaInfo ...) go through the engine, which Pulumi's mocks answer.
What the program must know before it declares a resource (which quota preferences exist: see
quota_request) it asks through a ``Lookups`` it is given: `pulumi up` (``__main__``) gives it Google's
answers (infra/ops/lookups.py), `scripts/plan` and the tests recorded ones (infra/ops/preview.py).
"""

from __future__ import annotations

from typing import Any, Protocol


class CannotAsk(Exception):
    """Google could not be asked (no credentials, network, permission): the message says which."""


class Lookups(Protocol):
    def quota_preferences(self, project: str) -> list[dict[str, Any]]:
        """Every quota preference of ``project`` as Cloud Quotas lists them; raises CannotAsk."""
        ...
