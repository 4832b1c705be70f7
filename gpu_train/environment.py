"""Everything a laptop command takes from the world it runs in, read once (as HTTPie's ``Environment``).

Each entry point (the `gpu-train` and `fab` tasks, scripts/plan, preflight, up, setup) builds one
``Environment`` from ``os.environ`` and its streams, and passes it in: a task gets it with
``Environment.of(c)``, a script's ``main`` builds it. Below them, code takes an ``env`` argument and never
reads ``os.environ`` for a ``GPU_TRAIN_*`` setting (tests/unit/test_environment.py holds that), so a test hands
in the Environment it wants instead of swapping the process's. Each setting is declared once below, with
its variable, its type and its default; a bad value is an error naming the variable and the fix.
The host's variables (the job's and the agent's) are the contract's: gpu_train/contract.py.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

from gpu_train import identity
from gpu_train.errors import UsageError
from gpu_train.stack import project as projects
from gpu_train.stack import stackfile

# The command the user typed, said in every fix we suggest: `gpu-train`, or `fab` inside this clone. Read
# once, here, from this process's argv; everything on the laptop names it through this (or an
# Environment's ``cli``, which is this unless a test hands another argv0). The host's side hears it in
# the agent's environment (contract.CLI_ENV, cli_name).
CLI = projects.command_name(sys.argv[0])

COMPUTE = "https://compute.googleapis.com"
SERVICEUSAGE = "https://serviceusage.googleapis.com"
CLOUDQUOTAS = "https://cloudquotas.googleapis.com"
SSH_CONFIG_CHOICES = {"include": True, "yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}


class SettingError(UsageError):
    """A ``GPU_TRAIN_*`` variable with a value it cannot have: bad input, before anything is done."""


def _path(name: str, value: str) -> Path:
    return Path(value).expanduser()


def _url(name: str, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise SettingError(f"{name}={value!r} is not a URL: set it to http(s)://HOST[:PORT], or unset it for Google's")
    return value.rstrip("/")


def _flag(name: str, value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no")


def _ssh_config(name: str, value: str) -> bool | None:
    choice = value.strip().lower()
    if choice not in SSH_CONFIG_CHOICES:
        raise SettingError(f"{name}={value!r}: set it to include or no (or unset it to be asked once)")
    return SSH_CONFIG_CHOICES[choice]


def _text(name: str, value: str) -> str:
    return value


def variable(name: str, parse: Callable[[str, str], Any], why: str) -> dict[str, Any]:
    """A field's metadata: read from ``$name`` (an empty value is unset), typed by ``parse(name, value)``."""
    return {"variable": name, "parse": parse, "why": why}


