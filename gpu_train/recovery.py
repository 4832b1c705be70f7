"""Back by itself: what the stack's recovery function does about a preempted VM, as pure decisions.

Compute Engine logs a system event when it preempts a spot VM (``compute.instances.preempted``), a
host error stops one (``compute.instances.hostError``) or host maintenance does
(``compute.instances.terminateOnHostMaintenance``: GPU VMs cannot live-migrate, and those with
``automaticRestart: false`` stay down); a log sink sends those of the stack's VMs
to Pub/Sub, and a Cloud Run function (``recovery_call.on_event``) runs these decisions against the
Compute API: start every node that this event took down, stop the others of a cluster first (the
group resumes together), leave every stop that was meant (idle auto-stop, `vm-stop`, `running:
false`, maxRunHours, `down`) alone, and keep trying while the zone has no capacity, until the
stack's bound (``recoverHours``), which ends within Cloud Run functions' 24 h retry window. What
happened is kept on each instance as labels (``gpu-train-rec-*``, ``record_labels``): instances.setLabels
needs no ``iam.serviceAccounts.actAs`` on the VM's service account, which setMetadata does (and metadata
is what the VM runs: a grant to write it is root on the VM); `status`, `ls` and the booted agent read
them. Standard library only, Python 3.8+: it runs in
Google's cloud (infra/recovery.py ships it with the function) and on the host (the agent's zipapp
carries it beside the contract); every Google answer it reads is checked by a table in
tests/unit/test_recovery.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

RECORD_PREFIX = "gpu-train-rec-"  # instance labels: the recovery's record of this node (record_labels)
LABEL = "gpu-train-recover"  # instance label: "on" while the stack wants its VMs back after a preemption
EVENTS = {
    "compute.instances.preempted": "preempted",
    "compute.instances.hostError": "host error",
    "compute.instances.terminateOnHostMaintenance": "host maintenance",
}
# Cloud Run functions (2nd gen) retry an event for 24 h, with backoff of 10 s to 600 s ("Enable event-driven
# function retries"); 7 days was 1st gen. The function gives up while deliveries still come: at most
# RETRY_WINDOW_S - LAST_CALL_S after the event (two longest backoffs before the window ends).
RETRY_WINDOW_S, LAST_CALL_S = 24 * 3600, 2 * 600
MAX_RECOVER_HOURS = RETRY_WINDOW_S / 3600
UP = ("PROVISIONING", "STAGING", "RUNNING")
# The function's environment (infra/recovery.py sets it; the last three: tests). No contract in its bundle:
# METADATA_URL_ENV repeats the contract's (a test holds them equal).
STACK_ENV, NODES_ENV, HOURS_ENV, NOTIFY_ENV = "GPU_TRAIN_STACK", "GPU_TRAIN_NODES", "GPU_TRAIN_RECOVER_HOURS", "GPU_TRAIN_NOTIFY"
COMPUTE_URL_ENV, METADATA_URL_ENV, OP_WAIT_S_ENV = "GPU_TRAIN_COMPUTE_URL", "GPU_TRAIN_METADATA_URL", "GPU_TRAIN_OP_WAIT_S"
OP_POLL_S_ENV = "GPU_TRAIN_OP_POLL_S"
# The stack's own project and zone: an event naming any other is not this stack's (whoever can publish to
# the topic chooses what an event says; the function acts only where the stack lives).
PROJECT_ENV, ZONE_ENV = "GPU_TRAIN_GCP_PROJECT", "GPU_TRAIN_ZONE"
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
    at: float  # epoch seconds, to the millisecond (what a label keeps: ``ms``)


def ms(at: float) -> int:
    return round(at * 1000)


def of_event(record: dict[str, Any], event: Event) -> bool:
    """The record is this event's (to the millisecond a label keeps)."""
    at = record.get("at")
    return isinstance(at, (int, float)) and ms(at) == ms(event.at)


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


