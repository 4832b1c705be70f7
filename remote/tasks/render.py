"""Status tables and messages: pure functions of the agent's documents."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpu_train.contract import RUN_LIMIT_NOTICE_S, run_limit_at
from gpu_train.recovery import describe_return
from gpu_train.views.table import aligned

if TYPE_CHECKING:
    from remote.ssh.target import Target


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render_status(doc: dict[str, Any], target: Target, cli: str = "gpu-train", current: str | None = None, others: int = 0) -> str:
    """The status table of ``doc``'s runs (the scope's: the task filtered them); PROJECT when they are not
    all ``current``'s; ``others``: how many runs of other projects the host has besides."""
    lines = [f"stack {target.stack}: {target.host} ({doc.get('host')}), root {doc.get('root')}"]
    if target.is_gcp and doc.get("uptimeS") is not None:
        hours = doc["uptimeS"] / 3600
        cost = f", about ${hours * target.hourly_cost_usd:,.2f} so far" if target.hourly_cost_usd else ""
        lines.append(f"VM up {hours:.1f} h{cost}")
    lines += agent_lines(doc, target, cli)
    for g in doc.get("gpus", []):
        lines.append(f"GPU {g['index']} {g['name']}: {g['utilization']:.0f}% busy, {g['memoryUsedMiB']:.0f}/{g['memoryTotalMiB']:.0f} MiB")
    lines += [f"unreachable: {u}" for u in doc.get("unreachable", [])]
    runs = doc.get("runs", [])
    if not runs:
        lines.append(
            f"no runs of this project yet: {cli} train --script SCRIPT.py" if others else f"no runs yet: {cli} train --script SCRIPT.py"
        )
    else:
        lines += run_table(runs, project=any(r.get("project") != current for r in runs))
        lines += [bucket_line(r["id"], r["bucket"]) for r in runs if r.get("bucket")]
    if others:
        lines.append(f"{others} run{'s' if others != 1 else ''} of other projects on this host: {cli} status --all-projects")
    return "\n".join(lines)


def outputs_cell(run: dict[str, Any]) -> str:
    """A run's results on the host: JOB_DIR's files and the outputs in its working directory, the newest change."""
    job, work = run.get("jobSummary"), run.get("workdirSummary")
    if job is None and work is None:
        return "-"
    from datetime import datetime

    from remote.transfer.codesize import human

    files = sum(int(s["files"]) for s in (job, work) if s)
    size = sum(int(s["bytes"]) for s in (job, work) if s)
    newest = max(int(s["newestNs"]) for s in (job, work) if s)
    where = f" ({work['files']} in workdir)" if work and work["files"] else ""
    when = f", newest {datetime.fromtimestamp(newest / 1e9):%m-%d %H:%M}" if files else ""
    return f"{files} file{'' if files == 1 else 's'} {human(size)}{where}{when}"


def bucket_line(run: str, b: dict[str, Any]) -> str:
    """What of a run is in its bucket (verified) and what is still only on the host."""
    only = b.get("onlyHost") or []
    text = f"  {run}: {b.get('files', 0)} file(s) in {b.get('url')} (verified)"
    if only:
        text += f"; only on the host: {len(only)} ({', '.join(only[:3])}{', ...' if len(only) > 3 else ''})"
    elif b.get("final"):
        text += "; nothing only on the host"
    if b.get("error"):
        text += f"; upload error: {str(b['error'])[:160]}"
    return text


def run_table(runs: list[dict[str, Any]], project: bool = False) -> list[str]:
    """One row per run under a header; PROJECT (whose run: the project's id) with ``project``; OUTPUTS when
    the host summed them up; LAST LINE is the job's own (its exception when it failed)."""
    summed = any("jobSummary" in r or "workdirSummary" in r for r in runs)
    first = ("PROJECT",) if project else ()
    rows: list[tuple[str, ...]] = [(*first, "RUN", "STATE", "EXIT", "DURATION", *(("OUTPUTS",) if summed else ()), "LAST LINE")]
    for r in runs:
        state = r["state"]
        notes = []
        if r.get("resumes"):
            notes.append(f"resumed {r['resumes']}x")
        if r.get("preemptions"):
            notes.append(f"preempted {r['preemptions']}x")
        if r.get("returns"):  # the last time the stack's recovery brought the machine back
            notes.append(describe_return(r["returns"][-1]))
        if r.get("detail"):
            notes.append(r["detail"])
        if notes:
            state += " [" + "; ".join(notes) + "]"
        code = r.get("exitCode")
        line = r.get("lastLine") or ""
        if r.get("reason") and (not line or line.startswith("[gpu-train]") or (code is None and r["state"] == "failed")):
            # Why it ended, where the job said nothing, or where gpu-train ended it (no exit code of the job's
            # own: resumes used up, the wrapper failed); its last line is then whatever came before.
            line = r["reason"]
        whose = (r.get("project") or "?",) if project else ()
        cells = (*whose, r["id"], state, "-" if code is None else str(code), duration(r.get("durationS")))
        rows.append((*cells, outputs_cell(r), line[:120]) if summed else (*cells, line[:120]))
    return [f"  {line}" for line in aligned(rows, right={2 + len(first), 3 + len(first)})]


def settings_lines(settings: dict[str, Any]) -> list[str]:
    """The agent's settings (`setup`'s answer, contract.AgentSettings's wire names) in words, one a line."""
    minutes = settings.get("idleStopMinutes") or 0
    command = " ".join(settings.get("poweroffCommand") or ()) or "systemctl poweroff"
    hours = settings.get("maxRunHours")
    return [
        f"idle stop: after {minutes:g} idle minutes ({command})" if minutes else "idle stop: off",
        f"resumes: a run is relaunched at most {settings.get('maxResumes', 10)} times (reboots, preemptions, resume)",
        *([f"run-time cap: {hours:g} h from each start (maxRunHours)"] if hours else []),
    ]


def agent_lines(doc: dict[str, Any], target: Target, cli: str = "gpu-train") -> list[str]:
    """The on-host agent's view: idle clock, run-time cap; the stack's idle stop where the host has another
    (a stack file edited since the host last heard of it: `train`, `sweep` and `setup` send it)."""
    agent = doc.get("agent") or {}
    lines = []
    minutes = agent.get("idleStopMinutes") or 0
    if minutes and agent.get("idleWhy"):
        lines.append(f"idle stop: {agent['idleWhy']}")
    elif minutes:
        lines.append(f"idle stop after {minutes} min (not checked yet: the agent's timer runs every minute)")
    else:
        lines.append("idle stop: off")
    wanted = target.agent_settings.idle_stop_minutes or 0
    if agent and wanted != minutes:
        lines.append(
            f"  the stack says idleStopMinutes: {wanted:g}; the host has {f'{minutes:g}' if minutes else 'off'} until the next "
            f"train or `{cli} setup --stack {target.stack}`"
        )
    hours = agent.get("maxRunHours")
    stop = run_limit_at(doc.get("now") or time.time(), doc.get("uptimeS"), hours)
    if hours and stop is not None:
        left = stop - (doc.get("now") or time.time())
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(stop))
        lines.append(
            f"run-time cap {hours:g} h (maxRunHours): Compute Engine stops the VM at {when} (start + "
            f"{hours:g} h), in {duration(max(left, 0))}; the job's $GPU_TRAIN_NOTICE appears "
            f"{RUN_LIMIT_NOTICE_S // 60} min before"
        )
    return lines
