"""How the VM is had (on demand, spot, Flex-start, a reservation) and what the instance says for it.

Pure decisions of (config, catalog): which way a stack asks for, the rules that refuse a way a shape
cannot be had by (each Problem naming the setting and the ways that exist), and the instance's
``scheduling`` and ``reservationAffinity`` inputs, spelled as pulumi-gcp 10.2 takes them (its
InstanceSchedulingArgsDict, InstanceReservationAffinityArgsDict; catalog source S27).

Choices made here, and why:
- Flex-start ends with ``instanceTerminationAction: STOP``, not DELETE: the runs live on a data disk
  that outlives the VM either way, but a stopped VM stays in the stack (boot disk, address of the
  stack's outputs), so `running: true` or `gpu-train up` starts it again, while a deleted one leaves
  the stack pointing at nothing until the next `pulumi up` recreates it. (pulumi-gcp's doc text says
  FLEX_START "should" DELETE; Google's Flex-start page says it stops or deletes per the action; whether a
  stopped Flex-start VM queues again on start is not verified without a live project.)
- A DENSE reservation (``Reservation.deploymentType``: calendar mode, future reservations, the usual A4 and
  A3 Ultra capacity) takes only ``provisioningModel: RESERVATION_BOUND`` ("Instances consuming DENSE
  reservations must use provisioningModel RESERVATION_BOUND"). The stack says so (``reservationBound``)
  rather than it being set behind the user's back, so `plan` shows offline exactly what `up` sends;
  `scripts/preflight` (which `scripts/up` runs first) reads the reservation's ``deploymentType`` and
  refuses a DENSE one without the setting, naming it (``reservations.fit``). SkyPilot sets it itself
  (skypilot#9779); a refusal that names the fix keeps the stack file the truth.
- A reservation-bound VM restarts by itself after host maintenance or a host error
  (``automaticRestart: true``, as Google's A4 / A3 Ultra sample has it) and ends with its reservation,
  so ``maxRunHours`` is refused with it and no recovery function is declared for it.
"""

from __future__ import annotations

import re

from gpu_train.catalog.model import FLEX_START, ON_DEMAND, RESERVATION, SPOT, Catalog
from gpu_train.stack.problems import Problem
from gpu_train.stack.settings import MAX_NOTICE_S, NAMESPACE, StackConfig

MAX_RUN_HOURS = 120 * 24  # Compute Engine caps maxRunDuration at 120 days
RESERVATION_KEY = "compute.googleapis.com/reservation-name"  # the key a SPECIFIC_RESERVATION names its reservation by
_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PROJECT = r"[a-z][-a-z0-9.:]{4,62}[a-z0-9]"
RESERVATION_RE = re.compile(
    rf"(?:projects/(?P<project>{_PROJECT})/reservations/)?(?P<name>{_NAME})"
    rf"(?:/reservationBlocks/(?P<block>{_NAME}))?"
)
FALLBACK_WAYS = (SPOT, FLEX_START, ON_DEMAND)  # what provisioningFallback may name


def way(cfg: StackConfig) -> str:
    """The way this stack asks for its VM."""
    if cfg.reservation:
        return RESERVATION
    if cfg.flex_start:
        return FLEX_START
    return SPOT if cfg.spot else ON_DEMAND


def recovered(cfg: StackConfig) -> bool:
    """A stack whose VMs Compute Engine leaves stopped after a preemption, host error or host maintenance
    (spot, Flex-start: automaticRestart false) gets the recovery function (infra/recovery.py), unless
    recoverHours is 0. Standard and reservation-bound VMs restart by themselves."""
    return way(cfg) in (SPOT, FLEX_START) and cfg.recover_hours > 0


def with_way(cfg_settings: dict[str, str], new_way: str) -> dict[str, str]:
    """The stack settings (as `scripts/up` sets them) that ask for ``new_way`` instead."""
    return {**cfg_settings, "spot": str(new_way == SPOT).lower(), "flexStart": str(new_way == FLEX_START).lower()}


def parse_reservation(text: str) -> tuple[str | None, str, str | None] | None:
    """``NAME``, ``projects/P/reservations/NAME`` or ``.../reservationBlocks/B``: (project, name, block); None
    when it is none of these."""
    m = RESERVATION_RE.fullmatch(text.strip())
    return None if m is None else (m.group("project"), m.group("name"), m.group("block"))


def run_seconds(hours: float) -> int:
    """maxRunHours as whole seconds (maxRunDuration's ``seconds``)."""
    return round(hours * 3600)


