"""A run's and the machine's life: stop, resume, boot after a reboot, shutdown, the idle clock, setup."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

from gpu_train import recovery
from gpu_train.answers import BootAction, Booted, Configured, Resumed, RunInterrupted, ShutDown, Stopped, Ticked, Uncronned
from gpu_train.codec import answer
from gpu_train.contract import (
    ACTIVE,
    FAILED,
    INTERRUPTED,
    MACHINE_IDLE,
    NOTICE,
    SHUTDOWN_REQUESTED,
    STARTING,
    STOP_REQUESTED,
    STOPPED,
    TERMINAL,
    AgentSettings,
    RunRecord,
)

from . import containerrun, hostcheck, registry, units
from .launch import start_wrapper
from .procs import alive, gpus, signal_group, ssh_sessions, sshd_sessions
from .prune import refuse_pruned
from .status import describe, effective_state, log_mtime, run_seconds
from .store import (
    EVERY_RUN,
    AgentError,
    agent_log,
    agent_path,
    find_run,
    locked,
    machine_mode,
    now,
    read_json,
    read_spec,
    read_state,
    run_dirs,
    run_locked,
    settings,
    spec_or_none,
    update_state,
    write_json,
    write_settings,
)
from .watch import metadata_value, own_instance, told_preempted

if TYPE_CHECKING:
    from .store import Scope


def cmd_stop(root: str, run_id: str | None, grace: float, scope: Scope = EVERY_RUN) -> Stopped:
    """SIGINT, a grace period, SIGTERM, another, then SIGKILL, to the step at work (the job, or pip
    while requirements install); the wrapper then starts nothing more. Nothing of the run is left.
    (The laptop picks the run `stop` without --run means: gpu_train.identity.running_run.)"""
    run_dir = find_run(root, run_id, scope)
    info = describe(run_dir)
    if info["state"] not in ACTIVE:
        if info.get("image"):  # a container its run's end left behind (its client and wrapper killed)
            containerrun.stop(root, info["id"], grace)
        return answer(Stopped, runId=info["id"], state=info["state"], signals=[])
    with run_locked(run_dir):  # the wrapper starts no step while we hold it: we see the step it started
        open(os.path.join(run_dir, STOP_REQUESTED), "w").close()
        state = read_state(run_dir)
    sent = []
    steps = [(state.pid, state.pid_start), (state.step_pid, state.step_start)]
    ctr = containerrun.of_run(root, run_dir)  # a container run: its job ends when its container does
    for pid, started in steps:  # the job, else pip
        if not (pid and alive(pid, started)):
            continue
        job = ctr if pid == state.pid else None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if not signal_group(pid, sig) and not containerrun.kill(job, sig):  # (its client gone: the container itself)
                break
            sent.append(sig.name)
            if containerrun.ended(pid, started, job, grace if sig != signal.SIGKILL else 5):
                break
        break
    if ctr:  # its client signalled (and passed the signals on) or gone: the container by name
        containerrun.stop(root, info["id"], 0 if sent else grace)  # a job signalled already had its graces
    deadline = time.time() + 10
    while time.time() < deadline and alive(state.wrapper_pid, state.wrapper_start):
        time.sleep(0.1)
    if state.unit:
        units.stop_unit(state.unit)  # whatever of the run is left (a daemon the job spawned)
    if effective_state(read_state(run_dir)) not in TERMINAL:
        update_state(run_dir, state=STOPPED, ended=now())  # the wrapper was gone: record it ourselves
    return answer(Stopped, runId=info["id"], state=describe(run_dir)["state"], signals=sent)


def cmd_boot(root: str, once_per_boot: bool = False) -> Booted:
    """After a reboot, preemption or maintenance: relaunch every run that was running, same RUN_ID
    and JOB_DIR, so a job that resumes from its newest checkpoint carries on. maxResumes stops a
    crash loop. Each run on its own: one that cannot be relaunched is failed with the reason, the
    others carry on. ``once_per_boot`` (the boot unit): a second call in the same boot does nothing,
    so a resume is counted once per boot."""
    limit = settings(root).max_resumes
    actions: list[BootAction] = []
    if not os.path.isdir(os.path.join(root, "runs")):
        return answer(Booted, actions=[])  # no run yet (a VM's first boot)
    with locked(root):
        if once_per_boot:
            key, record = units.boot_key(), os.path.join(root, "boot.json")
            if (read_json(record) or {}).get("bootKey") == key:
                return answer(Booted, actions=[], skipped="boot ran already in this boot")
            write_json(record, {"bootKey": key, "at": now()})
        for run_dir in run_dirs(root):
            run_id = os.path.basename(run_dir)
            try:
                action = boot_one(root, run_dir, limit)
            except Exception as e:  # this run only: the others are still resumed
                reason = f"could not be resumed: {e}" if isinstance(e, AgentError) else f"could not be resumed: {e!r}"
                with contextlib.suppress(Exception):
                    update_state(run_dir, state=FAILED, ended=now(), reason=reason)
                    agent_log(root, f"{run_id}: {reason}")
                action = answer(BootAction, runId=run_id, action="failed", reason=reason)
            if action:
                actions.append(action)
    return answer(Booted, actions=actions)


def boot_one(root: str, run_dir: str, limit: int) -> BootAction | None:
    state = read_state(run_dir)
    run_id = os.path.basename(run_dir)
    conf = settings(root)
    current = effective_state(state)
    if current == FAILED and lost_group(conf, run_dir, state):
        back = recovery.run_return(recovery_record(conf), state.ended, now())
        agent_log(
            root,
            f"{run_id}: its part failed as the cluster lost a node ({recovery.describe(recovery_record(conf))}); relaunched with the group",
        )
    elif current == INTERRUPTED:
        back = came_back(conf, state)
    else:
        return None
    resumes = state.resumes
    if resumes >= limit:
        reason = f"interrupted {resumes + 1} times; not resumed again (maxResumes = {limit})"
        update_state(run_dir, state=FAILED, ended=now(), reason=reason)
        agent_log(root, f"{run_id}: {reason}")
        return answer(BootAction, runId=run_id, action="failed", reason=reason)
    read_spec(run_dir)  # an AgentError saying what is wrong with it: the run cannot be relaunched
    relaunch(root, run_dir, state, back)
    return answer(BootAction, runId=run_id, action="resumed", resumes=resumes + 1)


def recovery_record(conf: AgentSettings) -> dict[str, Any]:
    """On a VM: the stack's recovery function's record of this machine (its labels, which the metadata
    server does not show: instances.get of itself, with its own token), or {}."""
    if not conf.gcp:
        return {}
    return recovery.record_of(own_instance(conf) or {})


def lost_group(conf: AgentSettings, run_dir: str, state: RunRecord) -> bool:
    """This failed run is a cluster part that failed because the recovery stopped its group (see
    recovery.lost_its_group)."""
    spec = spec_or_none(run_dir)
    node: dict[str, Any] = (spec and spec.node) or {}
    nnodes = int(node.get("nnodes") or 1)
    return nnodes > 1 and recovery.lost_its_group(recovery_record(conf), state.ended, nnodes)


def came_back(conf: AgentSettings, state: RunRecord) -> dict[str, Any] | None:
    """On a VM the stack's recovery function started again: its record of the preemption (or host error)
    that interrupted this run, for the run's own record."""
    return recovery.run_return(recovery_record(conf), state.interrupted_at, now())


