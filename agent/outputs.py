"""The run's outputs in its working directory: what the job created or changed there, not what was sent.

A real project writes its checkpoints where its own config says (``out_dir``), under its working
directory (REMOTE_ROOT/runs/RUN/code), not in JOB_DIR. So `launch` records what it put there
(``runs/RUN/sent.json``: each file's size, mtime and inode), and an output is any file or link that
is not in that record or whose identity moved: a file the job changed in place counts even when the
code was staged as hard links of the previous run's copy (its mtime moves). Not outputs: links into
the project's pushed data or venvs (REMOTE_ROOT/data, REMOTE_ROOT/envs), venvs and ``__pycache__``.
But what the job writes *through* a link to a pushed folder lands in DATA_DIR: those files (changed,
by their ctime, since the run was created) are outputs at the path the job wrote them; a pushed file
the job rewrote through its own link is named as one that cannot come home (copy it out of the data).
A run launched before the record existed counts what changed after it was created.
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import TYPE_CHECKING

from gpu_train.answers import TreeSummary
from gpu_train.codec import answer
from gpu_train.contract import INTERRUPTED, TERMINAL, UNREADABLE, RunRecord

from .store import read_json, read_state, write_json

if TYPE_CHECKING:
    from gpu_train.answers import ListingRow

WRITE_SLACK_S = 2.0  # a write the job made just before its end was recorded (the clock's and the file system's grain)

SENT = "sent.json"
SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc",)


def identity(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def record_sent(run_dir: str) -> None:
    """What the launch put in the working directory (files and links), by path: [size, mtimeNs, inode]."""
    code = os.path.join(run_dir, "code")
    sent, folders = {}, []
    for folder, dirs, names in os.walk(code):
        prefix = os.path.relpath(folder, code).replace(os.sep, "/") + "/"
        prefix = "" if prefix == "./" else prefix
        for name in dirs + names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                folders.append(prefix + name)
            else:
                sent[prefix + name] = identity(st)
    write_json(os.path.join(run_dir, SENT), {"files": sent, "dirs": folders})


def unshare(tree: str) -> int:
    """Give each regular file under ``tree`` that shares its inode with another (rsync's --link-dest, a
    reused run's hard links: the earlier runs' working directories) an inode of its own: copied beside it
    (mode and times kept), renamed over it. A job that rewrites a code file in place then rewrites its own
    run's copy only, never an earlier run's. The files copied."""
    copied = 0
    for folder, _, names in os.walk(tree):
        for name in names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
                continue
            tmp = f"{path}.gpu-train-unshare"
            shutil.copy2(path, tmp, follow_symlinks=False)
            os.replace(tmp, path)
            copied += 1
    return copied


def stage_sent(run_dir: str, staging: str) -> bool:
    """``staging`` as what was sent to ``run_dir`` (hard links; not what its job wrote there), when every
    file sent is still as it was; False (nothing staged) when a record is missing or a file moved."""
    code = os.path.join(run_dir, "code")
    doc = read_json(os.path.join(run_dir, SENT))
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        return False
    try:
        os.makedirs(staging, exist_ok=True)
        for rel in doc.get("dirs") or []:
            os.makedirs(os.path.join(staging, rel), exist_ok=True)
        for rel, ident in doc["files"].items():
            src, dest = os.path.join(code, rel), os.path.join(staging, rel)
            st = os.lstat(src)
            if identity(st) != ident:
                return False  # the job changed what was sent: the laptop sends it again
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dest)
            else:
                os.link(src, dest, follow_symlinks=False)
    except OSError:
        return False
    return True


def skip_roots(root: str) -> tuple[str, ...]:
    """Where links that are not outputs point: the project's pushed data and venvs (as named, and resolved)."""
    roots = set()
    for sub in ("data", "envs"):
        path = os.path.join(root, sub)
        roots.update({os.path.normpath(path) + os.sep, os.path.realpath(path) + os.sep})
    return tuple(sorted(roots))


def _into(folder: str, target: str, roots: tuple[str, ...]) -> bool:
    where = os.path.normpath(os.path.join(folder, target)) + os.sep
    return where.startswith(roots)