# -- rules --------------------------------------------------------------------------------------
def check(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Every problem with the way the stack asks for its VM(s), errors and warnings."""
    problems = _exclusive(cfg) + _run_hours(cfg, catalog)
    machines = list(dict.fromkeys([p.machine_type for p in cfg.pools] or [cfg.machine_type]))
    for machine in machines:
        if catalog.parse_machine_type(machine) is None:
            continue  # the machine type's own problem says so
        problems += _offered(cfg, catalog, machine, way(cfg))
    problems += _reservation(cfg, machines)
    problems += _fallback(cfg, catalog, machines)
    return problems


def _exclusive(cfg: StackConfig) -> list[Problem]:
    problems = []
    if cfg.flex_start and cfg.spot:
        problems.append(
            Problem(
                "flexStart",
                "cannot be combined with spot: a VM is one or the other",
                f"remove {NAMESPACE}:spot or {NAMESPACE}:flexStart (provisioningFallback tries one after the other)",
                True,
            )
        )
    if cfg.reservation and (cfg.spot or cfg.flex_start):
        which = "spot" if cfg.spot else "flexStart"
        problems.append(
            Problem(
                "reservation",
                f"cannot be combined with {which}: a VM that consumes a reservation runs on demand",
                f"remove {NAMESPACE}:{which} or {NAMESPACE}:reservation",
                cfg.reservation,
            )
        )
    if cfg.reservation_bound and not cfg.reservation:
        problems.append(
            Problem(
                "reservationBound", "needs a reservation to be bound to", f"set {NAMESPACE}:reservation, or remove reservationBound", True
            )
        )
    if cfg.preemption_notice_s and (not cfg.spot or not 0 < cfg.preemption_notice_s <= MAX_NOTICE_S):
        problems.append(
            Problem(
                "preemptionNoticeSeconds",
                f"applies to spot VMs only, 1 to {MAX_NOTICE_S} s (Compute Engine gives the notice before a spot VM's soft-off)",
                f"set {NAMESPACE}:spot true, or remove preemptionNoticeSeconds",
                cfg.preemption_notice_s,
            )
        )
    if cfg.reservation_bound and cfg.max_run_hours is not None:
        problems.append(
            Problem(
                "maxRunHours",
                "cannot be combined with reservationBound: a reservation-bound VM runs until its reservation ends, "
                "when Compute Engine stops it",
                f"remove {NAMESPACE}:maxRunHours (stop it earlier with vm-stop, or idleStopMinutes)",
                cfg.max_run_hours,
            )
        )
    return problems


def _run_hours(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    hours = cfg.max_run_hours
    if not cfg.flex_start:
        if hours is not None and not 1 <= hours <= MAX_RUN_HOURS:
            return [
                Problem(
                    "maxRunHours", f"must be between 1 and {MAX_RUN_HOURS} (fractions allowed)", "e.g. 24, or remove it for no cap", hours
                )
            ]
        return []
    flex = catalog.flex_start
    low = flex.min_run_minutes / 60
    if hours is None:
        return [
            Problem(
                "maxRunHours",
                "is required with flexStart (a Flex-start VM runs at most 7 days, and Compute Engine needs its run time up front)",
                f"set {NAMESPACE}:maxRunHours between {low:.3g} ({flex.min_run_minutes} minutes) and {flex.max_run_hours}, e.g. 24",
            )
        ]
    if not low <= hours <= flex.max_run_hours:
        return [
            Problem(
                "maxRunHours",
                f"must be between {low:.3g} ({flex.min_run_minutes} minutes) and {flex.max_run_hours} (7 days) with flexStart",
                "e.g. 24 (fractions allowed: 0.5 is 30 minutes)",
                hours,
            )
        ]
    return []


def _ways_text(ways: tuple[str, ...]) -> str:
    return ", ".join(ways) if ways else "no way gpu-train knows"


def _offered(cfg: StackConfig, catalog: Catalog, machine: str, wanted: str) -> list[Problem]:
    """Can ``machine`` be had the way the stack asks? Flex-start on a series no source vouches for: a warning."""
    ways = catalog.ways(machine)
    series = catalog.series_of(machine)
    key = {SPOT: "spot", FLEX_START: "flexStart", RESERVATION: "reservation", ON_DEMAND: "machineType"}[wanted]
    if wanted == FLEX_START and series in catalog.flex_start.unverified:
        return [
            Problem(
                "flexStart",
                f"Flex-start on {series} ({machine}) is unverified: Google's Flex-start page "
                "lists every accelerator-optimized type except A4X and G4, other sources say nothing",
                "it may be refused at `up`; scripts/plan shows what would be sent",
                True,
                "warning",
            )
        ]
    if wanted in ways:
        return []
    fix = _fix_for(machine, ways, catalog)
    if wanted == ON_DEMAND:
        return [Problem("machineType", f"{machine} cannot be had on demand, only as {_ways_text(ways)}", fix, machine)]
    what = {SPOT: "a Spot VM", FLEX_START: "Flex-start", RESERVATION: "a reservation"}[wanted]
    value = cfg.reservation if wanted == RESERVATION else True
    return [Problem(key, f"{machine} cannot be had as {what} ({series}): only as {_ways_text(ways)}", fix, value)]


def _fix_for(machine: str, ways: tuple[str, ...], catalog: Catalog) -> str:
    settings = {
        SPOT: f"{NAMESPACE}:spot true",
        FLEX_START: f"{NAMESPACE}:flexStart true with maxRunHours",
        RESERVATION: f"{NAMESPACE}:reservation NAME (one your project holds)",
        ON_DEMAND: "neither spot nor flexStart",
    }
    options = [settings[w] for w in ways]
    if not options:
        return "choose another machine type"
    return f"for {machine} set " + ", or ".join(options)


def _reservation(cfg: StackConfig, machines: list[str]) -> list[Problem]:
    if not cfg.reservation:
        return []
    if parse_reservation(cfg.reservation) is None:
        return [
            Problem(
                "reservation",
                "is not a reservation's name or path",
                "write NAME, projects/PROJECT/reservations/NAME or projects/PROJECT/reservations/NAME/reservationBlocks/BLOCK",
                cfg.reservation,
            )
        ]
    if len(machines) > 1:  # every node names it, and a VM of another type than it holds is refused
        return [
            Problem(
                "reservation",
                f"holds VMs of one machine type; the pools have {', '.join(machines)}",
                "use one machine type for every pool, or no reservation",
                cfg.reservation,
            )
        ]
    return []


def _fallback(cfg: StackConfig, catalog: Catalog, machines: list[str]) -> list[Problem]:
    problems = []
    for w in cfg.provisioning_fallback:
        if w not in FALLBACK_WAYS:
            problems.append(
                Problem(
                    "provisioningFallback",
                    f"{w!r} is not a way to fall back to",
                    f"use {', '.join(FALLBACK_WAYS)} (a reservation is the stack's own setting)",
                    list(cfg.provisioning_fallback),
                )
            )
            continue
        if cfg.reservation:
            problems.append(
                Problem(
                    "provisioningFallback",
                    "does not apply to a stack that consumes a reservation",
                    "remove provisioningFallback, or the reservation",
                    list(cfg.provisioning_fallback),
                )
            )
            break
        for machine in machines:
            if catalog.parse_machine_type(machine) is not None and w not in catalog.ways(machine):
                problems.append(
                    Problem(
                        "provisioningFallback",
                        f"{machine} cannot be had as {w} (only {_ways_text(catalog.ways(machine))})",
                        f"remove {w}",
                        list(cfg.provisioning_fallback),
                    )
                )
        if w == FLEX_START and not cfg.flex_start:
            trial = _run_hours(_as_flex(cfg), catalog)
            problems += [Problem("provisioningFallback", f"flex-start: maxRunHours {p.message}", p.fix, cfg.max_run_hours) for p in trial]
    return problems


def _as_flex(cfg: StackConfig) -> StackConfig:
    from dataclasses import replace

    return replace(cfg, flex_start=True, spot=False)


# -- what the instance says -----------------------------------------------------------------------
def scheduling(cfg: StackConfig, catalog: Catalog, machine_type: str) -> dict[str, object]:
    """The instance's ``scheduling``: GPUs cannot live-migrate, so host maintenance always TERMINATEs.

    Spot and Flex-start STOP at their end (the disk kept); ``maxRunHours`` STOPs the VM that long after
    each start. A STOP at maxRunDuration on a type with bundled Local SSD must discard it, or Compute
    Engine refuses the create (onInstanceStopAction.discardLocalSsd, which takes only true).
    """
    chosen = way(cfg)
    out: dict[str, object] = {"on_host_maintenance": "TERMINATE"}
    if chosen == SPOT:
        out |= {"provisioning_model": "SPOT", "preemptible": True, "automatic_restart": False, "instance_termination_action": "STOP"}
        if cfg.preemption_notice_s:  # the metadata's `preempted` this long before the soft-off: the job's notice
            out["preemption_notice_duration"] = {"seconds": cfg.preemption_notice_s}
    elif chosen == FLEX_START:
        out |= {"provisioning_model": "FLEX_START", "automatic_restart": False, "instance_termination_action": "STOP"}
    elif chosen == RESERVATION and cfg.reservation_bound:  # Google's sample: back by itself after maintenance
        out |= {"provisioning_model": "RESERVATION_BOUND", "automatic_restart": True, "instance_termination_action": "STOP"}
    else:
        out |= {"provisioning_model": "STANDARD", "automatic_restart": True}
    if cfg.max_run_hours:
        out["max_run_duration"] = {"seconds": run_seconds(cfg.max_run_hours)}
        out["instance_termination_action"] = "STOP"
        machine = catalog.parse_machine_type(machine_type)
        if machine is not None and machine.fixed is not None and machine.fixed.local_ssd:
            out["on_instance_stop_action"] = {"discard_local_ssd": True}
    return out


def reservation_affinity(cfg: StackConfig) -> dict[str, object] | None:
    """The instance's ``reservationAffinity``: the named reservation (SPECIFIC_RESERVATION), none at all for
    Flex-start (it must not consume one), else the provider's default (any reservation that matches)."""
    if cfg.reservation:
        return {"type": "SPECIFIC_RESERVATION", "specific_reservation": {"key": RESERVATION_KEY, "values": [cfg.reservation.strip()]}}
    if cfg.flex_start:
        return {"type": "NO_RESERVATION"}
    return None
