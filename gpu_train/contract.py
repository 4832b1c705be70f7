"""The contract between the laptop and the on-host agent, written once.

Both sides import this module: the laptop as ``gpu_train.contract``, the host from the agent's zipapp. Run states, the job
spec the laptop sends, the records the agent keeps and the agent's settings with their defaults live here, the documents
the agent answers with beside it (gpu_train/answers.py), so no state name, field or default is spelled twice. Standard
library only, Python 3.8+ (it runs on whatever python3 the host has).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # (3.10's; the agent's Python 3.8 never evaluates the annotation)
    from typing import TypeGuard

from gpu_train.codec import Document
from gpu_train.containerspec import ContainerSpec, PinnedImage  # a run in an image: the contract's, apart


# -- run states -------------------------------------------------------------------------------
class RunState(str, Enum):
    """A run's state as the host records it (state.json) and reports it. A str, so the JSON and any
    comparison with a state read back from a file are the plain word."""

    STARTING = "starting"  # launched; the wrapper has not started the job yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # `fab stop`
    INTERRUPTED = "interrupted"  # the machine went down under it: `boot` resumes it

    def __str__(self) -> str:  # the word, in messages and f-strings, on every Python from 3.8
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED, INTERRUPTED = RunState
ACTIVE = (STARTING, RUNNING)  # a process is (or is about to be) at work
TERMINAL = (SUCCEEDED, FAILED, STOPPED)  # nothing will change it again, short of `fab resume`

# -- names both sides check ------------------------------------------------------------------
# A run id: AI Platform / Vertex's job naming rule (letters, digits, underscores, starting with a
# letter, at most 128 characters); ids are BASE_YYYYmmdd_HHMMSS.
RUN_ID_PATTERN = r"[A-Za-z][A-Za-z0-9_]{0,127}"
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
# A stack name: Pulumi's rule; it names local folders and the cluster's hosts too.
STACK_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"


def is_run_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a run id (or a run id's base: the same rule), the one check both sides make of
    an id they did not make themselves (a host's answer, a bucket's object name, a command line)."""
    return isinstance(value, str) and _RUN_ID_RE.fullmatch(value) is not None


LAUNCH_GRACE_S = 30  # a 'starting' run with no wrapper yet is still starting for this long


# -- a run's record on its host: runs/RUN/state.json ----------------------------------------------
@dataclass(frozen=True)
class RunRecord(PinnedImage, Document):
    """A run as its host records it (runs/RUN/state.json): written by the agent alone (launch, the wrapper,
    stop, boot, shutdown), read by it to answer `status` (RunStatus) and to stop, relaunch or resume. An
    older agent's record reads: what it lacks gets the default, what this agent no longer knows is dropped."""

    id: str = ""
    base: str | None = None
    state: RunState = STARTING
    created: float | None = None  # launched (epoch seconds); kept across relaunches
    started: float | None = None  # the job's process started (the latest start)
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None  # why it failed before its job could say (a refusal, maxResumes, a lost spec)
    resumes: int = 0  # relaunches so far ($GPU_TRAIN_RESUMES)
    preemptions: int = 0  # preemptions before the latest relaunch ...
    preempted: bool = False  # ... and whether the latest interruption was one
    returns: tuple[dict[str, Any], ...] = ()  # each way back from a preemption or host error (the recovery's record)
    interrupted_at: float | None = None
    relaunched: float | None = None
    ran_s: float = 0  # the job's run time in the legs before the latest relaunch (DURATION sums them)
    unit: str | None = None  # its systemd unit, where the host allows one (else screen alone)
    wrapper_pid: int | None = None  # the wrapper, the job and the step before it (pip, uv): a pid with its
    wrapper_start: str | None = None  # process's start time (procs.proc_start_time), to tell a reused pid
    pid: int | None = None
    pid_start: str | None = None
    step_pid: int | None = None
    step_start: str | None = None
    project: str | None = None  # the project's id (JobSpec.project): whose run this is on a shared host
    WHAT = "the run's state.json"


