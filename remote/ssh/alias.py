"""`ssh gpu-train-STACK`: an ssh_config alias per stack, written at first contact, never a silent edit.

The first task that reaches a stack writes ``Host gpu-train-STACK`` into gpu-train's own include
file, with our key and known_hosts, and says so once. Only ``gpu-train-`` names: a stack's name (a
shared stack may be called ``github.com``) never shadows a real host. The files live in a folder of
the user's (``~/.ssh/gpu-train``, or ``$GPU_TRAIN_HOME``), never in a project, where any file that
appeared would become part of every ssh the user runs. Making OpenSSH read that file needs one ``Include`` line in ~/.ssh/config: that
line is added only when you say so (asked once on a terminal, or ``gpu-train ssh-config``, or
``GPU_TRAIN_SSH_CONFIG=include``), and ``gpu-train ssh-config --remove`` takes it and the aliases
away again. A GCP VM's new address after a restart simply rewrites its alias.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_train.atomic import atomic_write
from gpu_train.environment import Environment
from gpu_train.stack.project import command_name, project_name

if TYPE_CHECKING:
    from remote.ssh.target import Target

MARK = "# gpu-train: ssh aliases (`gpu-train ssh-config --remove` undoes this)"
CHOICE_ENV = "GPU_TRAIN_SSH_CONFIG"  # include | no: answer the question without asking (Environment.ssh_config)


def own_home(env: Environment) -> Path:
    """The user's own folder for aliases and the answer given once: $GPU_TRAIN_HOME (the user's setting),
    else ~/.ssh/gpu-train; never the project's .gpu-train (a project's files are not the user's word)."""
    return env.home if env.home is not None else Path.home() / ".ssh" / "gpu-train"


def alias_dir(home: Path) -> Path:
    return home / "ssh_config.d"


def user_config() -> Path:
    return Path.home() / ".ssh" / "config"


def include_line(home: Path) -> str:
    """Only the files gpu-train writes (gpu-train-*.conf), not whatever else lands in the folder."""
    return f'Include "{alias_dir(home)}/gpu-train-*.conf"'


def _quote(value: str) -> str:
    if not value or re.search(r"[\s\"\x00-\x1f]", value):
        if re.search(r"[\"\x00-\x1f]", value):
            raise ValueError(f"{value!r} cannot be written into an ssh_config file")
        return f'"{value}"'
    return value


def entry(
    stack: str,
    hosts: list[tuple[str, str, int]],
    key_file: str,
    known_hosts: str,
    proxies: list[str] | None = None,
    name: str | None = None,
    project: Path | None = None,
) -> str:
    """The Host blocks for one stack: node 0 as ``gpu-train-STACK``, node N as ``gpu-train-STACK-N``.

    Without ``key_file`` (keys from ssh-agent and the user's ssh_config) no IdentityFile is
    pinned; ``proxies`` gives each host's ProxyCommand (its jump hosts), or "" for none.
    """
    name = name or f"gpu-train-{stack}"
    blocks = [f"# written by gpu-train for stack {stack}"] + ([f"{OWNER}{json.dumps(str(project))}"] if project else [])
    for i, (user, host, port) in enumerate(hosts):
        names = [name] if i == 0 else [f"{name}-{i}"]
        keys = f"  IdentityFile {_quote(key_file)}\n  IdentitiesOnly yes\n" if key_file else ""
        proxy = f"  ProxyCommand {proxies[i]}\n" if proxies and proxies[i] else ""
        blocks.append(
            f"Host {' '.join(names)}\n  HostName {_quote(host)}\n  User {_quote(user)}\n  Port {port}\n"
            f"{keys}{proxy}  UserKnownHostsFile {_quote(known_hosts)}\n"
            "  StrictHostKeyChecking yes\n  ServerAliveInterval 15"
        )
    return "\n".join(blocks) + "\n"


OWNER = "# project: "  # the alias file's second line: whose project's stack it is (a JSON string)


def owner(path: Path) -> str | None:
    """The project an alias file was written for; "" for a file of an older gpu-train (no owner said);
    None when there is no file."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:2]
    except OSError:
        return None
    with contextlib.suppress(ValueError, IndexError):
        if lines[1].startswith(OWNER):
            return str(json.loads(lines[1][len(OWNER) :]))
    return ""


def alias_for(stack: str, project: Path, home: Path, unowned: Callable[[str], str] | None = None) -> str:
    """The alias of ``project``'s stack: ``gpu-train-STACK`` unless another project's stack of that name has it
    (a cloned project's `lab` must not take over yours), then ``gpu-train-STACK.PROJECT`` (and a hash of its
    path when that is taken too). A file of an older gpu-train, which says no owner, is adopted only when it
    is already, byte for byte, what this project would write there without an owner (``unowned(name)``):
    the same hosts, key, known_hosts and ProxyCommand, so taking it changes where no ssh goes. One that
    differs is some project's, which one cannot be known: it is left as it is (at_first_contact says how to
    give it to this project: delete it)."""
    from gpu_train.stack.project import state_folder

    base = f"gpu-train-{stack}"
    for name in (base, f"{base}.{project_name(project)}", f"{base}.{state_folder(Path(), project).name}"):
        path = alias_dir(home) / f"{name}.conf"
        whose = owner(path)
        if whose in (None, str(project)):
            return name
        if whose == "" and unowned is not None:
            with contextlib.suppress(OSError):
                if path.read_text(encoding="utf-8", errors="replace") == unowned(name):
                    return name
    raise ValueError(f"the ssh aliases for stack {stack} are other projects' (in {alias_dir(home)})")


def write_alias(target: Target, home: Path, project: Path) -> tuple[str, bool]:
    """Write (or refresh) the stack's alias file for ``project``; (alias, whether it is new)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", target.stack):
        raise ValueError(f"stack name {target.stack!r} cannot be an ssh host alias")
    from remote.ssh.openssh import proxy_command

    def text_for(name: str, project: Path | None) -> str:
        return entry(
            target.stack,
            [(h.user, h.host, h.port) for h in target.hosts],
            target.key_file,
            str(target.known_hosts),
            [proxy_command(target, h) for h in target.hosts],
            name,
            project,
        )

    name = alias_for(target.stack, project, home, lambda n: text_for(n, None))
    path = alias_dir(home) / f"{name}.conf"
    text = text_for(name, project)
    new = not path.is_file()
    if new or path.read_text() != text:
        atomic_write(path, text)
    return name, new


