"""Each task's flags as one frozen, checked object (`train`'s: trainoptions.py, `sweep`'s: sweepoptions.py).

A task's signature stays what Invoke parses (the flags, help and defaults a user sees); its body reads
them once into its options here (`read`: Invoke's strings and Nones, each number within its bounds, a run
named as a run id, never a path) and hands them to a plain function. A bad combination of flags is a
UsageError naming the flag and the fix, from the constructor (`problem`, pure, tested by a table), before
anything is contacted or written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_train.contract import STACK_NAME_PATTERN
from gpu_train.errors import UsageError
from remote.tasks import trust
from remote.transfer.fetch.generator import DEFAULT_STREAMS

SOURCES = (None, "host", "bucket")  # fetch --from
DASHBOARD_INTERVAL_S = 5.0  # dashboard --interval's default
STACK_NAME_RE = re.compile(STACK_NAME_PATTERN)


class Checked:
    """Options whose ``problem()`` (a pure function of their fields) is raised when they are made."""

    def __post_init__(self) -> None:
        if said := self.problem():
            raise UsageError(said)

    def problem(self) -> str | None:
        return None


@dataclass(frozen=True)
class FetchOptions(Checked):
    run: str | None = None
    all: bool = False
    dest: str | None = None
    watch: bool = False
    interval: float = 30.0
    node: int = 0
    all_nodes: bool = False
    streams: int = DEFAULT_STREAMS
    stack: str | None = None
    as_json: bool = False
    source: str | None = None  # --from: the host (None, `host`) or `bucket`
    sweep: str | None = None
    all_projects: bool = False

    @classmethod
    def read(
        cls,
        *,
        run: str | None = None,
        interval: str | None = None,
        node: str | None = None,
        streams: str | None = None,
        sweep: str | None = None,
        **rest: Any,
    ) -> FetchOptions:
        return cls(
            streams=parse_streams(streams),
            run=trust.run_option(run),
            interval=trust.number("--interval", 30 if interval is None else interval, float, 0),
            node=trust.number("--node", node or 0, int, 0),
            sweep=None if sweep is None else trust.run_option(sweep, "--sweep"),
            **rest,
        )

    def problem(self) -> str | None:
        if self.source not in SOURCES:
            return f"--from {self.source}: `host` (the default) or `bucket`"
        if self.sweep is not None and (self.run or self.all or self.dest):
            return "--sweep fetches every trial of a sweep: give no --run, --all or --dest with it"
        if self.watch and self.all_nodes and self.sweep is None and self.source != "bucket":
            return "--watch follows one node: give --node N (default 0), not --all-nodes"
        return None


@dataclass(frozen=True)
class LogsOptions(Checked):
    run: str | None = None
    follow: bool = False
    lines: int = 50  # shown first; 0: the whole log
    node: int = 0
    all_nodes: bool = False  # --all
    stack: str | None = None
    all_projects: bool = False

    @classmethod
    def read(cls, *, run: str | None = None, lines: str | None = None, node: str | None = None, **rest: Any) -> LogsOptions:
        return cls(
            run=trust.run_option(run),
            lines=trust.number("--lines", 50 if lines is None else lines, int, 0),
            node=trust.number("--node", node or 0, int, 0),
            **rest,
        )


@dataclass(frozen=True)
class StopOptions(Checked):
    run: str | None = None
    grace: float = 10.0
    stack: str | None = None
    as_json: bool = False
    sweep: str | None = None  # a sweep's trials instead (as `sweep stop`)
    all_projects: bool = False

    @classmethod
    def read(cls, *, run: str | None = None, grace: str | None = None, sweep: str | None = None, **rest: Any) -> StopOptions:
        named = None if sweep is None else trust.run_option(sweep, "--sweep") or ""
        return cls(run=trust.run_option(run), grace=_grace(grace), sweep=named, **rest)

    def problem(self) -> str | None:
        return "--run or --sweep, not both" if self.run and self.sweep is not None else None


@dataclass(frozen=True)
class ResumeOptions(Checked):
    run: str | None = None
    grace: float = 10.0
    stack: str | None = None
    as_json: bool = False
    force: bool = False
    all_projects: bool = False

    @classmethod
    def read(cls, *, run: str | None = None, grace: str | None = None, **rest: Any) -> ResumeOptions:
        return cls(run=trust.run_option(run), grace=_grace(grace), **rest)


@dataclass(frozen=True)
class DownOptions(Checked):
    """`down`: every run of every node home (or verified in the bucket), then the stack's machines go."""

    force: bool = False
    streams: int = DEFAULT_STREAMS
    stack: str | None = None
    no_fetch: bool = False  # nothing downloaded: every run verified in gpu-train:bucket instead
    all_projects: bool = False

    @classmethod
    def read(cls, *, streams: str | None = None, **rest: Any) -> DownOptions:
        return cls(streams=parse_streams(streams), **rest)


