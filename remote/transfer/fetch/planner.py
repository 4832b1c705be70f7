"""The host's one listing made into the work here: each run's entries checked (a listing that is not
one, names the run's folder keeps for gpu-train, names this file system refuses), folders and links
made, and a FileJob for each file that moves. What moves is generator.py's pure decision; this is
where it meets the laptop's tree, before engine.py moves the pieces."""

from __future__ import annotations

import os

from gpu_train.answers import Refusal, RunListing
from gpu_train.contract import UNREADABLE
from remote.transfer.fetch import direct as fdirect
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import receiver as fl
from remote.transfer.fetch.job import FileJob
from remote.transfer.fetch.report import RunResult, summary


def plan(
    results: list[RunResult], listing: dict[str, RunListing | Refusal], jobs: list[FileJob]
) -> tuple[list[tuple[fl.Tree, fp.Entry]], list[FileJob]]:
    """Each run's entries checked (their shape is the contract's, answers.Listed: checked as it was read),
    its folders and links made, a FileJob (appended to ``jobs``) per file that moves: (the folders, given
    their times last; the jobs with a local basis, compared by blocks)."""
    dirs: list[tuple[fl.Tree, fp.Entry]] = []
    basis: list[FileJob] = []
    for result in results:
        doc = listing.get(result.run_id)
        if doc is None or "error" in doc:
            result.error = doc["error"] if doc is not None else f"the host did not list {result.run_id}"
            continue
        try:
            entries = [fp.Entry.from_wire(row) for row in doc["entries"]]
            why = fp.listing_problem(entries, fl.capacity(result.dest))
        except (ValueError, TypeError) as e:
            why = f"the host's listing of {result.run_id} is not one ({e})"
        if why:
            result.error = why
            continue
        result.summary = summary(entries)
        try:
            _plan_run(result, entries, dirs, basis, jobs)
        except (fl.UnsafePath, OSError) as e:
            result.error = str(e)
    return dirs, basis


def _plan_run(
    result: RunResult, entries: list[fp.Entry], dirs: list[tuple[fl.Tree, fp.Entry]], basis: list[FileJob], jobs: list[FileJob]
) -> None:
    tree = fl.Tree(result.dest)
    workdir = "/" in result.run_id  # RUN/workdir: the working directory's outputs (no names reserved there)
    result.previous = fl.previous_dir(result.dest, workdir)
    direct = any(e.kind == "f" and e.size >= fdirect.DIRECT_MIN for e in entries) and fdirect.writes_direct(result.dest.parent)
    if entries or not workdir:  # no workdir/ for a job that wrote nothing in its working directory
        tree.folder("")
    taken: set[str] = set()  # top-level JOB_DIR names the run's folder here keeps for itself
    for e in entries:
        if e.kind == UNREADABLE:
            result.unreadable.append(f"{e.path} ({e.target})")
            continue
        if not workdir and (("/" not in e.path and fp.reserved(e.path)) or (taken and e.path.partition("/")[0] in taken)):
            if "/" not in e.path:
                taken.add(e.path)
                result.conflicts.append(
                    f"{e.path} (a name the run's folder here keeps for gpu-train: rename it in the JOB_DIR, or fetch with --dest)"
                )
            continue
        try:
            _plan_entry(result, tree, e, dirs, basis, direct, jobs)
        except (fl.UnsafePath, OSError) as err:  # a name this file system refuses (too long, not valid here)
            result.unstorable.append(f"{e.path} ({getattr(err, 'strerror', None) or err})")


def _plan_entry(
    result: RunResult,
    tree: fl.Tree,
    e: fp.Entry,
    dirs: list[tuple[fl.Tree, fp.Entry]],
    basis: list[FileJob],
    direct: bool,
    jobs: list[FileJob],
) -> None:
    local = tree.planned(e.path)
    action = fp.decide(e, local)
    if action == fp.KEEP_NEWER:
        result.kept_newer.append(e.path)
    elif action == fp.CONFLICT:
        result.conflicts.append(e.path)
    elif action == fp.UNSAFE:
        result.unsafe.append(f"{e.path} -> {e.target}")
    elif action == fp.MKDIR:
        tree.folder(e.path)
    elif action == fp.LINK:
        if tree.link(e.path, e.target, local):
            result.files += 1
    elif action in (fp.FETCH, fp.DELTA):
        job = FileJob(
            len(jobs),
            result,
            tree,
            e,
            local,
            fl.part_path(result.dest, e.path),
            direct=direct,
            request=fp.request_bytes(result.run_id, e.path),
        )
        jobs.append(job)
        if action == fp.DELTA or (e.size >= fp.DELTA_MIN and os.path.isfile(job.part)):
            basis.append(job)  # a local copy, or what an interrupted fetch left: compared by blocks
    if e.kind == "d":
        dirs.append((tree, e))
