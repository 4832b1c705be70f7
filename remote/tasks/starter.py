"""`gpu-train init`: a starter stack file in the researcher's project, and what to edit in it.

The texts are plain functions (tested by parsing what they write); the task writes the file
without ever replacing one that exists, and keeps the project's results and local state out of
git (``runs/``, ``.gpu-train/``), as the code sync already keeps them off the host.
"""

from __future__ import annotations

import re
from pathlib import Path

from invoke import Context, task

from gpu_train.contract import REMOTE_ROOT_DEFAULT, STACK_NAME_PATTERN
from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from gpu_train.stack.project import repo_script

NAME_RE = re.compile(STACK_NAME_PATTERN)
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


def gcp_stack(project: str, zone: str, gpu: str, spot: bool, source: str) -> str:
    return (
        "# A GCP stack: a Deep Learning VM with a GPU, created by `pulumi up` through gpu-train's Pulumi program\n"
        '# (see the README, "A GCP stack in your project"). Check it first: gpu-train\'s scripts/plan --stack NAME\n'
        "config:\n"
        f"  gcp:project: {project}   # EDIT: your Google Cloud project id\n"
        f"  gpu-train:zone: {zone}\n"
        f"  gpu-train:gpuType: {gpu}\n"
        "  gpu-train:gpuCount: 1\n"
        f"  gpu-train:spot: {'true' if spot else 'false'}   # spot: 60-91% cheaper, may be preempted\n"
        f"  gpu-train:sshSourceRanges: [{source}]   # EDIT: your address (curl -s ifconfig.me)/32\n"
        "  # gpu-train:idleStopMinutes: 30          # the VM powers off after 30 idle minutes\n"
    )


def to_edit(kind: str, path: Path, several: bool = False) -> list[str]:
    """What the user still has to do, line by line. In a project with several stacks each command names
    this one (without --stack they would stop at "no stack selected", or reach the selected other one)."""
    name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    flag = f" --stack {name}" if several else ""
    if kind == "ssh":
        return [
            f"check gpu-train:hosts in {path}",
            f"try it: gpu-train ssh{flag} -- nvidia-smi",
            f"so that a reboot of the host resumes runs: gpu-train setup{flag} (an @reboot line in your crontab "
            "there; gpu-train down takes it away)",
            f"then: gpu-train train{flag} --script train.py --follow",
        ]
    return [
        f"edit gcp:project and gpu-train:sshSourceRanges in {path}",
        f"check it: {repo_script('plan')} --stack {name}",
        'create the VM: see README, "A GCP stack in your project"',
        f"then: gpu-train train{flag} --script train.py --follow",
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
        "zone": "GCP stack: zone (default us-central1-a)",
        "gpu": "GCP stack: GPU type (default nvidia-tesla-t4)",
        "on_demand": "GCP stack: on-demand rather than spot",
    }
)
def init(c: Context, stack=None, host=None, key=None, gcp_project=None, zone="us-central1-a", gpu="nvidia-tesla-t4", on_demand=False):
    """Write a starter stack into this project's stacks/ (an SSH host, or a GCP VM), and say what to edit."""
    from gpu_train.stack import config

    if bool(host) == bool(gcp_project):
        raise UsageError("give --host USER@HOST[:PORT] (a machine you have) or --gcp-project ID (a VM on Google Cloud)")
    kind = "ssh" if host else "gcp"
    name = stack or ("lab" if host else "gcp")
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"--stack {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)")
    if host:
        try:
            config.split_host(host)
        except ValueError:
            raise UsageError(f"--host {host!r}: write it as user@host:port or a Host alias") from None
        text = ssh_stack(host, key)
    else:
        text = gcp_stack(gcp_project, zone, gpu, not on_demand, "203.0.113.7/32")
    env = Environment.of(c)
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
    for step in to_edit(kind, path.relative_to(root) if path.is_relative_to(root) else path, bool(others)):
        print(f"  next: {step}")
    if others and not env.stack:
        print(f"  this project has several stacks now: `gpu-train stack {name}` selects this one (or pass --stack {name})")