def listing(root: str, run_dir: str) -> list[ListingRow]:
    """The fetch listing of the working directory's outputs (fetchserve.listing's rows), each output's
    folders before it; things the host cannot read are rows of kind UNREADABLE with the reason."""
    code = os.path.join(run_dir, "code")
    doc = read_json(os.path.join(run_dir, SENT))
    sent = doc.get("files") if isinstance(doc, dict) else None
    record = read_state(run_dir)
    created_ns = int((record.created or 0) * 1e9)
    since_ns = created_ns if sent is None else 0
    until_ns = quiet_since_ns(record)
    roots = skip_roots(root)
    data_roots = tuple(r for r in roots if r.rstrip(os.sep).endswith(os.sep + "data"))
    rows: list[tuple[str, ListingRow]] = []
    folders: dict[str, ListingRow] = {}
    emitted: set[str] = set()

    def walk_error(err: OSError) -> None:
        if isinstance(err, FileNotFoundError):
            return  # gone since its folder was listed (or no working directory at all)
        rel = os.path.relpath(err.filename or code, code).replace(os.sep, "/")
        rows.append((rel, (rel, UNREADABLE, 0, 0, 0, err.strerror or str(err))))

    for folder, dirs, names in os.walk(code, onerror=walk_error):
        rel_folder = os.path.relpath(folder, code).replace(os.sep, "/")
        prefix = "" if rel_folder == "." else rel_folder + "/"
        keep = []
        for name in sorted(dirs):
            full = os.path.join(folder, name)
            if name in SKIP_DIRS or os.path.isfile(os.path.join(full, "pyvenv.cfg")):
                continue
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            except OSError as e:
                rows.append((prefix + name, (prefix + name, UNREADABLE, 0, 0, 0, e.strerror or str(e))))
                continue
            if stat.S_ISDIR(st.st_mode):
                keep.append(name)
                folders[prefix + name] = (prefix + name, "d", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode), "")
            else:
                names.append(name)  # a link to a folder: a link, as os.walk does not follow it
        dirs[:] = keep
        for name in sorted(names):
            rel = prefix + name
            if name.endswith(SKIP_SUFFIXES):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            except OSError as e:
                rows.append((rel, (rel, UNREADABLE, 0, 0, 0, e.strerror or str(e))))
                continue
            if sent is not None and sent.get(rel) == identity(st):
                continue
            if sent is None and st.st_mtime_ns <= since_ns:
                continue
            if stat.S_ISREG(st.st_mode):
                rows.append((rel, (rel, "f", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), "")))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(os.path.join(folder, name))
                except OSError:
                    continue
                if not _into(folder, target, roots):
                    rows.append((rel, (rel, "l", 0, st.st_mtime_ns, 0o777, target)))
                elif _into(folder, target, data_roots):
                    rows.extend(written_through(os.path.join(folder, target), rel, created_ns, folders, until_ns))
    out: list[ListingRow] = []
    for rel, row in rows:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            up = "/".join(parts[:i])
            if up not in emitted and up in folders:
                emitted.add(up)
                out.append(folders[up])
        out.append(row)
    return out


def quiet_since_ns(record: RunRecord) -> int | None:
    """When the run's job last could have written (ns): its end, or its interruption; None while it may
    still write. A pushed file changed after that (a later `push` of the project's data) is not its output."""
    if record.state in TERMINAL and record.ended:
        return int((record.ended + WRITE_SLACK_S) * 1e9)
    if record.state == INTERRUPTED and record.interrupted_at:
        return int((record.interrupted_at + WRITE_SLACK_S) * 1e9)
    return None


def written_through(
    target: str, rel: str, since_ns: int, folders: dict[str, ListingRow], until_ns: int | None = None
) -> list[tuple[str, ListingRow]]:
    """What the job wrote through a link to pushed data (``rel`` -> ``target`` in DATA_DIR): each file of
    a linked folder changed since ``since_ns`` (ctime: rsync sets a pushed file's mtime, not its ctime)
    and, for a run that ended, no later than ``until_ns`` (what changed after it is a later push's, not
    the job's), as a row at its path under ``rel``; a linked file itself rewritten, as a row that says why
    it cannot come home. Never follows a further link."""

    def by_the_job(ctime_ns: int) -> bool:
        return since_ns < ctime_ns and (until_ns is None or ctime_ns <= until_ns)

    try:
        st = os.stat(target)
    except OSError:
        return []
    if stat.S_ISREG(st.st_mode):
        if not by_the_job(st.st_ctime_ns):
            return []
        return [
            (
                rel,
                (
                    rel,
                    UNREADABLE,
                    0,
                    0,
                    0,
                    "the job rewrote this pushed file through its link into DATA_DIR: "
                    "copy it out of the pushed data (or write to a new name) to bring it home",
                ),
            )
        ]
    rows: list[tuple[str, ListingRow]] = []

    def unseen(err: OSError) -> None:  # a folder of the pushed data the job made unreadable: named, not skipped
        try:  # only one the run changed: a folder pushed as it is holds no output of this run
            changed = by_the_job(os.lstat(err.filename or target).st_ctime_ns)
        except OSError:
            changed = False
        if changed and not isinstance(err, FileNotFoundError):
            sub = os.path.relpath(err.filename or target, target).replace(os.sep, "/")
            where = rel if sub == "." else f"{rel}/{sub}"
            rows.append((where, (where, UNREADABLE, 0, 0, 0, err.strerror or str(err))))

    for folder, dirs, names in os.walk(target, onerror=unseen):
        sub = os.path.relpath(folder, target).replace(os.sep, "/")
        prefix = rel + "/" if sub == "." else f"{rel}/{sub}/"
        for d in dirs:
            try:
                with_st = os.lstat(os.path.join(folder, d))
            except OSError:  # gone since its folder was listed: nothing of it to bring home
                continue
            folders[prefix + d] = (prefix + d, "d", 0, with_st.st_mtime_ns, stat.S_IMODE(with_st.st_mode), "")
        folders.setdefault(prefix.rstrip("/"), (prefix.rstrip("/"), "d", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode), ""))
        for name in sorted(names):
            try:
                fst = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(fst.st_mode) and by_the_job(fst.st_ctime_ns):
                rows.append((prefix + name, (prefix + name, "f", fst.st_size, fst.st_mtime_ns, stat.S_IMODE(fst.st_mode), "")))
    return rows


def summary(root: str, run_dir: str) -> TreeSummary:
    """answers.TreeSummary of the outputs (files, bytes, newest change)."""
    files = [r for r in listing(root, run_dir) if r[1] == "f"]
    return answer(TreeSummary, files=len(files), bytes=sum(r[2] for r in files), newestNs=max((r[3] for r in files), default=0))
