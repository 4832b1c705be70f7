"""Parallel fetch: many runs' JOB_DIRs home over several SSH streams, from one listing.

1. One stream lists every run's JOB_DIR at once (one round trip however many runs).
2. Each entry is compared with what is here (remote/transfer/fetch/generator.py decides, planner.py
   applies it to the tree here): unchanged files are not
   sent, local files newer than the host's are kept, files that exist here but differ (or that
   an interrupted fetch left partly done) are compared block by block and only what differs is sent.
3. The pieces (whole small files, ranges of big ones) wait in one queue, largest first; each stream
   asks for a batch whenever the work it has asked for runs low, so no round trip is paid per file,
   the first stream moves data while the others log in, and the streams end together.
4. Each piece is written into the file's part beside the destination and checked against the
   SHA-256 the host computed while sending it; a file of several pieces is also checked whole
   against the host's hash of the whole file. The host's identity of the file (size, time, inode)
   must not move while it is read. Only then is the file renamed into place, with the host's time.

A dropped connection loses nothing: verified pieces stay in their part files, which the next
fetch uses as its basis (only blocks that differ from the host's are sent again).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpu_train.answers import Hashes, Listed, Pong, Refusal, RunListing
from remote.transfer.fetch import direct as fdirect
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import job as fj
from remote.transfer.fetch import planner
from remote.transfer.fetch import receiver as fl
from remote.transfer.fetch.job import FileJob
from remote.transfer.fetch.progress import Progress
from remote.transfer.fetch.report import RunResult
from remote.transfer.fetch.stream import Stream, StreamError


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
            dirs, basis = self._plan(results, first.read_doc(Listed, "the host's listing")["runs"])
            in_basis = {j.key for j in basis}
            pieces = self._hash_phase(first, basis)
            pieces += [p for j in self.jobs if j.key not in in_basis for p in self._whole(j)]
            self.progress.start(sum(p.length for p in pieces))
            n, rtt = fp.streams_for(self.streams, pieces), None
            if n > 1:  # only where it can change the count: a round trip costs one
                rtt = self._round_trip(first)
                n = fp.streams_for(self.streams, pieces, rtt)
            queue = fp.PieceQueue(pieces, fp.is_near(rtt), self._request_bytes)
            self._transfer(opened, queue, n, fp.lookahead(rtt))
            self._check_wholes(first)
            self._finish(dirs)
        except StreamError as e:
            for r in results:
                if r.error is None:
                    r.error, r.ssh_exit = f"{e}; run it again to resume", e.ssh_exit
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
        stream.read_doc(Pong, "the host's answer to a ping")
        return time.monotonic() - started

    def _plan(
        self, results: list[RunResult], listing: dict[str, RunListing | Refusal]
    ) -> tuple[list[tuple[fl.Tree, fp.Entry]], list[FileJob]]:
        """Each run's listing made into the work here (remote/transfer/fetch/planner.py): folders, links, jobs."""
        return planner.plan(results, listing, self.jobs)

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
            if src != job.part:  # the local file's blocks are compared with the host's
                job.compared = fp.compared_length(have, job.entry.size, blocks[job.key])
            return fl.block_hashes(job.part, fp.compared_length(have, job.entry.size, blocks[job.key]), blocks[job.key])

        with ThreadPoolExecutor(2) as pool:
            mine = list(pool.map(local, basis))
        theirs = stream.read_doc(Hashes, "the host's hashes")["items"]
        pieces = []
        for job, here, there in zip(basis, mine, theirs, strict=True):
            if "error" in there:
                self._unread(job, there["error"])
                continue
            if not self._same_file(job, there["stat"]):
                self._unread(job, None)
                continue
            job.whole = there["whole"]
            ranges = fp.changed_ranges(here, there["sha256"][: len(here)], blocks[job.key], job.entry.size)
            if job.compared is not None and any(off < job.compared for off, _ in ranges):
                job.compared = -1  # blocks of the local file differ from the host's
            job.pieces = len(ranges)
            pieces += [fp.Piece(job.key, off, n) for off, n in ranges]
            if not ranges:
                fj.install(job, self.lock)
        return pieces

    def _whole(self, job: FileJob) -> list[fp.Piece]:
        ranges = fp.whole_file_ranges(job.entry.size)
        job.pieces = len(ranges)
        if len(ranges) > 1 or job.entry.size == 0:
            fl.prepare_part(job.part, None, job.entry.size)
        if job.entry.size == 0:
            fj.install(job, self.lock)
            return []
        return [fp.Piece(job.key, off, n) for off, n in ranges]

    def _same_file(self, job: FileJob, st: Sequence[int]) -> bool:
        """The host's file is the one listed (size and time), and the same inode every time we look; a
        file that only grows (the run's log) may have grown meanwhile: what was listed is its start."""
        size, mtime_ns, ino = st
        grown = size > job.entry.size and fp.appends_only(job.run.run_id)
        with job.lock:
            job.ino = ino if job.ino is None else job.ino
            return (grown or (size == job.entry.size and mtime_ns == job.entry.mtime_ns)) and ino == job.ino

    # -- 3 and 4: move the pieces ---------------------------------------------------------------
    def _transfer(self, opened: list[Stream], queue: fp.PieceQueue, n: int, lookahead: int) -> None:
        """Up to ``n`` streams take the pieces from ``queue``: the first (open already) at once, each
        other as soon as it is open (a connection of its own logs in meanwhile, while the first moves
        data); none opens for less than a stream moves while it would connect."""
        lock, errors = threading.Lock(), list[StreamError]()
        threads: list[threading.Thread] = []
        for i in range(n):
            if i:
                with lock:
                    if errors or queue.left < fp.STREAM_WORTH:
                        break
                try:
                    opened.append(self.open_stream())
                except OSError:
                    break  # no more processes to be had here: the streams open take the rest
            threads.append(threading.Thread(target=self._work, args=(opened[i], queue, i == 0, lookahead, lock, errors)))
            threads[-1].start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _request_bytes(self, piece: fp.Piece) -> int:
        return self.jobs[piece.key].request

    def _work(
        self, stream: Stream, queue: fp.PieceQueue, lead: bool, lookahead: int, lock: threading.Lock, errors: list[StreamError]
    ) -> None:
        """One stream: ask for batches so that ``lookahead`` bytes of work stay asked for beyond the piece
        being received (the host never waits for a request), and receive the pieces in order."""
        buf = memoryview(mmap.mmap(-1, fdirect.BUFFER))  # page-aligned, as a direct write's buffer must be
        ahead: deque[fp.Piece] = deque()
        asked = requests = 0  # the bytes in ``ahead``, and what their requests took
        dry = False  # the queue has nothing more for this stream

        def top_up(reserve: int) -> None:
            """Once the bytes asked for, beyond ``reserve`` bytes of the piece being received, fall under half
            the lookahead, ask for the lookahead again (in large batches, not a request per file consumed).
            Checked as each chunk of a big piece comes, so the next request is there before the piece
            ends, and a stream holds little more than the lookahead beyond its current piece (a batch may
            end with one whole piece more). The requests sent ahead stay far within what an OpenSSH
            channel takes while the host is busy answering (its window is 2 MiB)."""
            nonlocal asked, requests, dry
            if dry or asked + reserve > lookahead // 2:
                return
            while not dry and (want := lookahead - asked - reserve) > 0 and requests < fp.REQUESTS_AHEAD:
                with lock:
                    batch = [] if errors else queue.take(lead, want)
                if not batch:
                    dry = True
                    return
                stream.send(
                    {"op": "read", "items": [[self.jobs[p.key].run.run_id, self.jobs[p.key].entry.path, p.offset, p.length] for p in batch]}
                )
                ahead.extend(batch)
                asked += sum(p.length for p in batch)
                requests += sum(self._request_bytes(p) for p in batch)

        try:
            while True:
                top_up(0)
                if not ahead:
                    return
                piece = ahead.popleft()
                asked -= piece.length
                requests -= self._request_bytes(piece)
                self._receive(stream, piece, buf, top_up)
        except StreamError as e:
            with lock:
                errors.append(e)
        except Exception as e:
            stream.close(kill=True)  # its answers are not read to the end: never used again
            with lock:
                errors.append(StreamError(f"a stream failed: {type(e).__name__}: {e}"))

    def _receive(self, stream: Stream, piece: fp.Piece, buf: memoryview, top_up: Callable[[int], None]) -> None:
        """One piece: into its file's part, checked against the host's SHA-256; the file installed when complete.
        ``top_up(bytes still to come)`` as each chunk comes."""
        job = self.jobs[piece.key]
        single = job.pieces == 1 and piece.offset == 0 and piece.length == job.entry.size and job.whole is None
        failure: OSError | None = None  # writing here failed (a full disk, a part in the way): drain, go on
        try:
            fd, chmod = fl.open_part(job.part, fp.safe_mode(job.entry.mode) if single else None, self.umask)
        except OSError as err:
            fd, chmod, failure = -1, False, err
        h, pos, received = hashlib.sha256(), piece.offset, 0
        top_up(piece.length)
        writer = fdirect.Writer(
            fd,
            job.direct
            and fd >= 0
            and piece.length >= fdirect.DIRECT_MIN
            and piece.offset % fdirect.DIRECT_ALIGN == 0
            and fdirect.set_direct(fd, True),
        )

        def sink(view: memoryview, h: hashlib._Hash = h) -> None:
            nonlocal pos, failure, received
            received += len(view)
            top_up(piece.length - received)
            h.update(view)
            self.progress.add(len(view))
            while view and failure is None:
                try:
                    n = writer.write(view, pos)
                except OSError as err:
                    failure = err
                    break
                pos, view = pos + n, view[n:]

        try:
            trailer, length = stream.read_range(sink, buf, piece.length)
            ok = "error" not in trailer and "short" not in trailer and trailer.get("sha256") == h.hexdigest()
            if ok and single and failure is None:
                try:
                    fj.stamp(job, fd, chmod)
                except OSError as err:
                    failure = err
        finally:
            if fd >= 0:
                os.close(fd)
        if failure is not None:
            job.failed = True
            with self.lock:
                job.run.error = job.run.error or f"{job.entry.path} could not be written here: {failure}"
            return
        if not ok or not self._same_file(job, trailer["stat"]):
            self._unread(job, trailer.get("error"))
            return
        with self.lock:
            job.run.bytes += length
        with job.lock:
            job.pieces -= 1
            last = job.pieces == 0
        if last and single:
            fj.install(job, self.lock, stamped=True)

    def _check_wholes(self, stream: Stream) -> None:
        """Files of several pieces: the SHA-256 of what was assembled against the host's of the whole file."""
        todo = [j for j in self.jobs if not j.failed and j.pieces == 0 and not j.installed]
        need = [j for j in todo if j.whole is None]
        if need:
            stream.send({"op": "hash", "items": [[j.run.run_id, j.entry.path, 0, j.entry.size, j.entry.size] for j in need]})
            for job, there in zip(need, stream.read_doc(Hashes, "the host's hashes")["items"], strict=True):
                if "error" in there:
                    self._unread(job, there["error"])
                elif self._same_file(job, there["stat"]):
                    job.whole = there["whole"]
                else:
                    self._unread(job, None)
        for job in todo:
            if job.failed:
                continue
            if job.whole is not None and fl.file_hash(job.part) == job.whole:
                fj.install(job, self.lock)
            else:
                self._unread(job, None)

    def _unread(self, job: FileJob, error: str | None) -> None:
        """A file not home: unreadable on the host (its error), else changed while it was read. Once per file."""
        with self.lock:
            if job.failed:
                return
            job.failed = True
            if error is not None:
                job.run.unreadable.append(f"{job.entry.path} ({error})")
            else:
                job.run.changed.append(job.entry.path)

    def _finish(self, dirs: list[tuple[fl.Tree, fp.Entry]]) -> None:
        """Folders get the host's times last (writing files into them moved their times)."""
        for tree, e in reversed(dirs):
            tree.set_time(e.path, e.mtime_ns)
        for job in self.jobs:
            if not job.failed and not job.installed:
                job.run.error = job.run.error or f"{job.entry.path} was not completed"