def relaunch(root: str, run_dir: str, state: RunRecord, back: dict[str, Any] | None = None) -> None:
    """Start a run again under screen, same RUN_ID and JOB_DIR, counting the resume (and ``back``: the
    recovery's return that brought the machine back, kept in the run's ``returns``)."""
    for marker in (SHUTDOWN_REQUESTED, STOP_REQUESTED, NOTICE):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(run_dir, marker))
    resumes = state.resumes + 1
    ran = run_seconds(state, effective_state(state), log_mtime(run_dir), now())  # the legs so far: DURATION goes on
    update_state(
        run_dir,
        state=STARTING,
        created=now() if state.created is None else state.created,
        resumes=resumes,
        wrapper_pid=None,
        wrapper_start=None,
        pid=None,
        pid_start=None,
        step_pid=None,
        step_start=None,
        relaunched=now(),
        ended=None,
        started=None,
        ran_s=ran or 0,
        exit_code=None,
        reason=None,
        preemptions=state.preemptions + int(state.preempted),
        preempted=False,
        **({"returns": (*state.returns, back)[-50:]} if back else {}),
    )
    start_wrapper(root, os.path.basename(run_dir))
    agent_log(root, f"{os.path.basename(run_dir)}: resumed ({resumes})")


def cmd_resume(root: str, run_id: str | None, grace: float, scope: Scope = EVERY_RUN, force: bool = False) -> Resumed:
    """Restart one run's part on this host (the laptop does it on every node: the whole group). A
    single-node run still at work is refused unless ``force``: its work since the last checkpoint would
    be lost (a cluster's part is restarted: another node's loss is why a cluster is resumed)."""
    run_dir = find_run(root, run_id, scope)
    refuse_pruned(run_dir)
    spec = spec_or_none(run_dir)
    if describe(run_dir)["state"] in ACTIVE and not force and not (spec is not None and spec.node):
        run = os.path.basename(run_dir)
        raise AgentError(
            f"{run} is still running: resuming it stops it first, and its work since the last checkpoint is "
            f"lost; to restart it anyway: resume --run {run} --force"
        )
    if describe(run_dir)["state"] in ACTIVE:
        secrets = registry.kept(root, os.path.basename(run_dir))
        cmd_stop(root, os.path.basename(run_dir), grace)
        registry.keep(root, os.path.basename(run_dir), secrets)  # its stop ended it; its relaunch pulls as it did
    state = read_state(run_dir)
    with locked(root):
        relaunch(root, run_dir, state)
    return answer(Resumed, runId=os.path.basename(run_dir), resumes=state.resumes + 1)


