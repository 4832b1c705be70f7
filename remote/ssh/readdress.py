"""A GCP VM started again has a new address: find it in the Compute API when the recorded one does not answer.

Compute Engine releases a VM's ephemeral external IP at every stop and gives it a new one at the next
start (vm-start, the recovery function, idle auto-stop then a start from the console), while the stack's
outputs (Pulumi's state, and the laptop's cache of them) keep the old one until someone refreshes. When
SSH to the recorded address fails, the session asks instances.get for each node (with the user's ADC)
and, where an address changed, rewrites the cached outputs (``with_addresses``, a pure function) so this
task and the next dial the VM where it is now.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpu_train.atomic import atomic_write
from gpu_train.environment import Environment


def nat_ip(inst: dict[str, Any] | None) -> str | None:
    """The external address of an instance's first interface (instances.get), None without one."""
    for nic in (inst or {}).get("networkInterfaces") or []:
        for access in nic.get("accessConfigs") or []:
            if access.get("natIP"):
                return str(access["natIP"])
    return None


def with_addresses(outputs: dict[str, Any], found: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    """The stack outputs with each node's address as the Compute API has it now (``found``: each instance's
    document by name, None where it could not be asked); None when nothing changed or a node is unknown."""
    names = outputs.get("instanceNames") or [outputs.get("instanceName")]
    if not all(names):
        return None
    now = [nat_ip(found.get(n)) for n in names]
    if None in now:
        return None
    before = outputs.get("externalIps") or [outputs.get("externalIp")]
    if now == list(before):
        return None
    return {**outputs, "externalIp": now[0], "externalIps": now}


def rediscover(env: Environment, stack: str, project: str | None, ask: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
    """Rewrite the stack's cached outputs with the addresses its VMs have now; True when any changed.
    ``ask``: instances.get of {project, zone, name} (infra/ops/probes.instance), None when it cannot be asked."""
    path = env.state_home / stack / "outputs.json"
    try:
        outputs = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    zone = outputs.get("zone")
    names = outputs.get("instanceNames") or [outputs.get("instanceName")]
    if not (project and zone and all(names)):
        return False
    updated = with_addresses(outputs, {n: ask({"project": project, "zone": zone, "name": n}) for n in names})
    if updated is None:
        return False
    atomic_write(path, json.dumps(updated, indent=1))
    return True
