"""A sweep's plan: the trials of a search space, their names and arguments, the slots they run in, and
which trial goes next. Pure decisions (tables test them); both sides use them: the laptop plans and
says what it will cost, the host's queue (agent/sweep.py) asks ``next_launches`` what to start.
Standard library only, Python 3.8+: the agent's zipapp carries it.

A space is a small document, as a sweep file (YAML) or built from inline options::

    method: grid            # or random (then: count, seed)
    args: "--lr {lr} --bs {bs}"   # optional: where the values go; else each is appended as --NAME VALUE
    parameters:
      lr: {values: [0.001, 0.0003]}
      bs: {values: [16, 32]}
      wd: {min: 1.0e-5, max: 1.0e-2, distribution: log_uniform}   # random only
      layers: {min: 2, max: 6, distribution: int_uniform}
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpu_train.codec import Document

METHODS = ("grid", "random")
DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform")
TRIALS_MAX = 10000
NAME_MAX = 40  # a sweep's name: the trials' run ids are NAME_T{index}_{values}_YYYYmmdd_HHMMSS
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A trial's state in the queue: not started yet, or its run's state (contract.RunState's words).
PENDING = "pending"
HOLDS_SLOT = ("starting", "running", "interrupted")  # interrupted: boot resumes it in its slot
SWEEPS_DIR = "sweeps"  # REMOTE_ROOT/sweeps/NAME/{sweep.json, code/}


class SpaceError(ValueError):
    """A space that cannot be planned: the message names the setting and the fix."""


@dataclass(frozen=True)
class Trial:
    index: int
    values: dict[str, Any]  # parameter -> value, in the space's order
    node: int = 0
    slot: int = 0  # where it runs first (the queue may use any free slot of its node)


@dataclass(frozen=True)
class SweepDoc(Document):
    """A sweep as its host keeps it (REMOTE_ROOT/sweeps/NAME/sweep.json): the job's spec with a placeholder
    run id, the trials, this node's slots (each a list of GPU indices; [] for a host without GPUs)."""

    name: str = ""
    stamp: str = ""  # _YYYYmmdd_HHMMSS shared by its trials' run ids
    job: dict[str, Any] = field(default_factory=dict)  # the JobSpec every trial starts from (its webhook kept apart, as a run's)
    # {index, values, args, base, node, and with gpu-train:bucket: bucket, the trial's own place (JobSpec.bucket)}
    trials: tuple[dict[str, Any], ...] = ()
    slots: tuple[list[Any], ...] = ()  # this node's slots: GPU indices each
    node: int = 0
    mode: str = "trials"  # or "workers": the user's own sweep agent, one per slot
    stopped: bool = False
    created: float = 0
    WHAT, REQUIRED = "the sweep's record", ("name",)


def check_space(doc: object) -> dict[str, Any]:
    """The space as a checked dict: method, parameters (name -> {values} or {min, max, distribution}),
    count, seed, args; a SpaceError naming the setting otherwise."""
    if not isinstance(doc, dict):
        raise SpaceError("the sweep file must be a mapping with 'parameters' (and 'method', 'count', 'args')")
    unknown = set(doc) - {"method", "parameters", "count", "seed", "args"}
    if unknown:
        raise SpaceError(f"unknown sweep setting(s) {', '.join(sorted(unknown))}: use method, parameters, count, seed, args")
    method = doc.get("method", "grid")
    if method not in METHODS:
        raise SpaceError(f"method {method!r}: use grid or random")
    params = doc.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SpaceError("parameters: give at least one, e.g. parameters: {lr: {values: [0.001, 0.01]}}")
    for name, p in params.items():
        where = f"parameters.{name}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", str(name)):
            raise SpaceError(f"{where}: a parameter's name is letters, digits, '_' and '-' (it becomes --{name})")
        if not isinstance(p, dict):
            raise SpaceError(f"{where}: give values: [...] or min/max")
        if "values" in p:
            if not isinstance(p["values"], list) or not p["values"] or not all(_plain(v) for v in p["values"]):
                raise SpaceError(f"{where}.values: a non-empty list of numbers, strings or booleans")
        elif "min" in p and "max" in p:
            if method == "grid":
                raise SpaceError(f"{where}: a range (min/max) needs method: random; a grid takes values: [...]")
            dist = p.get("distribution", "uniform")
            if dist not in DISTRIBUTIONS:
                raise SpaceError(f"{where}.distribution {dist!r}: use {', '.join(DISTRIBUTIONS)}")
            lo, hi = p["min"], p["max"]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)) or not lo <= hi:
                raise SpaceError(f"{where}: min and max are numbers, min <= max")
            if dist == "log_uniform" and lo <= 0:
                raise SpaceError(f"{where}: a log_uniform range needs min > 0")
        else:
            raise SpaceError(f"{where}: give values: [...] or min and max")
    count = doc.get("count")
    if method == "random" and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise SpaceError("count: a random sweep needs how many trials (count: N, N >= 1)")
    if "seed" in doc and not isinstance(doc["seed"], int):
        raise SpaceError("seed: a whole number")
    if "args" in doc:
        if not isinstance(doc["args"], str):
            raise SpaceError("args: one string, e.g. args: '--lr {lr}'")
        missing = set(PLACEHOLDER.findall(doc["args"])) - set(params)
        if missing:
            raise SpaceError(f"args names {', '.join('{' + m + '}' for m in sorted(missing))}, which parameters do not have")
    return {"method": method, "parameters": params, "count": count, "seed": doc.get("seed", 0), "args": doc.get("args")}


