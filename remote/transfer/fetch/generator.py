"""What a fetch moves, decided from one listing: pure functions, tested by tables.

The rules are rsync's (`rsync -a --update`), made explicit:
- a file whose size and modification time match the local copy is not sent (rsync's quick check);
- a local file newer than the host's is never replaced;
- a file that exists locally but differs is compared block by block (SHA-256 of fixed blocks on
  both sides), and only the blocks that differ, plus whatever the host has beyond the local end,
  are sent: a file that grew sends its new tail, a checkpoint rewritten in place sends what
  changed. (rsync's rolling checksum also finds data that moved; checkpoints do not move data.)
  A partial file left by an interrupted fetch is such a basis too, so a fetch resumes where it was.

Then the work is cut into pieces (a whole small file, or a range of a big one), which the streams take
in batches, largest first, each as the bytes it has asked for run low. Whether another stream is worth
opening weighs each piece's bytes plus a fixed per-file cost, so 1,000 small files count for what they cost.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_train.contract import RUN_FILES, UNREADABLE, WORKDIR

MiB = 1 << 20
MAX_SIZE = 1 << 56  # a claimed file size beyond any disk (the ranges it would take are bounded below too)
MAX_PATH = 4096  # Linux's PATH_MAX: a longer name in a listing is not a file's
MAX_ENTRIES = 2_000_000  # entries in one fetch's listing: beyond, a host is flooding, not listing
DEFAULT_STREAMS = 4  # `fab fetch --streams N`: enough to fill a long link from one laptop (4 x 2 MiB windows)
SPLIT_BYTES = 256 * MiB  # files larger than this travel in ranges, over several streams at once
RANGE_BYTES = 64 * MiB  # the size of those ranges
DELTA_MIN = 64 * 1024  # smaller files are sent whole rather than compared block by block
PIECE_COST = 32 * 1024  # what one more piece costs a stream beyond its bytes (headers, a file to open)

# Actions for one listing entry.
SKIP = "skip"  # same size and time here: nothing to do
KEEP_NEWER = "keep-newer"  # the local file is newer than the host's: never replaced
CONFLICT = "conflict"  # a different kind of thing is in the way here (a folder where a file goes): left alone
UNSAFE = "unsafe"  # a link that could point out of the run's folder (rsync's rules): not made here
MKDIR = "mkdir"
LINK = "link"
FETCH = "fetch"  # not here yet: sent whole (in ranges if big)
DELTA = "delta"  # here but different: compared block by block, only what differs sent


@dataclass(frozen=True)
class Entry:
    """One thing in a JOB_DIR on the host, as the host's listing gives it."""

    path: str  # relative to the JOB_DIR, '/'-separated
    kind: str  # f, d, l
    size: int = 0
    mtime_ns: int = 0
    mode: int = 0o644
    target: str = ""  # a link's target

    @classmethod
    def from_wire(cls, row: Sequence[Any]) -> Entry:
        """One row of the host's listing, each field checked as what it is (ValueError names the row)."""
        path, kind, size, mtime_ns, mode, target = row
        ints = (size, mtime_ns, mode)
        if (
            not isinstance(path, str)
            or not isinstance(target, str)
            or kind not in ("f", "d", "l", UNREADABLE)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in ints)
            or not 0 <= size <= MAX_SIZE
            or not 0 <= mode <= 0o177777
            or abs(mtime_ns) > 1 << 63
            or len(path) > MAX_PATH
            or len(target) > MAX_PATH
        ):
            raise ValueError(f"a listing row that is not one: {str(row)[:200]}")
        return cls(path, kind, size, mtime_ns, mode, target)


@dataclass(frozen=True)
class Local:
    """What is at the same path here (``lstat``), or None when nothing is."""

    kind: str  # f, d, l, or o (anything else)
    size: int = 0
    mtime_ns: int = 0
    target: str = ""


def decide(entry: Entry, local: Local | None) -> str:
    """What to do with one listing entry given what is here."""
    if entry.kind == "d":
        if local is None:
            return MKDIR
        return SKIP if local.kind == "d" else CONFLICT
    if entry.kind == "l":
        if not safe_link(entry.path, entry.target):
            return UNSAFE
        if local is None:
            return LINK
        if local.kind == "l":
            return SKIP if local.target == entry.target else (KEEP_NEWER if local.mtime_ns > entry.mtime_ns else LINK)
        return CONFLICT
    if local is None:
        return FETCH
    if local.kind != "f":
        return CONFLICT
    if local.mtime_ns > entry.mtime_ns:
        return KEEP_NEWER
    if local.size == entry.size and local.mtime_ns == entry.mtime_ns:
        return SKIP
    return DELTA if entry.size >= DELTA_MIN and local.size > 0 else FETCH


