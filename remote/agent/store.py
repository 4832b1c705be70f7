"""The run store on the host: atomic JSON documents, the launch lock, the runs' folders, settings.

State on the host is the truth about runs:

    REMOTE_ROOT/
      bin/gpu-train-agent                   (this agent, as a zipapp)
      agent.json, agent.log, idle.json      (settings, what the agent did, the idle clock)
      code/BASE.last -> ../runs/RUN/code   (the newest code of a name: rsync --link-dest)
      staging/RUN/                          (code being synced, before launch)
      runs/RUN/{code/, job/ (= JOB_DIR), log, state.json, spec.json}
      python/<hash>.requirements            (hash of the last requirements.txt installed per Python)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from .protocol import DEFAULT_SETTINGS


class AgentError(Exception):
    """A refusal or failure the laptop shows as it is (the agent answers {"error": message})."""


def now() -> float:
    return round(time.time(), 3)


def write_json(path: str, doc: dict) -> None:
    """Atomically: a reader sees the old or the new document, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_state(run_dir: str) -> dict:
    return read_json(os.path.join(run_dir, "state.json")) or {}


def update_state(run_dir: str, **changes: object) -> dict:
    path = os.path.join(run_dir, "state.json")
    state = read_json(path) or {}
    state.update(changes)
    write_json(path, state)
    return state


@contextlib.contextmanager
def locked(root: str):
    """One launch at a time on a host, so two runs of one name cannot both start."""
    with open(os.path.join(root, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def agent_path(root: str) -> str:
    """Where the laptop's bootstrap keeps this agent (the wrapper, cron and systemd run it)."""
    return os.path.join(root, "bin", "gpu-train-agent")


def run_dirs(root: str) -> list[str]:
    runs = os.path.join(root, "runs")
    try:
        names = sorted(os.listdir(runs))
    except OSError:
        return []
    return [os.path.join(runs, n) for n in names if os.path.isfile(os.path.join(runs, n, "state.json"))]


def find_run(root: str, run_id: str | None) -> str:
    dirs = run_dirs(root)
    if run_id:
        path = os.path.join(root, "runs", run_id)
        if path in dirs:
            return path
        raise AgentError(f"no run {run_id!r} on this host (runs: {', '.join(os.path.basename(d) for d in dirs) or 'none'})")
    if not dirs:
        raise AgentError("no runs on this host yet: start one with `fab train`")
    return max(dirs, key=lambda d: read_state(d).get("created", 0))


def settings(root: str) -> dict:
    return {**DEFAULT_SETTINGS, **(read_json(os.path.join(root, "agent.json")) or {})}


def agent_log(root: str, text: str) -> None:
    with open(os.path.join(root, "agent.log"), "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


def last_line(path: str, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            lines = [ln for ln in f.read().decode("utf-8", "replace").replace("\r", "\n").split("\n") if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-200:] if lines else ""


def tree_summary(path: str) -> dict:
    """Files, bytes and newest change under ``path``: equal summaries mean nothing to fetch."""
    files = size = newest = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(folder, name))
                files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return {"files": files, "bytes": size, "newestNs": newest}