def _plain(v: object) -> bool:
    return isinstance(v, (str, int, float, bool)) and not (isinstance(v, float) and not math.isfinite(v))


def inline_space(values: list[str], ranges: list[str], count: int | None, seed: int | None) -> dict[str, Any]:
    """The space from inline options: ``--values lr=0.001,0.01`` (a grid over each list), ``--random
    lr=1e-5:1e-2:log`` (a range; with ``--count N`` a random sweep)."""
    params: dict[str, Any] = {}
    for text in values:
        name, _, listed = text.partition("=")
        if not listed:
            raise SpaceError(f"--values {text!r}: write NAME=V1,V2,...")
        params[name.strip()] = {"values": [_value(v) for v in listed.split(",")]}
    for text in ranges:
        name, _, rng = text.partition("=")
        parts = rng.split(":")
        if len(parts) not in (2, 3):
            raise SpaceError(f"--random {text!r}: write NAME=MIN:MAX[:log|int]")
        kind = {"": "uniform", "log": "log_uniform", "int": "int_uniform"}.get(parts[2] if len(parts) == 3 else "")
        if kind is None:
            raise SpaceError(f"--random {text!r}: the third part is log or int")
        lo, hi = _value(parts[0]), _value(parts[1])
        params[name.strip()] = {"min": lo, "max": hi, "distribution": kind}
    doc: dict[str, Any] = {"method": "random" if ranges else "grid", "parameters": params}
    if count is not None:
        doc["count"] = count
    if seed is not None:
        doc["seed"] = seed
    return check_space(doc)


def _value(text: str) -> object:
    """A value as typed: an int, a float, true/false, else the string."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def expand(space: dict[str, Any]) -> list[dict[str, Any]]:
    """Every trial's values: a grid's product (the first parameter changes slowest), or ``count`` random
    draws (seeded: the same space gives the same trials on every laptop)."""
    params = space["parameters"]
    if space["method"] == "grid":
        names = list(params)
        size = math.prod(len(params[n]["values"]) for n in names)  # counted, not built: 10 values of 7 is 10**7
        if size > TRIALS_MAX:
            raise SpaceError(f"the grid has {size} trials, more than {TRIALS_MAX}: sweep fewer values, or method: random")
        return [{n: c[k] for k, n in enumerate(names)} for c in itertools.product(*(params[n]["values"] for n in names))]
    rng = random.Random(space["seed"])
    out = []
    for _ in range(min(space["count"], TRIALS_MAX)):
        out.append({n: _draw(rng, p) for n, p in params.items()})
    return out


def _draw(rng: random.Random, p: dict[str, Any]) -> object:
    if "values" in p:
        return rng.choice(p["values"])
    lo, hi, dist = p["min"], p["max"], p.get("distribution", "uniform")
    if dist == "int_uniform":
        return rng.randint(math.ceil(lo), math.floor(hi))
    if dist == "log_uniform":
        return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}")
    return float(f"{rng.uniform(lo, hi):.4g}")


def shown(v: object) -> str:
    """A value as it goes on the command line: true/false lower case, floats as Python writes them."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def trial_args(fixed: list[str], values: dict[str, Any], template: str | None) -> list[str]:
    """The trial's arguments: the fixed ones with ``{name}`` replaced, then the template's (replaced), or
    else each value not placed as ``--NAME VALUE`` (a script that wants ``--NAME=VALUE`` gives args)."""
    import shlex

    placed: set[str] = set()

    def fill(text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) in values:
                placed.add(m.group(1))
                return shown(values[m.group(1)])
            return m.group(0)

        return PLACEHOLDER.sub(sub, text)

    out = [fill(a) for a in fixed]
    if template:
        out += [fill(a) for a in shlex.split(template)]
    for name, v in values.items():
        if name not in placed:
            out += [f"--{name}", shown(v)]
    return out


