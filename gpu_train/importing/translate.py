"""Turn a :class:`~gpu_train.importing.importer.JobDescription` into a gpu-train stack and the train command.

Pure decisions, tested by tables: which Compute Engine shape each replica pool becomes, which zone
offers every shape of the job (one zone for the whole cluster, as AI Platform required), whether
the nodes share one shape (``nodes``) or need ``pools``; the ``train`` command that runs the same
module with the same arguments comes from command.py. Every choice that differs from the job is a note
with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpu_train.catalog.model import FLEX_START, ON_DEMAND, SPOT, Catalog
from gpu_train.gcp.shape_rules import nearest_regions
from gpu_train.importing.command import job_env, pool_jobs, train_command
from gpu_train.importing.importer import CHANGED, EXACT, NOT_MAPPED, JobDescription, JobImportError, Note, Replica, Tables, together

NAMESPACE = "gpu-train"
DEFAULT_REGION = "us-central1"


@dataclass(frozen=True)
class Shape:
    """A replica pool on Compute Engine: machine type and, for N1, the attached GPUs."""

    role: str
    count: int
    machine_type: str
    gpu_type: str | None  # the GPU the VM carries (implied by fixed shapes); None: CPU only
    gpu_count: int | None
    fixed: bool  # the machine type carries its GPUs

    def setting(self) -> dict[str, Any]:
        """How the stack declares this shape (fixed shapes: the machine type alone)."""
        out: dict[str, Any] = {"machineType": self.machine_type}
        if not self.fixed and self.gpu_type:
            out.update(gpuType=self.gpu_type, gpuCount=self.gpu_count)
        return out


@dataclass
class Translation:
    """The stack's settings, the train command, and the report."""

    stack: str
    settings: dict[str, Any]
    train: list[str]
    notes: list[Note] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the job's environment: the caller writes it to env_file (0600)
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # pools with jobs of their own: to pools_file (0600)


def accelerator_type(name: str, catalog: Catalog, tables: Tables) -> str:
    """An AI Platform/Vertex enum (NVIDIA_TESLA_T4) or an API name (nvidia-tesla-t4), as the API name."""
    known: dict[str, str] = tables["accelerators"]["types"]
    if name in known:
        return known[name]
    if name.upper().startswith("TPU"):
        raise JobImportError(f"accelerator {name}: a Cloud TPU; gpu-train runs GPU VMs only")
    if catalog.accelerator(name) is not None or name in catalog.retired:
        return name
    raise JobImportError(
        f"accelerator {name!r} is not a GPU gpu-train knows: use one of {', '.join(sorted(known))} or an API name such as nvidia-tesla-t4"
    )


def _retired(gpu: str, count: int, catalog: Catalog, where: str, notes: list[Note]) -> tuple[str, int]:
    """A retired GPU's nearest current one (the catalog's ``retired`` table), at the nearest count it
    attaches in (not above)."""
    gone = catalog.retired.get(gpu)
    if gone is None:
        return gpu, count
    new = gone.replacement
    allowed = sorted(lim.count for lim in catalog.n1_limits.get(new, ()))
    fits = [c for c in allowed if c <= count] or allowed[:1]
    new_count = fits[-1]
    more = "" if new_count == count else f" (at most {new_count} per VM)"
    notes.append(
        Note(
            where, CHANGED, f"{count} x {gpu} -> {new_count} x {new}{more}: {gone.gpu_name()} {gone.note}; {new} is the nearest current GPU"
        )
    )
    return new, new_count


