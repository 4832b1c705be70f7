"""The program's lookups for a real `pulumi up` (infra/__main__.py builds them): Google's own answers."""

from __future__ import annotations

from typing import Any

from gpu_train.environment import Environment
from infra.ops import cloud_quotas


class Google:
    """infra.lookups.Lookups answered by Google's APIs (at the Environment's endpoints), with the Application
    Default Credentials."""

    def __init__(self, env: Environment):
        self.env = env

    def quota_preferences(self, project: str) -> list[dict[str, Any]]:
        return cloud_quotas.list_preferences(project, self.env.cloudquotas_endpoint)