# -- REMOTE_ROOT when a stack does not set remoteRoot -------------------------------------------
# Hidden in the login's home, where no one clones a repository: the old default, ~/gpu-train, is
# where the README clones gpu-train itself, so a host you also work on got its runs inside your
# clone. An SSH host that has runs of ours under the old default keeps using it (remote/ssh/target.py
# asks once and says so). GCP VMs keep it: there it is the data disk's bind mount, made by the
# startup script when the VM was created, and a live VM's runs must not move out of sight.
REMOTE_ROOT_DEFAULT = "~/.gpu-train"
REMOTE_ROOT_BEFORE = "~/gpu-train"
GCP_REMOTE_ROOT = REMOTE_ROOT_BEFORE

# Whether a reboot resumes an SSH host's runs (launch's "bootResume"): its @reboot crontab line is
# there and a cron daemon runs it; not there; no crontab command; there, but no daemon runs.
BOOT_ON, BOOT_OFF, BOOT_NO_CRONTAB, BOOT_CRON_STOPPED = "on", "off", "no-crontab", "cron-stopped"


# -- the agent's settings: REMOTE_ROOT/agent.json ----------------------------------------------
@dataclass(frozen=True)
class AgentSettings(Document):
    """What the agent runs with: REMOTE_ROOT/agent.json (the stack's part, sent by `train` and `setup`) or,
    on a VM, root's MACHINE_SETTINGS, which also names whose REMOTE_ROOT it serves."""

    idle_stop_minutes: float = 0  # 0: never power off (SSH stacks unless asked; GCP stacks default to 30)
    max_resumes: int = 10
    ssh_port: int = 22
    poweroff_command: tuple[str, ...] = ("systemctl", "poweroff")
    gcp: bool = False
    max_run_hours: float | None = None
    shutdown_grace_s: float = 80  # SIGTERM to SIGKILL when the machine goes down: 25 on spot, 110 on standard VMs
    metadata_url: str | None = None  # Compute Engine's metadata server (None: $METADATA_URL_ENV, else METADATA_URL)
    user: str | None = None  # MACHINE_SETTINGS: the login whose REMOTE_ROOT the VM's units serve ...
    remote_root: str | None = None  # ... as the stack says it ('~/' is that login's home)
    WHAT = "the agent's settings"


METADATA_URL = "http://169.254.169.254/computeMetadata/v1/"
# On a VM: the startup script's root-owned settings (what the units run with), and the root idle clock.
MACHINE_SETTINGS = "/etc/gpu-train/agent.json"
MACHINE_IDLE = "/run/gpu-train/idle.json"

# Files in a run's folder: requests to the wrapper, and the early warning the job may watch.
STOP_REQUESTED = "stop-requested"
SHUTDOWN_REQUESTED = "shutdown-requested"
NOTICE = "notice"  # exists while a maintenance or preemption is announced; the job sees $GPU_TRAIN_NOTICE
# maxRunHours: Compute Engine stops the VM that long after each start (maxRunDuration); the job is told
# this long before, through the same notice file, so it saves a last checkpoint.
RUN_LIMIT_NOTICE_S = 600
RUN_LIMIT = "RUN_LIMIT"  # the event a notice names for that stop


def run_limit_at(now: float, uptime_s: float | None, max_run_hours: float | None) -> float | None:
    """When Compute Engine stops the VM for maxRunHours (epoch seconds): its boot (now - uptime) plus the
    cap, since maxRunDuration counts from each start; None without a cap or an uptime."""
    if not max_run_hours or uptime_s is None:
        return None
    return now - uptime_s + max_run_hours * 3600


