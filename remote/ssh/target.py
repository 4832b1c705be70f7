"""Which hosts a stack's tasks talk to: from the stack file (SSH stacks) or stack outputs (GCP).

GCP stack outputs come from `pulumi stack output --json`, which is slow to start, so they are
cached per stack under the local state directory and refreshed when a connection fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_train.atomic import atomic_write
from gpu_train.contract import REMOTE_ROOT_BEFORE, REMOTE_ROOT_DEFAULT, STACK_NAME_PATTERN, AgentSettings
from gpu_train.environment import Environment
from gpu_train.stack import check, project, stackfile
from gpu_train.stack.agentdoc import agent_settings
from gpu_train.stack.problems import ConfigError, Problem, shown
from gpu_train.stack.settings import StackConfig
from gpu_train.stack.sshhost import SshHost

REPO = project.REPO


def state_problem(*folders: Path) -> str:
    """Why these state folders cannot be trusted ('' when they can): they hold the hosts' cached
    addresses and pinned keys, so a folder another user owns or may write (a project in a shared lab
    folder) could point your tasks, your code and your secrets at their host."""
    for folder in folders:
        try:
            st = folder.stat()
        except OSError:
            continue
        if st.st_uid != os.getuid():  # (modes are not judged: a umask of 002, WSL's /mnt/c)
            return f"{folder} belongs to uid {st.st_uid}, not to you"
    if folders and (tracked := committed(folders[0])):
        return (
            f"{folders[0]} holds files committed to git ({', '.join(tracked[:3])}"
            f"{' ...' if len(tracked) > 3 else ''}): a commit (a clone, a `git pull`, which replaces ignored files "
            "without a word) chose them, not you"
        )
    return ""


def committed(folder: Path) -> list[str]:
    """The files under ``folder`` that the git repository around it tracks ([] outside one, or without git).

    git is asked with no command a repository's own config could name (project.GIT)."""
    if not folder.is_dir() or not shutil.which("git"):
        return []
    try:
        out = subprocess.run(
            [*project.GIT, "ls-files", "-z", "--", "."], cwd=folder, capture_output=True, timeout=10, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [n for n in out.stdout.decode("utf-8", "replace").split("\0") if n] if out.returncode == 0 else []


@dataclass(frozen=True)
class Target:
    stack: str
    hosts: tuple[SshHost, ...]
    key_file: str
    known_hosts: Path
    pinned: bool  # known_hosts given by the user: never written, unknown keys refused
    remote_root: str
    python: str | None
    venv: bool
    expect_gpus: int  # GCP: wait until nvidia-smi lists this many; SSH stacks: 0 (no waiting)
    hourly_cost_usd: float | None
    is_gcp: bool
    cache: Path
    agent_settings: AgentSettings = field(default_factory=AgentSettings)  # (its part: agentdoc.settings_part) REMOTE_ROOT/agent.json
    master_addr: str = ""  # where the nodes meet: node 0 as the others reach it (internal IP on GCP)
    gpus_per_node: int | None = None  # known on GCP; on SSH hosts the agent counts them
    node: int = 0
    vm: dict[str, Any] | None = None  # GCP: project, zone, name (this node's), spot, idleStopMinutes, maxRunHours
    # Pools (GCP): each node's GPUs and role, in node order; empty when every node is alike.
    node_gpus: tuple[int, ...] = ()
    roles: tuple[str, ...] = ()
    # Where the nodes reach each other, in node order (GCP: internal IPs); empty: at ``hosts``' addresses.
    # Not rotated by for_node.
    peer_addresses: tuple[str, ...] = ()
    notify: str | None = None  # gpu-train:notify (config.SECRET_VALUE while encrypted in the stack file)
    image: str | None = None  # gpu-train:image: the runs' container image unless `train --image` says otherwise
    # The laptop's command the agent's messages name (Environment.cli: `fab` inside this clone).
    cli: str = "gpu-train"
    bucket: str | None = None  # gpu-train:bucket (NAME or gs://NAME/PREFIX), checked
    bucket_area: str | None = None  # gpu-train:bucketArea (STACK@XXXXXXXX); None: a stack from before areas
    # An SSH stack without remoteRoot: each node's root as first contact found it (REMOTE_ROOT_DEFAULT,
    # or the old default where that host has runs of ours), in node order; "" until asked. Not rotated.
    ask_root: bool = False
    node_roots: tuple[str, ...] = ()

    def for_node(self, node: int) -> Target:
        """This target seen from one node: its host first, and its own REMOTE_ROOT ({node} expanded,
        for hosts that share a file system)."""
        hosts = (self.hosts[node], *self.hosts[:node], *self.hosts[node + 1 :])
        gpus: dict[str, Any] = (
            {"expect_gpus": self.node_gpus[node], "gpus_per_node": self.node_gpus[node] or None} if node < len(self.node_gpus) else {}
        )
        vm = self.vm and {**self.vm, "name": (self.vm.get("names") or [self.vm.get("name")] * (node + 1))[node]}
        known = self.node_roots[node] if node < len(self.node_roots) else ""
        return replace(
            self,
            hosts=hosts,
            remote_root=known or self.remote_root.replace("{node}", str(node)),
            node=node,
            vm=vm,
            agent_settings=replace(self.agent_settings, ssh_port=self.hosts[node].port),
            **gpus,
        )

    def root_known(self, node: int, root: str) -> Target:
        """This target with ``node``'s REMOTE_ROOT as its host answered (see ``root_question``)."""
        roots = list(self.node_roots or [""] * len(self.hosts))
        roots[node] = root
        return replace(self, node_roots=tuple(roots))

    @property
    def root_unknown(self) -> bool:
        """Whether this node's REMOTE_ROOT is still to be asked of its host (first contact)."""
        return self.ask_root and not (self.node < len(self.node_roots) and self.node_roots[self.node])

    @property
    def parameter_servers(self) -> int:
        """How many of the last nodes are a pool of parameter servers (0 without pools)."""
        return self.roles.count("ps")

    @property
    def host(self) -> SshHost:
        return self.hosts[0]

    def rsync_root(self) -> str:
        """remoteRoot as rsync wants it: '~/x' becomes 'x' (relative to the login's home)."""
        return self.remote_root[2:] if self.remote_root.startswith("~/") else self.remote_root


STACK_NAME_RE = re.compile(STACK_NAME_PATTERN)


def select_stack(env: Environment, stack: str | None, ask_pulumi: bool = True) -> str:
    """--stack, else $GPU_TRAIN_STACK, else the project's selected stack (`gpu-train stack NAME`), else
    its only stack, else Pulumi's selected stack (unless not ``ask_pulumi``: then ConfigError)."""
    return chosen_stack(env, stack, ask_pulumi)[0]


def chosen_stack(env: Environment, stack: str | None, ask_pulumi: bool = True) -> tuple[str, str]:
    """``select_stack``'s answer and why it is that one."""
    root = env.project_root
    own = project.stack_names([root / "stacks"])
    chosen, why = project.choose_stack(stack, env.stack, project.selected_stack(root), own)
    if chosen and not STACK_NAME_RE.fullmatch(chosen):
        raise ConfigError(
            [
                Problem(
                    "stack",
                    f"{shown(chosen)} is not a stack name",
                    "letters, digits, '_', '.' and '-', starting with a letter or digit",
                )
            ]
        )
    if chosen and why.startswith("selected") and project.stack_path(chosen, env.stack_dirs) is None:
        cli = env.cli
        raise ConfigError(
            [
                Problem(
                    "stack",
                    f"the project's selected stack {chosen!r} has no stack file any more (selected in {root / project.SELECTED})",
                    f"select another: `{cli} stack NAME`" + (f" ({', '.join(own)})" if own else "") + f", or `{cli} stack --clear`",
                )
            ]
        )
    if chosen:
        return chosen, why
    if ask_pulumi and shutil.which("pulumi"):
        out = subprocess.run(["pulumi", "stack", "--show-name"], cwd=REPO, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip(), "Pulumi's selected stack"
    what, fix = project.no_stack(own, env.found_project, env.cwd, env.cli)
    raise ConfigError([Problem("stack", what, fix)])


# First contact with an SSH host when the stack sets no remoteRoot: one command, before the agent is
# installed (which would create the new root). Its answer is kept per host in the stack's cache.
ROOT_QUESTION = (
    f"if [ -e {REMOTE_ROOT_DEFAULT} ]; then echo new; elif [ -d {REMOTE_ROOT_BEFORE}/runs ] && "
    f"[ -f {REMOTE_ROOT_BEFORE}/bin/gpu-train-agent ]; then echo before; else echo new; fi"
)
ROOTS_FILE = "remote-roots.json"


def root_from_answer(answer: str) -> str | None:
    """REMOTE_ROOT from ROOT_QUESTION's answer: the old default only where runs of ours are (the new
    one exists, or nothing of ours is in the old); None for an answer that is neither."""
    return {"new": REMOTE_ROOT_DEFAULT, "before": REMOTE_ROOT_BEFORE}.get(answer.strip())


def host_key(host: SshHost) -> str:
    return f"{host.user}@{host.host}:{host.port}"


def known_roots(cache: Path) -> dict[str, str]:
    try:
        doc = json.loads((cache / ROOTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in doc.items() if v in (REMOTE_ROOT_DEFAULT, REMOTE_ROOT_BEFORE)} if isinstance(doc, dict) else {}


def remember_root(cache: Path, host: SshHost, root: str) -> None:
    """Keep a host's REMOTE_ROOT in the stack's cache (rebuilt by asking again when lost)."""
    roots = {**known_roots(cache), host_key(host): root}
    atomic_write(cache / ROOTS_FILE, json.dumps(roots, indent=1))


def stack_outputs(stack: str, cache: Path, refresh: bool = False, ask_pulumi: bool = True) -> dict[str, Any]:
    """`pulumi stack output --json`, cached in cache/outputs.json (without ``ask_pulumi``, the cache or ConfigError)."""
    path = cache / "outputs.json"
    if not refresh and path.is_file():
        cached: dict[str, Any] = json.loads(path.read_text())
        return cached
    if not ask_pulumi:
        raise ConfigError([Problem("stack", f"stack {stack}'s outputs are not kept here yet", "ask the Pulumi CLI for them")])
    if not shutil.which("pulumi"):
        raise ConfigError(
            [
                Problem(
                    "stack",
                    f"stack {stack} is a GCP stack and its outputs are unknown here",
                    "install the Pulumi CLI and run `pulumi up`, or use an SSH stack (target: ssh)",
                )
            ]
        )
    out = subprocess.run(
        ["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", stack], cwd=REPO, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise ConfigError(
            [
                Problem(
                    "stack", f"`pulumi stack output --stack {stack}` failed: {out.stderr.strip()}", "run `pulumi up` for this stack first"
                )
            ]
        )
    outputs: dict[str, Any] = json.loads(out.stdout or "{}")
    if not outputs.get("externalIp"):
        raise ConfigError([Problem("stack", f"stack {stack} has no VM yet (no externalIp output)", "run `pulumi up`")])
    atomic_write(path, json.dumps(outputs, indent=1))
    return outputs


def target_from(cfg: StackConfig, outputs: dict[str, Any] | None, home: Path, cli: str = "gpu-train") -> Target:
    """The pure mapping from a stack's settings (and, on GCP, its outputs) to a Target (``cli``: Environment.cli)."""
    cache = home / cfg.stack
    if cfg.is_gcp:
        assert outputs is not None
        user = outputs.get("sshUser") or cfg.ssh_user
        gcp_key = os.path.expanduser(cfg.ssh_private_key_path())
        hosts = tuple(SshHost(user, ip, 22, keys=(gcp_key,)) for ip in outputs.get("externalIps") or [outputs["externalIp"]])
        master = (outputs.get("internalIps") or [outputs.get("internalIp") or hosts[0].host])[0]
        expect, cost, gpus = int(outputs.get("gpuCount") or 0), outputs.get("hourlyCostUsd"), outputs.get("gpuCount")
        pooled = bool(cfg.pools) and len(outputs.get("nodeGpuCounts") or []) == len(hosts)
        node_gpus = tuple(int(n) for n in outputs["nodeGpuCounts"]) if pooled else ()
        roles = tuple(outputs.get("nodeRoles") or ()) if pooled else ()
        peers = tuple(outputs.get("internalIps") or ())
        peers = peers if len(peers) == len(hosts) else ()
    else:
        own = (os.path.expanduser(cfg.ssh_key),) if cfg.ssh_key else ()
        hosts = tuple(h if h.keys else replace(h, keys=own) for h in cfg.hosts)
        expect, cost, gpus, node_gpus, roles, peers = 0, None, None, (), (), ()
        master = hosts[0].host if hosts else ""
    key = cfg.ssh_private_key_path() if cfg.is_gcp else cfg.ssh_key
    return Target(
        stack=cfg.stack,
        hosts=hosts,
        key_file=os.path.expanduser(key) if key else "",
        known_hosts=Path(os.path.expanduser(cfg.known_hosts)) if cfg.known_hosts else cache / "known_hosts",
        pinned=cfg.known_hosts is not None,
        remote_root=cfg.remote_root,
        python=cfg.python,
        venv=cfg.venv,
        expect_gpus=expect,
        hourly_cost_usd=cost,
        is_gcp=cfg.is_gcp,
        cache=cache,
        agent_settings=agent_settings(cfg, ssh_port=hosts[0].port if hosts else 22),
        master_addr=master,
        gpus_per_node=int(gpus) if gpus else None,
        vm={
            "project": cfg.project,
            "zone": outputs.get("zone") or cfg.zone,
            "name": outputs.get("instanceName"),
            "names": outputs.get("instanceNames"),
            "spot": cfg.spot,
            "idleStopMinutes": cfg.idle_stop_minutes,
            "maxRunHours": cfg.max_run_hours,
        }
        if cfg.is_gcp and outputs
        else None,
        node_gpus=node_gpus,
        roles=roles,
        peer_addresses=peers,
        notify=cfg.notify,
        image=cfg.image,
        bucket=cfg.bucket,
        bucket_area=cfg.bucket_area,
        ask_root=not cfg.is_gcp and "remoteRoot" not in cfg.given,
        cli=cli,
    )


def ssh_hosts(cfg: StackConfig) -> StackConfig:
    """An SSH stack with its hosts resolved as OpenSSH would (remote/ssh/config.py)."""
    from remote.ssh import config as sshconfig

    try:
        hosts = tuple(sshconfig.resolve(h.spec or str(h), cfg.ssh_key, cfg.ssh_config) for h in cfg.hosts)
    except sshconfig.SshConfigError as e:
        raise ConfigError([Problem("hosts", str(e), "fix the ssh_config, or write the host as user@host:port")], cfg.stack) from None
    return replace(cfg, hosts=hosts)


def resolve(env: Environment, stack: str | None, refresh: bool = False, ask_pulumi: bool = True) -> Target:
    """The Target of the selected stack; raises ConfigError with a fix when it cannot be had (without
    ``ask_pulumi``, also where only the Pulumi CLI could say: its selected stack, a GCP stack's outputs
    not kept here yet; the early calls of remote/ssh/early.py start no Pulumi, which takes a second)."""
    name = select_stack(env, stack, ask_pulumi)
    # The same validation as `scripts/plan` and `pulumi up`: a stack file from elsewhere is checked
    # before any of its values reaches ssh, rsync or a host (an SSH stack's by its rules alone).
    raw = stackfile.read_stack_file(env.stack_file(name))
    if check.target_of(raw) == "ssh":
        cfg, _ = check.check_ssh(raw, name)
    else:
        from gpu_train.catalog.loader import load_catalog
        from gpu_train.gcp import validate

        cfg, _ = validate.check(raw, name, load_catalog())
    home = env.state_home
    why = state_problem(home, home / name)
    if why:
        raise ConfigError(
            [
                Problem(
                    "stack",
                    f"{why}: it holds the stack's host addresses and host keys, which another user could point at their own host",
                    "work in a copy of the project that is yours, or set GPU_TRAIN_HOME to a folder of yours"
                    + (f" (committed files: `git rm -r --cached {home}` and delete them)" if "committed" in why else ""),
                )
            ],
            name,
        )
    outputs = stack_outputs(name, home / name, refresh, ask_pulumi) if cfg.is_gcp else None
    target = target_from(cfg if cfg.is_gcp else ssh_hosts(cfg), outputs, home, env.cli)
    if target.ask_root:  # what first contact found on each host, if it was asked before
        roots = known_roots(target.cache)
        target = replace(target, node_roots=tuple(roots.get(host_key(h), "") for h in target.hosts))
    if target.key_file and not Path(target.key_file).is_file():
        raise ConfigError(
            [
                Problem(
                    "sshKey" if cfg.ssh_key else "sshPublicKey",
                    f"no private key at {target.key_file}",
                    "set gpu-train:sshKey to your private key's path",
                )
            ],
            name,
        )
    agent = bool(os.environ.get("SSH_AUTH_SOCK"))
    for h in target.hosts:
        if not h.keys and not agent:
            raise ConfigError(
                [
                    Problem(
                        "sshKey",
                        f"no SSH key for {h.spec or h}: no ssh-agent (SSH_AUTH_SOCK) and none of "
                        "~/.ssh/id_* nor an IdentityFile in the ssh_config exists",
                        "create one (ssh-keygen -t ed25519), start ssh-agent, or set gpu-train:sshKey",
                    )
                ],
                name,
            )
    if target.pinned and not target.known_hosts.is_file():
        raise ConfigError(
            [
                Problem(
                    "knownHosts",
                    f"no file at {target.known_hosts}",
                    "point gpu-train:knownHosts at a known_hosts file, or remove it to learn keys",
                )
            ],
            name,
        )
    return target
