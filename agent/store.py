"""The run store on the host: atomic JSON documents, the launch lock, the runs' folders, settings.

State on the host is the truth about runs:

    REMOTE_ROOT/
      bin/gpu-train-agent                   (this agent, as a zipapp)
      agent.json, agent.log, idle.json      (settings, what the agent did, the idle clock)
      code/BASE.last -> ../runs/RUN/code   (the newest code of a name: rsync --link-dest)
      staging/RUN/                          (code being synced, before launch)
      runs/RUN/{code/, job/ (= JOB_DIR), log, state.json, spec.json}
      secrets/RUN.json                      (the run's registry credentials, 0600, until it ends: registry.py)
      python/<hash>.requirements            (hash of the last dependencies installed per Python and venv)
      envs/PROJECT/, data/PROJECT/          (the project's venv, what `push` sent; PROJECT: its id)
      tools/uv-VERSION/uv, cache/{uv,pip}/  (uv, fetched once; the downloads every venv links or copies)
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpu_train.answers import TreeSummary
from gpu_train.atomic import atomic_write
from gpu_train.codec import answer
from gpu_train.contract import GCP_REMOTE_ROOT, MACHINE_SETTINGS, TERMINAL, AgentSettings, JobSpec, RunRecord, cli_name
from gpu_train.ownership import in_scope

if TYPE_CHECKING:
    Scope = tuple[tuple[str, ...], str | None]  # (project ids, legacy name): gpu_train.contract.in_scope's


class AgentError(Exception):
    """A refusal or failure the laptop shows as it is (the agent answers {"error": message})."""


def now() -> float:
    return round(time.time(), 3)


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Atomically (gpu_train/atomic.py): a reader sees the old or the new document, never half of one."""
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True), 0o600, keep_mode=False)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None  # (every document here is an object: anything else is not one)


def read_spec(run_dir: str) -> JobSpec:
    """runs/RUN/spec.json as the contract reads it, or an AgentError saying what is wrong with it."""
    doc = read_json(os.path.join(run_dir, "spec.json"))
    if doc is None:
        raise AgentError(f"the run's spec.json is missing or unreadable in {run_dir}")
    try:
        return JobSpec.from_json(doc)
    except ValueError as e:
        raise AgentError(f"{e} (in {run_dir})") from None


def spec_or_none(run_dir: str) -> JobSpec | None:
    """The run's spec, or None where it has no readable one (then it has no bucket, node or PATH of its own)."""
    try:
        return read_spec(run_dir)
    except AgentError:
        return None


def read_state(run_dir: str) -> RunRecord:
    """runs/RUN/state.json as the contract reads it (none yet: a run just launched), or an AgentError naming
    what is wrong with it."""
    path = os.path.join(run_dir, "state.json")
    try:
        return RunRecord.from_json(read_json(path) or {}, path)
    except ValueError as e:
        raise AgentError(str(e)) from None


def update_state(run_dir: str, **changes: Any) -> RunRecord:
    """The run's record with ``changes`` (RunRecord's fields), written whole. A run that has ended
    (succeeded, failed, stopped) has its registry credentials removed: no later start pulls for it."""
    state = replace(read_state(run_dir), **changes)
    write_json(os.path.join(run_dir, "state.json"), state.to_json())
    if changes.get("state") in TERMINAL:
        forget_secrets(run_dir)
    return state


def secrets_path(root: str, run_id: str) -> str:
    """REMOTE_ROOT/secrets/RUN.json: outside the run's folder, which its container mounts."""
    return os.path.join(root, "secrets", f"{run_id}.json")


