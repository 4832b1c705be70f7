"""The fetch's decisions as tables: what to send, how to cut it, how to spread it over streams."""

from __future__ import annotations

import json
import os

import pytest

from remote.transfer.fetch import generator as fp
from remote.transfer.fetch.generator import Entry, Local, Piece
from remote.transfer.fetch.progress import bar_line

MiB = fp.MiB
T = 1_700_000_000_000_000_000  # a modification time, in ns


@pytest.mark.parametrize(("entry", "local", "action"), [
    # regular files
    (Entry("a", "f", 10, T), None, fp.FETCH),
    (Entry("a", "f", 10, T), Local("f", 10, T), fp.SKIP),  # rsync's quick check: size and time
    (Entry("a", "f", 10, T), Local("f", 10, T + 1), fp.KEEP_NEWER),  # newer here: never replaced
    (Entry("a", "f", 10, T), Local("f", 99, T + 10**9), fp.KEEP_NEWER),
    (Entry("a", "f", 10, T), Local("f", 5, T - 1), fp.FETCH),  # small: sent whole
    (Entry("a", "f", 10 * MiB, T), Local("f", 5 * MiB, T - 1), fp.DELTA),  # grew: compared, tail sent
    (Entry("a", "f", 10 * MiB, T), Local("f", 10 * MiB, T - 1), fp.DELTA),  # rewritten in place
    (Entry("a", "f", 10 * MiB, T), Local("f", 11 * MiB, T), fp.DELTA),  # same time, other size
    (Entry("a", "f", 10 * MiB, T), Local("f", 0, T - 1), fp.FETCH),  # nothing to compare with
    (Entry("a", "f", 10, T), Local("d"), fp.CONFLICT),  # a folder in the way: left alone
    (Entry("a", "f", 10, T), Local("l", target="x"), fp.CONFLICT),  # never written through a link
    (Entry("a", "f", 10, T), Local("o"), fp.CONFLICT),  # a folder on the way is a link or a file
    # folders
    (Entry("d", "d"), None, fp.MKDIR),
    (Entry("d", "d"), Local("d"), fp.SKIP),
    (Entry("d", "d"), Local("f", 3, T), fp.CONFLICT),
    # links
    (Entry("l", "l", 0, T, target="x"), None, fp.LINK),
    (Entry("l", "l", 0, T, target="x"), Local("l", 0, 1, "x"), fp.SKIP),
    (Entry("l", "l", 0, T, target="y"), Local("l", 0, T - 1, "x"), fp.LINK),
    (Entry("l", "l", 0, T, target="y"), Local("l", 0, T + 1, "x"), fp.KEEP_NEWER),
    (Entry("l", "l", 0, T, target="y"), Local("f", 1, T), fp.CONFLICT),
    (Entry("l", "l", 0, T, target="/etc/passwd"), None, fp.UNSAFE),  # out of the run: not made (rsync --safe-links)
    (Entry("d/l", "l", 0, T, target="../../x"), None, fp.UNSAFE),
])  # fmt: skip
def test_decide(entry: Entry, local: Local | None, action: str) -> None:
    assert fp.decide(entry, local) == action


@pytest.mark.parametrize(("size", "block"), [
    (0, 64 * 1024), (64 * 1024 * 1024, 64 * 1024), (64 * MiB + 1, 128 * 1024), (1 << 30, MiB),
    (8 << 30, 8 * MiB), (100 << 30, 8 * MiB),
])  # fmt: skip
def test_block_size(size: int, block: int) -> None:
    assert fp.block_size(size) == block


@pytest.mark.parametrize(("size", "ranges"), [
    (0, [(0, 0)]),
    (10, [(0, 10)]),
    (256 * MiB, [(0, 256 * MiB)]),  # not over the threshold: one piece
    (256 * MiB + 1, [(0, 64 * MiB), (64 * MiB, 64 * MiB), (128 * MiB, 64 * MiB), (192 * MiB, 64 * MiB), (256 * MiB, 1)]),
])  # fmt: skip
def test_whole_file_ranges(size: int, ranges: list) -> None:
    assert fp.whole_file_ranges(size) == ranges
    assert sum(n for _, n in ranges) == size


B = 1000  # a block size for the delta tables


