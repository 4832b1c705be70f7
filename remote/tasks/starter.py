"""`gpu-train init`: a starter stack file in the researcher's project, and what to edit in it.

The texts are plain functions (tested by parsing what they write); the task writes the file
without ever replacing one that exists, and keeps the project's results and local state out of
git (``runs/``, ``.gpu-train/``), as the code sync already keeps them off the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context, task

from gpu_train.contract import REMOTE_ROOT_DEFAULT
from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from gpu_train.stack.project import EXAMPLE_STACKS, repo_script
from remote.tasks.taskoptions import InitOptions

if TYPE_CHECKING:
    from gpu_train.catalog.model import Catalog

GITIGNORED = ("runs/", ".gpu-train/")


def ssh_stack(host: str, key: str | None) -> str:
    key_line = (
        f"  gpu-train:sshKey: {key}\n"
        if key
        else "  # gpu-train:sshKey: ~/.ssh/id_ed25519   # default: ssh-agent and your ~/.ssh/config's IdentityFile\n"
    )
    return (
        "# An SSH stack: a GPU machine you already have. `gpu-train train --script train.py` runs there.\n"
        "config:\n"
        "  gpu-train:target: ssh\n"
        f"  gpu-train:hosts: [{host!r}]   # user@host:port, or a Host alias from ~/.ssh/config (ProxyJump too)\n"
        f"{key_line}"
        "  # gpu-train:python: /usr/bin/python3     # the host's Python; the job runs in a venv made from it,\n"
        "  #                                        # with its site packages (a preinstalled torch is used)\n"
        f"  # gpu-train:remoteRoot: {REMOTE_ROOT_DEFAULT:<17}# where runs, code and data live on the host\n"
        "  # gpu-train:sshConfig: ~/.ssh/config     # another ssh_config file for the alias\n"
    )


@dataclass(frozen=True)
class StarterShape:
    """What a starter stack says of the machine: a GPU attached to N1 (gpuType, gpuCount) or a machine type
    that carries it (G2, A2, A3, A4, ...: machineType alone), a zone that offers it, how it is had."""

    lines: tuple[str, ...]
    zone: str
    way: str  # spot, on-demand or flex-start
    note: str = ""  # said to the user: what was chosen for them, and why


def starter_shape(catalog: Catalog, gpu: str, zone: str, zone_given: bool, spot: bool) -> StarterShape:
    """The smallest valid machine for one ``gpu`` (a name or its short one) from the catalog, in ``zone`` or,
    when the zone was not given and does not offer it, the first zone that does (in the same region first);
    spot, else on demand where the shape is had that way, else Flex-start (24 h). UsageError for a GPU the
    catalog does not know or a given zone that does not offer it."""
    from gpu_train.catalog.gpunames import resolve, suggest
    from gpu_train.catalog.model import FLEX_START, ON_DEMAND, SPOT

    acc = resolve(gpu, catalog)
    if acc is None:
        close = suggest(gpu, catalog)
        raise UsageError(f"--gpu {gpu}: not a GPU of the catalog" + (f"; did you mean {' or '.join(close)}?" if close else ""))
    lines: tuple[str, ...]
    machine: str | None
    if acc.attachable_to_n1:
        machine, lines = None, (f"gpu-train:gpuType: {acc.name}", "gpu-train:gpuCount: 1")
    else:
        shape = catalog.shapes_with(acc.name)[0]
        machine = shape.name
        lines = (f"gpu-train:machineType: {machine}   # {shape.gpu_count} x {acc.gpu} ({acc.series}: the GPU comes with the machine type)",)
    zones = catalog.zones_for(acc.name, catalog.parse_machine_type(machine) if machine else None)
    note = ""
    if zones and zone not in zones:
        if zone_given:
            raise UsageError(
                f"--zone {zone}: {acc.gpu} is not offered there; it is in {', '.join(zones[:6])}" + (" ..." if len(zones) > 6 else "")
            )
        region = zone.rsplit("-", 1)[0]
        zone = next((z for z in zones if z.startswith(region + "-")), next((z for z in zones if z.startswith("us-central1-")), zones[0]))
        note = f"{acc.gpu} is not offered in the default zone: {zone} chosen (--zone to pick another of {len(zones)})"
    ways = catalog.ways(machine) if machine else (ON_DEMAND, SPOT)
    if not {SPOT, ON_DEMAND, FLEX_START} & set(ways):
        raise UsageError(
            f"--gpu {gpu}: {machine} is had only through a reservation your project holds, so no starter stack can "
            f"be made for it: write gpu-train:machineType {machine} and gpu-train:reservation NAME yourself "
            f'({doc_page("google-cloud.md")}: "The big GPUs: Flex-start and reservations")'
        )
    way = SPOT if spot and SPOT in ways else ON_DEMAND if ON_DEMAND in ways else SPOT if SPOT in ways else FLEX_START
    if way != (SPOT if spot else ON_DEMAND):
        said = {SPOT: "spot", ON_DEMAND: "on demand", FLEX_START: "Flex-start (maxRunHours 24)"}[way]
        note = "; ".join(filter(None, (note, f"{machine or acc.name} is had {said}: {', '.join(ways)} only")))
    return StarterShape(lines, zone, way, note)


def gcp_stack(project: str, shape: StarterShape, source: str) -> str:
    from gpu_train.catalog.model import FLEX_START, SPOT

    way = {
        SPOT: "  gpu-train:spot: true   # spot: 60-91% cheaper, may be preempted (the run resumes when it returns)\n",
        FLEX_START: "  gpu-train:flexStart: true   # queued until capacity is free, then runs up to maxRunHours\n"
        "  gpu-train:maxRunHours: 24\n",
    }.get(shape.way, "  gpu-train:spot: false   # on demand; spot is 60-91% cheaper but may be preempted\n")
    return (
        "# A GCP stack: a Deep Learning VM with a GPU, created by `pulumi up` through gpu-train's Pulumi program\n"
        f'# ({doc_page("ssh-hosts.md")}, "A GCP stack in your project"). Check it first: {repo_script("plan")} --stack NAME\n'
        "config:\n"
        f"  gcp:project: {project}   # your Google Cloud project id\n"
        f"  gpu-train:zone: {shape.zone}\n"
        + "".join(f"  {line}\n" for line in shape.lines)
        + way
        + f"  gpu-train:sshSourceRanges: [{source}]   # EDIT: your address (curl -s ifconfig.me)/32\n"
        "  # gpu-train:idleStopMinutes: 30          # the VM powers off after 30 idle minutes\n"
    )


def doc_page(name: str) -> str:
    """A page of this clone's docs as a path the user can open from anywhere."""
    return str(EXAMPLE_STACKS.parent / "docs" / name)


