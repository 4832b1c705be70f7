"""The contract's answers: every document the agent says back to the laptop, declared once.

The agent builds each through ``codec.answer(Kind, ...)`` and the laptop reads it through
``codec.check(Kind, ...)`` (for a subcommand's answer, ``ANSWERS``: remote/ssh/agentcall.py): the same
declaration on both sides, every key present but a ``NotRequired`` one, no other, each value as
declared. A new field is one line here (``NotRequired`` where the agent leaves it out). The keys are the
wire's (camelCase). Standard library only, Python 3.8+: the agent's zipapp carries it (a TypedDict's
annotations stay text, so ``str | None`` and ``NotRequired`` never run there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, final

from gpu_train.bucketdoc import BucketFile, BucketProbe, BucketView
from gpu_train.contract import RunState, Scalars

if TYPE_CHECKING:
    from typing import NotRequired

    ListingRow = tuple[str, str, int, int, int, str]  # RunListing's row, for the code that builds or reads one


# -- `status` --------------------------------------------------------------------------------------
class TreeSummary(TypedDict):
    """Files, bytes and newest change of a JOB_DIR: equal summaries mean nothing to fetch."""

    files: int
    bytes: int
    newestNs: int


class RunStatus(TypedDict):
    """One run as `status` describes it (the summaries only with --summaries, ``bucket`` with a bucket)."""

    id: str
    base: str | None
    project: str | None  # whose run: the project's id (gpu_train/identity.py); a run from before ids: its folder's name
    state: RunState  # the effective one: a 'running' run with no process is 'interrupted'
    exitCode: int | None
    created: float | None
    started: float | None
    ended: float | None
    durationS: float | None
    jobDir: str
    log: str
    lastLine: str
    resumes: int
    preemptions: int
    returns: list[dict[str, Any]]  # each preemption (or host error) and return: event, at, back, attempts
    reason: str | None
    pid: int | None
    jobSummary: NotRequired[TreeSummary]
    workdirSummary: NotRequired[TreeSummary]  # the outputs in its working directory (agent's outputs.py)
    logSummary: NotRequired[TreeSummary]  # its log (RUN_LOG), which the fetch brings home too
    bucket: NotRequired[BucketView]
    image: NotRequired[str | None]  # a container run: its image as named ...
    imageId: NotRequired[str | None]  # ... and the ID it runs
    sweep: NotRequired[str]  # a sweep's trial: the sweep's name (its spec's GPU_TRAIN_SWEEP; absent for a run of its own)
    bucketRecord: NotRequired[
        dict[str, BucketFile]
    ]  # with --summaries: what the uploader verified (`down --no-fetch` checks the bucket for it)


class AgentView(TypedDict):
    """What `fab status` shows of the agent: its settings and the idle clock."""

    idleStopMinutes: float
    maxResumes: int
    maxRunHours: float | None
    idleSince: float | None
    idleWhy: str | None
    installed: bool


class GpuRow(TypedDict):
    index: int
    name: str
    utilization: float
    memoryUsedMiB: float
    memoryTotalMiB: float


class StatusDoc(TypedDict):
    """`status`'s answer: the host's runs (oldest first), GPUs and agent."""

    root: str
    runs: list[RunStatus]
    gpus: list[GpuRow]
    uptimeS: float | None
    host: str
    agent: AgentView
    now: float


# -- `logs`: the stream's marks on stderr (contract.LOG_START, contract.LOG_END) ---------------------
class LogStart(TypedDict):
    offset: int  # where the agent started reading the log


class LogEnd(TypedDict):
    runId: str
    state: RunState
    exitCode: int | None
    offset: int  # where it stopped: a dropped stream resumes there


# -- `launch`: its first line with --await-go, then its answer ----------------------------------------
class Ready(TypedDict):
    ready: bool  # the checks passed: the agent waits for "go" (or "abort"), unless it reused the code
    reused: bool  # the last run's code was reused: no sync is needed, and the agent launches without a "go"


class Waiting(TypedDict):
    waiting: str  # why the run cannot start yet (the NVIDIA driver still loading)


class Launched(TypedDict):
    runId: str
    runDir: str
    jobDir: str
    log: str
    screen: str
    python: str  # the job's Python (its venv's, where it has one)
    dataDir: str
    warnings: list[str]  # who else uses the GPUs, other runs of ours still going
    bootResume: NotRequired[str]  # an SSH host: whether a reboot resumes it (contract.BOOT_*)


class LaunchOutcome(TypedDict):
    """`launch-outcome --run RUN [--sweep NAME]`: what became of a start whose answer the laptop lost with its
    connection, final (agent/outcome.py): it started (``launched``: the launch's own answer, Launched; with
    --sweep, the sweep's start's, SweepStarted, RUN its staged code's name) or never will (``reason``)."""

    runId: str
    launched: Launched | SweepStarted | None
    reason: str | None


# -- `stop`, `resume`, `boot`, `shutdown`, `tick` ---------------------------------------------------
class Stopped(TypedDict):
    runId: str
    state: RunState
    signals: list[str]  # the signals sent (SIGINT, SIGTERM, SIGKILL), none when it had ended


class Resumed(TypedDict):
    runId: str
    resumes: int  # its relaunches, this one included


class BootAction(TypedDict):
    runId: str
    action: str  # resumed, failed
    reason: NotRequired[str]  # failed: why
    resumes: NotRequired[int]  # resumed: its relaunches, this one included


class Booted(TypedDict):
    actions: list[BootAction]
    skipped: NotRequired[str]  # why it did nothing (boot ran already in this boot)
    sweepStarted: NotRequired[list[str]]  # the sweeps' trials it started into free slots


class RunInterrupted(TypedDict):
    runId: str
    state: RunState


class ShutDown(TypedDict):
    runs: list[RunInterrupted]
    preempted: bool


class Ticked(TypedDict):
    idleSince: float | None
    poweroff: bool
    why: str
    sweepStarted: NotRequired[list[str]]  # the sweeps' trials it started into free slots


# -- `configure`, `uncron`, `prune` ---------------------------------------------------------------
class Configured(TypedDict):
    settings: dict[str, Any]  # the settings written (contract.AgentSettings' document)
    crontab: NotRequired[list[str]]  # with --cron: this root's crontab lines ...
    bootResume: NotRequired[str]  # ... and whether a reboot resumes runs now (contract.BOOT_*)


class Uncronned(TypedDict):
    removed: list[str]  # the crontab lines taken out


class PrunedRun(TypedDict):
    id: str
    files: int
    freedBytes: int | None  # None on a dry run (a file linked from a newer run's code frees nothing)


class KeptRun(TypedDict):
    id: str
    why: str


class Pruned(TypedDict):
    pruned: list[PrunedRun]
    kept: list[KeptRun]
    dryRun: bool


# -- a cluster's code hop: `authorize`, `unauthorize` ----------------------------------------------
class Authorized(TypedDict):
    authorized: str  # the authorized_keys file
    added: bool  # False: the line was there already


class Unauthorized(TypedDict):
    authorized: str
    removed: bool


class Hopped(TypedDict):
    """`relay-code`: a line per node as node 0's rsync to it ends."""

    node: int
    error: NotRequired[str]  # why the code did not reach it


# -- a sweep on its host: `sweep-start`, `sweep-advance`, `sweep-stop`, `sweep-status` ------------------
class SweepStarted(TypedDict):
    sweep: str
    trials: int  # this node's
    slots: int
    started: list[str]  # the trials' runs started now
    waiting: NotRequired[str]  # what the host waits for (as Waiting's): nothing was kept or started, the laptop asks again


class SweepAdvanced(TypedDict):
    started: list[str]


class SweepStopped(TypedDict):
    sweep: str
    stopped: list[str]  # the trials' runs stopped


class SweepTrial(TypedDict):
    runId: str
    index: int
    node: int
    values: dict[str, Any]  # its parameters' values
    state: str  # pending (no run yet), refused, or its run's effective state
    durationS: float | None
    last: float | None  # the metric's last value ...
    best: float | None  # ... and its best (lowest with mode min, highest with max)


class SweepStatus(TypedDict):
    sweep: str
    node: int
    mode: str
    stopped: bool
    slots: list[list[int]]  # each slot's GPUs
    blocked: str | None  # why the latest launch was refused before its run existed (retried; never "error")
    trials: list[SweepTrial]
    problems: list[str]
    tags: list[str]  # with a --metric no trial logged: the tags they did log (sorted, a few), to name the right one


# -- `fetch-serve`: the fetch stream's documents (agent/fetchserve.py; remote/transfer/fetch/) -----------
# Each is zlib-compressed JSON after a {"len": N, "zlib": true} line; a range's framing is gpu_train/fetchwire.py's.


@final  # (no other key: the codec refuses one; so `"error" in doc` tells them apart)
class Refusal(TypedDict):
    """What the host says instead: of a source it does not list, of a file it does not hash, of a
    request it cannot read (the whole answer then)."""

    error: str


@final
class RunListing(TypedDict):
    """One source's rows: [path ('/'-separated, under the source), kind (f, d, l, or contract.UNREADABLE),
    size, mtimeNs, mode, link target (of an unreadable one: why)]."""

    entries: list[tuple[str, str, int, int, int, str]]


class Listed(TypedDict):
    """`{"op": "list", "runs": [SOURCE, ...]}`: each source (RUN, RUN/workdir, RUN/.gpu-train) listed or refused."""

    runs: dict[str, RunListing | Refusal]


@final
class Hashed(TypedDict):
    """One item of a `hash` request: the SHA-256 of each block of the range, of the whole range, and the
    file's identity read after (size, mtimeNs, inode)."""

    sha256: list[str]
    whole: str
    stat: tuple[int, int, int]


class Hashes(TypedDict):
    """`{"op": "hash", "items": [[SOURCE, PATH, OFF, LEN, BLOCK], ...]}`: an answer per item, in order."""

    items: list[Hashed | Refusal]


class Pong(TypedDict):
    """`{"op": "ping"}`: nothing (the laptop times one round trip)."""


# The answer of each subcommand that answers with one document (the laptop checks it by this table).
ANSWERS: dict[str, Any] = {
    "status": StatusDoc,
    "stop": Stopped,
    "launch-outcome": LaunchOutcome,
    "resume": Resumed,
    "boot": Booted,
    "shutdown": ShutDown,
    "tick": Ticked,
    "configure": Configured,
    "uncron": Uncronned,
    "prune": Pruned,
    "authorize": Authorized,
    "unauthorize": Unauthorized,
    "bucket-check": BucketProbe,
    "scalars": Scalars,
    "sweep-start": SweepStarted,
    "sweep-advance": SweepAdvanced,
    "sweep-stop": SweepStopped,
    "sweep-status": SweepStatus,  # (a Document: the contract's dataclass, read by attribute)
}