def resolve(replica: Replica, catalog: Catalog, tables: Tables, notes: list[Note]) -> Shape:
    """One replica pool's Compute Engine shape."""
    where = f"{replica.source or replica.role} ({replica.role})"
    legacy = tables["legacyMachineTypes"]
    machine, gpu, count = replica.machine_type, None, None
    if machine in legacy["notTranslated"]:
        raise JobImportError(f"{replica.source} = {machine}: {legacy['notTranslated'][machine]}")
    if machine in legacy["types"]:
        row = legacy["types"][machine]
        machine, gpu, count = row["machineType"], row.get("gpuType"), row.get("gpuCount")
        gpus = f" + {count} x {gpu}" if gpu else ""
        notes.append(Note(where, EXACT, f"legacy {replica.machine_type} = {machine}{gpus}"))
        if replica.accelerator:
            notes.append(
                Note(
                    where,
                    CHANGED,
                    f"acceleratorConfig {replica.accelerator} ignored: {replica.machine_type} "
                    "comes with its own GPUs (AI Platform refused both too)",
                )
            )
    elif replica.accelerator:
        gpu, count = accelerator_type(replica.accelerator, catalog, tables), int(replica.accelerator_count or 1)
    shape = catalog.parse_machine_type(machine)
    if shape is None:
        raise JobImportError(
            f"{replica.source} = {replica.machine_type!r} is neither a Compute Engine machine type "
            "nor a legacy AI Platform type (standard_gpu, complex_model_m_p100, ...)"
        )
    if shape.fixed is not None:
        f = shape.fixed
        if gpu and (gpu != f.gpu_type or count != f.gpu_count):
            notes.append(
                Note(
                    where,
                    CHANGED,
                    f"{machine} carries {f.gpu_count} x {f.gpu_type}; the job's {count} x {gpu} is replaced by what the shape has",
                )
            )
        elif gpu:
            notes.append(Note(where, EXACT, f"{machine} with its {f.gpu_count} x {f.gpu_type}"))
        else:
            notes.append(Note(where, EXACT, f"{machine}"))
        return Shape(replica.role, replica.count, machine, f.gpu_type, f.gpu_count, fixed=True)
    if gpu:
        gpu, count = _retired(gpu, int(count or 1), catalog, where, notes)
        if not any(n.field == where for n in notes):
            notes.append(Note(where, EXACT, f"{machine} + {count} x {gpu}"))
    elif replica.role != "ps":
        gpu, count = "nvidia-tesla-t4", 1
        notes.append(
            Note(
                where,
                CHANGED,
                f"{machine} had no GPU; gpu-train's {replica.role} nodes carry one: added 1 x nvidia-tesla-t4 (the cheapest N1 GPU)",
            )
        )
    elif not any(n.field == where for n in notes):
        notes.append(Note(where, EXACT, f"{machine} (CPU only: a parameter server)"))
    return Shape(replica.role, replica.count, machine, gpu, count, fixed=False)


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def choose_zone(shapes: list[Shape], region: str | None, catalog: Catalog, notes: list[Note]) -> str:
    """One zone that offers every GPU shape of the job: in the job's region if one does, else nearby."""
    wanted = region or DEFAULT_REGION
    common: set[str] | None = None
    for s in shapes:
        if s.gpu_type is None:
            continue
        zones = set(catalog.zones_for(s.gpu_type, catalog.parse_machine_type(s.machine_type)))
        common = zones if common is None else common & zones
    if not common:
        if common is None:  # nothing needs a GPU zone (cannot happen: chief nodes carry GPUs)
            return f"{wanted}-a"
        raise JobImportError("no zone in the catalog offers every shape of this job together; use one GPU type for the whole cluster")
    in_region = sorted(z for z in common if _region_of(z) == wanted)
    if in_region:
        how = "the job's region" if region else f"no region given; {DEFAULT_REGION}, AI Platform's usual one"
        notes.append(
            Note(
                "region",
                EXACT if region else CHANGED,
                f"{wanted} -> zone {in_region[0]} ({how}; zones there with every shape: {', '.join(in_region)})",
            )
        )
        return in_region[0]
    nearby = nearest_regions(wanted, tuple(sorted(common)), n=1)
    zone = sorted(nearby[0][1])[0]
    notes.append(
        Note("region", CHANGED, f"no zone of {wanted} offers every shape of this job (catalog snapshot); the nearest that does: {zone}")
    )
    return zone