def trial_base(sweep: str, index: int, values: dict[str, Any], room: int) -> str:
    """The trial's base name: the sweep's, its index and its values (letters, digits, '_'), in ``room``
    characters: SWEEP_T3_lr0p001_bs32; the values are cut before the index and the sweep ever are."""
    head = f"{sweep}_t{index}"
    tail = "".join(f"_{re.sub(r'[^A-Za-z0-9]', '', str(k))}{_token(v)}" for k, v in values.items())
    return (head + tail)[:room] if len(head) <= room else head[:room]


def _token(v: object) -> str:
    """A value in a name: a number's point as p and minus as m (0.001 -> 0p001, 1e-05 -> 1em05)."""
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    text = shown(v).replace(".", "p").replace("-", "m").replace("+", "") if numeric else shown(v)
    return re.sub(r"[^A-Za-z0-9]", "", text)[:16]


def slots_of(gpus: int, per_trial: int, declared: int | None) -> list[list[int]]:
    """A node's slots, each the GPU indices one trial sees: its GPUs in groups of ``per_trial``; on a host
    without GPUs, ``declared`` slots that see none ([])."""
    if per_trial < 1:
        raise SpaceError(f"--gpus-per-trial {per_trial}: at least 1")
    if gpus == 0:
        if not declared:
            raise SpaceError("this host has no GPU: say how many trials may run at once with --slots N")
        return [[] for _ in range(declared)]
    if per_trial > gpus:
        raise SpaceError(f"--gpus-per-trial {per_trial}: a node has only {gpus} GPU(s)")
    count = gpus // per_trial if declared is None else min(declared, gpus // per_trial)
    return [list(range(k * per_trial, (k + 1) * per_trial)) for k in range(count)]


def spread(count: int, node_slots: list[int]) -> list[int]:
    """Each trial's node: in turn over the nodes' slots (node 0's first slot, node 1's first, ...), so
    every node gets trials in proportion to its slots, and the first wave fills every slot."""
    order = [n for k in range(max(node_slots, default=0)) for n, s in enumerate(node_slots) if k < s]
    if not order:
        raise SpaceError("no slot on any node")
    return [order[i % len(order)] for i in range(count)]


def next_launches(states: list[str], held: list[int | None], slots: int) -> list[tuple[int, int]]:
    """(trial, slot) to start now: pending trials in order, into the slots no starting, running or
    interrupted trial holds (``held``: each trial's slot, or None)."""
    busy = {held[i] for i, s in enumerate(states) if s in HOLDS_SLOT and held[i] is not None}
    free = [k for k in range(slots) if k not in busy]
    pending = [i for i, s in enumerate(states) if s == PENDING]
    return [(pending[k], free[k]) for k in range(min(len(pending), len(free)))]


@dataclass(frozen=True)
class Estimate:
    trials: int
    slots: int
    waves: int
    gpu_hours: float | None
    wall_hours: float | None
    cost: float | None


def estimate(trials: int, slots: int, gpus_per_trial: int, hours_per_trial: float | None, vm_hourly: float | None, nodes: int) -> Estimate:
    """What a sweep takes: waves of ``slots`` trials, GPU-hours (trials x GPUs x hours) and the stack's
    cost while it runs (every node paid for the whole wall time, idle slots of the last wave too)."""
    waves = math.ceil(trials / slots) if slots else 0
    if hours_per_trial is None:
        return Estimate(trials, slots, waves, None, None, None)
    wall = waves * hours_per_trial
    cost = None if vm_hourly is None else round(vm_hourly * wall * nodes, 2)
    return Estimate(trials, slots, waves, trials * gpus_per_trial * hours_per_trial, wall, cost)


R = TypeVar("R", bound="Mapping[str, Any]")  # a trial's row: the host's answer (answers.SweepTrial) or a plain dict


def best(rows: Sequence[R], mode: str) -> R | None:
    """The trial whose best value of the metric is lowest (``min``) or highest (``max``); rows without one
    are never best."""
    have = [r for r in rows if r.get("best") is not None]
    if not have:
        return None
    return (min if mode == "min" else max)(have, key=lambda r: r["best"])
