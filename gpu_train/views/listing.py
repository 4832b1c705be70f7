"""`gpu-train ls`: every stack at a glance, billing ones first. Pure decisions on gathered facts.

Per stack file the task gathers what it can quickly (the stack's settings, its last known outputs,
the Compute API's view of its VMs when credentials exist, the agent's status when the host answers
within seconds) and these functions turn it into one row: target, shape, zone, VM state (and where
that came from), runs running, $/h now, spent this month, the idle-stop clock.

"Spent this month" is VM uptime x the stack's hourly price: uptime intervals are kept in a small
local ledger, fed by every look at the VM (the API's lastStart/lastStop timestamps, the agent's
uptime), so it is as complete as the looks were and says so ("at least").
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpu_train import recovery
from gpu_train.catalog import gpunames
from gpu_train.catalog.model import Catalog
from gpu_train.contract import ACTIVE  # the contract with the host, written once
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.gcp.provisioning import way
from gpu_train.gcp.validate import shape_of
from gpu_train.stack.settings import StackConfig
from gpu_train.views.table import aligned

BILLING_STATES = ("RUNNING", "PROVISIONING", "STAGING", "STOPPING", "REPAIRING", "SUSPENDING")
Interval = tuple[float, float]


@dataclass(frozen=True)
class StackFacts:
    """What was gathered about one stack; None where it could not be had."""

    name: str
    cfg: StackConfig | None = None
    problem: str | None = None  # the stack file is invalid
    outputs: dict[str, Any] | None = None  # last known `pulumi stack output`
    instances: list[dict[str, Any]] | None = None  # the Compute API's instances of this stack (None: not asked)
    api_error: str | None = None
    status: dict[str, Any] | None = None  # the agent's status document (node 0)
    status_error: str | None = None
    ledger: tuple[Interval, ...] = ()


@dataclass(frozen=True)
class Row:
    stack: str
    target: str
    shape: str
    where: str
    state: str
    source: str  # how the state is known: "compute api", "last known outputs", "host answered", ...
    runs_running: int | None
    hourly_now: float | None
    spent_month: float | None
    idle: str
    billing: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """camelCase keys, as in `status --json`."""
        doc = {re.sub(r"_(\w)", lambda m: m.group(1).upper(), k): v for k, v in asdict(self).items()}
        doc["notes"] = list(self.notes)
        return doc


# -- uptime ledger ------------------------------------------------------------------------------
def parse_time(text: str | None) -> float | None:
    """An RFC 3339 timestamp from the Compute API (``2026-11-01T08:00:00.123-07:00``) as epoch seconds."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def instance_interval(instance: dict[str, Any], now: float) -> Interval | None:
    """The VM's latest run as the API tells it: lastStart to lastStop, or to now while it runs."""
    start = parse_time(instance.get("lastStartTimestamp")) or parse_time(instance.get("creationTimestamp"))
    if start is None:
        return None
    stop = parse_time(instance.get("lastStopTimestamp"))
    if instance.get("status") in BILLING_STATES or stop is None or stop < start:
        return (start, now) if instance.get("status") in BILLING_STATES else None
    return (start, stop)


