"""Is this stack a VM that Compute Engine will create? Pure rules of (config, catalog).

Every rule returns Problems naming the setting, its value and a fix (the nearest valid count, the
smallest machine type that fits, zones that have the GPU), so a user sees all of them at once,
before anything is created or billed. No I/O happens here.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, replace
from typing import Any

from gpu_train import disks, gpunames, images, names, values
from gpu_train.catalog import AI_ZONE_PATTERN, ZONE_PATTERN, Catalog, FixedShape, MachineShape
from gpu_train.config import NAMESPACE, ConfigError, Problem, StackConfig, parse_partial, parse_shape, shown
from gpu_train.pools import check_pools

ZONE_RE = re.compile(ZONE_PATTERN)
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced",
              "hyperdisk-extreme", "hyperdisk-throughput")  # fmt: skip
RESERVED_LABELS = ("gpu-train-stack", "gpu-train-project", "gpu-train-node")
MIN_DISK_GB, MAX_DISK_GB = 10, 65536


@dataclass(frozen=True)
class GpuShape:
    """The VM a valid stack describes: its machine type and the GPUs it has."""

    machine_type: str
    vcpus: int | None
    memory_gb: float | None
    gpu_type: str
    gpu_count: int
    attached: bool  # True: N1 with guestAccelerators; False: GPUs come with the machine type


def shape_of(cfg: StackConfig, catalog: Catalog) -> GpuShape:
    """The GPU shape of a stack that passed validation."""
    machine = catalog.parse_machine_type(cfg.machine_type)
    assert machine is not None, "validate the stack first"
    if machine.fixed is not None:
        f = machine.fixed
        return GpuShape(f.name, f.vcpus, f.memory_gb, f.gpu_type, f.gpu_count, attached=False)
    assert cfg.gpu_type and cfg.gpu_count
    return GpuShape(cfg.machine_type, machine.vcpus, machine.memory_gb, cfg.gpu_type, cfg.gpu_count, attached=True)


def node_shapes(cfg: StackConfig, catalog: Catalog) -> list[GpuShape]:
    """Each node's shape in node order: the stack's one shape ``nodes`` times, or each pool's
    (CPU-only parameter servers have ``gpu_count`` 0 and nothing attached)."""
    if not cfg.pools:
        return [shape_of(cfg, catalog)] * cfg.nodes
    out = []
    for pool in cfg.pools:
        machine = catalog.parse_machine_type(pool.machine_type)
        assert machine is not None, "validate the stack first"
        if machine.fixed is not None or pool.gpu_type:
            shape = shape_of(replace(cfg, machine_type=pool.machine_type, gpu_type=pool.gpu_type,
                                     gpu_count=pool.gpu_count, pools=()), catalog)
        else:
            shape = GpuShape(pool.machine_type, machine.vcpus, machine.memory_gb, "", 0, attached=False)
        out += [shape] * pool.count
    return out


def check(raw: dict[str, Any], stack: str, catalog: Catalog) -> tuple[StackConfig, list[Problem]]:
    """Parse and validate a stack's raw settings: the config and its warnings, or ConfigError.

    Settings that failed to parse are left out of the GPU rules (their own problem says why),
    so every problem is reported in one go.
    """
    cfg, problems = parse_partial(raw, stack)
    bad = {p.key for p in problems}
    problems += [p for p in validate(cfg, catalog) if p.key not in bad]
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigError(errors, stack)
    return cfg, problems


def validate(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Every problem with the stack, errors and warnings, in the order of the settings."""
    if not cfg.is_gcp:
        return _lifecycle(cfg) + values.check(cfg)
    problems = _zone(cfg)
    if cfg.pools:  # each pool its own shape, checked by the same rules as a stack's one shape
        problems += check_pools(cfg, catalog, lambda c, cat: _shape(c, cat, zone_ok=not problems))
    else:
        problems += _shape(cfg, catalog, zone_ok=not problems)
    problems += _disk(cfg, catalog) + _data_disk(cfg, catalog) + images.check(cfg, catalog) + _ssh(cfg)
    problems += _labels(cfg) + _lifecycle(cfg)
    problems += _nodes(cfg, catalog) + _quota_request(cfg) + _fallbacks(cfg, catalog) + values.check(cfg)
    problems += names.check(cfg.stack, cfg.nodes)
    return problems