def _merge(shapes: list[Shape]) -> list[Shape]:
    """Neighbouring pools of the same role and shape become one (Vertex's chief overflow, for one)."""
    out: list[Shape] = []
    for s in shapes:
        if out and (out[-1].role, out[-1].machine_type, out[-1].gpu_type, out[-1].gpu_count) == (
            s.role,
            s.machine_type,
            s.gpu_type,
            s.gpu_count,
        ):
            last = out.pop()
            s = Shape(s.role, last.count + s.count, s.machine_type, s.gpu_type, s.gpu_count, s.fixed)
        out.append(s)
    return out


def _spot_only(machine_type: str, catalog: Catalog) -> bool:
    """A shape whose ways to be had (catalog.ways) include spot but not on demand."""
    ways = catalog.ways(machine_type)
    return SPOT in ways and ON_DEMAND not in ways


def _flex_start(job: JobDescription, shapes: list[Shape], catalog: Catalog, settings: dict[str, Any], notes: list[Note]) -> bool:
    """Vertex's FLEX_START as the stack's flexStart, where every shape takes it; its timeout as maxRunHours
    (Flex-start needs one: Vertex's default timeout, 7 days, where the job gives none; at most 7 days)."""
    cannot = sorted({s.machine_type for s in shapes if FLEX_START not in catalog.ways(s.machine_type)})
    if cannot:
        notes.append(
            Note(
                "scheduling.strategy",
                CHANGED,
                f"FLEX_START: {', '.join(cannot)} cannot be had as Flex-start on Compute Engine; the stack asks for the VM on demand",
            )
        )
        return False
    top = catalog.flex_start.max_run_hours
    hours = min(top, max(1, math.ceil((job.max_running_s or top * 3600) / 60) / 60))
    hours = int(hours) if float(hours).is_integer() else round(hours, 4)
    settings[f"{NAMESPACE}:flexStart"] = True
    settings[f"{NAMESPACE}:maxRunHours"] = hours
    notes.append(Note("scheduling.strategy", EXACT, "FLEX_START -> gpu-train:flexStart true"))
    exact = job.max_running_s is not None and round(hours * 3600) == job.max_running_s
    notes.append(
        Note(
            "scheduling.timeout",
            EXACT if exact else CHANGED,
            f"{job.max_running_s} s -> maxRunHours {hours}"
            if job.max_running_s
            else f"none -> maxRunHours {hours} (Vertex's default timeout; Flex-start needs one)",
        )
    )
    return True