def merge(intervals: list[Interval] | tuple[Interval, ...]) -> tuple[Interval, ...]:
    """Overlapping or touching intervals joined; sorted."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def month_start(now: float) -> float:
    t = datetime.fromtimestamp(now, timezone.utc)
    return datetime(t.year, t.month, 1, tzinfo=timezone.utc).timestamp()


def hours_in_month(intervals: tuple[Interval, ...], now: float) -> float:
    start = month_start(now)
    return sum(max(0.0, min(e, now) - max(s, start)) for s, e in intervals) / 3600


def observed(facts: StackFacts, now: float) -> tuple[Interval, ...]:
    """The ledger with what this look saw added."""
    seen = list(facts.ledger)
    for inst in facts.instances or []:
        if (iv := instance_interval(inst, now)) is not None:
            seen.append(iv)
    if facts.status and facts.status.get("uptimeS") is not None and facts.cfg is not None and facts.cfg.is_gcp:
        seen.append((now - float(facts.status["uptimeS"]), now))
    return merge(seen)


# -- one row ------------------------------------------------------------------------------------
def shape_text(cfg: StackConfig | None, outputs: dict[str, Any] | None, catalog: Catalog) -> str:
    if cfg is None:
        return "?"
    if not cfg.is_gcp:
        return f"{len(cfg.hosts)} host{'s' * (len(cfg.hosts) != 1)}"
    o = outputs or {}
    machine = o.get("machineType") or cfg.machine_type
    gpu, count = o.get("gpuType") or cfg.gpu_type, o.get("gpuCount") or cfg.gpu_count
    acc = gpunames.resolve(gpu, catalog) if gpu else None
    gpu = gpunames.short_name(acc) if acc else gpu
    text = machine + (f" + {count} x {gpu}" if gpu and count and machine.startswith("n1-") else "")
    text = (f"{cfg.nodes} x " if cfg.nodes > 1 else "") + text
    return text + (" spot" if (o.get("spot") if "spot" in o else cfg.spot) else "")


def vm_state(facts: StackFacts) -> tuple[str, str]:
    """(state, how it is known)."""
    cfg = facts.cfg
    if cfg is None:
        return "invalid", "stack file"
    if not cfg.is_gcp:
        if facts.status is not None:
            return "reachable", "host answered"
        return ("unreachable", "ssh") if facts.status_error else ("-", "not asked")
    if facts.instances is not None:
        if not facts.instances:
            return "none", "compute api"
        states = [i.get("status", "?") for i in facts.instances]
        up = sum(s == "RUNNING" for s in states)
        if len(states) > 1:
            return (f"RUNNING {up}/{len(states)}" if up else states[0]), "compute api"
        return states[0], "compute api"
    if facts.outputs and facts.outputs.get("externalIp"):
        if facts.status is not None:
            return "RUNNING", "host answered"
        return ("RUNNING?" if cfg.running else "TERMINATED?"), "last known outputs"
    return "none", "no outputs"


def _billing(state: str) -> bool:
    return state.rstrip("?").split(" ")[0] in BILLING_STATES


def recovery_notes(instances: list[dict[str, Any]], now: float) -> list[str]:
    """What the stack's recovery function last did, per VM: "preempted 14:02, coming back (attempt 3, ...)",
    while it is news (recovery.worth_saying)."""
    out = []
    for inst in instances:
        record = recovery.record_of(inst)
        said = recovery.describe(record) if recovery.worth_saying(record, inst.get("status", ""), now) else ""
        if said:
            out.append(f"{inst.get('name')}: {said}" if len(instances) > 1 else said)
    return out


def idle_text(status: dict[str, Any] | None) -> str:
    if not status:
        return "-"
    agent = status.get("agent") or {}
    limit = agent.get("idleStopMinutes")
    if not limit:
        return "off"
    if any(r.get("state") in ACTIVE for r in status.get("runs", [])):
        return f"busy (stops after {limit:g} idle min)"
    since, now = agent.get("idleSince"), status.get("now")
    if since is None or now is None:
        return f"stops after {limit:g} idle min"
    return f"idle {max(0.0, (now - since) / 60):.0f} of {limit:g} min"


def row(facts: StackFacts, now: float, catalog: Catalog) -> Row:
    cfg = facts.cfg
    state, source = vm_state(facts)
    notes: list[str] = []
    if facts.problem:  # the first problem itself, not the "is invalid (N problems)" header
        lines = facts.problem.splitlines()
        notes.append(lines[1].strip().removeprefix("- ") if len(lines) > 1 else lines[0])
    if facts.api_error:
        notes.append(f"compute api: {facts.api_error}")
    if facts.status_error and state not in ("TERMINATED", "none"):
        notes.append(f"host: {facts.status_error}")
    notes += recovery_notes(facts.instances or [], now)
    running = None if facts.status is None else sum(r.get("state") in ACTIVE for r in facts.status.get("runs", []))
    if cfg is None or not cfg.is_gcp:
        where = ", ".join(str(h) for h in cfg.hosts) if cfg else "?"
        return Row(
            facts.name,
            cfg.target if cfg else "?",
            shape_text(cfg, None, catalog),
            where,
            state,
            source,
            running,
            None,
            None,
            idle_text(facts.status),
            False,
            tuple(notes),
        )
    price = (facts.outputs or {}).get("hourlyCostUsd")
    if price is None:  # not deployed yet, or outputs from before: the catalog's price for the stack's shape
        price = catalog_price(cfg, catalog)
    billing = _billing(state)
    hourly = (price if billing else 0.0) if (price is not None or not billing) else None
    ledger = observed(facts, now)
    spent = None if price is None else round(hours_in_month(ledger, now) * price, 2)
    if price is None and (billing or facts.outputs):
        notes.append("price unknown (not in the catalog)")
    return Row(
        facts.name,
        "gcp",
        shape_text(cfg, facts.outputs, catalog),
        (facts.outputs or {}).get("zone") or cfg.zone,
        state,
        source,
        running,
        hourly,
        spent,
        idle_text(facts.status),
        billing,
        tuple(notes),
    )


def catalog_price(cfg: StackConfig, catalog: Catalog) -> float | None:
    """The stack's $/h for all its nodes from the catalog (None when the catalog has no price)."""
    per_vm = hourly_cost(shape_of(cfg, catalog), catalog).for_way(way(cfg))
    return None if per_vm is None else round(per_vm * cfg.nodes, 5)


