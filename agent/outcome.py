"""A launch's answer (``Launched``): built by `launch` as it starts the run, or after the fact by
`launch-outcome` for a laptop whose connection was lost before the answer reached it. A sweep's start
(agent/sweep.py) is asked about the same way, by its staged code's name (`launch-outcome --sweep`): the
same marks (``given_up``, ``hold``) and waits (``await_release``) under its queue's lock.

The laptop chose the run's id, so it can ask by it once it is back. The answer is final: under the
host's launch lock (store.locked), either the run's folder is there (the launch passed the point where
it starts the run; `launch-outcome` then waits for that launch to end, which holds the folder's flock
until its wrapper started or failed), or it is not, and a "given up" mark makes sure it never will be
(the launch checks for it under the same lock before it makes the folder). A laptop is therefore never
told "failed" for a run that trains, nor "started" for one that never will.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

from gpu_train.answers import Launched, LaunchOutcome
from gpu_train.codec import answer
from gpu_train.contract import FAILED, LAUNCH_GRACE_S, STARTING, JobSpec, is_run_id
from gpu_train.ownership import project_dirs

from . import hostcheck, units
from .procs import gpu_apps, gpus
from .pyenv import dependency_files, run_env, venv_python
from .status import active_runs
from .store import AgentError, locked, now, read_json, settings, spec_or_none, update_state

HELD_WAIT_S = 60.0  # how long `launch-outcome` waits for a launch past its point of no return to end


def given_up(root: str, run_id: str) -> str:
    """The mark `launch-outcome` leaves for a launch that had not made its run's folder (a sweep's start:
    its record, ``run_id`` its staged code's name): it never will."""
    return os.path.join(root, "staging", f"{run_id}.given-up")


def hold(run_dir: str) -> int:
    """The launch's hold on its run's folder (a sweep's start: on the sweep's), an flock on it, released when
    the launch ends: its process exits, or it closes the descriptor; not inherited by the wrapper it starts."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def host_notes(root: str, besides: str | None = None) -> dict[str, Any]:
    """What the laptop says after "started": who else uses the GPUs, other runs of ours still going
    (``besides``: the run being announced, when it exists already), and on an SSH host whether a reboot
    would resume the run (a VM's units always do)."""
    active = [name for name in (os.path.basename(d) for d, _ in active_runs(root)) if name != besides]
    notes: dict[str, Any] = {"warnings": hostcheck.busy_warnings(gpu_apps(), gpus(), active)}
    if not settings(root).gcp:
        notes["bootResume"] = hostcheck.boot_resume(root)
    return notes


def job_python(root: str, spec: JobSpec, python: str, managed: bool) -> str:
    """The Python the job will run with: the project's venv's, or ``python`` itself (pyenv.run_env)."""
    installs = bool(dependency_files(os.path.join(root, "runs", spec.run_id, "code")))
    venv = run_env(project_dirs(root, spec.project)[0], python, spec.venv, managed, installs)
    return venv_python(venv) if venv else python


def launched(root: str, spec: JobSpec, notes: dict[str, Any]) -> Launched:
    """The launch's answer for the run of ``spec`` (as kept in its folder: its Python the detected one)."""
    run_dir = os.path.join(root, "runs", spec.run_id)
    return answer(
        Launched,
        runId=spec.run_id,
        runDir=run_dir,
        jobDir=os.path.join(run_dir, "job"),
        log=os.path.join(run_dir, "log"),
        screen=units.screen_name(spec.run_id),
        python=f"image {spec.container.image}" if spec.container else job_python(root, spec, spec.python or "", spec.externally_managed),
        dataDir=project_dirs(root, spec.project)[1],
        **notes,
    )


def cmd_launch_outcome(root: str, run_id: str, wait_s: float = HELD_WAIT_S) -> LaunchOutcome:
    """Whether the launch of ``run_id`` started it: its answer, or why it did not (and now never will)."""
    if not is_run_id(run_id):
        raise AgentError(f"launch-outcome: {run_id!r} is not a run id")
    run_dir = os.path.join(root, "runs", run_id)
    with locked(root):
        if not os.path.isdir(run_dir):
            return give_up(root, run_id, "the launch had not started it, and now will not")
    await_release(run_dir, wait_s, f"the launch of {run_id} is still starting it")
    state = wrapped(run_dir)
    spec = spec_or_none(run_dir)
    if spec is None or not state:
        return answer(LaunchOutcome, runId=run_id, launched=None, reason="the launch failed on the host before the run's record was kept")
    if state.get("state") == FAILED and not state.get("started"):
        return answer(LaunchOutcome, runId=run_id, launched=None, reason=str(state.get("reason") or "its wrapper did not start"))
    return answer(LaunchOutcome, runId=run_id, launched=launched(root, spec, host_notes(root, besides=run_id)), reason=None)


def give_up(root: str, run_id: str, reason: str) -> LaunchOutcome:
    """A start asked about before its point of no return (called under the lock it checks ``given_up`` under):
    marked, so that it refuses when it gets there; the answer says it did not start, and why."""
    os.makedirs(os.path.dirname(given_up(root, run_id)), exist_ok=True)
    open(given_up(root, run_id), "w").close()
    return answer(LaunchOutcome, runId=run_id, launched=None, reason=reason)


def await_release(folder: str, wait_s: float, still: str) -> None:
    """Once the start past its point of no return has let go of ``folder`` (``hold``): its wrapper or its
    trials start, or fail, within moments; AgentError saying ``still`` after ``wait_s``."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AgentError(f"{still} after {wait_s:g} s") from None
                time.sleep(0.05)
    finally:
        os.close(fd)


def wrapped(run_dir: str, poll_s: float = 0.05) -> dict[str, Any]:
    """The run's record once its launch has ended: a run still 'starting' with no wrapper yet gets until
    LAUNCH_GRACE_S after its launch for the wrapper to say it runs (it records its pid first thing), and
    one whose launch ended before it started the wrapper (the launch was killed) is recorded failed: it
    never runs, and nothing (boot, resume) takes it for interrupted and starts it later."""
    path = os.path.join(run_dir, "state.json")
    while True:
        state = read_json(path) or {}
        if state.get("state") != STARTING or state.get("wrapperPid"):
            return state
        if time.time() > float(state.get("created") or 0) + LAUNCH_GRACE_S:
            reason = "the launch ended before it started the run's wrapper"
            return update_state(run_dir, state=FAILED, ended=now(), reason=reason).to_json()
        time.sleep(poll_s)