def included(home: Path) -> bool:
    conf = user_config()
    return conf.is_file() and include_line(home) in conf.read_text()


def _without_ours(lines: list[str]) -> list[str]:
    """``lines`` less each of our comments and the Include after it (this version's, or an older one's
    that included a project's folder), and the blank line add_include put after them."""
    keep: list[str] = []
    skip = 0
    for ln in lines:
        if ln.rstrip("\n") == MARK:
            skip = 2
            continue
        if skip == 2 and ln.lstrip().lower().startswith("include"):
            skip = 1
            continue
        if skip == 1 and not ln.strip():
            skip = 0
            continue
        skip = 0
        keep.append(ln)
    return keep


def add_include(home: Path) -> Path:
    """Put the Include line first in ~/.ssh/config (Include must come before any Host block), in
    place of an older one of ours; a symbolic link is edited where it points. Raises OSError with
    the line to add when the file cannot be written."""
    conf = user_config()
    existing = conf.read_text() if conf.is_file() else ""
    if include_line(home) not in existing:
        rest = "".join(_without_ours(existing.splitlines(keepends=True)))
        try:
            atomic_write(conf, f"{MARK}\n{include_line(home)}\n\n{rest}" if rest else f"{MARK}\n{include_line(home)}\n")
        except OSError as e:
            raise OSError(
                f"cannot write {os.path.realpath(conf)} ({e.strerror or e}): add this line at its top yourself:\n    {include_line(home)}"
            ) from None
    return conf


def remove(home: Path) -> list[str]:
    """Take out our Include line (and its comment) and every alias file; what was done."""
    done = []
    conf = user_config()
    if conf.is_file():
        lines = conf.read_text().splitlines(keepends=True)
        keep = [ln for ln in _without_ours(lines) if ln.rstrip("\n") != include_line(home)]
        if len(keep) != len(lines):
            atomic_write(conf, "".join(keep))
            done.append(f"removed the Include line from {conf}")
    for f in sorted(alias_dir(home).glob("gpu-train-*.conf")) if alias_dir(home).is_dir() else []:
        f.unlink()
        done.append(f"removed {f}")
    return done


def _choice_path(home: Path) -> Path:
    return home / "ssh-config-choice.json"


def decide_include(home: Path, ask: Callable[[str], str] | None, say: Callable[[str], None], setting: bool | None = None) -> bool:
    """Whether to add the Include line: the setting ($GPU_TRAIN_SSH_CONFIG), else the answer given once,
    else ask (on a terminal)."""
    if setting is not None:
        return setting
    try:
        return bool(json.loads(_choice_path(home).read_text())["include"])
    except (OSError, ValueError, KeyError):
        pass
    if ask is None:
        say(
            f"  to make it work in plain `ssh`, add this line to the top of {user_config()} "
            f"(or run `{command_name(sys.argv[0])} ssh-config`):\n    {include_line(home)}"
        )
        return False
    answer = ask(f"Add `{include_line(home)}` to {user_config()} so `ssh gpu-train-STACK` works? [y/N] ").strip().lower()
    choice = answer in ("y", "yes")
    atomic_write(_choice_path(home), json.dumps({"include": choice}))
    if not choice:
        say(f"  not added (asked once; `{command_name(sys.argv[0])} ssh-config` adds it later, {CHOICE_ENV}=include answers it)")
    return choice


def terminal_ask(env: Environment) -> Callable[[str], str] | None:
    """A question to the user at the terminal; None when stdin is none (a script, CI: nobody to answer)."""
    if not env.stdin_isatty:
        return None

    def ask(question: str) -> str:
        try:
            return input(question)
        except EOFError:
            return ""

    return ask


def at_first_contact(
    target: Target,
    home: Path,
    say: Callable[[str], None],
    ask: Callable[[str], str] | None = None,
    setting: bool | None = None,
    project: Path | None = None,
) -> str:
    """Write or refresh the alias after a task reached the stack; the first time, say so (and ask once).

    Never fails the task: a problem with the alias is said, and the task goes on."""
    try:
        alias, new = write_alias(target, home, project or Path.cwd())
    except (OSError, ValueError) as e:
        say(f"ssh alias not written: {e}")
        return ""
    if new and alias != f"gpu-train-{target.stack}":
        taken = alias_dir(home) / f"gpu-train-{target.stack}.conf"
        theirs = owner(taken)
        whose = theirs or f"an older gpu-train's, for another host; to give it to this project, delete {taken}"
        say(f"ssh alias gpu-train-{target.stack} is another project's ({whose}): this project's stack {target.stack} is {alias}")
    if new:
        say(f"ssh alias: ssh {alias}, also for rsync, scp and editors' remote-SSH (written to {alias_dir(home) / (alias + '.conf')})")
        if not included(home) and decide_include(home, ask, say, setting):
            try:
                say(f"  added `{include_line(home)}` to {add_include(home)}")
            except OSError as e:
                say(f"  {e}")
    return alias