# -- the job spec: what `fab train` asks a host to run -----------------------------------------
@dataclass(frozen=True)
class JobSpec(Document):
    """What `fab train` asks the host to run (``launch``'s argument, kept as runs/RUN/spec.json)."""

    run_id: str
    base: str
    script: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    expect_gpus: int = 0
    code_manifest: str | None = None  # hash of the code listing, so the host can skip an unchanged sync
    reuse_code: bool = False  # the host reuses that code if it has it, and then launches without waiting for "go"
    agent_settings: dict[str, object] = field(default_factory=dict)
    launcher: str = "none"  # or "torchrun"
    nproc: int | None = None  # processes per node (torchrun); default: the node's GPUs, or 1
    node: dict[str, object] | None = None  # rank, nnodes, masterAddr, masterPort, hosts, tfPort, ps
    project: str | None = None  # the project's id (gpu_train/ownership.py): REMOTE_ROOT/envs/ID, data/ID; whose run it is
    venv: bool = False  # run in the project's venv (made from ``python`` with its site packages), not in ``python``
    needs_torch: bool = False  # the host checks that its Python imports torch before "started"
    go_when: str | None = None  # in a fan-out, the host's own word that also means "go" (see GO_WHEN)
    notify: str | None = None  # the webhook (a secret): kept as REMOTE_ROOT/notify.url (0600), not in spec.json
    pass_job_dir: bool = False  # --script gets `--job-dir JOB_DIR` appended (AI Platform's convention), only if asked
    resume_args: tuple[str, ...] = ()  # appended at every relaunch (boot, preemption, `resume`) ...
    resume_if: str | None = None  # ... once this file or glob exists, relative to the working directory (runs/RUN/code)
    bucket: dict[str, str] | None = None  # {"name", "prefix", "data", "parts"}: JOB_DIR goes to gs://NAME/PREFIX as it is written
    bucket_data: tuple[dict[str, Any], ...] = ()  # DataManifest's: what `push --to bucket` sent; only these come down
    path: str | None = None  # set by launch on the host: the login's PATH, for relaunches without a login
    externally_managed: bool = False  # set by launch: the job's Python refuses installs of its own (PEP 668)
    container: ContainerSpec | None = None  # `--image` (or the stack's gpu-train:image): the job runs in a container
    pool: str | None = None  # `train --pools`: this node runs its pool's own job (its place in node_roles, checked there)
    WHAT, REQUIRED = "the job spec", ("run_id", "base")


def node_roles(nnodes: int, ps: int) -> list[str]:
    """Each node's pool by its rank, as AI Platform and Vertex AI lay a cluster out: node 0 the chief, then
    the workers, the last ``ps`` nodes parameter servers (TF_CONFIG's task types; `train --pools`)."""
    return ["chief"] + ["worker"] * (nnodes - 1 - ps) + ["ps"] * ps


# In a fan-out (several nodes, the code sent once), the laptop's "go" to a node's waiting launch is one
# long-link trip after the code arrived there, and it learns of the arrival one trip before that. So
# the hosts say it among themselves, over the cluster's own network: the hop's rsync leaves
# ``staging/RUN.arrived`` on a node when it has received the whole tree, and node 0's relay leaves
# ``staging/RUN.relayed`` on node 0 when every hop has ended (its staged folder, the hops' source,
# may move then). A launch told ``goWhen`` takes that file as its "go" (the laptop committed when it
# released the relay); the laptop's own "go" still works, after sending the code itself.
ARRIVED, RELAYED = "arrived", "relayed"
GO_WHEN = (ARRIVED, RELAYED)


def go_marker(root: str, run_id: str, when: str) -> str:
    """The file that means "go" for ``run_id``'s launch (``when``: one of GO_WHEN)."""
    return os.path.join(root, "staging", f"{run_id}.{when}")


# The job's environment: which start of the run this is (0 the first, N the Nth relaunch), REMOTE_ROOT, NOTICE's path.
RESUMES_ENV, ROOT_ENV, NOTICE_ENV = "GPU_TRAIN_RESUMES", "GPU_TRAIN_ROOT", "GPU_TRAIN_NOTICE"
IN_JOB_DIR = ("$JOB_DIR/", "${JOB_DIR}/")  # a --resume-if that starts so is a path in JOB_DIR (where the job is told to checkpoint)


def resume_if_path(resume_if: str, workdir: str, job_dir: str) -> str:
    """Where `--resume-if` looks: a file or glob in the job's working directory, or, written as the job's own
    code names it (``$JOB_DIR/ckpt.pt``), in its JOB_DIR; no other variable is expanded (the laptop refuses one)."""
    for prefix in IN_JOB_DIR:
        if resume_if.startswith(prefix):
            return os.path.join(job_dir, resume_if[len(prefix) :])
    return os.path.join(workdir, resume_if)


