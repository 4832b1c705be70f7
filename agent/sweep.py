"""A sweep's queue on its host: at most one trial per slot, each an ordinary run.

`sweep-start` takes the sweep's record (gpu_train/sweeps.py SweepDoc: the job's spec, the trials, this
node's slots) and the code the laptop staged, keeps both in REMOTE_ROOT/sweeps/NAME/ and starts the first
trials. From then on the queue moves by itself: a trial's wrapper advances it when its job ends (the next
trial starts the moment a slot frees), `boot` after a reboot (interrupted trials are resumed in their own
slots first, as every run is) and `tick` every minute as a safety net. The plan's ``next_launches``
decides; this module only reads the runs' states and launches. A trial sees its slot's GPUs alone
(CUDA_VISIBLE_DEVICES) and its sweep's name (GPU_TRAIN_SWEEP); a finished trial is never run again (its
run exists), a stopped sweep starts nothing more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

from gpu_train.answers import Launched, LaunchOutcome, SweepStarted, SweepStatus, SweepStopped, SweepTrial
from gpu_train.codec import answer
from gpu_train.contract import ACTIVE, GO_WHEN, SLOT_ENV, SWEEP_ENV, JobSpec, RunState, go_marker, is_run_id
from gpu_train.sweeps import PENDING, SWEEPS_DIR, SweepDoc, next_launches

from . import notify
from .outcome import HELD_WAIT_S, await_release, give_up, given_up, hold
from .store import AgentError, agent_log, now, read_json, write_json

SLOTS_FILE = "slots.json"  # trial run id -> the slot it was started in
ERROR_FILE = "error.json"  # why the latest launch was refused before its run existed (the host's problem: retried)


def sweep_dir(root: str, name: str) -> str:
    return os.path.join(root, SWEEPS_DIR, name)


def read_sweep(root: str, name: str) -> SweepDoc:
    doc = read_json(os.path.join(sweep_dir(root, name), "sweep.json"))
    if doc is None:
        found = sorted(names(root))
        raise AgentError(f"no sweep {name!r} on this host; sweeps here: {', '.join(found) or 'none'}")
    try:
        return SweepDoc.from_json(doc)
    except ValueError as e:
        raise AgentError(str(e)) from None


def names(root: str) -> list[str]:
    top = os.path.join(root, SWEEPS_DIR)
    return [n for n in os.listdir(top) if os.path.isfile(os.path.join(top, n, "sweep.json"))] if os.path.isdir(top) else []


def trial_run(doc: SweepDoc, trial: dict[str, Any]) -> str:
    return f"{trial['base']}{doc.stamp}"


@contextlib.contextmanager
def queue_lock(root: str) -> Iterator[None]:
    """One queue mover at a time on a host (two trials ending at once start one trial each, not both the same)."""
    os.makedirs(os.path.join(root, SWEEPS_DIR), exist_ok=True)
    with open(os.path.join(root, SWEEPS_DIR, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def trial_states(root: str, doc: SweepDoc) -> list[str]:
    """Each of this node's trials' state: pending (no run yet), refused, or its run's effective state."""
    from .status import describe

    out = []
    for t in doc.trials:
        run = trial_run(doc, t)
        run_dir = os.path.join(root, "runs", run)
        if not os.path.isfile(os.path.join(run_dir, "state.json")):
            out.append("stopped" if doc.stopped else PENDING)
        else:
            out.append(str(describe(run_dir)["state"]))
    return out


def mine(doc: SweepDoc) -> SweepDoc:
    """The record with this node's trials only (a cluster's trials are spread over its nodes)."""
    return replace(doc, trials=tuple(t for t in doc.trials if t.get("node", 0) == doc.node))


def advance(root: str, only: str | None = None) -> list[Launched]:
    """Start what the plan says into the free slots of every sweep (or ``only``); the runs started."""
    started: list[Launched] = []
    with queue_lock(root):
        for name in [only] if only else names(root):
            try:
                doc = mine(read_sweep(root, name))
            except AgentError as e:
                agent_log(root, f"sweep {name}: {e}")
                continue
            if doc.stopped:
                continue
            states = trial_states(root, doc)
            slots_path = os.path.join(sweep_dir(root, name), SLOTS_FILE)
            held_by = read_json(slots_path) or {}
            held = [held_by.get(trial_run(doc, t)) for t in doc.trials]
            for i, slot in next_launches(states, held, len(doc.slots)):
                trial = doc.trials[i]
                run = trial_run(doc, trial)
                held_by[run] = slot
                write_json(slots_path, held_by)
                error_path = os.path.join(sweep_dir(root, name), ERROR_FILE)
                try:
                    started.append(launch_trial(root, doc, trial, slot))
                except AgentError as e:
                    # A run that existed is failed by its launch (terminal: the queue goes on); a refusal before
                    # it existed is the host's (no screen, no Python): the trial stays pending, tried again
                    # by the next trial's end, boot or tick, and `sweep status` says why.
                    write_json(error_path, {"at": now(), "run": run, "error": str(e)})
                    agent_log(root, f"sweep {name}: {run} could not start: {e}")
                    if not os.path.isfile(os.path.join(root, "runs", run, "state.json")):
                        break
                else:
                    with contextlib.suppress(OSError):
                        os.remove(error_path)
    return started