@dataclass(frozen=True)
class DashboardOptions(Checked):
    """`dashboard`: the live page, on a loopback address only (the page is this user's, and its secret
    travels in the URL)."""

    interval: float = DASHBOARD_INTERVAL_S  # seconds between two looks at each stack
    port: int = 0  # 0: any free one
    address: str = "127.0.0.1"
    no_browser: bool = False
    as_json: bool = False

    @classmethod
    def read(cls, *, interval: str | None = None, port: str | None = None, **rest: Any) -> DashboardOptions:
        return cls(
            interval=trust.number("--interval", DASHBOARD_INTERVAL_S if interval is None else interval, float, 1, 3600),
            port=trust.number("--port", 0 if port is None else port, int, 0, 65535),
            **rest,
        )

    def problem(self) -> str | None:
        import ipaddress

        try:
            ok = ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            ok = False
        if ok:
            return None
        return f"--address {self.address!r}: the dashboard listens on a loopback address only (127.0.0.1, or another 127.x.y.z)"


def parse_streams(value: str | int | None) -> int:
    """--streams as a number (the tasks default it to None, not an int: Invoke would parse an int
    default itself and fail on "abc" with a traceback instead of this message)."""
    if value is None:
        return DEFAULT_STREAMS
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= 64:
        raise UsageError(f"--streams {value}: a number of parallel SSH streams from 1 to 64 (default {DEFAULT_STREAMS})")
    return n


def _grace(value: str | float | None) -> float:
    return trust.number("--grace", 10 if value is None else value, float, 0, 86400)


@dataclass(frozen=True)
class ServeOptions(Checked):
    """`tensorboard` and `jupyter`: a server on the host (or TensorBoard here over fetched runs), opened here."""

    kind: str  # tensorboard or jupyter
    stack: str | None = None
    local_port: int | None = None
    as_json: bool = False
    run: str | None = None  # tensorboard: this run's folders (with --fetched: runs/STACK/RUN)
    logdir: str | None = None  # tensorboard: a log directory on the host
    fetched: bool = False  # tensorboard: here, over what `fetch` brought home
    dir: str | None = None  # jupyter: the notebook root on the host

    @classmethod
    def read(cls, kind: str, *, local_port: str | None = None, **rest: Any) -> ServeOptions:
        return cls(kind, local_port=trust.number("--local-port", local_port, int, 1, 65535), **rest)


@dataclass(frozen=True)
class ImportOptions(Checked):
    """`import`: a job config file, or gcloud's command (its words), into a stack file and a train command."""

    file: str | None = None  # the job's config (YAML or JSON); None: gcloud's command
    gcloud: tuple[str, ...] = ()  # gcloud's words, when the source is `gcloud`
    gcloud_option: str | None = None  # --gcloud as given (only with source `gcloud`)
    stack: str | None = None
    region: str | None = None
    project: str | None = None
    ssh_from: tuple[str, ...] = ()
    stacks_dir: str | None = None
    force: bool = False
    as_json: bool = False

    @classmethod
    def read(
        cls, source: str, *, gcloud: str | None = None, argv: Sequence[str] = (), ssh_from: str | None = None, **rest: Any
    ) -> ImportOptions:
        """``argv``: the command line, whose words after `--` are gcloud's as typed (Invoke joins them)."""
        from gpu_train.importing import gcloud_flags

        words: tuple[str, ...] = ()
        if source == "gcloud":
            typed = list(argv)[list(argv).index("--") + 1 :] if "--" in argv else []
            words = tuple(typed or gcloud_flags.split_gcloud_command(gcloud or ""))
        return cls(
            file=None if source == "gcloud" else source,
            gcloud=words,
            gcloud_option=gcloud,
            ssh_from=tuple(ssh_from or ()),
            **rest,
        )

    def problem(self) -> str | None:
        if self.file is None and not self.gcloud:
            return 'import gcloud: give gcloud\'s command after `--` (gpu-train) or as --gcloud "..."'
        if self.file is not None and self.gcloud_option:
            return f"--gcloud goes with `import gcloud`, not with a file ({self.file})"
        return None


@dataclass(frozen=True)
class InitOptions(Checked):
    """`init`: a starter stack, an SSH host's (--host) or a GCP VM's (--gcp-project)."""

    stack: str | None = None
    host: str | None = None
    key: str | None = None  # SSH stack
    gcp_project: str | None = None
    zone: str | None = None  # GCP stack, as gpu and on_demand
    gpu: str = "nvidia-l4"
    on_demand: bool = False

    @property
    def kind(self) -> str:
        return "ssh" if self.host else "gcp"

    @property
    def name(self) -> str:
        """The stack's name: --stack, else lab (an SSH host) or gcp."""
        return self.stack or ("lab" if self.host else "gcp")

    def problem(self) -> str | None:
        from gpu_train.stack import config

        if bool(self.host) == bool(self.gcp_project):
            return "give --host USER@HOST[:PORT] (a machine you have) or --gcp-project ID (a VM on Google Cloud)"
        if not STACK_NAME_RE.fullmatch(self.name):
            return f"--stack {self.name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)"
        if self.host:
            from gpu_train.stack.values import host_problem, login_problem

            try:
                user, host, _ = config.split_host(self.host)
            except ValueError:
                return f"--host {self.host!r}: write it as user@host:port or a Host alias"
            if why := (login_problem(user) if user else None) or host_problem(host):  # (the stack's own rules)
                return f"--host {self.host!r}: {why}; write it as user@host:port or a Host alias"
        return None