SWEEP_ENV, SLOT_ENV = "GPU_TRAIN_SWEEP", "GPU_TRAIN_SLOT"  # a sweep's trial: its sweep (RunStatus.sweep), its slot
# The host's own (the laptop's are gpu_train/environment.py's): another metadata server, authorized_keys.
METADATA_URL_ENV, AUTHORIZED_KEYS_ENV = "GPU_TRAIN_METADATA_URL", "GPU_TRAIN_AUTHORIZED_KEYS"


# -- the documents the agent answers with: gpu_train/answers.py (StatusDoc, RunStatus, Stopped, ...) ----


# -- a run's scalars: `scalars`'s answer (curves, a sweep's metric), read from what jobs write anywhere in
# JOB_DIR or the working directory: TensorBoard event files, JSONL metrics files ({"step": N, "loss": X}) and
# CSV metrics files (a header of names, a row a step: Lightning's CSVLogger writes lightning_logs/version_N/metrics.csv).
METRICS_FILE, METRICS_CSV = "*metrics*.jsonl", "*metrics*.csv"
SCALAR_POINTS, SCALAR_POINTS_MAX, SCALAR_SERIES_MAX = 500, 10000, 1000


class ScalarSeries(TypedDict):
    """One tag of one folder's event files (or of one JSONL or CSV file): its points, thinned evenly to the
    request's ``points`` (the first and last kept), and what the whole series says."""

    tag: str
    source: str  # the folder (event files) or file (JSONL, CSV), relative to the run's folder: job/..., code/...
    kind: str  # "tfevents", "jsonl" or "csv"
    points: list[list[Any]]  # [[step, value], ...] by step; a value that is not finite (NaN, inf) is null
    count: int  # points in the files (a resumed job's rewritten step N replaces the points from N on)
    last: list[Any]  # [step, value]; min and max: of the finite values, or null
    min: list[Any] | None
    max: list[Any] | None
    wallTime: float  # when the last point was written (epoch seconds)


@dataclass(frozen=True)
class Scalars(Document):
    """`scalars`'s answer: runs ({id, series: [ScalarSeries]}), at most ``points`` points a series and
    SCALAR_SERIES_MAX series in all (``truncated`` says some were left out)."""

    runs: tuple[dict[str, Any], ...] = ()
    problems: tuple[str, ...] = ()  # a corrupt record, an unreadable file: what was skipped
    points: int = SCALAR_POINTS
    truncated: bool = False
    WHAT = "the host's scalars"


# The fetch's sources: a run id (its JOB_DIR), or RUN/WORKDIR (the outputs in its working directory,
# which come home into runs/STACK/RUN/WORKDIR/); a listing row of kind UNREADABLE is something the host
# could not look into: [path, UNREADABLE, 0, 0, 0, why].
WORKDIR = "workdir"
UNREADABLE = "?"
# The run's own log (the job's stdout and stderr, the wrapper's lines: REMOTE_ROOT/runs/RUN/log) comes home
# with every fetch as runs/STACK/RUN/RUN_FILES/RUN_LOG, and goes to the bucket under the same name: a
# top-level name the run's folder keeps for gpu-train, so a JOB_DIR file called `log` never meets it. The
# fetch's source for it is RUN/RUN_FILES, which serves that one file and nothing else of the run's folder.
RUN_FILES = ".gpu-train"
RUN_LOG = "log"


# The log stream's markers on stderr: where it started reading, and the run's last word.
LOG_START = "GPU-TRAIN-START "
LOG_END = "GPU-TRAIN-END "

# The command the user runs on the laptop (`gpu-train` or `fab`), in the environment of every agent
# call, so that the fixes the agent's messages suggest name it; calls from a host's own units and
# cron (no laptop) get the default.
CLI_ENV = "GPU_TRAIN_CLI"
UNPACKED = ".agent-"  # REMOTE_ROOT/bin/.agent-CRC-SIZE: the bootstrap's unpacked copy of the zipapp
CLI_NAMES = ("gpu-train", "fab")


def cli_name(environ: dict[str, str] | None = None) -> str:
    """The laptop's command as the laptop named it, or ``gpu-train``."""
    name = (os.environ if environ is None else environ).get(CLI_ENV, "")
    return name if name in CLI_NAMES else CLI_NAMES[0]
