"""Back by itself: what the stack's recovery function does about a preempted VM, as pure decisions.

Compute Engine logs a system event when it preempts a spot VM (``compute.instances.preempted``) or
a host error stops one (``compute.instances.hostError``); a log sink sends those of the stack's VMs
to Pub/Sub, and a Cloud Run function (``recovery_call.on_event``) runs these decisions against the
Compute API: start every node that this event took down, stop the others of a cluster first (the
group resumes together), leave every stop that was meant (idle auto-stop, `vm-stop`, `running:
false`, maxRunHours, `down`) alone, and keep trying while the zone has no capacity, until the
stack's bound (``recoverHours``). What happened is kept on each instance (metadata RECORD_KEY),
where `status`, `ls` and the booted agent read it. Standard library only, Python 3.8+: it runs in
Google's cloud (infra/recovery.py ships it with the function) and on the host (the agent's zipapp
carries it beside the contract); every Google answer it reads is checked by a table in
tests/unit/test_recovery.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

RECORD_KEY = "gpu-train-recovery"  # instance metadata: the recovery's record of this node (JSON)
LABEL = "gpu-train-recover"  # instance label: "on" while the stack wants its VMs back after a preemption
EVENTS = {"compute.instances.preempted": "preempted", "compute.instances.hostError": "host error"}
UP = ("PROVISIONING", "STAGING", "RUNNING")
# The function's environment (infra/recovery.py sets it; the last three: tests). No contract in its bundle:
# METADATA_URL_ENV repeats the contract's (a test holds them equal).
STACK_ENV, NODES_ENV, HOURS_ENV, NOTIFY_ENV = "GPU_TRAIN_STACK", "GPU_TRAIN_NODES", "GPU_TRAIN_RECOVER_HOURS", "GPU_TRAIN_NOTIFY"
COMPUTE_URL_ENV, METADATA_URL_ENV, OP_WAIT_S_ENV = "GPU_TRAIN_COMPUTE_URL", "GPU_TRAIN_METADATA_URL", "GPU_TRAIN_OP_WAIT_S"
# instances.start's operation errors that pass with time: the zone's capacity (the usual answer right
# after a preemption), the region's quota (other VMs stop), Google's own trouble.
CAPACITY = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "zone out of capacity",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "zone out of capacity",
    "RESOURCE_POOL_EXHAUSTED": "zone out of capacity",
    "QUOTA_EXCEEDED": "quota exceeded in the region",
    "RESOURCE_OPERATION_RATE_EXCEEDED": "too many operations at once",
    "INTERNAL_ERROR": "Compute Engine internal error",
}
TRANSIENT_HTTP = (408, 429, 500, 502, 503, 504)

# What the function does with the event in the end (the Pub/Sub delivery): done (acknowledged), or
# retry (an error to the trigger, which delivers it again with exponential backoff, 10 s to 600 s).
DONE, RETRY = "done", "retry"


# -- the event ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """One system event of the stack's VMs, as Cloud Logging wrote it."""

    kind: str  # "preempted" or "host error"
    project: str
    zone: str
    instance: str
    at: float  # epoch seconds


def parse_time(stamp: str | None) -> float | None:
    """An RFC 3339 timestamp as Google writes them (``2026-11-25T14:02:31.325309Z``, ``...-08:00``)."""
    if not stamp:
        return None
    from datetime import datetime

    text = stamp.strip().replace("Z", "+00:00")
    if "." in text:  # Python 3.8's fromisoformat takes 3 or 6 digits of fraction only
        head, _, rest = text.partition(".")
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        text = head + "." + (digits + "000000")[:6] + rest[len(digits) :]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def event_of(entry: dict) -> Event | None:
    """The event a log entry (the sink's Pub/Sub message) tells of, or None for any other entry."""
    payload = entry.get("protoPayload") or {}
    kind = EVENTS.get(payload.get("methodName", ""))
    parts = str(payload.get("resourceName", "")).split("/")
    at = parse_time(entry.get("timestamp"))
    if kind is None or at is None or len(parts) != 6 or parts[0::2] != ["projects", "zones", "instances"]:
        return None
    return Event(kind, parts[1], parts[3], parts[5], at)


# -- one node's record (instance metadata RECORD_KEY) ------------------------------------------------
def record_of(inst: dict) -> dict:
    """The recovery's record kept on an instance ({} when none or unreadable)."""
    for item in (inst.get("metadata") or {}).get("items") or []:
        if item.get("key") == RECORD_KEY:
            try:
                doc = json.loads(item.get("value") or "{}")
            except ValueError:
                return {}
            return doc if isinstance(doc, dict) else {}
    return {}


