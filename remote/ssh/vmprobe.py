"""When a GCP stack's VM does not answer SSH, ask the Compute API what it is doing, and say it.

A VM that stopped itself when idle (or was preempted, or hit maxRunHours) never answers: waiting
the full SSH timeout for it helps nobody. The API's status (TERMINATED, STOPPING, SUSPENDED, ...)
and last stop time settle it in one call; RUNNING or PROVISIONING means "booting, keep waiting".
The message is a pure function of the instance document (tested as a table); the call is handed in
(infra/ops/probes.instance, by the task's session).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpu_train import recovery
from gpu_train.environment import Environment

DOWN = {"TERMINATED", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED"}


def ago(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 2 * 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} days ago"


def likely_causes(spot: bool, idle_minutes: int, max_run_hours: int | None) -> list[str]:
    causes = []
    if idle_minutes:
        causes.append(f"idle auto-stop after {idle_minutes} idle min")
    if spot:
        causes.append("a spot preemption")
    if max_run_hours:
        causes.append(f"the {max_run_hours} h run-time cap (maxRunHours)")
    return causes or ["someone stopped it"]


def stopped_message(inst: dict[str, Any], stack: str, vm: dict[str, Any], now: float) -> str | None:
    """What to tell the user about a VM that is not running; None while it is (or is starting)."""
    status = inst.get("status", "?")
    if status not in DOWN:
        return None
    when = ""
    stamp = inst.get("lastStopTimestamp") or inst.get("lastSuspendedTimestamp")
    if stamp:
        try:
            when = f", stopped {ago(now - datetime.fromisoformat(stamp).timestamp())}"
        except ValueError:
            when = f", stopped at {stamp}"
    causes = " or ".join(likely_causes(bool(vm.get("spot")), int(vm.get("idleStopMinutes") or 0), vm.get("maxRunHours")))
    start = (
        f"gcloud compute instances {'resume' if status.startswith('SUSPEND') else 'start'} {vm['name']} "
        f"--zone {vm['zone']} --project {vm['project']}"
    )
    said = recovery.describe(recovery.record_of(inst))
    if said and recovery.record_of(inst).get("state") not in ("resumed", "gave up"):
        return f"the VM {vm['name']} is {status}: {said}; the stack's recovery starts it (or: {start})"
    if said:
        causes = f"{causes}; last: {said}"
    return f"the VM {vm['name']} is {status}{when} (likely {causes}); it does not answer SSH. Start it: {start}"


def probe(
    env: Environment,
    stack: str,
    vm: dict[str, Any] | None,
    say: Callable[[str], None],
    ask: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> Callable[[], str | None] | None:
    """The check open_connection runs while SSH does not answer (None when the VM is unknown). ``ask``:
    the VM's Compute API document (instances.get; infra/ops/probes.instance), None when it cannot be asked."""
    if not vm or not vm.get("name"):
        return None
    asked = {"told": False}

    def check() -> str | None:
        doc = ask(vm)
        if doc is None:
            if not asked["told"]:
                say("(cannot ask the Compute API about the VM: no Application Default Credentials; waiting for SSH)")
                asked["told"] = True
            return None
        return stopped_message(doc, stack, vm, env.clock())

    return check
