"""Parallel fetch: many runs' JOB_DIRs home over several SSH streams, from one listing.

1. One stream lists every run's JOB_DIR at once (one round trip however many runs).
2. Each entry is compared with what is here (remote/fetch_plan.py): unchanged files are not
   sent, local files newer than the host's are kept, files that exist here but differ (or that
   an interrupted fetch left partly done) are compared block by block and only what differs is sent.
3. The pieces (whole small files, ranges of big ones) are spread over the streams by size; each
   stream gets its whole share in one request, so no round trip is paid per file.
4. Each piece is written into the file's part beside the destination and checked against the
   SHA-256 the host computed while sending it; a file of several pieces is also checked whole
   against the host's hash of the whole file. The host's identity of the file (size, time, inode)
   must not move while it is read. Only then is the file renamed into place, with the host's time.

A dropped connection loses nothing: verified pieces stay in their part files, which the next
fetch uses as its basis (only blocks that differ from the host's are sent again).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from remote import fetch_local as fl
from remote import fetch_plan as fp
from remote.fetch_progress import Progress
from remote.fetch_stream import Stream, StreamError
from remote.sync import human


@dataclass
class RunResult:
    """What one run's fetch did: the counts for the summary line and the reasons it is not complete."""

    run_id: str
    dest: Path
    files: int = 0
    bytes: int = 0
    kept_newer: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # links pointing out of the JOB_DIR: not made here
    changed: list[str] = field(default_factory=list)  # changed on the host while being read: next time
    error: str | None = None
    summary: dict | None = None  # the host's JOB_DIR: files, bytes, newest change (for the fetch record)

    @property
    def up_to_date(self) -> bool:
        return self.error is None and self.files == 0 and not self.changed

    @property
    def complete(self) -> bool:
        return self.error is None and not self.changed


@dataclass
class FileJob:
    key: int
    run: RunResult
    tree: fl.Tree
    entry: fp.Entry
    planned: fl.Local | None
    part: str
    pieces: int = 0
    whole: str | None = None  # the host's SHA-256 of the whole file, when it comes in several pieces
    ino: int | None = None
    failed: bool = False
    installed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _some(paths: list[str], limit: int = 5) -> str:
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def notes(result: RunResult, where: Path) -> list[str]:
    """What to tell the user about one run's fetch."""
    rid = result.run_id
    if result.error is not None:
        lines = [f"{rid}: fetch failed: {result.error}"]
    elif result.up_to_date:
        lines = [f"{rid}: up to date in {where}"]
    else:
        lines = [f"{rid}: fetched {result.files} file(s), {human(result.bytes)} -> {where}"]
    if result.kept_newer:
        lines.append(f"  kept {len(result.kept_newer)} local file(s) newer than the host's: {_some(result.kept_newer)}")
    if result.conflicts:
        lines.append(f"  left alone, something else is in the way here: {_some(result.conflicts)}")
    if result.unsafe:
        lines.append(f"  not made, links pointing out of the run: {_some(result.unsafe)}")
    if result.changed:
        lines.append(f"  changed on the host while being read (the next fetch takes them): {_some(result.changed)}")
    return lines


def summary_line(results: list[RunResult], elapsed: float, streams: int) -> str:
    """The one line a fetch ends with."""
    files, moved = sum(r.files for r in results), sum(r.bytes for r in results)
    fresh = sum(1 for r in results if r.up_to_date)
    rate = f", {human(moved / elapsed)}/s" if elapsed > 0 and moved else ""
    return (f"fetched {files} file(s), {human(moved)} from {len(results)} run(s) in {elapsed:.1f} s{rate} "
            f"(up to {streams} streams); {fresh} up to date, {sum(1 for r in results if r.error)} failed")


def summary(entries: list[fp.Entry]) -> dict:
    files = [e for e in entries if e.kind == "f"]
    return {"files": len(files), "bytes": sum(e.size for e in files),
            "newestNs": max((e.mtime_ns for e in entries), default=0)}


