"""What the agent reports: each run's effective state, the status document, and the log stream."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from gpu_train.answers import AgentView, LogEnd, LogStart, RunStatus, StatusDoc, TreeSummary
from gpu_train.codec import answer
from gpu_train.contract import (
    ACTIVE,
    FAILED,
    INTERRUPTED,
    LAUNCH_GRACE_S,
    LOG_END,
    LOG_START,
    MACHINE_IDLE,
    MACHINE_SETTINGS,
    STARTING,
    SWEEP_ENV,
    TERMINAL,
    AgentSettings,
    RunRecord,
    RunState,
)
from gpu_train.retry import Backoff

from . import outputs, upload
from .procs import alive, gpus, uptime_s
from .store import (
    EVERY_RUN,
    AgentError,
    checked_settings,
    find_run,
    last_line,
    now,
    read_json,
    read_state,
    root_from_settings,
    run_dirs,
    run_project,
    settings,
    tree_summary,
)

if TYPE_CHECKING:
    from .store import Scope

# A followed log is read again 10 ms after it grew, then less and less often, up to every 0.3 s: a
# job's lines (its first after the start, its last before the end) show as they come, and a quiet
# log costs no more looks than a fixed 0.3 s poll did.
FOLLOW_POLL_S = (0.01, 0.3)
# A run being launched (logs --await-run): looked for every few ms, for as long as a launch told to go
# takes to write its record (milliseconds; a busy host's disk, seconds).
AWAIT_RUN_S = 30.0
AWAIT_POLL_S = (0.005, 0.05)
# Bytes of a log read and sent at a time, the next read at once: a follow resumed far behind (a laptop that
# slept for a night of a chatty job) or a whole log asked for costs the host this much memory, not the log's size.
READ_MAX = 1 << 20


def effective_state(state: RunRecord) -> RunState:
    """The recorded state, corrected by what is alive: a 'running' run with no process was interrupted."""
    recorded = state.state
    if recorded in TERMINAL or recorded == INTERRUPTED:
        return recorded
    if alive(state.pid, state.pid_start) or alive(state.wrapper_pid, state.wrapper_start):
        return recorded
    launching = recorded == STARTING and not state.wrapper_pid
    if launching and time.time() - (state.created or 0) < LAUNCH_GRACE_S:
        return recorded  # screen is starting the wrapper, which records its pid first thing
    return INTERRUPTED


def run_seconds(state: RunRecord, current: str, log_mtime: float | None, at: float) -> float | None:
    """How long the run's job has run, summed over its starts (`status`'s DURATION): the legs before this
    one (``ranS``, added up as each relaunch begins) and this one, from its job's start (on the first
    leg, from the launch while it installs) to its end: the one recorded (ended; interrupted, as the
    wrapper saw it go); after a hard kill, which records none, the log's last write; now while it runs.
    Time while the machine was down, or the run waited for `resume`, is not run time. None before any."""
    before = state.ran_s
    start = state.started or (None if before else state.created)
    if not start:
        return round(before, 1) if before else None
    if current in ACTIVE:
        end = at
    elif current == INTERRUPTED:
        cut = state.interrupted_at
        end = cut if cut and cut >= start else (log_mtime or start)
    else:
        end = state.ended or at
    return round(before + max(0.0, min(end, at) - start), 1)


def log_mtime(run_dir: str) -> float | None:
    try:
        return os.stat(os.path.join(run_dir, "log")).st_mtime
    except OSError:
        return None


def describe(run_dir: str) -> RunStatus:
    """One run as `status` reports it (answers.RunStatus)."""
    state = read_state(run_dir)
    st = effective_state(state)
    return answer(
        RunStatus,
        id=os.path.basename(run_dir),
        base=state.base,
        project=state.project or run_project(run_dir),
        state=st,
        exitCode=state.exit_code,
        created=state.created,
        started=state.started,
        ended=state.ended,
        durationS=run_seconds(state, st, log_mtime(run_dir) if st == INTERRUPTED else None, time.time()),
        jobDir=os.path.join(run_dir, "job"),
        log=os.path.join(run_dir, "log"),
        lastLine=last_line(os.path.join(run_dir, "log"), st == FAILED),
        resumes=state.resumes,
        preemptions=state.preemptions + int(state.preempted),
        returns=list(state.returns),
        reason=state.reason,
        pid=state.pid,
        **spec_view(run_dir, state),
        **({"bucket": bucket} if (bucket := upload.view(run_dir)) is not None else {}),
    )


def spec_view(run_dir: str, state: RunRecord) -> dict[str, Any]:
    """What `status` says from the run's spec: a container run's image as named and the ID it runs
    (RunStatus.image, imageId), a sweep trial's sweep (RunStatus.sweep); {} for a plain run."""
    doc = read_json(os.path.join(run_dir, "spec.json")) or {}
    container = doc.get("container")
    named = container.get("image") if isinstance(container, dict) else None
    env = doc.get("env")
    sweep = env.get(SWEEP_ENV) if isinstance(env, dict) else None
    return {
        **({"image": named, "imageId": state.image_id} if named else {}),
        **({"sweep": sweep} if isinstance(sweep, str) and sweep else {}),
    }