def _shape(cfg: StackConfig, catalog: Catalog, zone_ok: bool) -> list[Problem]:
    """The machine type and GPUs of one shape, and whether the zone offers them."""
    shape_problems, machine = _machine_and_gpus(cfg, catalog)
    gpu_type = _offered_gpu(cfg, catalog, machine)
    if gpu_type is not None and zone_ok:  # a valid zone and a known GPU: is it offered there?
        shape_problems += _availability(cfg, catalog, machine, gpu_type)
    return shape_problems


# -- zone -------------------------------------------------------------------------------------
def _zone(cfg: StackConfig) -> list[Problem]:
    if ZONE_RE.fullmatch(cfg.zone):
        return []
    return [Problem("zone", "is not a zone name", "use a zone such as us-central1-a (region + '-' + letter) or an AI "
                    "zone such as us-central1-ai1", cfg.zone)]


# -- machine type and GPUs --------------------------------------------------------------------
def _machine_and_gpus(cfg: StackConfig, catalog: Catalog) -> tuple[list[Problem], MachineShape | None]:
    machine = catalog.parse_machine_type(cfg.machine_type)
    if machine is None:
        known = [s.name for s in catalog.n1_types()] + list(catalog.fixed_shapes)
        close = difflib.get_close_matches(cfg.machine_type, known, n=3, cutoff=0.6)
        fix = (f"did you mean {', '.join(close)}?" if close
               else "use an N1 type (n1-standard-8) or a GPU shape (g2-standard-8, a2-highgpu-1g)")
        return [Problem("machineType", "is not a machine type gpu-train knows", fix, cfg.machine_type)], None
    if machine.fixed is not None:
        return _fixed_shape(cfg, catalog, machine.fixed), machine
    if machine.series == "n1":
        return _n1(cfg, catalog, machine), machine
    return [_incompatible_series(cfg, catalog, machine)], None


def _gpu_type_problem(cfg: StackConfig, catalog: Catalog) -> Problem | None:
    if cfg.gpu_type in catalog.retired:
        return Problem("gpuType", catalog.retired[cfg.gpu_type], "choose a current GPU, e.g. nvidia-tesla-t4 or nvidia-l4", cfg.gpu_type)
    if catalog.accelerator(cfg.gpu_type) is None:
        return Problem("gpuType", "is not a GPU type", gpunames.describe_unknown(cfg.gpu_type, catalog), cfg.gpu_type)
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
    if shape.obtain:
        if "spot" not in shape.obtain:
            problems.append(Problem("machineType", f"can only be had with {' or '.join(shape.obtain)}, which gpu-train does not declare",
                                    "choose another shape, e.g. a3-highgpu-8g or a4-highgpu-8g with spot: true", shape.name))
        elif not cfg.spot:
            problems.append(Problem("spot", f"{shape.name} can only be had as {', '.join(shape.obtain)}, not on demand",
                                    f"set {NAMESPACE}:spot true", cfg.spot))
    return problems


def _nearest(value: int, allowed: list[int]) -> int:
    return min(allowed, key=lambda a: (abs(a - value), -a))