def event_of(entry: dict[str, Any]) -> Event | None:
    """The event a log entry (the sink's Pub/Sub message) tells of, or None for any other entry."""
    payload = entry.get("protoPayload") or {}
    kind = EVENTS.get(payload.get("methodName", ""))
    parts = str(payload.get("resourceName", "")).split("/")
    at = parse_time(entry.get("timestamp"))
    if kind is None or at is None or len(parts) != 6 or parts[0::2] != ["projects", "zones", "instances"]:
        return None
    return Event(kind, parts[1], parts[3], parts[5], ms(at) / 1000)


# -- one node's record (instance labels RECORD_PREFIX*) -----------------------------------------------
# A label value holds 63 characters of [a-z0-9_-]: times in milliseconds, states and events as words joined
# by "-", the reason as a short code (``why_code``) the record's reader turns back into words.
_TIMES = {"at": "at", "updated": "updated", "resumedAt": "resumed"}


def _word(text: str) -> str:
    return "-".join("".join(c if c.isalnum() or c == "_" else " " for c in text.lower()).split())[:63]


def why_code(why: str) -> str:
    """A reason as a label value: a capacity error's code, the bound that ended it, else its first words."""
    for code in CAPACITY:
        if f"({code})" in why:
            return code.lower()
    if "gpu-train:recoverHours = " in why:
        return "recoverhours-" + why.split("gpu-train:recoverHours = ", 1)[1].split(")")[0].replace(".", "_")
    if "retry window" in why:
        return "retry-window"
    return _word(why)


def why_words(code: str) -> str:
    """``why_code``'s reason in words again."""
    if code.upper() in CAPACITY:
        return f"{CAPACITY[code.upper()]} ({code.upper()})"
    if code.startswith("recoverhours-"):
        return f"not back within gpu-train:recoverHours = {code.split('-', 1)[1].replace('_', '.')}"
    if code == "retry-window":
        return "not back within Cloud Run functions' 24 h retry window"
    return code.replace("-", " ")


def record_labels(record: dict[str, Any]) -> dict[str, str]:
    """The record as instance labels (every key RECORD_PREFIX*)."""
    out = {f"{RECORD_PREFIX}{label}": str(ms(float(record[key]))) for key, label in _TIMES.items() if record.get(key) is not None}
    for key in ("event", "state"):
        if record.get(key):
            out[RECORD_PREFIX + key] = _word(str(record[key]))
    out[RECORD_PREFIX + "attempts"] = str(int(record.get("attempts") or 0))
    if record.get("why"):
        out[RECORD_PREFIX + "why"] = why_code(str(record["why"]))
    return out


def record_of(inst: dict[str, Any]) -> dict[str, Any]:
    """The recovery's record kept on an instance's labels ({} when none or unreadable)."""
    labels = {k[len(RECORD_PREFIX) :]: v for k, v in (inst.get("labels") or {}).items() if k.startswith(RECORD_PREFIX)}
    try:
        out: dict[str, Any] = {key: int(labels[label]) / 1000 for key, label in _TIMES.items() if label in labels}
        out["attempts"] = int(labels.get("attempts") or 0)
    except ValueError:
        return {}
    if "at" not in out:
        return {}
    for key in ("event", "state"):
        if labels.get(key):
            out[key] = labels[key].replace("-", " ")
    if labels.get("why"):
        out["why"] = why_words(labels["why"])
    return out


def has_local_ssd(inst: dict[str, Any]) -> bool:
    """The instance has Local SSD (disks of type SCRATCH: A2 Ultra, A3 and A4 come with theirs): a stop must
    say what becomes of it (instances.stop's discardLocalSsd, "required if the instance has any attached
    Local SSD disks")."""
    return any(d.get("type") == "SCRATCH" for d in inst.get("disks") or [])


def wanted_back(inst: dict[str, Any]) -> bool:
    """The stack wants this VM back after a preemption: its label says so (``running: false``, `vm-stop`
    and a stack without recovery set it off; a deleted VM has no label)."""
    return (inst.get("labels") or {}).get(LABEL) == "on"