def is_active(run_dir: str) -> bool:
    return describe(run_dir)["state"] in ACTIVE


def active_runs(root: str, base: str = "") -> list[tuple[str, RunRecord]]:
    """The runs at work (those whose ids start with ``base``), each folder with its record. Only a state.json
    that says starting or running gets the contract's reading and the check of its processes (nothing
    else is ever at work: ``effective_state``): a host keeps hundreds of finished runs, and every launch
    asks twice."""
    found = []
    for run_dir in run_dirs(root):
        if not os.path.basename(run_dir).startswith(base):  # (a run's id starts with its base: jobs.run_id)
            continue
        if (read_json(os.path.join(run_dir, "state.json")) or {}).get("state") not in ACTIVE:
            continue
        state = read_state(run_dir)
        if effective_state(state) in ACTIVE:
            found.append((run_dir, state))
    return found


def busy_runs(root: str, base: str, project: str | None) -> list[str]:
    """The project's runs of name ``base`` still at work (another project's ``train`` is no clash)."""
    return [
        os.path.basename(d) for d, state in active_runs(root, base) if state.base == base and (state.project or run_project(d)) == project
    ]


def machine_settings(root: str) -> AgentSettings | None:
    """The VM's root-owned settings when they are this REMOTE_ROOT's (what its units run with)."""
    doc = read_json(MACHINE_SETTINGS)
    try:
        conf = checked_settings(doc, MACHINE_SETTINGS) if doc else None
        return conf if conf and root_from_settings(conf) == root else None
    except (AgentError, KeyError, OSError):
        return None


def agent_view(root: str) -> AgentView:
    """What `fab status` shows of the agent: its settings and the idle clock (answers.AgentView);
    on a VM, those of its units."""
    machine = machine_settings(root)
    conf = machine or settings(root)
    idle = read_json(MACHINE_IDLE if machine else os.path.join(root, "idle.json")) or {}
    return answer(
        AgentView,
        idleStopMinutes=conf.idle_stop_minutes,
        maxResumes=conf.max_resumes,
        maxRunHours=conf.max_run_hours,
        idleSince=idle.get("idleSince"),
        idleWhy=idle.get("why"),
        installed=bool(machine) or os.path.exists(os.path.join(root, "agent.json")),
    )