def forget_secrets(run_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(secrets_path(os.path.dirname(os.path.dirname(run_dir)), os.path.basename(run_dir)))


@contextlib.contextmanager
def locked(root: str) -> Iterator[None]:
    """One launch at a time on a host, so two runs of one name cannot both start."""
    with os.fdopen(os.open(os.path.join(root, ".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as f:
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


def listed(ids: list[str], limit: int = 8) -> str:
    """Run ids for a message, sorted: every one up to ``limit``, else the last ``limit`` (the newest
    of a name) "and N more", so that a count beside the list always agrees with it."""
    ids = sorted(ids)
    if len(ids) <= limit:
        return ", ".join(ids)
    return ", ".join(ids[-limit:]) + f" and {len(ids) - limit} more"


def match_run(ids: list[str], wanted: str, created: dict[str, float]) -> str:
    """The run ``wanted`` names: its id, a unique prefix of one, or a base name (its newest run);
    AgentError with the candidates or a "did you mean" otherwise. Pure, for the table tests."""
    if wanted in ids:
        return wanted
    matches = [i for i in ids if i.startswith(wanted)]
    same_base = [i for i in matches if i[: -len("_20260101_000000")] == wanted]
    if same_base:
        return max(same_base, key=lambda i: created.get(i, 0))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise AgentError(f"{wanted!r} matches {len(matches)} runs ({listed(matches)}): give more of the run id")
    stamp = len("_20260101_000000")
    newest: dict[str, str] = {}
    for i in ids:  # each base name stands for its newest run
        if i[:-stamp] not in newest or created.get(i, 0) >= created.get(newest[i[:-stamp]], 0):
            newest[i[:-stamp]] = i
    close = difflib.get_close_matches(wanted, ids, n=3, cutoff=0.6) or [
        newest[b] for b in difflib.get_close_matches(wanted, list(newest), n=3, cutoff=0.6)
    ]
    hint = f"did you mean {' or '.join(close)}?" if close else f"runs here: {listed(ids) or 'none'}"
    raise AgentError(f"no run {wanted!r} on this host; {hint}")


# A command's scope, (ids, legacy): the project ids its defaults keep to, and the name of runs from before
# ids (gpu_train.contract.in_scope); ((), None) is every run.
EVERY_RUN: Scope = ((), None)


def run_project(run_dir: str) -> str | None:
    """Whose run this is: the project id its record carries; a run from before that, its spec's project."""
    recorded = read_state(run_dir).project
    if recorded:
        return recorded
    spec = spec_or_none(run_dir)
    return spec.project if spec is not None else None


def scoped(dirs: list[str], scope: Scope) -> list[str]:
    """The run folders of ``dirs`` that are the scope's."""
    return dirs if scope == EVERY_RUN else [d for d in dirs if in_scope(run_project(d), *scope)]


def find_run(root: str, run_id: str | None, scope: Scope = EVERY_RUN) -> str:
    """The run ``run_id`` names (an id, a unique prefix, a base name: the scope's runs first, then any
    project's), or without it the scope's newest run."""
    dirs = run_dirs(root)
    mine = scoped(dirs, scope)
    if run_id:
        errors = []
        for among in (mine, dirs):
            by_id = {os.path.basename(d): d for d in among}
            try:
                return by_id[match_run(list(by_id), run_id, {i: read_state(d).created or 0 for i, d in by_id.items()})]
            except AgentError as e:
                errors.append(e)
        # No match anywhere: every run's "did you mean" or a prefix's matches; but a bare list is this project's
        # runs, not the first names of every project's in sorted order (another's sweep trials hid them).
        raise errors[0] if mine and "runs here:" in str(errors[-1]) else errors[-1]
    if dirs and not mine:
        raise AgentError(f"no runs of this project on this host yet ({len(dirs)} of other projects: --run names one)")
    if not mine:
        raise AgentError(f"no runs on this host yet: start one with `{cli_name()} train`")
    return max(mine, key=lambda d: read_state(d).created or 0)


# Set by `--settings FILE` (the VM's root-installed units): the root-owned settings that the
# startup script wrote, used instead of REMOTE_ROOT/agent.json, which the user can write.
_settings_file: str | None = None


def use_settings_file(path: str) -> AgentSettings:
    """Take the settings from ``path`` (root-owned, not writable by others) for this process; they name
    the user and remoteRoot, which tell REMOTE_ROOT. Returns them."""
    global _settings_file
    st = os.stat(path)
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise AgentError(f"{path} must be owned by root and writable by no one else")
    doc = read_json(path)
    if doc is None:
        raise AgentError(f"{path} is not a JSON document")
    conf = checked_settings(doc, path)
    _settings_file = path
    return conf


def machine_mode() -> bool:
    """Running as one of the VM's units, with the machine's root-owned settings (`--settings`)."""
    return _settings_file is not None


def root_from_settings(conf: AgentSettings) -> str:
    """REMOTE_ROOT of the settings' user: '~/x' is under that user's home."""
    import pwd

    root = conf.remote_root or GCP_REMOTE_ROOT  # (the startup script always writes it)
    if root.startswith("~/"):
        if not conf.user:
            raise AgentError(f"the machine's settings ({MACHINE_SETTINGS}) name no user for remoteRoot {root}")
        root = os.path.join(pwd.getpwnam(conf.user).pw_dir, root[2:])
    return os.path.abspath(root)


def checked_settings(doc: dict[str, Any], path: str) -> AgentSettings:
    """The settings in ``doc`` (read from ``path``), or an AgentError naming the bad value and the file."""
    try:
        return AgentSettings.from_json(doc, path)
    except ValueError as e:
        raise AgentError(f"{e}: the stack's setting is sent again by `{cli_name()} setup` (or correct the file)") from None


def settings(root: str) -> AgentSettings:
    """What this agent runs with: REMOTE_ROOT/agent.json, or the machine's (``use_settings_file``), checked."""
    path = _settings_file or os.path.join(root, "agent.json")
    return checked_settings(read_json(path) or {}, path)


def write_settings(root: str, new: dict[str, Any]) -> AgentSettings:
    """REMOTE_ROOT/agent.json with ``new`` (the laptop's, from the stack) over what it held: checked as
    one document before it is written, so a bad value is refused where it arrives."""
    path = os.path.join(root, "agent.json")
    old = read_json(path) or {}
    conf = checked_settings({**old, **new}, path)
    if conf.to_json() != old:  # (every launch brings them: written when they changed)
        write_json(path, conf.to_json())
    return conf


@contextlib.contextmanager
def run_locked(run_dir: str) -> Iterator[None]:
    """One run's lock: a stop request and the wrapper starting a step never cross (the wrapper
    checks for a stop under it before it starts pip or the job; `stop` writes its request and reads
    the pids under it)."""
    with open(os.path.join(run_dir, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def agent_log(root: str, text: str) -> None:
    with open(os.path.join(root, "agent.log"), "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


WRAPPER_MARK = "[gpu-train] "  # the wrapper's own lines in a job's log
EXCEPTION_RE = re.compile(r"([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|KeyboardInterrupt|SystemExit)(:|$)")


RESUMED_MARK = ": resumed ("  # the wrapper's first line of a relaunch (wrap.py): a new leg of the run begins
# CSI cursor moves and erases (tqdm's nested bars end each inner bar with ESC [ A): dropped from the last line,
# where the laptop would write them out as `\x1b[A`; gpu_train/errors.py CURSOR_MOVES drops the same in `logs`.
CURSOR_MOVES = r"\x1b\[[0-9;]{0,64}[A-HJKf]"
_CURSOR_MOVES_RE = re.compile(CURSOR_MOVES)


def job_line(text: str, failed: bool) -> str:
    """The line of a log tail that says most about the job's latest leg (an earlier leg's KeyboardInterrupt
    is not this one's): for a failed run its exception (the last line of a traceback), else its own last
    line that has a word in it (not a rule of `=====`); the wrapper's lines only when the job said nothing
    (pip failed, say)."""
    text = _CURSOR_MOVES_RE.sub("", text)
    lines = [ln.strip() for ln in text.replace("\r", "\n").split("\n") if ln.strip()]
    legs = [i for i, ln in enumerate(lines) if ln.startswith(WRAPPER_MARK) and RESUMED_MARK in ln]
    lines = lines[legs[-1] :] if legs else lines
    own = [ln for ln in lines if not ln.startswith(WRAPPER_MARK) and any(c.isalnum() for c in ln)]
    if failed:
        for ln in reversed(own):
            if EXCEPTION_RE.match(ln):
                return ln[:200]
    if own:
        return own[-1][:200]
    return lines[-1][:200] if lines else ""


def last_line(path: str, failed: bool = False, limit: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return job_line(f.read().decode("utf-8", "replace"), failed)
    except OSError:
        return ""


def tree_summary(path: str) -> TreeSummary:
    """Files, bytes and newest change under ``path``: equal summaries mean nothing to fetch."""
    files = size = newest = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(folder, name))
                files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return answer(TreeSummary, files=files, bytes=size, newestNs=newest)