def _n1(cfg: StackConfig, catalog: Catalog, machine: MachineShape) -> list[Problem]:
    n1_gpus = [a.name for a in catalog.accelerators.values() if a.attachable_to_n1]
    problems = []
    if cfg.gpu_type is None:
        problems.append(Problem("gpuType", f"is required with an N1 machine type ({cfg.machine_type})",
                                f"set gpuType to one of {', '.join(n1_gpus)}, or use a GPU shape such as g2-standard-8"))
    elif (p := _gpu_type_problem(cfg, catalog)) is not None:
        problems.append(p)
    elif not catalog.accelerator(cfg.gpu_type).attachable_to_n1:
        problems.append(_not_attachable(cfg, catalog))
    if cfg.gpu_count is None:
        allowed = _allowed_counts(cfg, catalog)
        hint = f" ({', '.join(map(str, allowed))} for {cfg.gpu_type})" if allowed else ""
        problems.append(Problem("gpuCount", "is required with an N1 machine type", f"set gpuCount{hint}"))
    if problems:
        return problems

    limits = {lim.count: lim for lim in catalog.n1_limits[catalog.accelerator(cfg.gpu_type).name]}
    if cfg.gpu_count not in limits:
        allowed = sorted(limits)
        return [Problem("gpuCount", f"{cfg.gpu_type} attaches to N1 in counts of {', '.join(map(str, allowed))} only",
                        f"nearest valid count: {_nearest(cfg.gpu_count, allowed)}", cfg.gpu_count)]
    max_vcpus, max_mem = limits[cfg.gpu_count].ceilings(cfg.zone)
    if machine.vcpus > max_vcpus or machine.memory_gb > max_mem:
        fits = [t for t in catalog.n1_types() if t.vcpus <= max_vcpus and t.memory_gb <= max_mem]
        largest = max(fits, key=lambda t: (t.vcpus, t.memory_gb)).name if fits else None
        more = [c for c, lim in sorted(limits.items()) if machine.vcpus <= lim.ceilings(cfg.zone)[0]
                and machine.memory_gb <= lim.ceilings(cfg.zone)[1]]
        fix = f"with {cfg.gpu_count} x {cfg.gpu_type} use at most {max_vcpus} vCPUs and {max_mem:g} GB"
        if largest:
            fix += f", e.g. machineType {largest}"
        if more:
            fix += f"; or keep {cfg.machine_type} with gpuCount {more[0]}"
        return [Problem("machineType", f"has {machine.vcpus} vCPUs and {machine.memory_gb:g} GB, over the ceiling of "
                        f"{max_vcpus} vCPUs and {max_mem:g} GB for {cfg.gpu_count} x {cfg.gpu_type}", fix, cfg.machine_type)]
    return []


def _allowed_counts(cfg: StackConfig, catalog: Catalog) -> list[int]:
    acc = catalog.accelerator(cfg.gpu_type or "")
    return [lim.count for lim in catalog.n1_limits.get(acc.name, ())] if acc else []


def _smallest_shape(catalog: Catalog, gpu_type: str, count: int | None) -> FixedShape | None:
    shapes = catalog.shapes_with(gpu_type)
    exact = [s for s in shapes if count is None or s.gpu_count == count]
    enough = [s for s in shapes if count is not None and s.gpu_count >= count]
    return (exact or enough or shapes or [None])[0]


def _not_attachable(cfg: StackConfig, catalog: Catalog) -> Problem:
    acc = catalog.accelerator(cfg.gpu_type)
    shape = _smallest_shape(catalog, cfg.gpu_type, cfg.gpu_count)
    fix = (f"set machineType {shape.name} ({shape.gpu_count} x {shape.gpu_type}, {shape.vcpus} vCPUs) "
           "and remove gpuType/gpuCount" if shape else "choose an N1 GPU such as nvidia-tesla-t4")
    return Problem("gpuType", f"{acc.gpu} is not attached to N1 VMs: it comes with {acc.series} machine types", fix, cfg.gpu_type)


