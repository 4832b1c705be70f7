"""A stack's host as the researcher's OpenSSH would reach it: aliases, User, Port, IdentityFile, ProxyJump.

Lab boxes are usually reached through ``~/.ssh/config`` (an alias, a user, a key, a jump host).
Rather than re-implement its rules (Host patterns, Match, Include, tokens), we ask OpenSSH itself:
``ssh -G`` prints the configuration it would use for a destination. What the stack spells out
(``user@host:port``, ``sshKey``) wins over the file, as on ssh's own command line. Jump hosts are
resolved the same way, each in turn. The result is a plain SshHost that paramiko and the OpenSSH
command lines (rsync, ``gpu-train ssh``) both use, so the two never disagree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpu_train.stack.config import split_host
from gpu_train.stack.sshhost import SshHost
from gpu_train.stack.values import host_problem, login_problem

MAX_JUMPS = 8  # a loop in ProxyJump settings stops here
MAX_CONFIG_BYTES = 1 << 20  # an ssh_config bigger than this is not one

# What makes ``ssh -G`` (or any ssh reading the file) run a command, load code or read another file
# (ssh_config(5)): refused in any file but the user's own ~/.ssh/config. Keywords ending in "command"
# or "provider" are refused as a class, so one OpenSSH adds later is too.
RUNS_SOMETHING = {
    "include": "reads other files (which may say anything)",
    "permitlocalcommand": "lets LocalCommand run",
    "proxyusefdpass": "goes with a ProxyCommand",
    "match exec": "runs a command here each time ssh reads the file",
}


class SshConfigError(ValueError):
    """The ssh_config could not be read for a host; the message says which and why."""


def parse_dump(text: str) -> dict[str, list[str]]:
    """``ssh -G`` output ("key value" lines, keys lowercase) as key -> values (IdentityFile repeats)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def jump_specs(value: str) -> list[str]:
    """ProxyJump's value: comma-separated ``[user@]host[:port]`` hops (``ssh://`` URIs too); 'none' is none."""
    if not value or value.lower() == "none":
        return []
    return [hop.strip().removeprefix("ssh://") for hop in value.split(",") if hop.strip()]


def from_dump(dump: dict[str, list[str]], spec: str, keys: tuple[str, ...], jump: tuple[SshHost, ...]) -> SshHost:
    """The SshHost ``ssh -G`` describes (pure: the tests feed it tables of dumps).

    An ssh_config is input like a stack file (``sshConfig`` may name any file): its User and
    HostName are checked as the stack's own ``user@host`` is, because they go before the destination
    on OpenSSH and rsync command lines, where ``-oProxyCommand=...`` would run a command here.
    """
    user, host, port = dump["user"][0], dump["hostname"][0], dump["port"][0]
    why = login_problem(user) or host_problem(host)  # (a bad Port, ssh -G itself refuses)
    if why:
        raise SshConfigError(f"{spec}: the ssh_config gives User {user!r}, HostName {host!r}, Port {port!r}: {why}")
    return SshHost(user, host, int(port), spec=spec, keys=keys, jump=jump)


def identity_files(dump: dict[str, list[str]], key: str | None) -> tuple[str, ...]:
    """Keys to offer: the stack's ``sshKey`` alone, else the ssh_config's IdentityFiles that exist
    (OpenSSH lists its defaults, ~/.ssh/id_ed25519 and the like, when the file names none)."""
    if key:
        return (os.path.expanduser(key),)
    found = [os.path.expanduser(p) for p in dump.get("identityfile", [])]
    return tuple(dict.fromkeys(p for p in found if Path(p).is_file()))


def config_problems(data: bytes) -> list[str]:
    """What in an ssh_config file could run a command on this machine (pure; [] when nothing).

    Read as OpenSSH reads it, leaning to refusal: lines end at a newline only, a NUL ends a line,
    quotes and backslashes are dropped (OpenSSH takes ``"Match" "exec"`` as Match exec), words are
    split at whitespace and '=' and compared without case.
    """
    problems = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        line = raw.split(b"\0")[0].decode("utf-8", "replace")
        words = [w.lower() for w in re.split(r"[\s=]+", re.sub(r"[\"'\\]", "", line)) if w]
        if not words or words[0].startswith("#"):
            continue
        key = words[0]
        if key == "match" and any("exec" in w for w in words[1:]):
            why, key = RUNS_SOMETHING["match exec"], "Match exec"
        elif key in RUNS_SOMETHING:
            why = RUNS_SOMETHING[key]
        elif key.endswith("command"):
            why = "runs a command"
        elif key.endswith("provider"):
            why = "loads a library into ssh"
        else:
            continue
        problems.append(f"line {number}: {key} {why}")
    return problems