@pytest.mark.parametrize(("local", "remote", "size", "ranges"), [
    # identical: nothing
    (["a", "b", "c"], ["a", "b", "c"], 3 * B, []),
    # the file grew: only the tail beyond the compared blocks
    (["a", "b"], ["a", "b", "c", "d"], 3 * B + 500, [(2 * B, B + 500)]),
    # one block changed in the middle; two adjacent ones merge
    (["a", "b", "c", "d"], ["a", "X", "c", "d"], 4 * B, [(B, B)]),
    (["a", "b", "c", "d"], ["a", "X", "Y", "d"], 4 * B, [(B, 2 * B)]),
    (["a", "b", "c", "d"], ["X", "b", "c", "Y"], 4 * B, [(0, B), (3 * B, B)]),
    # changed at the end and grew: one range from the change to the end
    (["a", "b"], ["a", "X", "c"], 3 * B, [(B, 2 * B)]),
    # the host's file shrank below the local basis: only its own length counts
    (["a", "b", "c"], ["a", "b"], 2 * B + 10, [(2 * B, 10)]),
    # nothing to compare (a basis shorter than a block): everything
    ([], ["a", "b"], 2 * B, [(0, 2 * B)]),
])  # fmt: skip
def test_changed_ranges(local: list, remote: list, size: int, ranges: list) -> None:
    assert fp.changed_ranges(local, remote, B, size) == ranges


def test_changed_ranges_are_capped_at_the_range_size() -> None:
    block = 64 * MiB
    ranges = fp.changed_ranges(["a"], ["b", "c", "d"], block, 3 * block)
    assert ranges == [(0, 64 * MiB), (64 * MiB, 64 * MiB), (128 * MiB, 64 * MiB)]


@pytest.mark.parametrize(("local", "remote", "block", "compared"), [
    (0, 100, 10, 0), (35, 100, 10, 30), (100, 35, 10, 30), (100, 100, 10, 100), (5, 100, 10, 0),
])  # fmt: skip
def test_compared_length(local: int, remote: int, block: int, compared: int) -> None:
    assert fp.compared_length(local, remote, block) == compared


