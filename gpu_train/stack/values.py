"""Stack values checked as what they become: ssh_config lines, shell words, paths on a host.

A stack file may come from a colleague's repository, so every value that reaches a command line,
a config file or a path on a host is checked here against the syntax of what it turns into: a host
name by hostname/IP syntax (a newline in `hosts` would otherwise become an ssh_config directive), a
user by login-name syntax, ``remoteRoot`` by a safe character set (it is rendered into the root
startup script and the systemd units), local paths without control characters. Sizes are bounded
(``nodes``, ``quotaRequest.gpus``) so that a typo cannot make ``plan`` build a hundred thousand VMs.
Pure functions of the config; no I/O.
"""

from __future__ import annotations

import ipaddress
import re

from gpu_train.contract import REMOTE_ROOT_DEFAULT
from gpu_train.stack.problems import Problem, shown
from gpu_train.stack.settings import StackConfig

# Login names as useradd accepts them by default (NAME_REGEX), plus upper case and dots, which
# some directories (LDAP, macOS) use. Never a leading '-': it would become an ssh option.
LOGIN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
HOST_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
MAX_HOSTNAME = 253
# remoteRoot: absolute or under the login's home, from a character set no shell, unit file or
# rsync pattern gives a meaning to. `{node}` is the only placeholder.
REMOTE_ROOT_RE = re.compile(r"(/|~/)[A-Za-z0-9._/+-]*")
MAX_REMOTE_ROOT = 200  # its paths must stay well under a unix socket's 108 bytes... and screen's
MAX_NODES = 256
MAX_QUOTA_GPUS = 10_000
# The widest SSH source ranges accepted without allowSshFromAnywhere: a /7 is half of an /8's
# neighbours already "the internet" in practice.
WIDEST_PREFIX = {4: 8, 6: 32}
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def host_problem(host: str) -> str | None:
    """Why ``host`` is not a host name or IP address (None when it is one)."""
    if not host:
        return "the host is empty"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if CONTROL_RE.search(host) or any(c.isspace() for c in host):
        return "the host contains whitespace or control characters"
    if host.startswith("-"):
        return "the host starts with '-' (it would be read as an option)"
    if len(host) > MAX_HOSTNAME:
        return f"the host name is longer than {MAX_HOSTNAME} characters"
    labels = host.rstrip(".").split(".")
    for label in labels:
        if len(label) > 63:
            return "a part of the host name is longer than 63 characters"
        if not HOST_LABEL_RE.fullmatch(label):
            return "the host is not a host name (letters, digits, '-' and '.') or an IP address"
    return None


def login_problem(user: str) -> str | None:
    """Why ``user`` is not a login name (None when it is one)."""
    if LOGIN_RE.fullmatch(user):
        return None
    if user.startswith("-"):
        return "the user starts with '-' (it would be read as an option)"
    return "the user is not a login name (letters, digits, '.', '_' and '-', at most 32, not starting with '-')"


def remote_root_problem(root: str, gcp: bool) -> str | None:
    """Why ``root`` cannot be REMOTE_ROOT (None when it can)."""
    if len(root) > MAX_REMOTE_ROOT:
        return f"is longer than {MAX_REMOTE_ROOT} characters"
    if "{node}" in root and gcp:
        return "has a {node} placeholder, which only SSH stacks expand (each VM of a GCP stack has its own disk)"
    bare = root.replace("{node}", "0")
    if not REMOTE_ROOT_RE.fullmatch(bare):
        return "must be an absolute path or ~/PATH using only letters, digits, '.', '_', '-', '+' and '/' (and {node})"
    parts = bare.split("/")
    if ".." in parts:
        return "must not contain '..'"
    if bare.rstrip("/") in ("", "~"):
        return "must not be / or your home directory itself (gpu-train keeps its own tree there)"
    return None


def local_path_problem(path: str) -> str | None:
    """A local path the tools write into ssh_config lines and argv: no control characters, no leading '-'."""
    if CONTROL_RE.search(path):
        return "contains a newline or another control character"
    if path.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    return None


def wide_range_problem(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    """Why an SSH source range is too wide to accept without allowSshFromAnywhere."""
    widest = WIDEST_PREFIX[net.version]
    if net.prefixlen < widest:
        share = f"1/{2**net.prefixlen}" if net.prefixlen else "all"
        return f"{net} opens SSH to {share} of the {'IPv4' if net.version == 4 else 'IPv6'} internet (wider than /{widest})"
    return None


# A project id: 6 to 30 lowercase letters, digits and hyphens, from a letter, not ending in '-';
# older ones may carry an organisation's domain first ("example.com:my-project").
PROJECT_RE = re.compile(r"([a-z][a-z0-9.-]{0,61}[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


def check(cfg: StackConfig) -> list[Problem]:
    """Every value of ``cfg`` that is not what it will be used as."""
    problems: list[Problem] = []
    if cfg.is_gcp and cfg.project and not PROJECT_RE.fullmatch(cfg.project):
        # it goes into API paths and gcloud commands shown to the user
        problems.append(
            Problem(
                "gcp:project",
                "is not a project id (6 to 30 lowercase letters, digits and '-', starting with a letter)",
                "pulumi config set gcp:project YOUR_PROJECT_ID (the id, not the project's name or number)",
                cfg.project,
            )
        )
    for h in cfg.hosts:
        for why in (login_problem(h.user), host_problem(h.host)):
            if why:
                problems.append(Problem("hosts", f"{shown(str(h))}: {why}", "write each host as user@host:port"))
    if (why := remote_root_problem(cfg.remote_root, cfg.is_gcp)) is not None:
        problems.append(
            Problem("remoteRoot", why, f"e.g. {REMOTE_ROOT_DEFAULT}, in a directory only you can write (not /tmp)", cfg.remote_root)
        )
    paths = {"sshKey": cfg.ssh_key, "knownHosts": cfg.known_hosts, "sshConfig": cfg.ssh_config, "python": cfg.python}
    if cfg.is_gcp and not cfg.ssh_public_key.lstrip().startswith(("ssh-", "ecdsa-", "sk-")):
        paths["sshPublicKey"] = cfg.ssh_public_key
    for key, value in paths.items():
        if value is not None and (why := local_path_problem(value)) is not None:
            problems.append(Problem(key, why, "give a plain path", value))
    if cfg.nodes > MAX_NODES:
        problems.append(Problem("nodes", f"must be at most {MAX_NODES}", "e.g. 2", cfg.nodes))
    gpus = cfg.quota_request.get("gpus", "")
    if gpus.isdigit() and int(gpus) > MAX_QUOTA_GPUS:
        problems.append(Problem("quotaRequest", f"gpus must be at most {MAX_QUOTA_GPUS}", "ask for what you will use", cfg.quota_request))
    if cfg.is_gcp and not cfg.allow_ssh_from_anywhere:
        for text in cfg.ssh_source_ranges:
            try:
                net = ipaddress.ip_network(text, strict=False)
            except ValueError:
                continue  # validate reports it
            if net.prefixlen and (why := wide_range_problem(net)) is not None:
                problems.append(
                    Problem(
                        "sshSourceRanges",
                        why,
                        "list only your own addresses, or set allowSshFromAnywhere: true if you mean it",
                        list(cfg.ssh_source_ranges),
                    )
                )
    return problems