def own_config(path: str) -> bool:
    """Whether ``path`` is the user's own ~/.ssh/config (the one file ssh reads anyway)."""
    return os.path.realpath(path) == os.path.realpath(os.path.expanduser("~/.ssh/config"))


def checked_copy(path: str, folder: str) -> str:
    """A private copy of the ssh_config at ``path`` for ``ssh -F``, once nothing in it can run a command;
    raises SshConfigError naming each line. The copy is what was checked: the file cannot change in between."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise SshConfigError(f"gpu-train:sshConfig: cannot read {path}: {e.strerror}") from None
    problems = ["more than 1 MiB"] if len(data) > MAX_CONFIG_BYTES else config_problems(data)
    if problems:
        raise SshConfigError(
            f"gpu-train:sshConfig: {path} is not your own ~/.ssh/config, and ssh would run what it says: "
            + "; ".join(problems)
            + ". Remove those lines (a project's or a shared ssh_config may give HostName, "
            "User, Port, IdentityFile, ProxyJump), or move the host's block into your own ~/.ssh/config and "
            "remove gpu-train:sshConfig"
        )
    copy = os.path.join(folder, "ssh_config")
    with os.fdopen(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(data)
    return copy


def ssh_dump(host: str, user: str | None, port: int | None, config_file: str | None) -> dict[str, list[str]]:
    """Run ``ssh -G`` for one destination (the user's own config files unless ``config_file``);
    raises SshConfigError with OpenSSH's complaint."""
    argv = ["ssh", "-G", *(["-F", config_file] if config_file else [])]
    argv += ["-l", user] if user else []
    argv += ["-p", str(port)] if port else []
    result = subprocess.run([*argv, "--", host], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SshConfigError(f"ssh -G {host} (reading {config_file or '~/.ssh/config'}) failed: {result.stderr.strip()}")
    return parse_dump(result.stdout)


def resolve(spec: str, key: str | None = None, config_file: str | None = None, depth: int = 0) -> SshHost:
    """A stack's ``hosts`` entry resolved through the ssh_config (its jump hosts too).

    Without OpenSSH on this machine the entry is taken literally (current user, port 22).
    """
    user, host, port = split_host(spec)
    path = os.path.expanduser(config_file) if config_file else None
    if path and not Path(path).is_file():
        raise SshConfigError(f"gpu-train:sshConfig: no file at {path}")
    if not shutil.which("ssh"):
        return SshHost(
            user or os.environ.get("USER") or "root", host, port or 22, spec=spec, keys=(os.path.expanduser(key),) if key else ()
        )
    if path and not own_config(path):
        with tempfile.TemporaryDirectory(prefix="gpu-train-ssh-") as folder:
            copy = checked_copy(path, folder)
            try:
                dump = ssh_dump(host, user, port, copy)
            except SshConfigError as e:
                raise SshConfigError(str(e).replace(copy, path)) from None
    else:
        dump = ssh_dump(host, user, port, path)
    hops: list[SshHost] = []
    for hop in jump_specs(dump.get("proxyjump", [""])[0]):
        if depth + len(hops) >= MAX_JUMPS:
            raise SshConfigError(f"{spec}: more than {MAX_JUMPS} ProxyJump hops (a loop in {path or '~/.ssh/config'}?)")
        resolved = resolve(hop, None, config_file, depth + 1)
        hops.extend([*resolved.jump, _without_jump(resolved)])
    return from_dump(dump, spec, identity_files(dump, key), tuple(hops))


def _without_jump(host: SshHost) -> SshHost:
    return SshHost(host.user, host.host, host.port, spec=host.spec, keys=host.keys)