@dataclass(frozen=True)
class Environment:
    """The streams, the command's name, the project, the state home, the clock and the settings."""

    # -- the GPU_TRAIN_* settings: each read here and nowhere else on the laptop -------------------
    stack: str | None = field(default=None, metadata=variable("GPU_TRAIN_STACK", _text, "the stack when --stack is not given"))
    stacks_dir: Path | None = field(
        default=None,
        metadata=variable("GPU_TRAIN_STACKS_DIR", _path, "another directory of stack files (--stacks-dir), after the project's stacks/"),
    )
    home: Path | None = field(
        default=None,
        metadata=variable(
            "GPU_TRAIN_HOME",
            _path,
            "the laptop's records (stack outputs, known_hosts, ssh aliases, pushed data); else "
            "~/.local/state/gpu-train/projects/NAME-HASH/ per project (aliases: ~/.ssh/gpu-train)",
        ),
    )
    project: Path | None = field(
        default=None,
        metadata=variable("GPU_TRAIN_PROJECT", _path, "the user's project outright, for scripts run elsewhere; else found from the cwd"),
    )
    debug: bool = field(default=False, metadata=variable("GPU_TRAIN_DEBUG", _flag, "an unexpected error prints its traceback"))
    ssh_config: bool | None = field(
        default=None,
        metadata=variable("GPU_TRAIN_SSH_CONFIG", _ssh_config, "include | no: whether to add the ssh aliases' Include line, unasked"),
    )
    compute_endpoint: str = field(
        default=COMPUTE, metadata=variable("GPU_TRAIN_COMPUTE_ENDPOINT", _url, "another Compute API (tests run a local one)")
    )
    serviceusage_endpoint: str = field(
        default=SERVICEUSAGE, metadata=variable("GPU_TRAIN_SERVICEUSAGE_ENDPOINT", _url, "another Service Usage API")
    )
    cloudquotas_endpoint: str = field(
        default=CLOUDQUOTAS, metadata=variable("GPU_TRAIN_CLOUDQUOTAS_ENDPOINT", _url, "another Cloud Quotas API")
    )
    # -- the world the command runs in -------------------------------------------------------------
    cli: str = "gpu-train"  # what the user typed: `gpu-train`, or `fab` inside this clone (for the fixes we suggest)
    cwd: Path = field(default_factory=Path.cwd)
    stdin: TextIO = field(default=sys.stdin, repr=False)
    stdout: TextIO = field(default=sys.stdout, repr=False)
    stderr: TextIO = field(default=sys.stderr, repr=False)
    stdin_isatty: bool = False
    stdout_isatty: bool = False
    stderr_isatty: bool = False
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)

    @classmethod
    def from_os(cls, environ: Mapping[str, str] | None = None, argv0: str | None = None, **given: Any) -> Environment:
        """The Environment of this process: ``environ`` (default ``os.environ``), the real streams and cwd;
        ``given`` fields win (``stacks_dir`` from --stacks-dir). SettingError names a bad variable."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.metadata.get("variable")
            if name and environ.get(name, "").strip():
                values[f.name] = f.metadata["parse"](name, environ[name].strip())
        values.update(
            cli=CLI if argv0 is None else projects.command_name(argv0),
            stdin=sys.stdin,
            stdout=sys.stdout,
            stderr=sys.stderr,
            stdin_isatty=_isatty(sys.stdin),
            stdout_isatty=_isatty(sys.stdout),
            stderr_isatty=_isatty(sys.stderr),
        )
        values.update(given)
        return cls(**values)

    @staticmethod
    def of(c: Any) -> Environment:
        """The Environment of a task's Invoke Context: the one the program built, else built now from the
        process (`fab`, whose program is Fabric's own) and kept in the Context's config for the next task."""
        env = c.config.get(CONFIG_KEY)
        if isinstance(env, Environment):
            return env
        made = Environment.from_os()
        c.config[CONFIG_KEY] = made
        return made

    def replace(self, **changes: Any) -> Environment:
        return dataclasses.replace(self, **changes)

    @cached_property
    def project_root(self) -> Path:
        """$GPU_TRAIN_PROJECT, else the nearest directory at or above the cwd with a ``stacks/`` or ``.git``,
        else the cwd."""
        return self.project.resolve() if self.project is not None else projects.project_root(self.cwd)

    @property
    def found_project(self) -> Path | None:
        """The project when one was named or found; None when the cwd is in none."""
        return self.project_root if self.project is not None else projects.find_project(self.cwd)

    @property
    def stack_dirs(self) -> list[Path]:
        """Where stack files are looked for, in order: the project's stacks/, $GPU_TRAIN_STACKS_DIR, the examples."""
        return projects.stack_dirs(self.project_root, self.stacks_dir)

    @property
    def state_home(self) -> Path:
        """The laptop's records of this project (stack outputs: the hosts' addresses; known_hosts): $GPU_TRAIN_HOME,
        else the user's own folder for this project (``user_home``/projects/NAME-HASH, keyed by its path); never
        the project's tree, where a project copied without git (a ZIP, `cp -r`, a synced drive) brought the
        addresses and pinned keys of someone else's hosts along."""
        return self.home if self.home is not None else projects.state_folder(self.user_home, self.project_root)

    @property
    def user_home(self) -> Path:
        """The user's own records, never a project's (a project copied with its .gpu-train/ is not the user's
        word): $GPU_TRAIN_HOME, else $XDG_STATE_HOME/gpu-train (default ~/.local/state/gpu-train)."""
        if self.home is not None:
            return self.home
        state = os.environ.get("XDG_STATE_HOME", "").strip()
        return (Path(state) if state and Path(state).is_absolute() else Path.home() / ".local" / "state") / "gpu-train"

    def project_of(self, path: Path | None = None) -> tuple[Path, str]:
        """(the project folder ``path`` (default: the cwd) belongs to, its id): gpu_train/identity.py. A
        path outside the project root belongs to the root's project."""
        path = (path or self.cwd).resolve()
        root = self.project_root
        return identity.project_for(self.state_home, path if path == root or path.is_relative_to(root) else root, root)

    def scope(self, everything: bool = False) -> identity.Scope:
        """The runs the defaults keep to: the cwd's project and the projects beneath it (their ids), and the
        runs from before ids of the project root's name; ``everything`` (--all-projects): every run."""
        folder, _ = self.project_of()
        scope = identity.ProjectIds(self.state_home).scope(folder, projects.project_name(self.project_root))
        return dataclasses.replace(scope, everything=everything)

    def stack_file(self, name: str) -> Path:
        """The stack ``name``'s file along ``stack_dirs``; ConfigError (with close names and the fix) when none."""
        return stackfile.stack_file(name, self.stack_dirs, self.cli)

    @property
    def new_stacks_dir(self) -> Path:
        """Where new stack files go: $GPU_TRAIN_STACKS_DIR (--stacks-dir), else the project's stacks/."""
        return self.stacks_dir if self.stacks_dir is not None else self.project_root / "stacks"

    def exported(self) -> dict[str, str]:
        """The settings as variables, for a process of ours this one starts (scripts/up from a task)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            name, value = f.metadata.get("variable"), getattr(self, f.name)
            if name and value != f.default:
                out[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


CONFIG_KEY = "gpu_train_environment"  # where a task's Invoke Context keeps the Environment


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by a test, or closed
        return False


def settings() -> list[tuple[str, str, str]]:
    """(variable, default, what it does) for each setting, for the docs and `--help`."""
    return [
        (f.metadata["variable"], "" if f.default is None else str(f.default), f.metadata["why"])
        for f in dataclasses.fields(Environment)
        if "variable" in f.metadata
    ]