def likely_script(root: Path) -> str:
    """The script a project most likely trains with, for the hints: train.py, else a file with `train` in its
    name, else main.py, else its first Python file at the top; SCRIPT.py when it has none."""
    from gpu_train.jobs import script_candidates

    found = script_candidates(root, limit=500)
    top = [f for f in found if "/" not in f]
    for pick in (
        [f for f in found if f == "train.py"],
        [f for f in top if "train" in f],
        [f for f in found if f.rsplit("/", 1)[-1].startswith("train")],
        [f for f in top if f == "main.py"],
        [f for f in top if not f.startswith(("setup", "test_", "conftest"))],
    ):
        if pick:
            return pick[0]
    return "SCRIPT.py"


def to_edit(kind: str, path: Path, several: bool = False, script: str = "train.py") -> list[str]:
    """What the user still has to do, line by line. In a project with several stacks each command names
    this one (without --stack they would stop at "no stack selected", or reach the selected other one);
    ``script``: the project's own (likely_script)."""
    name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    flag = f" --stack {name}" if several else ""
    if kind == "ssh":
        return [
            f"check gpu-train:hosts in {path}",
            f"try it: gpu-train ssh{flag} -- nvidia-smi",
            f"so that a reboot of the host resumes runs: gpu-train setup{flag} (an @reboot line in your crontab "
            "there; gpu-train down takes it away)",
            f"then: gpu-train train{flag} --script {script} --follow",
        ]
    return [
        f"edit gpu-train:sshSourceRanges in {path} (your address as a /32)",
        f"check it: gpu-train plan --stack {name}   (offline: every problem, every resource, the cost)",
        f'create the VM: gpu-train up --stack {name}   ({doc_page("ssh-hosts.md")}: "A GCP stack in your project")',
        f"then: gpu-train train{flag} --script {script} --follow",
    ]