def translate(
    job: JobDescription,
    stack: str,
    catalog: Catalog,
    tables: Tables,
    project: str | None = None,
    ssh_ranges: tuple[str, ...] = (),
    env_file: str | None = None,
    pools_file: str = "POOLS.yaml",
) -> Translation:
    """The stack settings and train command for a job (validation is the caller's next step).

    ``project`` and ``ssh_ranges`` are what no job description holds; without them the stack gets a
    placeholder project and no SSH ranges, and the report says to set them.
    """
    job.project = project or job.project
    notes = list(job.notes)
    if not job.replicas:
        raise JobImportError("the job declares no machines")
    resolved, wrong = [], []
    for replica in job.replicas:  # every pool's problem at once, not the first only
        try:
            resolved.append(resolve(replica, catalog, tables, notes))
        except JobImportError as e:
            wrong.append(str(e))
    if wrong:
        raise JobImportError(together(wrong))
    shapes = _merge(resolved)
    zone = choose_zone(shapes, job.region, catalog, notes)
    settings: dict[str, Any] = {"gcp:project": job.project or "YOUR_PROJECT"}
    if not job.project:
        notes.append(Note("gcp:project", NOT_MAPPED, "set your project: edit gcp:project in the stack file"))
    settings[f"{NAMESPACE}:zone"] = zone
    ps = sum(s.count for s in shapes if s.role == "ps")
    uniform = len({(s.machine_type, s.gpu_type, s.gpu_count) for s in shapes}) == 1
    if uniform:
        settings.update({f"{NAMESPACE}:{k}": v for k, v in shapes[0].setting().items()})
        total = sum(s.count for s in shapes)
        if total > 1:
            settings[f"{NAMESPACE}:nodes"] = total
        notes.append(
            Note(
                "cluster",
                EXACT,
                f"{total} node{'s' if total > 1 else ''} of one shape"
                + (f"; the last {ps} are TF parameter servers (--ps {ps})" if ps else ""),
            )
        )
    else:
        settings[f"{NAMESPACE}:pools"] = [{"role": s.role, **({"count": s.count} if s.count != 1 else {}), **s.setting()} for s in shapes]
        notes.append(
            Note(
                "cluster",
                EXACT,
                "pools of different shapes: "
                + ", ".join(
                    f"{s.count} x {s.role} {s.machine_type}" + (f" + {s.gpu_count} x {s.gpu_type}" if s.gpu_type and not s.fixed else "")
                    for s in shapes
                ),
            )
        )
    spot_only = [s.machine_type for s in shapes if _spot_only(s.machine_type, catalog)]
    flex = job.flex_start and _flex_start(job, shapes, catalog, settings, notes)
    if job.spot:
        settings[f"{NAMESPACE}:spot"] = True
    elif spot_only and not flex:
        settings[f"{NAMESPACE}:spot"] = True
        notes.append(
            Note(
                "spot",
                CHANGED,
                f"{', '.join(spot_only)} cannot be had on demand on Compute Engine (spot, "
                "flex-start or reservations only): the stack uses spot; the VM may be preempted, and "
                "gpu-train resumes the run from its last checkpoint",
            )
        )
    if job.max_running_s and not flex:
        minutes = math.ceil(job.max_running_s / 60)  # fractions of an hour are allowed: whole minutes
        hours = max(1, minutes // 60 if minutes % 60 == 0 else round(minutes / 60, 4))
        settings[f"{NAMESPACE}:maxRunHours"] = hours
        exact = round(hours * 3600) == job.max_running_s
        notes.append(
            Note(
                "maxRunningTime",
                EXACT if exact else CHANGED,
                f"{job.max_running_s} s -> maxRunHours {hours}"
                + ("" if exact else " (at least 1 hour, whole minutes)")
                + ": Compute Engine stops the VM "
                "then",
            )
        )
    if job.boot_disk_gb:
        settings[f"{NAMESPACE}:bootDiskSizeGb"] = job.boot_disk_gb
        notes.append(Note("diskSpec.bootDiskSizeGb", EXACT, str(job.boot_disk_gb)))
    if job.use_chief_in_tf_config is False and (len(shapes) > 1 or shapes[0].count > 1):
        notes.append(
            Note(
                "useChiefInTfConfig",
                CHANGED,
                "false: TF_CONFIG names node 0 'chief' (as "
                "useChiefInTfConfig: true did); code that looks for 'master' must look for 'chief'",
            )
        )
    elif job.use_chief_in_tf_config:
        notes.append(Note("useChiefInTfConfig", EXACT, "TF_CONFIG names node 0 'chief'"))
    if ssh_ranges:
        settings[f"{NAMESPACE}:sshSourceRanges"] = list(ssh_ranges)
    else:
        notes.append(
            Note(
                "sshSourceRanges",
                NOT_MAPPED,
                "AI Platform had no SSH: set the addresses allowed to "
                'reach the VM (--ssh-from "$(curl -s ifconfig.me)/32", or edit the stack file)',
            )
        )
    # With pools the stack itself says which nodes are parameter servers; `--ps` is for `nodes`.
    pools = pool_jobs(job, notes, pools_file)  # (each pool's own image, command, args and env: `train --pools`)
    train = train_command(job, stack, 0 if not uniform else ps, notes, env_file, pools, pools_file)
    return Translation(stack, settings, train, notes, job_env(job), pools)
