"""A run's and the machine's life: stop, resume, boot after a reboot, shutdown, the idle clock, setup."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from .launch import start_wrapper
from .procs import alive, gpus, signal_group, ssh_sessions
from .protocol import ACTIVE, FAILED, INTERRUPTED, STARTING, STOPPED, TERMINAL
from .status import describe, effective_state
from .store import (
    AgentError,
    agent_log,
    agent_path,
    find_run,
    locked,
    now,
    read_json,
    read_state,
    run_dirs,
    settings,
    update_state,
    write_json,
)

METADATA = "http://169.254.169.254/computeMetadata/v1/instance/"


def cmd_stop(root: str, run_id: str | None, grace: float) -> dict:
    """SIGINT, a grace period, SIGTERM, another, then SIGKILL, to the job's process group."""
    run_dir = find_run(root, run_id)
    state = read_state(run_dir)
    info = describe(run_dir)
    if info["state"] not in ACTIVE:
        return {"runId": info["id"], "state": info["state"], "signals": []}
    open(os.path.join(run_dir, "stop-requested"), "w").close()
    pid = state.get("pid")
    sent = []
    if pid and alive(pid, state.get("pidStart")):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if not signal_group(pid, sig):
                break
            sent.append(sig.name)
            deadline = time.time() + (grace if sig != signal.SIGKILL else 5)
            while time.time() < deadline and alive(pid, state.get("pidStart")):
                time.sleep(0.1)
            if not alive(pid, state.get("pidStart")):
                break
    wrapper = state.get("wrapperPid")
    deadline = time.time() + 5
    while time.time() < deadline and alive(wrapper, state.get("wrapperStart")):
        time.sleep(0.1)
    if effective_state(read_state(run_dir)) not in TERMINAL:
        update_state(run_dir, state=STOPPED, ended=now())  # the wrapper was gone: record it ourselves
    return {"runId": info["id"], "state": describe(run_dir)["state"], "signals": sent}


def cmd_boot(root: str) -> dict:
    """After a reboot, preemption or maintenance: relaunch every run that was running, same RUN_ID
    and JOB_DIR, so a job that resumes from its newest checkpoint carries on. maxResumes stops a
    crash loop."""
    limit = int(settings(root)["maxResumes"])
    actions: list[dict] = []
    with locked(root):
        for run_dir in run_dirs(root):
            state = read_state(run_dir)
            run_id = os.path.basename(run_dir)
            if effective_state(state) != INTERRUPTED:
                continue
            resumes = int(state.get("resumes", 0))
            if resumes >= limit:
                reason = f"interrupted {resumes + 1} times; not resumed again (maxResumes = {limit})"
                update_state(run_dir, state=FAILED, ended=now(), reason=reason)
                agent_log(root, f"{run_id}: {reason}")
                actions.append({"runId": run_id, "action": "failed", "reason": reason})
                continue
            relaunch(root, run_dir, state)
            actions.append({"runId": run_id, "action": "resumed", "resumes": resumes + 1})
    return {"actions": actions}


def relaunch(root: str, run_dir: str, state: dict) -> None:
    """Start a run again under screen, same RUN_ID and JOB_DIR, counting the resume."""
    for marker in ("shutdown-requested", "stop-requested"):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(run_dir, marker))
    resumes = int(state.get("resumes", 0)) + 1
    update_state(run_dir, state=STARTING, created=state.get("created", now()), resumes=resumes,
                 wrapperPid=None, wrapperStart=None, pid=None, pidStart=None, relaunched=now(), ended=None,
                 exitCode=None, reason=None,
                 preemptions=int(state.get("preemptions", 0)) + int(bool(state.get("preempted"))), preempted=False)
    start_wrapper(root, os.path.basename(run_dir))
    agent_log(root, f"{os.path.basename(run_dir)}: resumed ({resumes})")


def cmd_resume(root: str, run_id: str | None, grace: float) -> dict:
    """Restart one run's part on this host (the laptop does it on every node: the whole group)."""
    run_dir = find_run(root, run_id)
    if describe(run_dir)["state"] in ACTIVE:
        cmd_stop(root, os.path.basename(run_dir), grace)
    state = read_state(run_dir)
    with locked(root):
        relaunch(root, run_dir, state)
    return {"runId": os.path.basename(run_dir), "resumes": int(state.get("resumes", 0)) + 1}


