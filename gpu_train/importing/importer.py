"""Bring an AI Platform Training or Vertex AI custom job: read its description into one neutral form.

Three inputs say the same thing in different words: an AI Platform ``config.yaml`` (``trainingInput``),
``gcloud ai-platform jobs submit training`` flags (read in ``gcloud_flags``, onto the same fields), and
a Vertex AI ``CustomJob``/``CustomJobSpec`` (``workerPoolSpecs``). Each reader turns its input into a
:class:`JobDescription` and notes every field it met: mapped exactly, mapped with a change (and why),
or not mapped (and what to do). Nothing here touches the disk or the network: the AI Platform facts
(``data/ai-platform.yaml``) are read by the caller with ``load_tables`` and handed in;
``gpu_train.importing.translate`` turns the description into a stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpu_train.errors import UsageError

DATA_PATH = Path(__file__).parent.parent / "data" / "ai-platform.yaml"

EXACT, CHANGED, NOT_MAPPED = "exact", "changed", "not mapped"
Tables = dict[str, Any]  # data/ai-platform.yaml: scale tiers, accelerator enums, legacy machine types


class JobImportError(UsageError, ValueError):
    """The input is not a job description this import can read; the message says what it expected."""


@dataclass(frozen=True)
class Note:
    """One line of the import report: which field, how it was mapped, and why or what to do."""

    field: str
    status: str  # EXACT | CHANGED | NOT_MAPPED
    detail: str

    def __str__(self) -> str:
        return f"{self.status:<10}  {self.field}: {self.detail}"


@dataclass(frozen=True)
class Replica:
    """One replica pool as the job declared it (names not yet resolved)."""

    role: str  # chief | worker | ps
    count: int
    machine_type: str
    accelerator: str | None = None  # an enum name (NVIDIA_TESLA_T4) or an API name (nvidia-tesla-t4)
    accelerator_count: int | None = None
    source: str = ""  # the field it came from, for the report


@dataclass(frozen=True)
class Container:
    """A replica's container: Vertex's containerSpec (or AI Platform's imageUri, containerCommand,
    containerArgs), or with ``package`` the prebuilt image a Python package runs in (executorImageUri)."""

    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    package: bool = False
    module: str | None = None  # a package's pythonModule (with ``args``), where its pool names its own


@dataclass
class JobDescription:
    """What a job asks for, whatever form it came in."""

    replicas: list[Replica] = field(default_factory=list)
    region: str | None = None
    project: str | None = None
    python_module: str | None = None
    package_dir: str | None = None  # the local folder holding the package (gcloud --package-path)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    job_dir: str | None = None
    output_env: bool = False  # Vertex: the output folder reaches the code as AIP_* variables, not --job-dir
    max_running_s: int | None = None
    use_chief_in_tf_config: bool | None = None
    containers: dict[str, Container] = field(default_factory=dict)  # by role: chief, worker, ps
    boot_disk_gb: int | None = None
    spot: bool = False  # Vertex scheduling.strategy SPOT
    flex_start: bool = False  # Vertex scheduling.strategy FLEX_START (Dynamic Workload Scheduler)
    notes: list[Note] = field(default_factory=list)

    def note(self, name: str, status: str, detail: str) -> None:
        self.notes.append(Note(name, status, detail))


@cache
def load_tables(path: Path = DATA_PATH) -> Tables:
    """The AI Platform / Vertex facts (data/ai-platform.yaml)."""
    with open(path, encoding="utf-8") as f:
        tables: Tables = yaml.safe_load(f)
    return tables


# -- small readers -----------------------------------------------------------------------------
def _seconds(text: Any, name: str) -> int:
    """'7200s', '2h', '90m' or a number of seconds (AI Platform and Vertex write durations as '7200s')."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not m:
        raise JobImportError(f"{name} = {text!r}: expected a duration such as '7200s'")
    return int(float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])


