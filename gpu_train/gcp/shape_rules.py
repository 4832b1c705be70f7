"""The rules of a stack's machine type and GPUs, and of where its GPU is offered: pure functions of
(config, catalog), each returning Problems with the nearest valid value as the fix. Part of
``validate`` (which runs them), kept apart because they are the longest of its rules.
"""

from __future__ import annotations

import difflib
import re

from gpu_train.catalog import gpunames
from gpu_train.catalog.model import AI_ZONE_PATTERN, Catalog, FixedShape, MachineShape, dated
from gpu_train.stack.problems import Problem
from gpu_train.stack.settings import StackConfig


# -- machine type and GPUs --------------------------------------------------------------------
def machine_and_gpus(cfg: StackConfig, catalog: Catalog) -> tuple[list[Problem], MachineShape | None]:
    machine = catalog.parse_machine_type(cfg.machine_type)
    if machine is None:
        known = [s.name for s in catalog.n1_types()] + list(catalog.fixed_shapes)
        close = difflib.get_close_matches(cfg.machine_type, known, n=3, cutoff=0.6)
        fix = (
            f"did you mean {', '.join(close)}?" if close else "use an N1 type (n1-standard-8) or a GPU shape (g2-standard-8, a2-highgpu-1g)"
        )
        return [Problem("machineType", "is not a machine type gpu-train knows", fix, cfg.machine_type)], None
    if machine.fixed is not None:
        return _fixed_shape(cfg, catalog, machine.fixed), machine
    if sizes := sorted((s for s in catalog.fixed_shapes.values() if s.name.split("-")[0] == machine.series), key=lambda s: s.vcpus):
        # g2-standard-3: a GPU series' size that does not exist (not "the G2 series takes no GPUs")
        asked = machine.vcpus  # (its trailing number: g2-standard-3's 3)
        near = sorted(sizes, key=lambda s: abs(s.vcpus - asked))[:1] if asked and sizes[0].vcpus else []
        close = [s.name for s in near] or difflib.get_close_matches(cfg.machine_type, [s.name for s in sizes], n=3, cutoff=0.6)
        names = f"{machine.series.upper()} types: {', '.join(s.name for s in sizes)}"
        fix = f"did you mean {', '.join(close)}? ({names})" if close else names
        said = f"is not a machine type of the {machine.series.upper()} series that gpu-train knows"
        return [Problem("machineType", said, fix, cfg.machine_type)], None
    if machine.series == "n1":
        return _n1(cfg, catalog, machine), machine
    return [_incompatible_series(cfg, catalog, machine)], None


def _gpu_type_problem(cfg: StackConfig, catalog: Catalog) -> Problem | None:
    gpu_type = cfg.gpu_type or ""
    if gpu_type in catalog.retired:
        gone = catalog.retired[gpu_type]
        return Problem(
            "gpuType",
            gone.note,
            f"the nearest current GPU is {gone.replacement}: set gpuType {gone.replacement} (gpuCount and machineType checked against it)",
            cfg.gpu_type,
        )
    acc = catalog.accelerator(gpu_type)
    if acc is None:
        return Problem("gpuType", "is not a GPU type", gpunames.describe_unknown(gpu_type, catalog), cfg.gpu_type)
    if acc.shutdown:
        return Problem(
            "gpuType",
            f"{acc.gpu} is deprecated: Compute Engine shuts it down on {acc.shutdown}",
            "plan a move to a current GPU, e.g. nvidia-l4 (machineType g2-standard-8)",
            cfg.gpu_type,
            "warning",
        )
    return None


def _fixed_shape(cfg: StackConfig, catalog: Catalog, shape: FixedShape) -> list[Problem]:
    problems = []
    implied = f"{shape.name} comes with {shape.gpu_count} x {shape.gpu_type}"
    if "gpuType" in cfg.given:
        acc = catalog.accelerator(cfg.gpu_type or "")
        if acc is None or acc.name != shape.gpu_type:
            options = ", ".join(s.name for s in catalog.shapes_with(cfg.gpu_type or "")) if acc else ""
            fix = f"remove gpuType (it is implied) or set it to {shape.gpu_type}"
            if options:
                fix += f"; for {cfg.gpu_type} use machineType {options}"
            problems.append(Problem("gpuType", f"does not match the machine type: {implied}", fix, cfg.gpu_type))
    if "gpuCount" in cfg.given and cfg.gpu_count != shape.gpu_count:
        same_gpu = [s.name for s in catalog.shapes_with(shape.gpu_type) if s.gpu_count == cfg.gpu_count]
        fix = f"remove gpuCount (it is implied) or set it to {shape.gpu_count}"
        if same_gpu:
            fix += f"; for {cfg.gpu_count} GPUs use machineType {same_gpu[0]}"
        problems.append(Problem("gpuCount", f"does not match the machine type: {implied}", fix, cfg.gpu_count))
    return problems  # how the shape may be had (on demand, spot, ...): gpu_train.gcp.provisioning