def sizes(batch: list[Piece], unit: int = MiB) -> list[int]:
    return [p.length // unit for p in batch]


def test_the_queue_gives_largest_first_in_batches_worth_what_is_asked() -> None:
    queue = fp.PieceQueue([Piece(i, 0, s * MiB) for i, s in enumerate([3, 5, 3, 4, 3])])
    assert queue.left == 18 * MiB + 5 * fp.PIECE_COST
    assert sizes(queue.take(False, 6 * MiB)) == [5, 4]  # 5 MiB are not yet 6 MiB
    assert sizes(queue.take(True, 1)) == [3]  # at least one piece
    assert sizes(queue.take(False, 100 * MiB)) == [3, 3]  # fewer where fewer are left
    assert queue.take(True, MiB) == [] and queue.left == 0


def test_equal_pieces_keep_the_listing_order() -> None:
    queue = fp.PieceQueue([Piece(k, off, MiB) for k, off in [(2, 0), (1, MiB), (1, 0)]])
    assert [(p.key, p.offset) for p in queue.take(False, 10 * MiB)] == [(1, 0), (1, MiB), (2, 0)]


KiB = 1024


def test_near_the_small_pieces_are_the_lead_streams_own() -> None:
    """Near: pieces under PIECE_COST go to the lead stream only, before its big ones (the laptop's per-file
    work in one thread, while the other streams move bytes); far, every stream takes them in turn."""
    pieces = [Piece(0, 0, 64 * MiB), Piece(1, 0, 2 * KiB), Piece(2, 0, 32 * KiB), Piece(3, 0, 32 * KiB - 1)]
    near = fp.PieceQueue(pieces, near=True)
    assert sizes(near.take(False, MiB), KiB) == [64 * KiB]  # the other streams: big ones only
    assert sizes(near.take(False, MiB), KiB) == [32]
    assert near.take(False, MiB) == []
    assert [p.length for p in near.take(True, 1)] == [32 * KiB - 1]
    assert [p.length for p in near.take(True, GiB)] == [2 * KiB]
    far = fp.PieceQueue(pieces)
    assert [p.key for p in far.take(False, GiB)] == [0, 2, 3, 1]


def test_a_batch_stops_at_a_request_the_channel_takes_at_once() -> None:
    """Long paths: a batch's request stays within REQUEST_BYTES however little the pieces weigh."""
    queue = fp.PieceQueue([Piece(i, 0, 10) for i in range(100)], request_bytes=lambda p: 4096)
    assert len(queue.take(False, GiB)) == fp.REQUEST_BYTES // 4096
    assert len(fp.PieceQueue([Piece(i, 0, 10) for i in range(100)]).take(False, GiB)) == 100


def finish_times(pieces: list[Piece], starts: list[float], rate: float, lookahead: int) -> list[float]:
    """When each stream ends, taking from one queue as the engine's streams do: stream i opens at
    ``starts[i]``; a piece takes its cost (bytes and per-file work) over ``rate``, its bytes arriving
    evenly; before each piece, and again as soon as the piece's bytes still to come plus the bytes asked
    for ahead fall under ``lookahead``, the stream asks for more."""
    queue = fp.PieceQueue(pieces)
    ahead: list[list[Piece]] = [[] for _ in starts]
    asked = [0] * len(starts)
    done: list[float] = [0.0] * len(starts)

    def top_up(s: int, reserve: int) -> None:
        if asked[s] + reserve > lookahead // 2:
            return
        while (want := lookahead - asked[s] - reserve) > 0 and (batch := queue.take(s == 0, want)):
            ahead[s] += batch
            asked[s] += sum(p.length for p in batch)

    events: list[tuple[float, int, str, float, float, int]] = [(t, s, "next", 0, 0, 0) for s, t in enumerate(starts)]
    while events:
        events.sort()
        t, s, what, end, duration, length = events.pop(0)
        if what == "top up":
            top_up(s, max(0, round((end - t) / duration * length)))  # the bytes of the piece still to come
            continue
        top_up(s, 0)
        if not ahead[s]:
            done[s] = t
            continue
        piece = ahead[s].pop(0)
        asked[s] -= piece.length
        duration = fp.cost(piece) / rate
        events.append((t + duration, s, "next", 0, 0, 0))
        if piece.length + asked[s] >= lookahead // 2:  # the moment the rest of the piece no longer covers it
            left = lookahead // 2 - asked[s]
            events.append((t + duration * (1 - left / piece.length), s, "top up", t + duration, duration, piece.length))
        else:
            top_up(s, piece.length)
    return done


CHECKPOINTS = [Piece(i, 0, 200 * MiB) for i in range(4)] + [Piece(4 + i, 0, 200 * KiB) for i in range(1000)]


@pytest.mark.parametrize(("pieces", "starts", "rate", "lookahead"), [
    # loopback: the second stream logs in while the first moves data, 0.17 s later
    (CHECKPOINTS, [0, 0.17], 200 * MiB, fp.LOOKAHEAD_NEAR),
    # 100 ms away: a window per round trip each, the streams opening one after another
    (CHECKPOINTS, [0, 0.4, 0.5, 0.6], 20 * MiB, fp.LOOKAHEAD),
    (CHECKPOINTS[:3] + CHECKPOINTS[4:], [0, 0.4, 0.5, 0.6], 20 * MiB, fp.LOOKAHEAD),  # three big ones, four streams
    # a file in 64 MiB ranges and a few small ones
    ([Piece(0, i * 64 * MiB, 64 * MiB) for i in range(16)] + [Piece(1 + i, 0, MiB) for i in range(9)],
     [0, 0.4, 0.5, 0.6], 20 * MiB, fp.LOOKAHEAD),
])  # fmt: skip
def test_streams_taking_from_the_queue_end_together(pieces: list[Piece], starts: list[float], rate: float, lookahead: int) -> None:
    """Whatever each stream's start, they end within the time of the lookahead and a piece of those left at
    the end, where the big pieces would have gone first."""
    ends = finish_times(pieces, starts, rate, lookahead)
    small = min(fp.cost(p) for p in pieces if p.length < 100 * MiB)
    assert max(ends) - min(ends) <= (lookahead + small) / rate + 1e-9, ends
    total = sum(fp.cost(p) for p in pieces) / rate
    assert max(ends) <= (total + sum(starts)) / len(starts) + (lookahead + small) / rate  # no stream idles


GiB = 1 << 30


@pytest.mark.parametrize(("rtt", "near"), [(None, False), (0.0003, True), (0.0049, True), (0.005, False), (0.1, False)])
def test_is_near(rtt: float | None, near: bool) -> None:
    assert fp.is_near(rtt) is near


@pytest.mark.parametrize(("requested", "sizes", "rtt", "streams"), [
    (4, [MiB] * 100, None, 4),
    (4, [10], None, 1),  # one small file: one stream
    (8, [64 * MiB, 64 * MiB], None, 2),  # no more streams than pieces
    (4, [MiB, MiB], None, 1),  # 2 MiB: one stream moves it before another would connect
    (4, [1000] * 50, None, 1),  # 50 KB in all: not worth a second connection
    (1, [MiB] * 10, None, 1),
    (4, [MiB] * 100, 0.0003, 2),  # loopback, a LAN: two streams
    (12, [MiB] * 100, 0.004, 2),
    (4, [MiB] * 100, 0.006, 4),  # a few ms away: a window per round trip can be the limit
    (8, [MiB] * 100, 0.1, 8),  # across a continent
    (1, [MiB] * 100, 0.0003, 1),
    (4, [2000] * 60_000, 0.0003, 1),  # near, small files: per-file work in one process, one stream
    (4, [2000] * 60_000, 0.1, 4),  # far, the same: a window each
    (4, [200 * 1024] * 1000 + [64 * MiB] * 12, 0.0003, 2),  # near, checkpoints: the big ones are worth two
    (4, [200 * 1024] * 1000 + [4 * MiB], 0.0003, 1),  # near, one big piece less than a stream's worth
])  # fmt: skip
def test_streams_for(requested: int, sizes: list[int], rtt: float | None, streams: int) -> None:
    assert fp.streams_for(requested, [Piece(i, 0, s) for i, s in enumerate(sizes)], rtt) == streams


@pytest.mark.parametrize(("path", "target", "safe"), [
    ("latest", "ckpt/step_10.pt", True),
    ("ckpt/latest", "step_10.pt", True),
    ("ckpt/latest", "../config.json", True),
    ("ckpt/latest", "../../config.json", False),
    ("latest", "../x", False),
    ("a/b/l", "../../c/./d", True),
    ("a/b/l", "./../../c", True),
    ("a/l", "x/../../../y", False),  # climbs out on the way, whatever comes after
    ("notes.txt", "d/e/up/../../x", False),  # through a link `d/e/up -> ../..` made by the same fetch
    ("a/l", "x/../y", False),  # `..` after a name: x may be a link (rsync >= 3.4 refuses it too)
    ("a/l", "../x/..", False),
    ("d/e/up", "../..", True),
    ("l", "/etc/passwd", False),
    ("l", "", False),
])  # fmt: skip
def test_safe_link(path: str, target: str, safe: bool) -> None:
    assert fp.safe_link(path, target) is safe


@pytest.mark.parametrize(("mode", "safe"), [
    (0o644, 0o644), (0o755, 0o755), (0o4755, 0o755), (0o2755, 0o755), (0o1777, 0o755), (0o666, 0o644),
    (0o600, 0o600), (0o444, 0o444),
])  # fmt: skip
def test_safe_mode(mode: int, safe: int) -> None:
    assert fp.safe_mode(mode) == safe


@pytest.mark.parametrize(("done", "total", "elapsed", "text"), [
    (0, 100 * MiB, 0.0, "[------------------------]   0%  0 B / 100.0 MiB  0 B/s  ETA -"),
    (50 * MiB, 100 * MiB, 5.0, "[############------------]  50%  50.0 MiB / 100.0 MiB  10.0 MiB/s  ETA 5 s"),
    (100 * MiB, 100 * MiB, 4.0, "[########################] 100%  100.0 MiB / 100.0 MiB  25.0 MiB/s  ETA -"),
])  # fmt: skip
def test_bar_line(done: int, total: int, elapsed: float, text: str) -> None:
    assert bar_line(done, total, elapsed) == text


@pytest.mark.parametrize(
    "path", ["ckpt/step_10.pt", 'a"b\\c', "café/ü.pt", "日本/データ.pt", "emoji/🙂.pt", "ctl\x01name", os.fsdecode(b"caf\xe9.pt")]
)
def test_a_requests_size_is_never_counted_short(path: str) -> None:
    """What a piece adds to a read request, as the engine sends it: never more than counted (the bound on
    requests sent ahead rests on it)."""
    item = json.dumps([["r_20250101_000000", path, 2**40, 2**30]], separators=(",", ":"))
    assert len(item.encode()) - 2 <= fp.request_bytes("r_20250101_000000", path)