def ignore_lines(existing: str) -> list[str]:
    """The lines of GITIGNORED a .gitignore lacks (exact lines, with or without a leading '/')."""
    have = {line.strip().lstrip("/") for line in existing.splitlines()}
    return [line for line in GITIGNORED if line not in have and line.rstrip("/") not in have]


@task(
    help={
        "stack": "the stack's name (default: lab for --host, gcp for --gcp-project)",
        "host": "SSH stack: user@host[:port] or an alias from ~/.ssh/config",
        "key": "SSH stack: the private key (default: ssh-agent and ~/.ssh/config)",
        "gcp_project": "GCP stack: your Google Cloud project id",
        "zone": "GCP stack: zone (default us-central1-a, or the first zone that offers the GPU)",
        "gpu": "GCP stack: GPU type, as the catalog names it or its short name (default nvidia-l4: `gpu-train gpus` lists them)",
        "on_demand": "GCP stack: on-demand rather than spot",
    }
)
def init(
    c: Context,
    stack: str | None = None,
    host: str | None = None,
    key: str | None = None,
    gcp_project: str | None = None,
    zone: str | None = None,
    gpu: str = "nvidia-l4",
    on_demand: bool = False,
) -> None:
    """Write a starter stack into this project's stacks/ (an SSH host, or a GCP VM), and say what to edit."""
    o = InitOptions(stack=stack, host=host, key=key, gcp_project=gcp_project, zone=zone, gpu=gpu, on_demand=bool(on_demand))
    write_starter(Environment.of(c), o)


def write_starter(env: Environment, o: InitOptions) -> None:
    """`init`'s work for checked options: the stack file (never over one), .gitignore's lines, the next steps."""
    kind, name = o.kind, o.name
    if o.host:
        text = ssh_stack(o.host, o.key)
    else:
        from gpu_train.catalog.loader import load_catalog

        shape = starter_shape(load_catalog(), o.gpu, o.zone or "us-central1-a", bool(o.zone), not o.on_demand)
        text = gcp_stack(o.gcp_project or "", shape, "203.0.113.7/32")
        if shape.note:
            print(shape.note)
    root = env.project_root
    path = root / "stacks" / f"Pulumi.{name}.yaml"
    if path.exists():
        raise GpuTrainError(f"{path} exists; nothing written (edit it, or pick another --stack)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as f:  # never replaces a file written meanwhile
        f.write(text)
    print(f"wrote {path}")
    gitignore = root / ".gitignore"
    if (root / ".git").exists() or gitignore.exists():
        existing = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
        missing = ignore_lines(existing)
        if missing:
            sep = "" if not existing or existing.endswith("\n") else "\n"
            with open(gitignore, "a", encoding="utf-8") as f:
                f.write(sep + "".join(f"{line}\n" for line in missing))
            print(f"added {', '.join(missing)} to {gitignore} (fetched runs and gpu-train's local state)")
    others = [p.name for p in path.parent.glob("Pulumi.*.y*ml") if p != path]
    for step in to_edit(kind, path.relative_to(root) if path.is_relative_to(root) else path, bool(others), likely_script(root)):
        print(f"  next: {step}")
    if others and not env.stack:
        print(f"  this project has several stacks now: `gpu-train stack {name}` selects this one (or pass --stack {name})")