def _incompatible_series(cfg: StackConfig, catalog: Catalog, machine: MachineShape) -> Problem:
    """E2, N2, C2, ... take no GPUs; Compute Engine would answer 'features are not compatible'."""
    acc = catalog.accelerator(cfg.gpu_type or "")
    if acc is not None and acc.attachable_to_n1:
        limits = catalog.n1_limits[acc.name]
        for_count = [lim for lim in limits if lim.count == cfg.gpu_count] or limits
        ceiling = max(lim.max_vcpus for lim in for_count)
        fits = [t for t in catalog.n1_types() if t.name.startswith("n1-standard") and t.vcpus <= ceiling]
        want = machine.vcpus or 8
        pick = next((t for t in fits if t.vcpus >= want), fits[-1])
        fix = f"use an N1 type with {acc.gpu}, e.g. machineType {pick.name}"
    elif acc is not None:
        shape = _smallest_shape(catalog, acc.name, cfg.gpu_count)
        fix = f"use machineType {shape.name}, which comes with {acc.gpu}" if shape else "use a GPU machine type"
    else:
        fix = "use an N1 type with gpuType/gpuCount (n1-standard-8 + nvidia-tesla-t4), or a GPU shape (g2-standard-8)"
    return Problem("machineType", f"the {machine.series.upper()} series takes no GPUs "
                   f"(Compute Engine: '[{cfg.machine_type}, {cfg.gpu_type or 'GPU'}] features are not compatible')",
                   fix, cfg.machine_type)


# -- where the GPU is offered -----------------------------------------------------------------
def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _offered_gpu(cfg: StackConfig, catalog: Catalog, machine: MachineShape | None) -> str | None:
    """The GPU type whose zones apply, when the machine and GPU are known well enough to ask."""
    if machine is None:
        return None
    if machine.fixed is not None:
        return machine.fixed.gpu_type
    acc = catalog.accelerator(cfg.gpu_type or "")
    return acc.name if acc is not None and acc.attachable_to_n1 else None


def _availability(cfg: StackConfig, catalog: Catalog, machine: MachineShape, gpu_type: str) -> list[Problem]:
    zones = catalog.zones_for(gpu_type, machine)
    if cfg.zone in zones or not zones:  # no zones in the catalog: nothing to check against
        return []
    acc = catalog.accelerator(gpu_type)
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
    msg = f"{what} is not offered in this zone (catalog snapshot of {catalog.dates['zones']}"
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
    order = sorted(by_region, key=lambda r: (r.split("-")[0] != area,
                                             -difflib.SequenceMatcher(None, r, region).ratio(), r))
    return [(r, by_region[r]) for r in order[:n]]