def wanted_back(inst: dict) -> bool:
    """The stack wants this VM back after a preemption: its label says so (``running: false``, `vm-stop`
    and a stack without recovery set it off; a deleted VM has no label)."""
    return (inst.get("labels") or {}).get(LABEL) == "on"


# -- what to do with each node --------------------------------------------------------------------------
START, STOP, WAIT, NONE, GONE = "start", "stop", "wait", "none", "gone"


def node_action(inst: dict | None, event: Event, is_event_node: bool) -> tuple[str, str]:
    """(action, why) for one node of the stack after ``event``. ``inst``: instances.get's document,
    None when the instance is gone (deleted: `down`)."""
    if inst is None:
        return GONE, "the VM no longer exists (the stack was taken down)"
    if not wanted_back(inst):
        return NONE, f"recovery is off for this VM (label {LABEL}: running is false, or vm-stop)"
    status = inst.get("status", "")
    record = record_of(inst)
    ours = record.get("at") == event.at  # the record this event started (a group stop or an attempt)
    started = parse_time(inst.get("lastStartTimestamp"))
    if status in UP:
        if is_event_node or ours:
            return NONE, "running"
        return STOP, f"another node was {event.kind}: the group restarts together"
    if status in ("STOPPING", "SUSPENDING"):
        return WAIT, f"{status.lower()}"
    if status != "TERMINATED":
        return NONE, f"{status}: not a stop this recovery made or answers"
    if started is not None and started > event.at and not (ours and record.get("state") == "stopping for the group"):
        # Started again after this event, and stopped since: that stop was someone's (idle auto-stop,
        # vm-stop, maxRunHours) or a later event's, which brings its own message.
        return NONE, "stopped again after it came back: a meant stop (or a later event's)"
    if is_event_node or ours:
        return START, f"{event.kind}"
    # A node that stopped on its own before this event: an idle auto-stop or a meant stop of its own.
    return NONE, "stopped before this event: a meant stop"


@dataclass
class Plan:
    """What one invocation does: nodes to stop, then (once every node is down) nodes to start."""

    stop: list[str] = field(default_factory=list)
    start: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    outcome: str = DONE


def plan(event: Event, nodes: list[str], found: dict[str, dict | None]) -> Plan:
    """The invocation's plan for the stack's ``nodes`` (``found``: each one's instances.get document, None
    when gone). Nothing is started while a node of the group is still up or stopping: the cluster
    resumes as one (each node's agent relaunches its part at boot, torchrun meets again)."""
    out = Plan()
    if event.instance not in nodes:
        out.why[event.instance] = "not a VM of this stack"
        return out
    for name in nodes:
        action, why = node_action(found.get(name), event, name == event.instance)
        out.why[name] = why
        if action == STOP:
            out.stop.append(name)
        elif action == WAIT:
            out.waiting.append(name)
        elif action == START:
            out.start.append(name)
        elif action == GONE and name == event.instance:
            return Plan(why=out.why)  # the stack is gone: nothing to bring back
    if (out.stop or out.waiting) and out.start:
        out.start = []  # the group first: start once every node is down
        out.outcome = RETRY
    elif out.waiting:
        out.outcome = RETRY
    return out


# -- instances.start's answers ------------------------------------------------------------------------------
def start_answer(http_status: int, operation: dict | None, error_doc: dict | None = None) -> tuple[str, str]:
    """(started | retry | give up, why) for one instances.start: the HTTP answer to the call, then the
    operation it returned, as zoneOperations.get has it last (``status`` DONE or not, ``error.errors``)."""
    if http_status >= 400:
        err = (error_doc or {}).get("error") or {}
        message = str(err.get("message") or f"HTTP {http_status}")
        reasons = [e.get("reason", "") for e in err.get("errors") or []]
        if http_status == 404:
            return "give up", "the VM no longer exists"
        if http_status in TRANSIENT_HTTP or "resourceNotReady" in reasons:
            return "retry", f"Compute Engine answered {http_status}: {message}"
        return "give up", f"Compute Engine refused the start ({http_status}): {message}"
    if not operation:
        return "retry", "no operation in the answer"
    errors = ((operation.get("error") or {}).get("errors")) or []
    if errors:
        code = str(errors[0].get("code", ""))
        if code in CAPACITY:
            return "retry", f"{CAPACITY[code]} ({code})"
        return "give up", f"{code}: {errors[0].get('message', '')}".strip()
    if operation.get("status") != "DONE":
        return "retry", "the start is still in progress"
    return "started", "started"