# -- what to do with each node --------------------------------------------------------------------------
START, STOP, WAIT, NONE, GONE = "start", "stop", "wait", "none", "gone"


def node_action(inst: dict[str, Any] | None, event: Event, is_event_node: bool) -> tuple[str, str]:
    """(action, why) for one node of the stack after ``event``. ``inst``: instances.get's document,
    None when the instance is gone (deleted: `down`)."""
    if inst is None:
        return GONE, "the VM no longer exists (the stack was taken down)"
    if not wanted_back(inst):
        return NONE, f"recovery is off for this VM (label {LABEL}: running is false, or vm-stop)"
    status = inst.get("status", "")
    record = record_of(inst)
    ours = of_event(record, event)  # the record this event started (a group stop or an attempt)
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


def plan(event: Event, nodes: list[str], found: dict[str, dict[str, Any] | None]) -> Plan:
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
def start_answer(http_status: int, operation: dict[str, Any] | None, error_doc: dict[str, Any] | None = None) -> tuple[str, str]:
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
    """Why to stop trying (the stack's bound passed, or the trigger's retry window is about to), or None while
    neither has."""
    head = f"not back after {(now - event.at) / 3600:.1f} h and {attempts} attempt(s)"
    if now - event.at >= bound_hours * 3600:
        return f"{head} (gpu-train:recoverHours = {bound_hours:g})"
    if now - event.at >= RETRY_WINDOW_S - LAST_CALL_S:
        return f"{head} (the end of Cloud Run functions' 24 h retry window)"
    return None


def updated_record(record: dict[str, Any], event: Event, state: str, now: float, why: str = "", attempt: bool = False) -> dict[str, Any]:
    """The node's record after this step: a new event starts a new record (labels keep one: the last);
    ``state``: preempted | stopping for the group | coming back | resumed | gave up."""
    if not of_event(record, event):
        record = {"event": event.kind, "at": event.at, "attempts": 0}
    out = {**record, "state": state, "updated": now}
    if why:
        out["why"] = why
    if attempt:
        out["attempts"] = int(record.get("attempts", 0)) + 1
    if state == "resumed":
        out["resumedAt"] = now
    return out


def run_return(record: dict[str, Any], interrupted_at: float | None, back: float) -> dict[str, Any] | None:
    """The run's record of this return (event, at, back, attempts), when the recovery's record (the
    instance's metadata, as the booted VM reads it) tells of the stop that interrupted the run."""
    at = record.get("at")
    if not isinstance(at, (int, float)) or not isinstance(interrupted_at, (int, float)) or abs(at - interrupted_at) > 900:
        return None
    out = {"event": record.get("event", "preempted"), "at": at, "back": back, "attempts": int(record.get("attempts") or 0)}
    if record.get("state") == "gave up":  # started by someone else after the recovery's bound
        out["gaveUp"] = str(record.get("why") or "")
    return out


def lost_its_group(record: dict[str, Any], ended: float | None, nnodes: int) -> bool:
    """A cluster run's part that failed because its group lost a node: the recovery stopped this node
    (or brought it back) for an event that happened just before the part ended (torchrun fails when a
    peer vanishes). Such a part is relaunched at boot like an interrupted one, so the group meets again."""
    at = record.get("at")
    if nnodes < 2 or not isinstance(at, (int, float)) or not isinstance(ended, (int, float)):
        return False
    return at - 120 <= ended <= at + 900


def describe_return(ret: dict[str, Any], local: bool = True) -> str:
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


def worth_saying(record: dict[str, Any], status: str, now: float) -> bool:
    """Does `ls` mention this record? While the recovery is at work or gave up on a VM still down; a
    return for a day after it."""
    state = record.get("state")
    if not record.get("at") or state is None:
        return False
    if state == "resumed":
        return now - float(record.get("resumedAt") or record["at"]) < RECENT_S
    return status not in UP


def describe(record: dict[str, Any], local: bool = True) -> str:
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