def _count(value: Any, name: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise JobImportError(f"{name} = {value!r}: expected a whole number") from None
    if number < 0:
        raise JobImportError(f"{name} = {value!r}: must not be negative")
    return number


def _accelerator_config(conf: Any, name: str) -> tuple[str | None, int | None]:
    """AI Platform's ``acceleratorConfig: {count, type}``; (None, None) when absent."""
    if not conf:
        return None, None
    if not isinstance(conf, dict):
        raise JobImportError(f"{name} must be a mapping with count and type")
    kind = conf.get("type")
    return (str(kind) if kind else None), (_count(conf.get("count", 1), f"{name}.count") if kind else None)


def flag_accelerator(text: str, name: str) -> tuple[str, int]:
    """gcloud's ``count=4,type=nvidia-tesla-t4``."""
    parts = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
    if "type" not in parts:
        raise JobImportError(f"{name} {text!r}: expected count=N,type=TYPE")
    return parts["type"], _count(parts.get("count", "1"), f"{name} count")


def together(wrong: list[str]) -> str:
    """Every problem of a job in one message, so one edit fixes them all."""
    return wrong[0] if len(wrong) == 1 else f"{len(wrong)} problems in the job:\n" + "\n".join(f"  {w}" for w in wrong)


# -- AI Platform config.yaml -------------------------------------------------------------------
_TI_HANDLED = {
    "scaleTier", "masterType", "masterConfig", "workerCount", "workerType", "workerConfig",
    "parameterServerCount", "parameterServerType", "parameterServerConfig", "region", "pythonModule",
    "packageUris", "args", "jobDir", "scheduling", "useChiefInTfConfig", "runtimeVersion", "pythonVersion",
}  # fmt: skip


def _scale_tier(job: JobDescription, ti: dict[str, Any], tables: Tables) -> dict[str, Any]:
    """Expand a preset scale tier into masterType/workerCount/...; CUSTOM leaves ``ti`` as it is."""
    tier = str(ti.get("scaleTier", "CUSTOM" if ti.get("masterType") else "BASIC")).upper()
    known = tables["scaleTiers"]
    if tier in known["notTranslated"]:
        raise JobImportError(f"trainingInput.scaleTier = {tier}: {known['notTranslated'][tier]}")
    if tier == "CUSTOM":
        if "scaleTier" in ti:
            job.note("scaleTier", EXACT, "CUSTOM: the machines come from masterType, workerType, parameterServerType")
        return ti
    preset = known["tiers"].get(tier)
    if preset is None:
        raise JobImportError(f"trainingInput.scaleTier = {tier!r}: expected one of {', '.join([*known['tiers'], 'CUSTOM'])}")
    expanded = {**ti, "masterType": preset["master"]}
    if preset.get("workers"):
        expanded.update(workerCount=preset["workers"], workerType=preset["workerType"])
    if preset.get("parameterServers"):
        expanded.update(parameterServerCount=preset["parameterServers"], parameterServerType=preset["parameterServerType"])
    unverified = "" if preset.get("verified", True) else " (the tier's machine types were never published; "
    unverified += "each replica gets the legacy 'standard' type: choose your own shapes in the stack)" if unverified else ""
    job.note(
        "scaleTier",
        CHANGED if unverified else EXACT,
        f"{tier} = master {preset['master']}"
        + (f", {preset['workers']} workers" if preset.get("workers") else "")
        + (f", {preset['parameterServers']} parameter servers" if preset.get("parameterServers") else "")
        + unverified,
    )
    return expanded


def read_training_input(doc: Any, tables: Tables) -> JobDescription:
    """An AI Platform job: a ``config.yaml`` (``trainingInput: ...``) or the trainingInput itself."""
    if not isinstance(doc, dict):
        raise JobImportError("expected a YAML mapping with trainingInput (AI Platform) or workerPoolSpecs (Vertex AI)")
    ti = doc.get("trainingInput", doc)
    if not isinstance(ti, dict):
        raise JobImportError("trainingInput must be a mapping")
    job = JobDescription()
    ti = _scale_tier(job, ti, tables)
    wrong: list[str] = []  # every field missing or malformed, said together (AI Platform's own check did too)
    roles = (("chief", "master", 1), ("worker", "worker", None), ("ps", "parameterServer", None))
    for role, prefix, fixed in roles:
        try:
            _replica(job, ti, role, prefix, fixed)
        except JobImportError as e:
            wrong.append(str(e))
    wrong += _common_fields(job, ti)
    if wrong:
        raise JobImportError(together(wrong))
    for extra in sorted(set(ti) - _TI_HANDLED):
        job.note(extra, NOT_MAPPED, "gpu-train has no such setting; it is left out")
    return job


def _replica(job: JobDescription, ti: dict[str, Any], role: str, prefix: str, fixed: int | None) -> None:
    """One AI Platform replica pool (master, workers, parameter servers) into ``job``, if it has any."""
    machine = ti.get(f"{prefix}Type")
    count = fixed if fixed is not None else _count(ti.get(f"{prefix}Count", 0), f"trainingInput.{prefix}Count")
    if not count:
        return
    if not machine:
        if role == "chief":
            raise JobImportError("trainingInput.scaleTier = CUSTOM needs masterType (AI Platform requires it too)")
        raise JobImportError(f"trainingInput.{prefix}Count = {count} needs {prefix}Type")
    conf = ti.get(f"{prefix}Config") or {}
    accel, accel_count = _accelerator_config(conf.get("acceleratorConfig"), f"{prefix}Config.acceleratorConfig")
    job.replicas.append(Replica(role, count, str(machine), accel, accel_count, f"{prefix}Type"))
    if conf.get("imageUri"):
        command, args = conf.get("containerCommand") or [], conf.get("containerArgs") or []
        job.containers[role] = Container(str(conf["imageUri"]), tuple(map(str, command)), tuple(map(str, args)))
    for extra in sorted(set(conf) - {"acceleratorConfig", "imageUri", "containerCommand", "containerArgs"}):
        job.note(f"{prefix}Config.{extra}", NOT_MAPPED, "gpu-train has no such setting; it is left out")


def _common_fields(job: JobDescription, ti: dict[str, Any]) -> list[str]:
    """The fields AI Platform's config and gcloud's flags share (flags are read into this shape); returns
    what is wrong in them."""
    wrong: list[str] = []
    if ti.get("region"):
        job.region = str(ti["region"])
    if ti.get("pythonModule"):
        job.python_module = str(ti["pythonModule"])
    if ti.get("packageUris"):
        job.note(
            "packageUris",
            CHANGED,
            "packages are not downloaded: run the import's train command from the "
            "folder that holds the package's source (it is synced as code)",
        )
    if ti.get("args") is not None:
        if isinstance(ti["args"], list):
            job.args += [str(a) for a in ti["args"]]
        else:
            wrong.append("trainingInput.args must be a list of strings")
    if ti.get("jobDir"):
        job.job_dir = str(ti["jobDir"])
    scheduling = ti.get("scheduling") or {}
    if isinstance(scheduling, dict) and scheduling.get("maxRunningTime"):
        try:
            job.max_running_s = _seconds(scheduling["maxRunningTime"], "scheduling.maxRunningTime")
        except JobImportError as e:
            wrong.append(str(e))
    if "useChiefInTfConfig" in ti:
        job.use_chief_in_tf_config = str(ti["useChiefInTfConfig"]).lower() == "true"
    for name in ("runtimeVersion", "pythonVersion"):
        if ti.get(name):
            job.note(
                name,
                CHANGED,
                f"{ti[name]}: the VM runs a Deep Learning VM image with its own framework and "
                "Python (gpu-train:imageFamily); pin versions in requirements.txt",
            )
    return wrong


# -- Vertex AI CustomJob ------------------------------------------------------------------------
_POOL_ROLES = ("chief", "worker", "ps")


def read_vertex(doc: Any, region: str | None = None) -> JobDescription:
    """A Vertex AI ``CustomJob`` (``jobSpec.workerPoolSpecs``) or ``CustomJobSpec`` (``workerPoolSpecs``).

    Pool 0 is the chief, pool 1 the workers, pool 2 parameter servers (or reduction servers), pool 3
    evaluators (not translated).
    """
    spec = doc.get("jobSpec", doc) if isinstance(doc, dict) else None
    pools = spec.get("workerPoolSpecs") if isinstance(spec, dict) else None
    single = isinstance(pools, dict)  # gcloud's reference writes one pool as a mapping, not a list of one
    pools = [pools] if single else pools
    if not isinstance(spec, dict) or not isinstance(pools, list) or not pools:
        raise JobImportError("a Vertex AI job needs workerPoolSpecs (a list, pool 0 being the chief, or one pool as a mapping)")
    job = JobDescription(region=region or (doc.get("region") if isinstance(doc, dict) else None))
    if single:
        job.note("workerPoolSpecs", EXACT, "one pool written as a mapping (gcloud's form): the chief")
    wrong: list[str] = []
    for index, pool in enumerate(pools):
        where = "workerPoolSpecs" if single else f"workerPoolSpecs[{index}]"
        if not pool:  # an empty pool keeps its place (Vertex's way to skip the worker pool)
            continue
        if index > 2:
            job.note(where, NOT_MAPPED, "evaluator pools are not run; evaluate from the chief or after training")
            continue
        if not isinstance(pool, dict):
            wrong.append(f"{where} must be a mapping with machineSpec and replicaCount")
            continue
        machine = pool.get("machineSpec") or {}
        if not isinstance(machine, dict) or not machine.get("machineType"):
            wrong.append(f"{where}.machineSpec.machineType is required")
            continue
        try:
            count = _count(pool.get("replicaCount", 1), f"{where}.replicaCount")
        except JobImportError as e:
            wrong.append(str(e))
            continue
        accel = machine.get("acceleratorType")
        accel = None if accel in (None, "ACCELERATOR_TYPE_UNSPECIFIED") else accel
        shape = (machine["machineType"], accel, machine.get("acceleratorCount"))
        if index == 0:
            job.replicas.append(Replica("chief", 1, *shape, source=where))
            if count > 1:  # Vertex allows one chief replica only; more are workers of the same shape
                job.note(f"{where}.replicaCount", CHANGED, f"{count}: one chief; the other {count - 1} become workers")
                job.replicas.append(Replica("worker", count - 1, *shape, source=where))
        elif count:
            job.replicas.append(Replica(_POOL_ROLES[index], count, *shape, source=where))
        disk = pool.get("diskSpec") or {}
        if index == 0 and disk.get("bootDiskSizeGb"):
            job.boot_disk_gb = _count(disk["bootDiskSizeGb"], f"{where}.diskSpec.bootDiskSizeGb")
        if pool.get("pythonPackageSpec"):
            py = pool["pythonPackageSpec"]
            job.python_module = job.python_module or py.get("pythonModule")
            if index == 0:
                job.args += [str(a) for a in py.get("args") or []]
                job.env.update({e["name"]: str(e.get("value", "")) for e in py.get("env") or [] if "name" in e})
            if py.get("executorImageUri"):
                env = tuple((str(e["name"]), str(e.get("value", ""))) for e in py.get("env") or [] if isinstance(e, dict) and "name" in e)
                module, words = py.get("pythonModule"), tuple(str(a) for a in py.get("args") or [])
                job.containers[_POOL_ROLES[index]] = Container(
                    str(py["executorImageUri"]), (), words, env, package=True, module=str(module) if module else None
                )
        spec_ = pool.get("containerSpec")
        if isinstance(spec_, dict) and spec_.get("imageUri"):
            env = tuple((str(e["name"]), str(e.get("value", ""))) for e in spec_.get("env") or [] if isinstance(e, dict) and "name" in e)
            command, args = spec_.get("command") or [], spec_.get("args") or []
            job.containers[_POOL_ROLES[index]] = Container(str(spec_["imageUri"]), tuple(map(str, command)), tuple(map(str, args)), env)
        elif spec_:
            wrong.append(f"{where}.containerSpec needs imageUri")
    if wrong:
        raise JobImportError(together(wrong))
    output = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if output:
        job.job_dir, job.output_env = str(output), True
    scheduling = spec.get("scheduling") or {}
    if scheduling.get("timeout"):
        job.max_running_s = _seconds(scheduling["timeout"], "scheduling.timeout")
    strategy = str(scheduling.get("strategy", "STANDARD")).upper()
    if strategy == "SPOT":
        job.spot = True
        job.note("scheduling.strategy", EXACT, "SPOT -> gpu-train:spot true")
    elif strategy == "FLEX_START":
        job.flex_start = True  # (the stack's flexStart; translate checks the shape takes it)
        if scheduling.get("maxWaitDuration"):
            job.note(
                "scheduling.maxWaitDuration",
                CHANGED,
                f"{scheduling['maxWaitDuration']}: no counterpart (the "
                "provider sends no queueing time); scripts/up tries zone by zone, --retry-until-up keeps trying",
            )
    elif strategy not in ("STANDARD", "ON_DEMAND", "STRATEGY_UNSPECIFIED"):
        job.note("scheduling.strategy", CHANGED, f"{strategy}: gpu-train creates the VM on demand (or spot: set gpu-train:spot)")
    for extra in sorted(set(spec) - {"workerPoolSpecs", "baseOutputDirectory", "scheduling"}):
        job.note(extra, NOT_MAPPED, "gpu-train has no such setting; it is left out")
    return job


def read_any(doc: Any, tables: Tables, region: str | None = None) -> JobDescription:
    """Whichever job a YAML/JSON document describes."""
    spec = doc.get("jobSpec", doc) if isinstance(doc, dict) else None
    if isinstance(spec, dict) and "workerPoolSpecs" in spec:
        return read_vertex(doc, region)
    job = read_training_input(doc, tables)
    job.region = region or job.region
    return job