def give_up_reason(event: Event, now: float, bound_hours: float, attempts: int) -> str | None:
    """Why to stop trying (the stack's bound passed), or None while it has not."""
    if now - event.at >= bound_hours * 3600:
        return f"not back after {(now - event.at) / 3600:.1f} h and {attempts} attempt(s) (gpu-train:recoverHours = {bound_hours:g})"
    return None


def updated_record(record: dict, event: Event, state: str, now: float, why: str = "", attempt: bool = False) -> dict:
    """The node's record after this step: a new event starts a new record (the old one's outcome goes
    into ``history``); ``state``: preempted | stopping for the group | coming back | resumed | gave up."""
    if record.get("at") != event.at:
        past = (
            [*record.get("history", []), {k: record[k] for k in ("event", "at", "state", "attempts", "resumedAt") if k in record}][-10:]
            if record.get("at")
            else []
        )
        record = {"event": event.kind, "at": event.at, "attempts": 0, "history": past}
    out = {**record, "state": state, "updated": now}
    if why:
        out["why"] = why
    if attempt:
        out["attempts"] = int(record.get("attempts", 0)) + 1
    if state == "resumed":
        out["resumedAt"] = now
    return out


def run_return(record: dict, interrupted_at: float | None, back: float) -> dict | None:
    """The run's record of this return (event, at, back, attempts), when the recovery's record (the
    instance's metadata, as the booted VM reads it) tells of the stop that interrupted the run."""
    at = record.get("at")
    if not isinstance(at, (int, float)) or not isinstance(interrupted_at, (int, float)) or abs(at - interrupted_at) > 900:
        return None
    out = {"event": record.get("event", "preempted"), "at": at, "back": back, "attempts": int(record.get("attempts") or 0)}
    if record.get("state") == "gave up":  # started by someone else after the recovery's bound
        out["gaveUp"] = str(record.get("why") or "")
    return out


def lost_its_group(record: dict, ended: float | None, nnodes: int) -> bool:
    """A cluster run's part that failed because its group lost a node: the recovery stopped this node
    (or brought it back) for an event that happened just before the part ended (torchrun fails when a
    peer vanishes). Such a part is relaunched at boot like an interrupted one, so the group meets again."""
    at = record.get("at")
    if nnodes < 2 or not isinstance(at, (int, float)) or not isinstance(ended, (int, float)):
        return False
    return at - 120 <= ended <= at + 900


def describe_return(ret: dict, local: bool = True) -> str:
    """A run's return for `status`: "preempted 14:02, resumed 14:19 (3 attempts)"."""
    tries = int(ret.get("attempts") or 0)
    head = f"{ret.get('event', 'preempted')} {clock(ret['at'], local)}"
    if "gaveUp" in ret:
        return f"{head}, not brought back ({ret['gaveUp']}); resumed {clock(ret['back'], local)} when started again"
    return f"{head}, resumed {clock(ret['back'], local)}" + (f" ({tries} attempts)" if tries > 1 else "")


# -- words ----------------------------------------------------------------------------------------------------
def clock(at: float, local: bool = True) -> str:
    return time.strftime("%H:%M", time.localtime(at) if local else time.gmtime(at))


RECENT_S = 24 * 3600  # a return is news for a day; a VM someone started after the recovery gave up is none


def worth_saying(record: dict, status: str, now: float) -> bool:
    """Does `ls` mention this record? While the recovery is at work or gave up on a VM still down; a
    return for a day after it."""
    state = record.get("state")
    if not record.get("at") or state is None:
        return False
    if state == "resumed":
        return now - float(record.get("resumedAt") or record["at"]) < RECENT_S
    return status not in UP


def describe(record: dict, local: bool = True) -> str:
    """One line for `status` and `ls`: "preempted 14:02, coming back (attempt 3, zone out of capacity)"."""
    if not record.get("at"):
        return ""
    head = f"{record.get('event', 'preempted')} {clock(record['at'], local)}"
    state, attempts = record.get("state", ""), int(record.get("attempts", 0))
    if state == "resumed":
        return f"{head}, resumed {clock(record.get('resumedAt') or record['at'], local)}"
    if state == "gave up":
        return f"{head}, not brought back: {record.get('why', '')}"
    if state == "coming back" and attempts:
        return f"{head}, coming back (attempt {attempts}, {record.get('why', '')})"
    return f"{head}, coming back ({state})" if state else head