def listing_problem(entries: list[Entry], capacity: int) -> str:
    """Why a run's listing cannot be fetched to a disk of ``capacity`` bytes ('' when it can): a file,
    or all of them, bigger than the whole disk never fits, and would only make ranges by the billion."""
    biggest = max((e.size for e in entries if e.kind == "f"), default=0)
    total = sum(e.size for e in entries if e.kind == "f")
    if total > capacity:
        return (
            f"the host lists {total} bytes of files (the largest {biggest}), more than this disk holds "
            f"({capacity} bytes): nothing was fetched"
        )
    return ""


PREVIOUS = ".previous"  # runs/STACK/RUN/.previous/: the previous content of files a fetch replaced
_RESERVED = re.compile(rf"{WORKDIR}|\.previous|{re.escape(RUN_FILES)}|node-[0-9]+|\..*\.gpu-train-partial")


def reserved(path: str) -> bool:
    """Whether a JOB_DIR path lies under a top-level name the run's folder here keeps for itself: its
    working directory's outputs, the previous versions, the run's log, other nodes' files, partial files."""
    return _RESERVED.fullmatch(path.partition("/")[0]) is not None


def appends_only(source: str) -> bool:
    """Whether a source's files only grow (the run's log, RUN/.gpu-train): one that grew while it was
    read is still home as the start the host had when it was listed, not "changed while being read"."""
    return source.endswith("/" + RUN_FILES)


def block_size(size: int) -> int:
    """Blocks for comparing a file: at most about 1,024 of them, each 64 KiB to 8 MiB (a power of two)."""
    block = 64 * 1024
    while block < 8 * MiB and block * 1024 < size:
        block *= 2
    return block


def split(offset: int, length: int, size: int | None = None) -> list[tuple[int, int]]:
    """[offset, offset+length) cut into ranges of at most ``size`` bytes (default RANGE_BYTES)."""
    size = size or RANGE_BYTES
    return [(o, min(size, offset + length - o)) for o in range(offset, offset + length, size)] or [(offset, 0)]


def whole_file_ranges(size: int) -> list[tuple[int, int]]:
    """A new file: one piece, or ranges when it is big enough to be worth several streams."""
    return split(0, size) if size > SPLIT_BYTES else [(0, size)]


def changed_ranges(local_blocks: list[str], remote_blocks: list[str], block: int, remote_size: int) -> list[tuple[int, int]]:
    """The ranges of the host's file to send, given both sides' block hashes over their common length.

    Blocks that differ (adjacent ones merged), then everything past the compared blocks: the
    part the host has and the local basis lacks. Each range at most RANGE_BYTES.
    """
    ranges: list[tuple[int, int]] = []
    compared = min(len(local_blocks), len(remote_blocks))
    start = None
    for i in range(compared):
        if local_blocks[i] != remote_blocks[i]:
            start = i if start is None else start
        elif start is not None:
            ranges.append((start * block, (i - start) * block))
            start = None
    tail_from = (start if start is not None else compared) * block
    if tail_from < remote_size:
        ranges.append((tail_from, remote_size - tail_from))
    out: list[tuple[int, int]] = []
    for off, length in ranges:
        length = min(length, remote_size - off)
        if length > 0:
            out.extend(split(off, length))
    return out


def compared_length(local_size: int, remote_size: int, block: int) -> int:
    """How much of the file both sides hash: the whole blocks both have (a short last block is just sent)."""
    return min(local_size, remote_size) // block * block


@dataclass(frozen=True)
class Piece:
    """A range of one file to send; ``key`` says which file (the engine's own handle)."""

    key: int
    offset: int
    length: int


class PieceQueue:
    """The pieces not yet asked for, in the order streams take them: largest first.

    Each stream takes a batch whenever the work it has asked for and not yet begun runs low
    (``lookahead``, below), so no stream waits for another's fixed share: one that opened late, or
    moves slower, simply takes less, and the streams end within a batch of each other. Largest
    first starts the big transfers early and leaves small pieces for the end, where they even out.

    ``near`` (a near link, see streams_for): pieces under PIECE_COST are taken by the lead stream
    only, before anything else: their cost is the laptop's per-file work, which a second stream's
    thread only contends with for the one interpreter, while the other streams move the big ones.
    ``request_bytes`` is what a piece adds to the request that asks for it (its path): a batch stops
    at REQUEST_BYTES of it; the engine keeps a stream's unanswered requests under REQUESTS_AHEAD, so
    they never fill the SSH channel's window while the host is busy answering (it reads the next
    request only after answering the last).
    """

    def __init__(self, pieces: list[Piece], near: bool = False, request_bytes: Callable[[Piece], int] = lambda p: 64):
        ordered = sorted(pieces, key=_largest_first)
        self._lead = deque(p for p in ordered if near and p.length < PIECE_COST)
        self._any = deque(p for p in ordered if not (near and p.length < PIECE_COST))
        self._request_bytes = request_bytes
        self.left = sum(cost(p) for p in ordered)  # bytes plus PIECE_COST each, not yet taken

    def take(self, lead: bool, want: int) -> list[Piece]:
        """Pieces of at least ``want`` bytes in all (fewer where fewer are left; none when the queue has
        nothing for this stream), whose request stays under REQUEST_BYTES."""
        batch: list[Piece] = []
        got = size = 0
        while got < want and size < REQUEST_BYTES:
            lane = self._lead if lead and self._lead else self._any
            if not lane:
                break
            piece = lane.popleft()
            batch.append(piece)
            got += piece.length
            size += self._request_bytes(piece)
            self.left -= cost(piece)
        return batch


