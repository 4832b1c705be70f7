"""`prune`: free the code copies of finished runs, keeping everything the job wrote.

Every run keeps the code it was sent (REMOTE_ROOT/runs/RUN/code, its working directory), so a large
tree synced as code costs every run its space. Pruning removes, in a finished run (succeeded,
failed, stopped), only the files still exactly as `launch` recorded sending them (outputs.SENT:
size, mtime, inode): what the job created or changed there is its output, and stays, fetched or
not. Never a running or interrupted run's (boot and `resume` relaunch from that code), nor the newest
run of each name (the next sync links its unchanged files against it). A pruned run cannot be
resumed; it says so. Standard library only.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from gpu_train.answers import KeptRun, Pruned, PrunedRun, RunStatus
from gpu_train.codec import answer
from gpu_train.contract import TERMINAL

from .outputs import SENT, identity
from .status import describe
from .store import EVERY_RUN, AgentError, find_run, forget_secrets, now, read_json, run_dirs, scoped, write_json

if TYPE_CHECKING:
    from .store import Scope

PRUNED = "pruned.json"  # in the run's folder: when, and what went


def newest_code(root: str) -> set[str]:
    """The runs whose code the next sync of each name links against (REMOTE_ROOT/code/NAME.last)."""
    keep = set()
    folder = os.path.join(root, "code")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.endswith(".last"):
            target = os.path.realpath(os.path.join(folder, name))
            keep.add(os.path.basename(os.path.dirname(target)))
    return keep


def why_kept(run: RunStatus, has_record: bool, newest: set[str]) -> str | None:
    """Why a run's code must stay (None: it may go)."""
    if run["state"] not in TERMINAL:
        return f"{run['state']}: " + (
            "boot or resume relaunches it from that code" if run["state"] == "interrupted" else "it is still going"
        )
    if run["id"] in newest:
        return "the newest run of its name: the next sync links its unchanged files against it"
    if not has_record:
        return "launched before gpu-train recorded what it sent, so its outputs cannot be told from its code"
    return None


def prune_run(run_dir: str) -> tuple[int, int]:
    """Remove the files of ``run_dir``'s code still as sent, and folders left empty: (files, bytes freed)."""
    forget_secrets(run_dir)  # (removed at its end already: this is the promise kept whatever ended it)
    code = os.path.join(run_dir, "code")
    sent = (read_json(os.path.join(run_dir, SENT)) or {}).get("files") or {}
    removed = freed = 0
    for rel, was in sent.items():
        path = os.path.join(code, *rel.split("/"))
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) or identity(st) != was:
            continue  # the job changed it: an output
        os.remove(path)
        removed += 1
        freed += st.st_size if st.st_nlink == 1 or stat.S_ISLNK(st.st_mode) else 0  # a hard link frees nothing
    for folder, _dirs, _names in sorted(os.walk(code), key=lambda t: -len(t[0])):
        if folder != code and not os.listdir(folder):
            os.rmdir(folder)
    return removed, freed


def cmd_prune(root: str, run_id: str | None, dry_run: bool, scope: Scope = EVERY_RUN) -> Pruned:
    """Prune every finished run's code (or one run's), reporting what went and what stayed, and why."""
    newest = newest_code(root)
    pruned: list[PrunedRun] = []
    kept: list[KeptRun] = []
    for run_dir in [find_run(root, run_id, scope)] if run_id is not None else scoped(run_dirs(root), scope):
        run = describe(run_dir)
        if os.path.exists(os.path.join(run_dir, PRUNED)):
            continue
        why = why_kept(run, os.path.isfile(os.path.join(run_dir, SENT)), newest)
        if why:
            kept.append(answer(KeptRun, id=run["id"], why=why))
            continue
        files, freed = (len((read_json(os.path.join(run_dir, SENT)) or {}).get("files") or {}), None) if dry_run else prune_run(run_dir)
        if not dry_run:
            write_json(os.path.join(run_dir, PRUNED), {"files": files, "freedBytes": freed, "at": now()})
        pruned.append(answer(PrunedRun, id=run["id"], files=files, freedBytes=freed))
    return answer(Pruned, pruned=pruned, kept=kept, dryRun=dry_run)


def refuse_pruned(run_dir: str) -> None:
    """`resume` of a pruned run: its code is gone."""
    if os.path.exists(os.path.join(run_dir, PRUNED)):
        raise AgentError(f"run {os.path.basename(run_dir)}'s code was pruned (gpu-train prune): it cannot be resumed; train it again")