def _nearest(value: int, allowed: list[int]) -> int:
    return min(allowed, key=lambda a: (abs(a - value), -a))


def _n1(cfg: StackConfig, catalog: Catalog, machine: MachineShape) -> list[Problem]:
    n1_gpus = [a.name for a in catalog.accelerators.values() if a.attachable_to_n1]
    problems = []
    p: Problem | None = None
    if cfg.gpu_type is None:
        problems.append(
            Problem(
                "gpuType",
                f"is required with an N1 machine type ({cfg.machine_type})",
                f"set gpuType to one of {', '.join(n1_gpus)}, or use a GPU shape such as g2-standard-8",
            )
        )
    elif (p := _gpu_type_problem(cfg, catalog)) is not None and p.severity == "error":
        problems.append(p)
    elif not (acc := catalog.accelerator(cfg.gpu_type)) or not acc.attachable_to_n1:
        problems.append(_not_attachable(cfg, catalog))
    if cfg.gpu_count is None:
        allowed = _allowed_counts(cfg, catalog)
        hint = f" ({', '.join(map(str, allowed))} for {cfg.gpu_type})" if allowed else ""
        problems.append(Problem("gpuCount", "is required with an N1 machine type", f"set gpuCount{hint}"))
    if problems:
        return problems

    acc = catalog.accelerator(cfg.gpu_type or "")
    assert acc is not None and cfg.gpu_count is not None and machine.vcpus is not None and machine.memory_gb is not None
    warned = [p] if p is not None else []  # a deprecated GPU: said, and the shape still checked
    limits = {lim.count: lim for lim in catalog.n1_limits[acc.name]}
    if cfg.gpu_count not in limits:
        allowed = sorted(limits)
        return [
            *warned,
            Problem(
                "gpuCount",
                f"{cfg.gpu_type} attaches to N1 in counts of {', '.join(map(str, allowed))} only",
                f"nearest valid count: {_nearest(cfg.gpu_count, allowed)}",
                cfg.gpu_count,
            ),
        ]
    max_vcpus, max_mem = limits[cfg.gpu_count].ceilings(cfg.zone)
    if machine.vcpus > max_vcpus or machine.memory_gb > max_mem:
        fits = [t for t in catalog.n1_types() if (t.vcpus or 0) <= max_vcpus and (t.memory_gb or 0) <= max_mem]
        largest = max(fits, key=lambda t: (t.vcpus or 0, t.memory_gb or 0)).name if fits else None
        vcpus, memory_gb = machine.vcpus, machine.memory_gb
        more = [c for c, lim in sorted(limits.items()) if vcpus <= lim.ceilings(cfg.zone)[0] and memory_gb <= lim.ceilings(cfg.zone)[1]]
        fix = f"with {cfg.gpu_count} x {cfg.gpu_type} use at most {max_vcpus} vCPUs and {max_mem:g} GB"
        if largest:
            fix += f", e.g. machineType {largest}"
        if more:
            fix += f"; or keep {cfg.machine_type} with gpuCount {more[0]}"
        return [
            *warned,
            Problem(
                "machineType",
                f"has {machine.vcpus} vCPUs and {machine.memory_gb:g} GB, over the "
                f"ceiling of {max_vcpus} vCPUs and {max_mem:g} GB for {cfg.gpu_count} x {cfg.gpu_type}",
                fix,
                cfg.machine_type,
            ),
        ]
    return warned


def _allowed_counts(cfg: StackConfig, catalog: Catalog) -> list[int]:
    acc = catalog.accelerator(cfg.gpu_type or "")
    return [lim.count for lim in catalog.n1_limits.get(acc.name, ())] if acc else []


def _smallest_shape(catalog: Catalog, gpu_type: str, count: int | None) -> FixedShape | None:
    shapes = catalog.shapes_with(gpu_type)
    exact = [s for s in shapes if count is None or s.gpu_count == count]
    enough = [s for s in shapes if count is not None and s.gpu_count >= count]
    return next(iter(exact or enough or shapes), None)