def launch_trial(root: str, doc: SweepDoc, trial: dict[str, Any], slot: int) -> Launched:
    """The trial as an ordinary run: the sweep's code (hard links) staged for it, its spec launched."""
    from .launch import cmd_launch

    run = trial_run(doc, trial)
    staging = os.path.join(root, "staging", run)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    shutil.copytree(os.path.join(sweep_dir(root, doc.name), "code"), staging, symlinks=True, copy_function=os.link)
    job = JobSpec.from_json(doc.job)
    gpus = doc.slots[slot]
    env = {**job.env, SWEEP_ENV: doc.name, SLOT_ENV: str(slot)}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    spec = replace(
        job,
        run_id=run,
        base=trial["base"],
        args=tuple(trial["args"]),
        env=env,
        expect_gpus=0,
        reuse_code=False,
        bucket=trial.get("bucket") or job.bucket,  # the trial's own place (a record from before had the sweep's)
        notify=notify.kept(root, f"{doc.name}.sweep"),  # the sweep's own webhook, as its start kept it
    )
    return cast("Launched", cmd_launch(root, spec.to_json(), False))  # (expects no GPUs: never Waiting)


def after_trial(root: str, run_dir: str) -> None:
    """A trial's wrapper, at its job's end: the next trial into the freed slot. Never raises: the
    trial's own end is recorded already, and `tick` advances the queue as well."""
    from .store import spec_or_none

    spec = spec_or_none(run_dir)
    if spec is None or SWEEP_ENV not in spec.env:
        return
    try:
        advance(root, spec.env[SWEEP_ENV])
    except Exception as e:
        with contextlib.suppress(Exception):
            agent_log(root, f"sweep {spec.env[SWEEP_ENV]}: the queue did not advance after {os.path.basename(run_dir)}: {e!r}")


def cmd_sweep_start(root: str, raw: dict[str, Any], staged: str) -> SweepStarted:
    """Keep the sweep (its record and the code staged as ``staged``) and start its first trials."""
    from .launch import driver_missing

    try:
        doc = SweepDoc.from_json(raw)
        job = JobSpec.from_json(doc.job)
    except ValueError as e:
        raise AgentError(str(e)) from None
    waiting = driver_missing(job.expect_gpus)  # as a launch waits: nothing kept, nothing started, the code stays staged
    if waiting:
        return answer(SweepStarted, sweep=doc.name, trials=len(mine(doc).trials), slots=len(doc.slots), started=[], waiting=waiting)
    folder = sweep_dir(root, doc.name)
    with queue_lock(root):
        if os.path.exists(given_up(root, staged)):  # the laptop lost the word of this start and was told it ends here
            shutil.rmtree(os.path.join(root, "staging", staged), ignore_errors=True)
            raise AgentError(f"sweep {doc.name!r} was not started: the laptop lost its connection during its start and gave it up")
        if os.path.isdir(folder):
            old = mine(read_sweep(root, doc.name))
            left = [s for s in trial_states(root, old) if s == PENDING or s in ACTIVE or s == RunState.INTERRUPTED]
            if left and not old.stopped:
                raise AgentError(f"sweep {doc.name!r} is still going here ({len(left)} trial(s) left): stop it, or pick another --name")
            shutil.rmtree(folder)
        code = os.path.join(root, "staging", staged)
        if not os.path.isdir(code):
            raise AgentError(f"the code for sweep {doc.name} did not arrive (no {code}): run the sweep again")
        os.makedirs(folder)
        held = hold(folder)  # until its first trials started: what `launch-outcome --sweep` waits for (outcome.py)
        os.replace(code, os.path.join(folder, "code"))
        for when in GO_WHEN:  # a cluster's code came through node 0: its markers (RUN.arrived, RUN.relayed) are done with
            with contextlib.suppress(OSError):
                os.remove(go_marker(root, staged, when))
        notify.keep(root, f"{doc.name}.sweep", job.notify)  # the sweep's own webhook (0600), never in the record
        write_json(os.path.join(folder, "sweep.json"), replace(doc, job=replace(job, notify=None).to_json(), created=now()).to_json())
    try:
        started = advance(root, doc.name)
    finally:
        os.close(held)
    return answer(SweepStarted, sweep=doc.name, trials=len(mine(doc).trials), slots=len(doc.slots), started=[s["runId"] for s in started])