def preempted() -> bool:
    """Compute Engine's word on whether this stop is a preemption (False off GCP)."""
    import urllib.request

    req = urllib.request.Request(METADATA + "preempted", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=1) as r:
            return r.read().decode().strip().upper() == "TRUE"
    except OSError:
        return False


def cmd_shutdown(root: str, grace: float) -> dict:
    """The machine is going down: SIGTERM each job so it saves a last checkpoint, wait up to
    ``grace`` seconds, record the runs as interrupted (preempted when Compute Engine says so)."""
    was_preempted = settings(root)["gcp"] and preempted()
    running = []
    for run_dir in run_dirs(root):
        state = read_state(run_dir)
        if effective_state(state) not in ACTIVE:
            continue
        open(os.path.join(run_dir, "shutdown-requested"), "w").close()
        if state.get("pid") and alive(state["pid"], state.get("pidStart")):
            signal_group(state["pid"], signal.SIGTERM)
        running.append((run_dir, state))
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(st.get("pid"), st.get("pidStart")) for _, st in running):
        time.sleep(0.2)
    # Give the wrappers a moment to record the exit codes, then make sure every run says interrupted.
    settle = time.time() + 2
    while time.time() < settle and any(alive(st.get("wrapperPid"), st.get("wrapperStart")) for _, st in running):
        time.sleep(0.1)
    result = []
    for run_dir, _ in running:
        current = read_state(run_dir)
        if current.get("state") not in TERMINAL:
            update_state(run_dir, state=INTERRUPTED, interruptedAt=current.get("interruptedAt") or now(),
                         preempted=bool(was_preempted))
        result.append({"runId": os.path.basename(run_dir), "state": describe(run_dir)["state"]})
        agent_log(root, f"{os.path.basename(run_dir)}: interrupted by shutdown (preempted: {bool(was_preempted)})")
    return {"runs": result, "preempted": bool(was_preempted)}


def idle_decision(now_s: float, idle_since: float | None, minutes: float, jobs_running: int, sessions: int,
                  gpu_util: float) -> tuple[float | None, bool, str]:
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


def cmd_tick(root: str) -> dict:
    """Every minute: power the machine off when it has been idle for idleStopMinutes."""
    conf = settings(root)
    path = os.path.join(root, "idle.json")
    jobs = sum(1 for d in run_dirs(root) if describe(d)["state"] in ACTIVE)
    util = max((g["utilization"] for g in gpus()), default=0.0)
    since, stop, why = idle_decision(time.time(), (read_json(path) or {}).get("idleSince"),
                                     float(conf["idleStopMinutes"]), jobs, ssh_sessions(int(conf["sshPort"])), util)
    write_json(path, {"idleSince": since, "why": why, "checked": now()})
    if stop:
        agent_log(root, why)
        subprocess.run(conf["poweroffCommand"], check=False)
    return {"idleSince": since, "poweroff": stop, "why": why}


def cmd_configure(root: str, new: dict, cron: bool) -> dict:
    """Write agent.json; with ``cron``, run `boot` at reboot (and `tick` every minute when idle stop is on)."""
    agent = agent_path(root)
    write_json(os.path.join(root, "agent.json"), {**settings(root), **new})
    if not cron:
        return {"settings": settings(root)}
    if not shutil.which("crontab"):
        raise AgentError("crontab is not installed on this host (sudo apt-get install cron); "
                         "or run `gpu-train-agent boot` from your own boot hook")
    current = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    py = shlex.quote(sys.executable)
    base = f"{py} {shlex.quote(agent)} --root {shlex.quote(root)}"
    tag = f"# gpu-train {root}"
    keep = [line for line in current.splitlines() if not line.endswith(tag)]
    lines = [*keep, f"@reboot {base} boot >/dev/null 2>&1 {tag}"]
    if float(settings(root)["idleStopMinutes"]) > 0:
        lines.append(f"* * * * * {base} tick >/dev/null 2>&1 {tag}")
    subprocess.run(["crontab", "-"], input="\n".join(lines) + "\n", text=True, check=True)
    return {"settings": settings(root), "crontab": [line for line in lines if line.endswith(tag)]}
