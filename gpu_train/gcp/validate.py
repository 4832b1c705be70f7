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

from gpu_train import recovery
from gpu_train.catalog import disks
from gpu_train.catalog.model import ZONE_PATTERN, Catalog
from gpu_train.gcp import images, names, provisioning
from gpu_train.gcp.shape_rules import availability, machine_and_gpus, offered_gpu
from gpu_train.stack import placeholders, values
from gpu_train.stack.check import checked, lifecycle, ssh_rules
from gpu_train.stack.config import parse_shape
from gpu_train.stack.pools import check_pools
from gpu_train.stack.problems import Problem, shown
from gpu_train.stack.settings import StackConfig

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
            shape = shape_of(
                replace(cfg, machine_type=pool.machine_type, gpu_type=pool.gpu_type, gpu_count=pool.gpu_count, pools=()), catalog
            )
        else:
            shape = GpuShape(pool.machine_type, machine.vcpus, machine.memory_gb, "", 0, attached=False)
        out += [shape] * pool.count
    return out


def check(raw: dict[str, Any], stack: str, catalog: Catalog) -> tuple[StackConfig, list[Problem]]:
    """Parse and validate a stack's raw settings: the config and its warnings, or ConfigError.

    Settings that failed to parse are left out of the GPU rules (their own problem says why),
    so every problem is reported in one go.
    """
    return checked(raw, stack, catalog, lambda cfg: validate(cfg, catalog))