def _not_attachable(cfg: StackConfig, catalog: Catalog) -> Problem:
    acc = catalog.accelerator(cfg.gpu_type or "")
    assert acc is not None  # a known GPU that N1 does not take
    shape = _smallest_shape(catalog, acc.name, cfg.gpu_count)
    fix = (
        f"set machineType {shape.name} ({shape.gpu_count} x {shape.gpu_type}, {shape.vcpus} vCPUs) and remove gpuType/gpuCount"
        if shape
        else "choose an N1 GPU such as nvidia-tesla-t4"
    )
    return Problem("gpuType", f"{acc.gpu} is not attached to N1 VMs: it comes with {acc.series} machine types", fix, cfg.gpu_type)


def _incompatible_series(cfg: StackConfig, catalog: Catalog, machine: MachineShape) -> Problem:
    """E2, N2, C2, ... take no GPUs; Compute Engine would answer 'features are not compatible'."""
    acc = catalog.accelerator(cfg.gpu_type or "")
    if acc is not None and acc.attachable_to_n1:
        limits = catalog.n1_limits[acc.name]
        for_count = [lim for lim in limits if lim.count == cfg.gpu_count] or limits
        ceiling = max(lim.max_vcpus for lim in for_count)
        fits = [t for t in catalog.n1_types() if t.name.startswith("n1-standard") and (t.vcpus or 0) <= ceiling]
        want = machine.vcpus or 8
        pick = next((t for t in fits if (t.vcpus or 0) >= want), fits[-1])
        fix = f"use an N1 type with {acc.gpu}, e.g. machineType {pick.name}"
    elif acc is not None:
        shape = _smallest_shape(catalog, acc.name, cfg.gpu_count)
        fix = f"use machineType {shape.name}, which comes with {acc.gpu}" if shape else "use a GPU machine type"
    else:
        fix = "use an N1 type with gpuType/gpuCount (n1-standard-8 + nvidia-tesla-t4), or a GPU shape (g2-standard-8)"
    return Problem(
        "machineType",
        f"the {machine.series.upper()} series takes no GPUs "
        f"(Compute Engine: '[{cfg.machine_type}, {cfg.gpu_type or 'GPU'}] features are not compatible')",
        fix,
        cfg.machine_type,
    )


# -- where the GPU is offered -----------------------------------------------------------------
def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def offered_gpu(cfg: StackConfig, catalog: Catalog, machine: MachineShape | None) -> str | None:
    """The GPU type whose zones apply, when the machine and GPU are known well enough to ask."""
    if machine is None:
        return None
    if machine.fixed is not None:
        return machine.fixed.gpu_type
    acc = catalog.accelerator(cfg.gpu_type or "")
    return acc.name if acc is not None and acc.attachable_to_n1 else None


def availability(cfg: StackConfig, catalog: Catalog, machine: MachineShape, gpu_type: str) -> list[Problem]:
    zones = catalog.zones_for(gpu_type, machine)
    if cfg.zone in zones or not zones:  # no zones in the catalog: nothing to check against
        return []
    acc = catalog.accelerator(gpu_type)
    assert acc is not None  # offered_gpu names only known GPUs
    in_region = [z for z in zones if _region_of(z) == cfg.region]
    if in_region:
        fix = f"zones of {cfg.region} with {acc.gpu}: {', '.join(in_region)}"
    else:
        fix = f"{cfg.region} has no {acc.gpu}; nearest regions with it: " + "; ".join(
            f"{r} ({', '.join(zs)})" for r, zs in nearest_regions(cfg.region, zones)
        )
    # AI zones (us-central1-ai1) hold GPU capacity the snapshot does not list: say so, stop nothing.
    unverified = acc.name in catalog.unverified_zones or re.fullmatch(AI_ZONE_PATTERN, cfg.zone) is not None
    what = f"{acc.gpu}" + (f" as {machine.name}" if machine.fixed and machine.fixed.zones else "")
    msg = f"{what} is not offered in this zone (catalog snapshot{dated(catalog.dates['zones'])}"
    msg += "; unverified for this GPU or zone)" if unverified else ")"
    fix += f"; check live: gcloud compute accelerator-types list --filter=name={acc.name}"
    return [Problem("zone", msg, fix, cfg.zone, "warning" if unverified else "error")]


def nearest_regions(region: str, zones: tuple[str, ...], n: int = 3) -> list[tuple[str, list[str]]]:
    """Regions that have ``zones``, same geography first (us-, europe-, asia-...), then by name."""
    by_region: dict[str, list[str]] = {}
    for z in zones:
        by_region.setdefault(_region_of(z), []).append(z)
    area = region.split("-")[0]
    # Within an area, prefer regions whose name is closest (us-east1 is near us-east4).
    order = sorted(by_region, key=lambda r: (r.split("-")[0] != area, -difflib.SequenceMatcher(None, r, region).ratio(), r))
    return [(r, by_region[r]) for r in order[:n]]