def request_bytes(run_id: str, path: str) -> int:
    """At least what one piece of ``path`` adds to a read request's JSON: a character beyond printable
    ASCII is escaped (\\uXXXX, twice for one beyond the first 64K); a run id is plain ASCII."""
    size = len(path) + path.count('"') + path.count("\\") if path.isascii() and path.isprintable() else 12 * len(path)
    return size + len(run_id) + 48  # the numbers, quotes and commas


def cost(piece: Piece) -> int:
    """What a piece costs a stream: its bytes, and PIECE_COST for the per-file work."""
    return piece.length + PIECE_COST


REQUEST_BYTES = 64 * 1024  # a batch's request stays under this
REQUESTS_AHEAD = 512 * 1024  # a stream stops asking while its unanswered requests exceed this (a channel's window is 2 MiB)
LOOKAHEAD_NEAR = 2 * MiB  # bytes a stream keeps asked for beyond the piece it receives, on a near link
LOOKAHEAD = 8 * MiB  # elsewhere: a window (2 MiB) a round trip moves at most, several times over


def lookahead(rtt: float | None) -> int:
    """How many bytes a stream keeps asked for ahead: enough to cover a round trip at the stream's
    pace (a stream moves at most a 2 MiB window per round trip; per-file work only slows it, so bytes,
    not the pieces' cost, say how long the host stays busy), little enough that the streams end together."""
    return LOOKAHEAD_NEAR if is_near(rtt) else LOOKAHEAD


def _largest_first(p: Piece) -> tuple[int, int, int]:
    return (-p.length, p.key, p.offset)


STREAM_WORTH = 8 * MiB  # about what one stream moves while another connection is being opened


NEAR_RTT_S = 0.005  # a round trip this short: one stream's window moves 400 MiB/s, more than a disk takes
NEAR_STREAMS = 2  # streams on such a link: more only contend for the laptop's CPU and disk
NEAR_BIG = MiB  # on such a link, a second stream opens only for the bytes of pieces this big


def is_near(rtt: float | None) -> bool:
    """A round trip (seconds; None: not timed) short enough that one stream's window is no limit."""
    return rtt is not None and rtt < NEAR_RTT_S


def streams_for(requested: int, pieces: list[Piece], rtt: float | None = None) -> int:
    """No more streams than there is work for: one per piece, one per STREAM_WORTH of data at most.

    On a near link (``rtt``, seconds, under NEAR_RTT_S) a stream's window is no limit, so more streams
    only share the laptop's CPU: at most NEAR_STREAMS, and a second one only for the bytes of big
    pieces. Small files there are all per-file work in one process, which a second stream's thread
    only contends with (loopback, 60,000 files of 2 KB: one stream 10 s, two 12 to 19 s; 1 GiB of
    checkpoints: two streams 3.7 s, one 4.2 s, four 15% slower than two).
    """
    total = sum(p.length + PIECE_COST for p in pieces)
    if is_near(rtt):
        big = sum(p.length for p in pieces if p.length >= NEAR_BIG)
        requested = min(requested, NEAR_STREAMS, 1 + big // STREAM_WORTH)
    return max(1, min(requested, len(pieces), total // STREAM_WORTH + 1))


def safe_link(path: str, target: str) -> bool:
    """Whether a link at ``path`` to ``target`` stays inside the tree: relative, its leading ``..`` no
    more than the folders above it, and no ``..`` after any other part (rsync's rule since 3.4,
    CVE-2024-12088): ``d/e/up -> ../..`` is fine alone, but ``x -> d/e/up/../../..`` climbs out
    through it, and a lexical count cannot know that ``up`` is a link made by the same fetch."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    depth = path.count("/")  # folders above the link, inside the tree
    descended = False
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if descended or depth < 0:
                return False
        elif part not in ("", "."):
            descended = True
    return True


def safe_mode(mode: int) -> int:
    """A fetched file's mode: the host's, less setuid/setgid/sticky and group/world write."""
    return mode & 0o755