def cmd_sweep_outcome(root: str, name: str, staged: str, wait_s: float = HELD_WAIT_S) -> LaunchOutcome:
    """`launch-outcome --sweep NAME --run STAGED`: whether the start of sweep ``name`` (its code staged as
    ``staged``) kept it, final, as a launch's (outcome.py): its record is this start's (the queue moves by
    itself from then on) and the trials started so far are said, or it was not and now never will be."""
    if not (is_run_id(name) and is_run_id(staged) and staged.startswith(name)):
        raise AgentError(f"launch-outcome: {name!r} and {staged!r} are not a sweep's name and its staged code's")
    with queue_lock(root):
        kept = read_json(os.path.join(sweep_dir(root, name), "sweep.json")) or {}
        if f"{kept.get('name')}{kept.get('stamp')}" != staged:
            return give_up(root, staged, "the sweep's start had not kept it, and now will not")
    await_release(sweep_dir(root, name), wait_s, f"the start of sweep {name} is still starting its trials")
    doc = mine(read_sweep(root, name))
    runs = [trial_run(doc, t) for t in doc.trials]
    started = [r for r in runs if os.path.isfile(os.path.join(root, "runs", r, "state.json"))]
    said = answer(SweepStarted, sweep=name, trials=len(doc.trials), slots=len(doc.slots), started=started)
    return answer(LaunchOutcome, runId=staged, launched=said, reason=None)


def cmd_sweep_stop(root: str, name: str, grace: float) -> SweepStopped:
    """Start nothing more, and stop the trials at work."""
    from .lifecycle import cmd_stop

    with queue_lock(root):
        doc = read_sweep(root, name)
        write_json(os.path.join(sweep_dir(root, name), "sweep.json"), replace(doc, stopped=True).to_json())
    doc = mine(doc)
    stopped = []
    states = trial_states(root, doc)
    for t, state in ((t, states[i]) for i, t in enumerate(doc.trials)):
        if state in ACTIVE or state == RunState.INTERRUPTED:
            cmd_stop(root, trial_run(doc, t), grace)
            stopped.append(trial_run(doc, t))
    return answer(SweepStopped, sweep=name, stopped=stopped)


def pending(root: str) -> int:
    """Trials left to start in sweeps that are not stopped (idle stop counts them as work)."""
    left = 0
    for name in names(root):
        with contextlib.suppress(AgentError):
            doc = mine(read_sweep(root, name))
            if not doc.stopped:
                left += sum(1 for s in trial_states(root, doc) if s == PENDING)
    return left


def newest(root: str) -> str:
    found = names(root)
    if not found:
        raise AgentError("no sweep on this host yet: start one with `gpu-train sweep`")
    return max(found, key=lambda n: (read_json(os.path.join(sweep_dir(root, n), "sweep.json")) or {}).get("created") or 0)


def metric_of(run_dir: str, metric: str, mode: str, problems: list[str]) -> tuple[float | None, float | None]:
    """(last, best) of ``metric`` in a run's series: the last value of the series written furthest, the
    lowest (min) or highest (max) of any."""
    from .metrics import run_scalars

    series = [s for s in run_scalars(run_dir, [metric], 1, problems) if s["count"]]
    if not series:
        return None, None
    last = max(series, key=lambda s: (s["last"][0], s["wallTime"]))["last"][1]
    ends = [end[1] for end in (s["min"] if mode == "min" else s["max"] for s in series) if end is not None]
    return last, ((min if mode == "min" else max)(ends) if ends else None)


def logged_tags(run_dirs: list[str], limit: int = 30) -> list[str]:
    """The tags the runs logged, sorted, at most ``limit``: a --metric that none of them logged (`eval_loss`,
    as the HF Trainer prints it, where its TensorBoard tag is `eval/loss`) is answered with them."""
    from .metrics import run_scalars

    tags = {s["tag"] for d in run_dirs for s in run_scalars(d, [], 1, []) if s["count"]}
    return sorted(tags)[:limit]


def cmd_sweep_status(root: str, name: str | None, metric: str | None, mode: str) -> SweepStatus:
    """One row per trial of this node: its run, values, state, duration, and the metric's last and best."""
    from .status import describe

    doc = mine(read_sweep(root, name or newest(root)))
    problems: list[str] = []
    rows, ran = [], []
    states = trial_states(root, doc)
    for t, state in ((t, states[i]) for i, t in enumerate(doc.trials)):
        run = trial_run(doc, t)
        run_dir = os.path.join(root, "runs", run)
        duration = last = best = None
        if os.path.isfile(os.path.join(run_dir, "state.json")):
            duration = describe(run_dir)["durationS"]
            ran.append(run_dir)
            if metric:
                last, best = metric_of(run_dir, metric, mode, problems)
        row = answer(
            SweepTrial,
            runId=run,
            index=t["index"],
            node=doc.node,
            values=t["values"],
            state=state,
            durationS=duration,
            last=last,
            best=best,
        )
        rows.append(row)
    return answer(
        SweepStatus,
        sweep=doc.name,
        node=doc.node,
        mode=doc.mode,
        stopped=doc.stopped,
        slots=[list(s) for s in doc.slots],
        blocked=(read_json(os.path.join(sweep_dir(root, doc.name), ERROR_FILE)) or {}).get("error"),
        trials=rows,
        problems=problems[:20],
        tags=logged_tags(ran) if metric and all(r["last"] is None for r in rows) else [],
    )