def preempted(conf: AgentSettings) -> bool:
    """Compute Engine's word on whether this stop is a preemption (False off GCP). One query of 2 s at
    most: a run in a unit of its own gets its SIGTERM only after the shutdown command, so every second
    spent here is taken from the job's grace."""
    return metadata_value(conf, "instance/preempted", timeout=2).upper() == "TRUE"


def cmd_shutdown(root: str, grace: float | None = None) -> ShutDown:
    """The machine is going down: record each running run as interrupted (preempted when Compute
    Engine says so now, or said so to a running run through gpu-train-watch). A run in a unit of its
    own is ordered to stop after this, and its unit gives it SIGTERM and the grace; a run under screen
    alone gets SIGTERM here, and ``grace`` seconds."""
    conf = settings(root)
    grace = conf.shutdown_grace_s if grace is None else grace
    said = conf.gcp and preempted(conf)
    active = [(d, st) for d in run_dirs(root) if effective_state(st := read_state(d)) in ACTIVE]
    # gpu-train-watch may have told a running run already: the machine's preemption, even when the
    # query above got no answer in time (a busy metadata server).
    was_preempted = said or (conf.gcp and any(told_preempted(d) for d, _ in active))
    running, result = [], []  # (result: answers.RunInterrupted)
    for run_dir, state in active:
        open(os.path.join(run_dir, SHUTDOWN_REQUESTED), "w").close()
        update_state(run_dir, preempted=was_preempted)
        agent_log(root, f"{os.path.basename(run_dir)}: interrupted by shutdown (preempted: {was_preempted})")
        if state.unit:
            result.append(answer(RunInterrupted, runId=os.path.basename(run_dir), state=INTERRUPTED))
            continue
        if state.pid and alive(state.pid, state.pid_start):
            signal_group(state.pid, signal.SIGTERM)
        running.append((run_dir, state, containerrun.of_run(root, run_dir)))
    deadline = time.time() + grace
    for _, st, ctr in running:  # (each job's end: a container run's is its container's)
        containerrun.ended(st.pid, st.pid_start, ctr, deadline - time.time())
    # Give the wrappers a moment to record the exit codes, then make sure every run says interrupted.
    settle = time.time() + 2
    while time.time() < settle and any(alive(st.wrapper_pid, st.wrapper_start) for _, st, _ in running):
        time.sleep(0.1)
    for run_dir, _, ctr in running:
        if ctr:  # the grace is over: its container too, by name
            containerrun.stop(root, os.path.basename(run_dir), 0)
        current = read_state(run_dir)
        if current.state not in TERMINAL:
            update_state(run_dir, state=INTERRUPTED, interrupted_at=current.interrupted_at or now())
        result.append(answer(RunInterrupted, runId=os.path.basename(run_dir), state=describe(run_dir)["state"]))
    return answer(ShutDown, runs=result, preempted=was_preempted)