def validate(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Every problem with the stack, errors and warnings, in the order of the settings."""
    if not cfg.is_gcp:
        return ssh_rules(cfg)
    problems = _zone(cfg)
    if cfg.pools:  # each pool its own shape, checked by the same rules as a stack's one shape
        problems += check_pools(cfg, catalog, lambda c, cat: _shape(c, cat, zone_ok=not problems))
    else:
        problems += _shape(cfg, catalog, zone_ok=not problems)
    problems += _disk(cfg, catalog) + _data_disk(cfg, catalog) + images.check(cfg, catalog) + _ssh(cfg)
    problems += _labels(cfg) + lifecycle(cfg) + _recovery(cfg) + provisioning.check(cfg, catalog)
    problems += _nodes(cfg, catalog) + _quota_request(cfg) + _fallbacks(cfg, catalog) + values.check(cfg)
    problems += names.check(cfg.stack, cfg.nodes)
    problems += placeholders.check(cfg.project, cfg.ssh_source_ranges)
    return problems


def _shape(cfg: StackConfig, catalog: Catalog, zone_ok: bool) -> list[Problem]:
    """The machine type and GPUs of one shape, and whether the zone offers them."""
    shape_problems, machine = machine_and_gpus(cfg, catalog)
    gpu_type = offered_gpu(cfg, catalog, machine)
    if machine is not None and gpu_type is not None and zone_ok:  # a known GPU in a valid zone: offered there?
        shape_problems += availability(cfg, catalog, machine, gpu_type)
    return shape_problems


# -- zone -------------------------------------------------------------------------------------
def _zone(cfg: StackConfig) -> list[Problem]:
    if ZONE_RE.fullmatch(cfg.zone):
        return []
    return [
        Problem(
            "zone",
            "is not a zone name",
            "use a zone such as us-central1-a (region + '-' + letter) or an AI zone such as us-central1-ai1",
            cfg.zone,
        )
    ]


# -- disk -------------------------------------------------------------------------------------
def _disk(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    problems = []
    if not MIN_DISK_GB <= cfg.boot_disk_size_gb <= MAX_DISK_GB:
        problems.append(
            Problem(
                "bootDiskSizeGb",
                f"must be between {MIN_DISK_GB} and {MAX_DISK_GB}",
                "Deep Learning VM images need about 50 GB or more; 200 is the default",
                cfg.boot_disk_size_gb,
            )
        )
    if cfg.boot_disk_type not in DISK_TYPES:
        close = difflib.get_close_matches(cfg.boot_disk_type, DISK_TYPES, n=1)
        fix = f"did you mean {close[0]}?" if close else f"one of {', '.join(DISK_TYPES)}"
        problems.append(Problem("bootDiskType", "is not a disk type", fix, cfg.boot_disk_type))
    elif (why := disks.disk_type_problem(catalog, cfg.machine_type, cfg.boot_disk_type)) is not None:
        problems.append(
            Problem(
                "bootDiskType",
                why,
                f"remove bootDiskType (the default for {cfg.machine_type} is "
                f"{disks.default_disk_type(catalog, cfg.machine_type)}) or set one of those",
                cfg.boot_disk_type,
            )
        )
    return problems


def _data_disk(cfg: StackConfig, catalog: Catalog) -> list[Problem]:
    """Each node's data disk: its size, and a given type every node's series takes as a data disk."""
    problems = []
    if not MIN_DISK_GB <= cfg.data_disk_size_gb <= MAX_DISK_GB:
        problems.append(
            Problem(
                "dataDiskSizeGb",
                f"must be between {MIN_DISK_GB} and {MAX_DISK_GB}",
                "room for your runs' checkpoints; 100 is the default",
                cfg.data_disk_size_gb,
            )
        )
    kind = cfg.data_disk_type
    if kind is None:
        return problems
    if kind not in DISK_TYPES:
        close = difflib.get_close_matches(kind, DISK_TYPES, n=1)
        fix = f"did you mean {close[0]}?" if close else f"one of {', '.join(DISK_TYPES)}"
        return [*problems, Problem("dataDiskType", "is not a disk type", fix, kind)]
    for machine in dict.fromkeys([p.machine_type for p in cfg.pools] or [cfg.machine_type]):
        if (why := disks.disk_type_problem(catalog, machine, kind, disks.DATA)) is not None:
            problems.append(
                Problem(
                    "dataDiskType",
                    why,
                    f"remove dataDiskType (the default for {machine} is {disks.default_disk_type(catalog, machine)}) or set one of those",
                    kind,
                )
            )
    return problems


# -- lifecycle: the recovery of a preempted VM (idle stop, resumes: every target's, stack/check.py) ---
MAX_RECOVER_HOURS = recovery.MAX_RECOVER_HOURS  # Cloud Run functions retry an event for 24 h (7 days was 1st gen)


def _recovery(cfg: StackConfig) -> list[Problem]:
    problems = []
    if not 0 <= cfg.recover_hours <= MAX_RECOVER_HOURS:
        problems.append(
            Problem(
                "recoverHours",
                f"must be between 0 (no recovery) and {MAX_RECOVER_HOURS:g}: Cloud Run functions retry an event for 24 hours "
                "at most, and the recovery gives up within that window (20 minutes before its end)",
                "e.g. 24",
                cfg.recover_hours,
            )
        )
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
        return [
            Problem(
                "pools" if cfg.pools else "nodes",
                f"{series} takes no compact placement policy: the "
                f"{cfg.nodes} nodes will be placed "
                "anywhere in the zone, with more latency between them",
                f"for tight coupling use a series that supports it ({', '.join(sorted(catalog.compact_series))})",
                cfg.nodes,
                "warning",
            )
        ]
    if cfg.nodes > limit:
        return [Problem("nodes", f"a compact placement policy holds at most {limit} VMs", f"use at most {limit} nodes", cfg.nodes)]
    return []


# -- quota requests and fallback shapes ---------------------------------------------------------
def _quota_request(cfg: StackConfig) -> list[Problem]:
    q = cfg.quota_request
    if not q:
        return []
    problems = []
    unknown = sorted(set(q) - {"gpus", "justification", "contactEmail"})
    if unknown:
        problems.append(Problem("quotaRequest", f"unknown field(s) {', '.join(unknown)}", "use gpus, justification and contactEmail", q))
    if not q.get("gpus", "").isdigit() or int(q["gpus"]) < 1:
        problems.append(
            Problem(
                "quotaRequest",
                "needs gpus: a whole number of GPUs, 1 or more",
                "e.g. {gpus: 8, justification: ..., contactEmail: you@example.com}",
                q,
            )
        )
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
            problems.append(
                Problem(
                    "fallbackShapes",
                    f"{shown(text)}: the count must be a whole number",
                    "write MACHINE or MACHINE/GPU/COUNT, e.g. n1-standard-8/nvidia-tesla-v100/1",
                )
            )
            continue
        trial = replace(
            cfg,
            machine_type=machine,
            gpu_type=gpu,
            gpu_count=count,
            given=cfg.given - {"gpuType", "gpuCount"} | ({"gpuType", "gpuCount"} if gpu else set()),
            fallback_shapes=(),
        )
        shape_problems, _ = machine_and_gpus(trial, catalog)
        if "bootDiskType" in cfg.given and (why := disks.disk_type_problem(catalog, machine, cfg.boot_disk_type)):
            shape_problems.append(Problem("bootDiskType", why, "remove bootDiskType so each shape gets its series' own type"))
        for p in shape_problems:
            if p.severity == "error":  # (a deprecated GPU is warned about where the stack names it)
                problems.append(Problem("fallbackShapes", f"{shown(text)}: {p.message}", p.fix))
    return problems


# -- SSH and labels ---------------------------------------------------------------------------
def _ssh(cfg: StackConfig) -> list[Problem]:
    problems = []
    if not USER_RE.fullmatch(cfg.ssh_user) or cfg.ssh_user == "root":
        problems.append(
            Problem("sshUser", "must be a Linux user name other than root (lower case, digits, _ or -)", "e.g. trainer", cfg.ssh_user)
        )
    if not cfg.ssh_source_ranges:
        problems.append(
            Problem("sshSourceRanges", "lists no range", 'add your address as a /32, e.g. ["203.0.113.7/32"] (curl -s ifconfig.me)')
        )
    for text in cfg.ssh_source_ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            problems.append(
                Problem(
                    "sshSourceRanges",
                    f"{shown(text)} is not a CIDR range",
                    "write an address with its prefix length, e.g. 203.0.113.7/32",
                    list(cfg.ssh_source_ranges),
                )
            )
            continue
        if str(net) != text and "/" in text:
            problems.append(
                Problem(
                    "sshSourceRanges", f"{shown(text)} has host bits set", f"write the network address: {net}", list(cfg.ssh_source_ranges)
                )
            )
        elif "/" not in text:
            problems.append(Problem("sshSourceRanges", f"{shown(text)} has no prefix length", f"write {net}", list(cfg.ssh_source_ranges)))
        if net.prefixlen == 0 and not cfg.allow_ssh_from_anywhere:
            problems.append(
                Problem(
                    "sshSourceRanges",
                    f"{text} opens SSH to the whole internet",
                    "list only your own addresses, or set allowSshFromAnywhere: true if you mean it",
                    list(cfg.ssh_source_ranges),
                )
            )
    return problems


def _labels(cfg: StackConfig) -> list[Problem]:
    problems = []
    if len(cfg.labels) > 64 - len(RESERVED_LABELS):
        problems.append(
            Problem("labels", f"has too many labels (Compute Engine allows 64, gpu-train sets {len(RESERVED_LABELS)})", "remove some")
        )
    for k, v in cfg.labels.items():
        if k in RESERVED_LABELS:
            problems.append(Problem("labels", f"{shown(k)} is set by gpu-train itself", f"remove {k}", cfg.labels))
        elif not LABEL_KEY_RE.fullmatch(k):
            problems.append(
                Problem(
                    "labels",
                    f"key {shown(k)} is not a valid label key",
                    "start with a lower-case letter; lower case, digits, _ and - only; at most 63",
                    cfg.labels,
                )
            )
        if not LABEL_VALUE_RE.fullmatch(v):
            problems.append(
                Problem(
                    "labels",
                    f"value {shown(v)} of {shown(k)} is not a valid label value",
                    "lower case, digits, _ and - only; at most 63",
                    cfg.labels,
                )
            )
    return problems