def cmd_status(root: str, run_id: str | None, summaries: bool = False, bucket_record: bool = False, scope: Scope = EVERY_RUN) -> StatusDoc:
    """answers.StatusDoc: the runs (oldest first), GPUs, uptime and the agent's view; ``bucket_record``: each
    bucket run's record of what is verified there (`down --no-fetch` only: one entry per file)."""
    dirs = [find_run(root, run_id, scope)] if run_id else run_dirs(root)  # (a prefix: the scope's runs first)
    runs = sorted((describe(d) for d in dirs), key=lambda r: r["created"] or 0)
    if summaries:
        runs = [
            answer(
                RunStatus,
                **r,
                jobSummary=tree_summary(r["jobDir"]),
                workdirSummary=outputs.summary(root, os.path.dirname(r["jobDir"])),
                logSummary=log_summary(r["log"]),
            )
            for r in runs
        ]
    if bucket_record:
        runs = [
            answer(RunStatus, **r, bucketRecord=upload.record_files(os.path.dirname(r["jobDir"]))) if "bucket" in r else r for r in runs
        ]
    return answer(
        StatusDoc, root=root, runs=runs, gpus=gpus(), uptimeS=uptime_s(), host=os.uname().nodename, agent=agent_view(root), now=now()
    )


def log_summary(path: str) -> TreeSummary:
    """answers.TreeSummary of the run's log (the fetch brings it home too: a log that grew is something to fetch)."""
    try:
        st = os.lstat(path)
    except OSError:
        return answer(TreeSummary, files=0, bytes=0, newestNs=0)
    return answer(TreeSummary, files=1, bytes=st.st_size, newestNs=st.st_mtime_ns)


def cmd_logs(
    root: str, run_id: str | None, offset: int, lines: int | None, follow: bool, scope: Scope = EVERY_RUN, await_run: bool = False
) -> int:
    """Write the log from a byte offset (or its last N lines); with follow, until the job ends.
    ``await_run``: the run ``run_id`` names exactly is being launched (`train --follow` asks as the launch
    answers): wait up to AWAIT_RUN_S for its record.

    The last line on stderr is a JSON trailer with the run's state and exit code.
    """
    if await_run and run_id:
        await_record(root, run_id)
    run_dir = find_run(root, run_id, scope)
    path = os.path.join(run_dir, "log")
    out = sys.stdout.buffer
    pos = offset
    if lines is not None and offset == 0:
        pos = tail_offset(path, lines)
    sys.stderr.write(LOG_START + json.dumps(answer(LogStart, offset=pos)) + "\n")
    sys.stderr.flush()
    wait = Backoff(*FOLLOW_POLL_S)
    while True:
        # The state before the read: a run seen ended has written its last line, so an empty read
        # after it is the end (read first, a line written between the read and the look is lost).
        ended = follow and effective_state(read_state(run_dir)) not in ACTIVE
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read(READ_MAX)
        except OSError:
            chunk = b""
        if chunk:
            out.write(chunk)
            out.flush()
            pos += len(chunk)
            wait = Backoff(*FOLLOW_POLL_S)
        if len(chunk) == READ_MAX:
            continue  # more is there
        if not follow or (ended and not chunk):
            break
        time.sleep(wait.next())
    info = describe(run_dir)
    sys.stderr.write(
        "\n" + LOG_END + json.dumps(answer(LogEnd, runId=info["id"], state=info["state"], exitCode=info["exitCode"], offset=pos)) + "\n"
    )
    return 0


def await_record(root: str, run_id: str) -> None:
    """Until the run ``run_id`` (an exact id) has its record, or AWAIT_RUN_S passed (find_run then says
    it is not there). The launch writes the record whole (atomic) once the run's folder is ready."""
    if os.sep in run_id or run_id in (".", ".."):
        return
    record = os.path.join(root, "runs", run_id, "state.json")
    wait = Backoff.within(AWAIT_RUN_S, *AWAIT_POLL_S)
    while not os.path.exists(record) and wait.left() > 0:
        time.sleep(wait.next())


def tail_offset(path: str, lines: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            block = min(size, 64 * 1024 + lines * 512)
            f.seek(size - block)
            data = f.read()
    except OSError:
        return 0
    cut = len(data)
    for _ in range(lines + (1 if data.endswith(b"\n") else 0)):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return size - block
    return size - block + cut + 1