# -- disk -------------------------------------------------------------------------------------
def _disk(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    problems = []
    if not MIN_DISK_GB <= cfg.boot_disk_size_gb <= MAX_DISK_GB:
        problems.append(Problem("bootDiskSizeGb", f"must be between {MIN_DISK_GB} and {MAX_DISK_GB}",
                                "Deep Learning VM images need about 50 GB or more; 200 is the default", cfg.boot_disk_size_gb))
    if cfg.boot_disk_type not in DISK_TYPES:
        close = difflib.get_close_matches(cfg.boot_disk_type, DISK_TYPES, n=1)
        fix = f"did you mean {close[0]}?" if close else f"one of {', '.join(DISK_TYPES)}"
        problems.append(Problem("bootDiskType", "is not a disk type", fix, cfg.boot_disk_type))
    elif (why := disks.disk_type_problem(catalog, cfg.machine_type, cfg.boot_disk_type)) is not None:
        problems.append(Problem("bootDiskType", why, f"remove bootDiskType (the default for {cfg.machine_type} is "
                                f"{disks.default_disk_type(catalog, cfg.machine_type)}) or set one of those", cfg.boot_disk_type))
    return problems


def _data_disk(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Each node's data disk: its size, and a given type every node's series takes as a data disk."""
    problems = []
    if not MIN_DISK_GB <= cfg.data_disk_size_gb <= MAX_DISK_GB:
        problems.append(Problem("dataDiskSizeGb", f"must be between {MIN_DISK_GB} and {MAX_DISK_GB}",
                                "room for your runs' checkpoints; 100 is the default", cfg.data_disk_size_gb))
    kind = cfg.data_disk_type
    if kind is None:
        return problems
    if kind not in DISK_TYPES:
        close = difflib.get_close_matches(kind, DISK_TYPES, n=1)
        fix = f"did you mean {close[0]}?" if close else f"one of {', '.join(DISK_TYPES)}"
        return [*problems, Problem("dataDiskType", "is not a disk type", fix, kind)]
    for machine in dict.fromkeys([p.machine_type for p in cfg.pools] or [cfg.machine_type]):
        if (why := disks.disk_type_problem(catalog, machine, kind, disks.DATA)) is not None:
            problems.append(Problem("dataDiskType", why, f"remove dataDiskType (the default for {machine} is "
                                    f"{disks.default_disk_type(catalog, machine)}) or set one of those", kind))
    return problems


# -- lifecycle: idle stop, run-time cap, resumes ----------------------------------------------
MAX_RUN_HOURS = 120 * 24  # Compute Engine caps maxRunDuration at 120 days


def _lifecycle(cfg: StackConfig) -> list[Problem]:
    problems = []
    if cfg.idle_stop_minutes < 0:
        problems.append(Problem("idleStopMinutes", "must be 0 (off) or more", "e.g. 30", cfg.idle_stop_minutes))
    if cfg.max_run_hours is not None and not 1 <= cfg.max_run_hours <= MAX_RUN_HOURS:
        problems.append(Problem("maxRunHours", f"must be between 1 and {MAX_RUN_HOURS}",
                                "e.g. 24, or remove it for no cap", cfg.max_run_hours))
    if cfg.max_resumes < 0:
        problems.append(Problem("maxResumes", "must be 0 (never resume) or more", "e.g. 10", cfg.max_resumes))
    return problems


# -- several nodes ----------------------------------------------------------------------------
def _nodes(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    if cfg.nodes < 1:
        return [Problem("nodes", "must be 1 or more", "1 for one VM; 2 or more for multi-node training", cfg.nodes)]
    if cfg.nodes == 1:
        return []
    machine_types = [p.machine_type for p in cfg.pools] or [cfg.machine_type]
    outside = sorted({catalog.series_of(m) for m in machine_types} - catalog.compact_series)
    limit = catalog.max_vms_per_compact_policy
    if outside:
        series = "/".join(outside)
        return [Problem("pools" if cfg.pools else "nodes", f"{series} takes no compact placement policy: the "
                        f"{cfg.nodes} nodes will be placed "
                        "anywhere in the zone, with more latency between them",
                        f"for tight coupling use a series that supports it ({', '.join(sorted(catalog.compact_series))})",
                        cfg.nodes, "warning")]
    if cfg.nodes > limit:
        return [Problem("nodes", f"a compact placement policy holds at most {limit} VMs",
                        f"use at most {limit} nodes", cfg.nodes)]
    return []


# -- quota requests and fallback shapes ---------------------------------------------------------
def _quota_request(cfg: StackConfig) -> list[Problem]:
    q = cfg.quota_request
    if not q:
        return []
    problems = []
    unknown = sorted(set(q) - {"gpus", "justification", "contactEmail"})
    if unknown:
        problems.append(Problem("quotaRequest", f"unknown field(s) {', '.join(unknown)}",
                                "use gpus, justification and contactEmail", q))
    if not q.get("gpus", "").isdigit() or int(q["gpus"]) < 1:
        problems.append(Problem("quotaRequest", "needs gpus: a whole number of GPUs, 1 or more",
                                "e.g. {gpus: 8, justification: ..., contactEmail: you@example.com}", q))
    if not q.get("justification"):
        problems.append(Problem("quotaRequest", "needs a justification (Google reads it)", "say what you will train", q))
    if "@" not in q.get("contactEmail", ""):
        problems.append(Problem("quotaRequest", "needs contactEmail: an address Google can write to", "e.g. you@example.com", q))
    return problems


def _fallbacks(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Each fallback shape must itself be valid (its own machine, GPUs and spot rules)."""
    problems = []
    for text in cfg.fallback_shapes:
        try:
            machine, gpu, count = parse_shape(text)
        except ValueError:
            problems.append(Problem("fallbackShapes", f"{shown(text)}: the count must be a whole number",
                                    "write MACHINE or MACHINE/GPU/COUNT, e.g. n1-standard-8/nvidia-tesla-v100/1"))
            continue
        trial = replace(cfg, machine_type=machine, gpu_type=gpu, gpu_count=count,
                        given=cfg.given - {"gpuType", "gpuCount"} | ({"gpuType", "gpuCount"} if gpu else set()),
                        fallback_shapes=())
        shape_problems, _ = _machine_and_gpus(trial, catalog)
        if "bootDiskType" in cfg.given and (why := disks.disk_type_problem(catalog, machine, cfg.boot_disk_type)):
            shape_problems.append(Problem("bootDiskType", why, "remove bootDiskType so each shape gets its series' own type"))
        for p in shape_problems:
            problems.append(Problem("fallbackShapes", f"{shown(text)}: {p.message}", p.fix))
    return problems


# -- SSH and labels ---------------------------------------------------------------------------
def _ssh(cfg: StackConfig) -> list[Problem]:
    problems = []
    if not USER_RE.fullmatch(cfg.ssh_user) or cfg.ssh_user == "root":
        problems.append(Problem("sshUser", "must be a Linux user name other than root (lower case, digits, _ or -)",
                                "e.g. trainer", cfg.ssh_user))
    if not cfg.ssh_source_ranges:
        problems.append(Problem("sshSourceRanges", "lists no range",
                                "add your address as a /32, e.g. [\"203.0.113.7/32\"] (curl -s ifconfig.me)"))
    for text in cfg.ssh_source_ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            problems.append(Problem("sshSourceRanges", f"{shown(text)} is not a CIDR range",
                                    "write an address with its prefix length, e.g. 203.0.113.7/32", list(cfg.ssh_source_ranges)))
            continue
        if str(net) != text and "/" in text:
            problems.append(Problem("sshSourceRanges", f"{shown(text)} has host bits set",
                                    f"write the network address: {net}", list(cfg.ssh_source_ranges)))
        elif "/" not in text:
            problems.append(Problem("sshSourceRanges", f"{shown(text)} has no prefix length",
                                    f"write {net}", list(cfg.ssh_source_ranges)))
        if net.prefixlen == 0 and not cfg.allow_ssh_from_anywhere:
            problems.append(Problem("sshSourceRanges", f"{text} opens SSH to the whole internet",
                                    "list only your own addresses, or set allowSshFromAnywhere: true if you mean it",
                                    list(cfg.ssh_source_ranges)))
    return problems


def _labels(cfg: StackConfig) -> list[Problem]:
    problems = []
    if len(cfg.labels) > 64 - len(RESERVED_LABELS):
        problems.append(Problem("labels", f"has too many labels (Compute Engine allows 64, gpu-train sets "
                                          f"{len(RESERVED_LABELS)})", "remove some"))
    for k, v in cfg.labels.items():
        if k in RESERVED_LABELS:
            problems.append(Problem("labels", f"{shown(k)} is set by gpu-train itself", f"remove {k}", cfg.labels))
        elif not LABEL_KEY_RE.fullmatch(k):
            problems.append(Problem("labels", f"key {shown(k)} is not a valid label key",
                                    "start with a lower-case letter; lower case, digits, _ and - only; at most 63", cfg.labels))
        if not LABEL_VALUE_RE.fullmatch(v):
            problems.append(Problem("labels", f"value {shown(v)} of {shown(k)} is not a valid label value",
                                    "lower case, digits, _ and - only; at most 63", cfg.labels))
    return problems
