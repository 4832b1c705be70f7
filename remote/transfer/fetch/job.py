"""One file of a fetch, from plan to install: what is known of it, and installing it once verified
(the host's mode and time, the rename into place, the previous content of a local file it replaces kept).

A local file whose content a fetch replaces is never lost silently: it is hard-linked into the run's
previous versions first (RUN/.previous/PATH, one version per file: an older one goes), which costs no
copy and no time, and the destination is never absent meanwhile. A file whose local copy is the start of
the new one (a log that grew) loses nothing, so nothing is kept. There is no size limit: one previous
version per file holds at most the run's size again, and a limit is where a good big checkpoint would be
lost; delete RUN/.previous/ to free it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field

from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import receiver as fl
from remote.transfer.fetch.report import RunResult


@dataclass
class FileJob:
    """A file to fetch, and how far it got (each stream's thread updates it under its lock)."""

    key: int
    run: RunResult
    tree: fl.Tree
    entry: fp.Entry
    planned: fp.Local | None
    part: str
    pieces: int = 0
    whole: str | None = None  # the host's SHA-256 of the whole file, when it comes in several pieces
    ino: int | None = None
    direct: bool = False  # its big pieces are written past the page cache (remote/transfer/fetch/direct.py)
    request: int = 0  # what each of its pieces adds to a read request (fp.request_bytes)
    compared: int | None = None  # the local file matched the host's blocks up to here (delta; -1: it did not)
    failed: bool = False
    installed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def stamp(job: FileJob, fd: int, chmod: bool = True) -> None:
    """The host's modification time, and its mode less setuid/setgid and group/world write."""
    if chmod:
        os.fchmod(fd, fp.safe_mode(job.entry.mode))
    os.utime(fd, ns=(job.entry.mtime_ns, job.entry.mtime_ns))


def install(job: FileJob, lock: threading.Lock, stamped: bool = False) -> None:
    """Rename a verified file into place (unless the destination changed meanwhile); a local file of
    other content that it replaces is kept in the run's previous versions (receiver.previous_dir)."""
    job.installed = True
    e = job.entry
    try:
        if not stamped:
            fd = os.open(job.part, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                stamp(job, fd)
            finally:
                os.close(fd)
        keep = keeper(job.run, lock) if differs(job) else None
        installed = job.tree.install(job.part, e.path, job.planned, keep)
    except (OSError, fl.UnsafePath) as err:
        with lock:
            job.run.conflicts.append(f"{e.path} ({getattr(err, 'strerror', None) or err})")
        return
    if not installed:  # kept for the next fetch to compare with: writable by us, private again
        with contextlib.suppress(OSError):
            os.chmod(job.part, 0o600)
    with lock:
        if installed:
            job.run.files += 1
            if keep is not None:
                job.run.kept.append(e.path)
        else:
            job.run.kept_newer.append(e.path)


def differs(job: FileJob) -> bool:
    """Whether installing ``job`` loses local content: the file here is not empty and not the start of
    the new one (a log that grew loses nothing). Only files that are here already pay for it: what
    the delta compared is known, the rest is read."""
    here = job.planned
    if here is None or here.kind != "f" or here.size == 0:
        return False
    if here.size > job.entry.size or job.compared == -1:
        return True
    return not fl.same_bytes(f"{job.tree.base}/{job.entry.path}", job.part, job.compared or 0, here.size)


def keeper(run: RunResult, lock: threading.Lock) -> fl.Tree:
    """The run's previous-versions tree (never through a link planted where it goes)."""
    with lock:  # (Tree's folders are made by one thread at a time)
        assert run.previous is not None
        if os.path.islink(run.previous):
            raise fl.UnsafePath(f"{run.previous} is a link: the previous version could not be kept, so the file was not replaced")
        return fl.Tree(run.previous)