def rows(facts: list[StackFacts], now: float, catalog: Catalog) -> list[Row]:
    """One row per stack, those billing now first (then by name)."""
    return sorted((row(f, now, catalog) for f in facts), key=lambda r: (not r.billing, r.stack))


# How a row's VM state is known (vm_state's second value), as the footer says it.
SOURCE_WORDS = {
    "compute api": "from the Compute API",
    "host answered": "from the host's answer",
    "last known outputs": "from the last known stack outputs",
    "ssh": "unknown (SSH failed)",
    "stack file": "unknown (invalid stack file)",
    "not asked": "not asked",
    "no outputs": "none deployed (no stack outputs)",
}


def sources_text(table: list[Row]) -> str:
    """How the VM states were known, each way with the stacks it holds for:
    "from the Compute API (t4, l4); not asked (lab)"."""
    by_source: dict[str, list[str]] = {}
    for r in table:
        by_source.setdefault(r.source, []).append(r.stack)
    order = list(SOURCE_WORDS)
    parts = [
        f"{SOURCE_WORDS.get(s, s)} ({', '.join(stacks)})"
        for s, stacks in sorted(by_source.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    ]
    return "; ".join(parts)


def render(table: list[Row]) -> str:
    def money(v: float | None) -> str:
        return "-" if v is None else f"${v:.2f}"

    head = ["STACK", "TARGET", "SHAPE", "ZONE/HOSTS", "VM", "RUNNING", "$/H NOW", "THIS MONTH", "IDLE STOP"]
    body = [
        [
            r.stack,
            r.target,
            r.shape,
            r.where,
            r.state,
            "?" if r.runs_running is None else str(r.runs_running),
            money(r.hourly_now),
            money(r.spent_month) if r.spent_month is None else f"≥{money(r.spent_month)}",
            r.idle,
        ]
        for r in table
    ]
    lines = aligned([head, *body])
    everywhere = set.intersection(*(set(r.notes) for r in table)) if len(table) > 1 else set()
    for r in table:
        lines += [f"  {r.stack}: {n}" for n in r.notes if n not in everywhere]
    lines += [f"  every stack: {n}" for n in sorted(everywhere)]
    total = sum(r.hourly_now or 0 for r in table if r.billing)
    if not table:
        return "no stack files (copy one from stacks/, or `pulumi stack init NAME`)"
    lines.append(f"billing now: ${total:.2f}/h across {sum(r.billing for r in table)} stack(s); VM states " + sources_text(table))
    lines.append("this month: VM uptime seen so far x $/h (disks are not counted: the catalog has no disk prices)")
    return "\n".join(lines)