class Fetcher:
    """Fetch runs from one host over up to ``streams`` connections opened by ``open_stream``."""

    def __init__(self, open_stream: Callable[[], Stream], streams: int = 4, progress: Progress | None = None):
        self.open_stream, self.streams = open_stream, max(1, int(streams))
        self.progress = progress or Progress(0, live=False)
        self.jobs: list[FileJob] = []
        self.lock = threading.Lock()  # the runs' counters, updated by every stream's thread
        self.umask = fl.current_umask()  # a new file made with its final mode needs no chmod where this keeps it

    # -- 1 and 2: list and decide ---------------------------------------------------------------
    def run(self, runs: list[tuple[str, Path]]) -> list[RunResult]:
        results = [RunResult(run_id, dest) for run_id, dest in runs]
        first = self.open_stream()
        opened = [first]
        try:
            first.send({"op": "list", "runs": [r.run_id for r in results]})
            dirs, basis = self._plan(results, first.read_doc()["runs"])
            in_basis = {j.key for j in basis}
            pieces = self._hash_phase(first, basis)
            pieces += [p for j in self.jobs if j.key not in in_basis for p in self._whole(j)]
            self.progress.start(sum(p.length for p in pieces))
            n, rtt = fp.streams_for(self.streams, pieces), None
            if n > 1:  # only where it can change the count: a round trip costs one
                rtt = self._round_trip(first)
                n = fp.streams_for(self.streams, pieces, rtt)
            shares = fp.balance(pieces, n, near=fp.is_near(rtt)) if pieces else []
            opened += [self.open_stream() for _ in shares[1:]]
            self._transfer(list(zip(opened, shares, strict=False)))
            self._check_wholes(first)
            self._finish(dirs)
        except StreamError as e:
            for r in results:
                r.error = r.error or f"{e}; run it again to resume"
        finally:
            for s in opened:
                s.close(kill=True)
            self.progress.done()
        for r in results:
            if r.complete:
                shutil.rmtree(fl.partial_dir(r.dest), ignore_errors=True)
        return results

    @staticmethod
    def _round_trip(stream: Stream) -> float:
        """Seconds for one request and its answer on an open stream (the host does nothing for it)."""
        started = time.monotonic()
        stream.send({"op": "ping"})
        stream.read_doc()
        return time.monotonic() - started

    def _plan(self, results: list[RunResult], listing: dict) -> tuple[list, list[FileJob]]:
        dirs: list[tuple[Path, fp.Entry]] = []
        basis: list[FileJob] = []
        for result in results:
            doc = listing.get(result.run_id) or {"error": f"the host did not list {result.run_id}"}
            if "error" in doc:
                result.error = doc["error"]
                continue
            entries = [fp.Entry.from_wire(row) for row in doc["entries"]]
            result.summary = summary(entries)
            try:
                self._plan_run(result, entries, dirs, basis)
            except (fl.UnsafePath, OSError) as e:
                result.error = str(e)
        return dirs, basis

    def _plan_run(self, result: RunResult, entries: list[fp.Entry], dirs: list, basis: list) -> None:
        tree = fl.Tree(result.dest)
        tree.folder("")
        for e in entries:
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
                job = FileJob(len(self.jobs), result, tree, e, local, fl.part_path(result.dest, e.path))
                self.jobs.append(job)
                if action == fp.DELTA or (e.size >= fp.DELTA_MIN and os.path.isfile(job.part)):
                    basis.append(job)  # a local copy, or what an interrupted fetch left: compared by blocks
            if e.kind == "d":
                dirs.append((tree, e))

    # -- delta: compare blocks with the host ----------------------------------------------------
    def _hash_phase(self, stream: Stream, basis: list[FileJob]) -> list[fp.Piece]:
        """Block hashes of each basis on both sides at once; the ranges that differ become pieces."""
        if not basis:
            return []
        blocks = {j.key: fp.block_size(j.entry.size) for j in basis}
        stream.send({"op": "hash", "items": [[j.run.run_id, j.entry.path, 0, j.entry.size, blocks[j.key]] for j in basis]})

        def local(job: FileJob) -> list[str]:
            src = job.part if os.path.isfile(job.part) else f"{job.tree.base}/{job.entry.path}"
            fl.prepare_part(job.part, src, job.entry.size)
            have = min(job.entry.size, (job.planned.size if job.planned and src != job.part else job.entry.size))
            return fl.block_hashes(job.part, fp.compared_length(have, job.entry.size, blocks[job.key]), blocks[job.key])

        with ThreadPoolExecutor(2) as pool:
            mine = list(pool.map(local, basis))
        theirs = stream.read_doc()["items"]
        pieces = []
        for job, here, there in zip(basis, mine, theirs, strict=True):
            if "error" in there or not self._same_file(job, there["stat"]):
                job.run.changed.append(job.entry.path)
                job.failed = True
                continue
            job.whole = there["whole"]
            ranges = fp.changed_ranges(here, there["sha256"][: len(here)], blocks[job.key], job.entry.size)
            job.pieces = len(ranges)
            pieces += [fp.Piece(job.key, off, n) for off, n in ranges]
            if not ranges:
                self._complete(job)
        return pieces

    def _whole(self, job: FileJob) -> list[fp.Piece]:
        ranges = fp.whole_file_ranges(job.entry.size)
        job.pieces = len(ranges)
        if len(ranges) > 1 or job.entry.size == 0:
            fl.prepare_part(job.part, None, job.entry.size)
        if job.entry.size == 0:
            self._complete(job)
            return []
        return [fp.Piece(job.key, off, n) for off, n in ranges]

    def _same_file(self, job: FileJob, st: list) -> bool:
        """The host's file is the one listed (size and time), and the same inode every time we look."""
        size, mtime_ns, ino = st
        with job.lock:
            job.ino = ino if job.ino is None else job.ino
            return size == job.entry.size and mtime_ns == job.entry.mtime_ns and ino == job.ino

    # -- 3 and 4: move the pieces ---------------------------------------------------------------
    def _transfer(self, shares: list[tuple[Stream, list[fp.Piece]]]) -> None:
        for stream, share in shares:
            stream.send({"op": "read", "items": [[self.jobs[p.key].run.run_id, self.jobs[p.key].entry.path, p.offset,
                                                  p.length] for p in share]})
        errors: list[StreamError] = []
        threads = [threading.Thread(target=self._receive, args=(s, share, errors)) for s, share in shares]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _receive(self, stream: Stream, share: list[fp.Piece], errors: list) -> None:
        buf = memoryview(bytearray(fl.CHUNK))
        for piece in share:
            job = self.jobs[piece.key]
            single = job.pieces == 1 and piece.offset == 0 and piece.length == job.entry.size and job.whole is None
            failure: OSError | None = None  # writing here failed (a full disk, a part in the way): drain, go on
            try:
                fd, chmod = fl.open_part(job.part, fp.safe_mode(job.entry.mode) if single else None, self.umask)
            except OSError as err:
                fd, chmod, failure = -1, False, err
            h, pos = hashlib.sha256(), piece.offset

            def sink(view: memoryview, fd: int = fd, h=h) -> None:
                nonlocal pos, failure
                h.update(view)
                self.progress.add(len(view))
                while view and failure is None:
                    try:
                        n = os.pwrite(fd, view, pos)
                    except OSError as err:
                        failure = err
                        break
                    pos, view = pos + n, view[n:]

            try:
                trailer, length = stream.read_range(sink, buf)
                ok = "error" not in trailer and "short" not in trailer and trailer.get("sha256") == h.hexdigest()
                if ok and single and failure is None:
                    try:
                        self._stamp(job, fd, chmod)
                    except OSError as err:
                        failure = err
            except StreamError as e:
                errors.append(e)
                return
            finally:
                if fd >= 0:
                    os.close(fd)
            if failure is not None:
                job.failed = True
                with self.lock:
                    job.run.error = job.run.error or f"{job.entry.path} could not be written here: {failure}"
                continue
            if not ok or not self._same_file(job, trailer["stat"]):
                job.failed = True
                if job.entry.path not in job.run.changed:
                    job.run.changed.append(job.entry.path)
                continue
            with self.lock:
                job.run.bytes += length
            with job.lock:
                job.pieces -= 1
                last = job.pieces == 0
            if last and single:
                self._complete(job, stamp=False)

    def _check_wholes(self, stream: Stream) -> None:
        """Files of several pieces: the SHA-256 of what was assembled against the host's of the whole file."""
        todo = [j for j in self.jobs if not j.failed and j.pieces == 0 and not j.installed]
        need = [j for j in todo if j.whole is None]
        if need:
            stream.send({"op": "hash", "items": [[j.run.run_id, j.entry.path, 0, j.entry.size, j.entry.size] for j in need]})
            for job, there in zip(need, stream.read_doc()["items"], strict=True):
                if "error" not in there and self._same_file(job, there["stat"]):
                    job.whole = there["whole"]
        for job in todo:
            if job.whole is not None and fl.file_hash(job.part) == job.whole:
                self._complete(job)
            elif job.entry.path not in job.run.changed:
                job.failed = True
                job.run.changed.append(job.entry.path)

    @staticmethod
    def _stamp(job: FileJob, fd: int, chmod: bool = True) -> None:
        """The host's modification time, and its mode less setuid/setgid and group/world write."""
        if chmod:
            os.fchmod(fd, fp.safe_mode(job.entry.mode))
        os.utime(fd, ns=(job.entry.mtime_ns, job.entry.mtime_ns))

    def _complete(self, job: FileJob, stamp: bool = True) -> None:
        """Rename a verified file into place (unless the destination changed meanwhile)."""
        job.installed = True
        e = job.entry
        try:
            if stamp:
                fd = os.open(job.part, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    self._stamp(job, fd)
                finally:
                    os.close(fd)
            installed = job.tree.install(job.part, e.path, job.planned)
        except (OSError, fl.UnsafePath) as err:
            with self.lock:
                job.run.conflicts.append(f"{e.path} ({err})")
            return
        if not installed:  # kept for the next fetch to compare with: writable by us, private again
            with contextlib.suppress(OSError):
                os.chmod(job.part, 0o600)
        with self.lock:
            if installed:
                job.run.files += 1
            else:
                job.run.kept_newer.append(e.path)

    def _finish(self, dirs: list[tuple[fl.Tree, fp.Entry]]) -> None:
        """Folders get the host's times last (writing files into them moved their times)."""
        for tree, e in reversed(dirs):
            tree.set_time(e.path, e.mtime_ns)
        for job in self.jobs:
            if not job.failed and not job.installed:
                job.run.error = job.run.error or f"{job.entry.path} was not completed"