def idle_decision(
    now_s: float, idle_since: float | None, minutes: float, jobs_running: int, sessions: int, gpu_util: float
) -> tuple[float | None, bool, str]:
    """(idle since, power off now?, why). Idle means: no job, no SSH session, GPUs under 5% busy."""
    if minutes <= 0:
        return None, False, "idle stop is off"
    busy = []
    if jobs_running:
        busy.append(f"{jobs_running} job(s) running")
    if sessions:
        busy.append(f"{sessions} SSH session(s) open")
    if gpu_util >= 5:
        busy.append(f"GPU {gpu_util:.0f}% busy")
    if busy:
        return None, False, "busy: " + ", ".join(busy)
    since = now_s if idle_since is None else idle_since
    idle_min = (now_s - since) / 60
    if idle_min >= minutes:
        return since, True, f"idle {idle_min:.0f} min, limit {minutes:g}: powering off"
    return since, False, f"idle {idle_min:.0f} min, stops at {minutes:g}"


def cmd_tick(root: str) -> Ticked:
    """Every minute or so: power the machine off when it has been idle for idleStopMinutes.

    On a VM (the root timer, `--settings`) it reads the runs, writes only its own idle clock, counts
    sshd's sessions on any port, and powers off with `systemctl poweroff`, never a command from a
    file the user can write. Elsewhere (the user's crontab) it uses the user's settings."""
    conf = settings(root)
    machine = machine_mode()
    path = MACHINE_IDLE if machine else os.path.join(root, "idle.json")
    from .sweep import pending

    jobs = sum(1 for d in run_dirs(root) if effective_state(read_state(d)) in ACTIVE) + pending(root)  # a queue's trials are work
    util = max((g["utilization"] for g in gpus()), default=0.0)
    sessions = sshd_sessions() if machine else ssh_sessions(conf.ssh_port)
    since, stop, why = idle_decision(time.time(), (read_json(path) or {}).get("idleSince"), conf.idle_stop_minutes, jobs, sessions, util)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, {"idleSince": since, "why": why, "checked": now(), "root": root})
    if stop:
        if not machine:
            agent_log(root, why)
        subprocess.run(["systemctl", "poweroff"] if machine else list(conf.poweroff_command), check=False)
    return answer(Ticked, idleSince=since, poweroff=stop, why=why)


def cmd_configure(root: str, new: dict[str, Any], cron: bool) -> Configured:
    """Write agent.json; with ``cron``, run `boot` at reboot (and `tick` every minute when idle stop is on)."""
    conf = write_settings(root, new)
    if not cron:
        return answer(Configured, settings=conf.to_json())
    if not shutil.which("crontab"):
        raise AgentError(
            "crontab is not installed on this host (sudo apt-get install cron); or run `gpu-train-agent boot` from your own boot hook"
        )
    lines = hostcheck.cron_lines(root, agent_path(root), conf.idle_stop_minutes > 0)
    hostcheck.set_cron(root, lines)
    return answer(Configured, settings=conf.to_json(), crontab=lines, bootResume=hostcheck.boot_resume(root))


def cmd_uncron(root: str) -> Uncronned:
    """Take this root's crontab lines away (`down` on an SSH stack): nothing of ours is left to run."""
    return answer(Uncronned, removed=hostcheck.set_cron(root, []) if hostcheck.crontab() is not None else [])
