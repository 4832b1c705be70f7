"""A hostile host's answers are bounded (issue 28 E, F): what the laptop reads from a fetch stream or
an agent call cannot exhaust its memory or hang it, and a range is exactly what was asked for.

The fetch stream is the real Stream class reading a crafted wire (``cat FILE``: what a host's
fetch-serve would write), in a process under a memory cap (``prlimit --as``) where memory is the
point; agent calls go to a real sshd whose key runs a flooding or silent command.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gpu_train.answers import Listed
from gpu_train.fetchwire import RANGE_HEAD, RANGE_TRAILER
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch.stream import MAX_DOC, MAX_LINE, Stream, StreamError
from tests.conftest import ROOT

MiB = 1 << 20
MEMORY_CAP = "--as=1500000000"  # the laptop's process, capped: the old code needed gigabytes for a few bytes


def doc_wire(text: bytes, announced: int | None = None) -> bytes:
    packed = zlib.compress(text, 9)
    return json.dumps({"len": len(packed) if announced is None else announced}).encode() + b"\n" + packed


def zeros_bomb(size: int) -> bytes:
    """A whole zlib stream of ``size`` zero bytes (a multiple of 64 MiB), about 1/1000 of it. One 64 MiB
    piece is compressed once and repeated: after a full flush, deflate forgets what came before, so each
    piece reads the same. (Compressing 4 GiB took 12 s of CPU.) The end: an empty final block, then
    the Adler-32 of ``size`` zeros (1, and ``size`` mod 65521)."""
    chunk = bytes(64 * MiB)
    z = zlib.compressobj(9)
    first = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    header, piece = first[:2], first[2:]
    return header + piece * (size // len(chunk)) + b"\x03\x00" + struct.pack(">I", (size % 65521) << 16 | 1)


def test_the_bomb_is_zlib_of_that_many_zeros() -> None:
    inflate = zlib.decompressobj()
    data = inflate.decompress(zeros_bomb(128 * MiB))  # two pieces
    assert len(data) == 128 * MiB and not data.strip(b"\0") and inflate.eof and not inflate.unused_data  # Adler-32 checked


CAPPED = r"""import sys
sys.path.insert(0, sys.argv[2])
from gpu_train.answers import Listed
from remote.transfer.fetch.stream import Stream, StreamError
s = Stream(["cat", sys.argv[1]])
try:
    s.read_doc(Listed, "the host's listing")
    print("read")
except StreamError as e:
    print("refused:", e)
finally:
    s.close()
"""


def read_doc_capped(wire: Path) -> subprocess.CompletedProcess:
    if not shutil.which("prlimit"):
        pytest.skip("needs prlimit")
    return subprocess.run(
        ["prlimit", MEMORY_CAP, sys.executable, "-c", CAPPED, str(wire), str(ROOT)], capture_output=True, text=True, timeout=300
    )


def test_a_zlib_bomb_is_refused_under_a_memory_cap(tmp_path: Path) -> None:
    # 4 GiB of zeros in about 4 MiB: the old read_doc inflated it whole.
    bomb = zeros_bomb(4 << 30)
    assert len(bomb) < 8 * MiB
    wire = tmp_path / "wire"
    wire.write_bytes(json.dumps({"len": len(bomb)}).encode() + b"\n" + bomb)
    result = read_doc_capped(wire)
    assert result.stdout.startswith("refused:") and f"more than {MAX_DOC} bytes" in result.stdout, result.stderr[-2000:]


def test_a_flood_of_entries_is_refused_before_parsing(tmp_path: Path) -> None:
    rows = b'{"runs": {"r_1": {"entries": [' + b",".join([b"[]"] * (fp.MAX_ENTRIES + 100)) + b"]}}}"
    wire = tmp_path / "wire"
    wire.write_bytes(doc_wire(rows))
    result = read_doc_capped(wire)
    assert result.stdout.startswith("refused:") and "entries" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize(("wire", "words"), [
    (b"x" * (MAX_LINE + 10), "longer than"),  # a header with no end
    (b'{"len": 99999999999999}\n', "announced"),
    (b'{"len": "5"}\n', "announced"),
    (doc_wire(b"[1, 2]"), "not one"),
    (doc_wire(b"nonsense"), "not JSON"),
    (b'{"len": 4}\nabcd', "not zlib"),
])  # fmt: skip
def test_bad_documents_are_stream_errors(tmp_path: Path, wire: bytes, words: str) -> None:
    (tmp_path / "wire").write_bytes(wire)
    stream = Stream(["cat", str(tmp_path / "wire")])
    try:
        with pytest.raises(StreamError, match=words):
            stream.read_doc(Listed, "the host's listing")
    finally:
        stream.close()


@pytest.mark.parametrize("answered", [200 * MiB // 1024, 9, -1])
def test_a_range_longer_or_shorter_than_asked_is_refused(tmp_path: Path, answered: int) -> None:
    # A 10-byte file answered with 200 KiB (whose trailer hashes what was sent) was installed whole.
    data = bytes(max(answered, 0))
    import hashlib

    head = RANGE_HEAD % answered if answered >= 0 else b'{"len": "x"}\n'
    trailer = RANGE_TRAILER % (hashlib.sha256(data).hexdigest().encode(), 10, 1, 1, b"")
    (tmp_path / "wire").write_bytes(head + data + trailer)
    stream = Stream(["cat", str(tmp_path / "wire")])
    got = bytearray()
    try:
        with pytest.raises(StreamError, match="for a request of 10"):
            stream.read_range(got.extend, memoryview(bytearray(65536)), 10)
    finally:
        stream.close()
    assert got == b""


@pytest.mark.parametrize(("row", "ok"), [
    (["a.txt", "f", 10, 1, 0o644, ""], True),
    (["a.txt", "f", 2**62, 1, 0o644, ""], False),  # 2**36 ranges of 64 MiB
    (["a.txt", "f", -1, 1, 0o644, ""], False),
    (["a.txt", "f", "10", 1, 0o644, ""], False),
    (["a.txt", "f", True, 1, 0o644, ""], False),
    (["a.txt", "x", 10, 1, 0o644, ""], False),
    (["a" * 5000, "f", 10, 1, 0o644, ""], False),
    ([["a"], "f", 10, 1, 0o644, ""], False),
    (["l", "l", 0, 1, 0o777, "t" * 5000], False),
])  # fmt: skip
def test_listing_rows_are_checked(row: list, ok: bool) -> None:
    if ok:
        assert fp.Entry.from_wire(row).size == 10
    else:
        with pytest.raises(ValueError, match="not one"):
            fp.Entry.from_wire(row)


def test_a_listing_bigger_than_the_disk_is_refused_before_any_range() -> None:
    big = [fp.Entry("a", "f", 1 << 50), fp.Entry("d", "d")]
    assert "more than this disk holds" in fp.listing_problem(big, 1 << 40)
    assert fp.listing_problem([fp.Entry("a", "f", 1 << 30)] * 3, 1 << 40) == ""


def test_a_fetch_of_a_lying_listing_says_so_and_plans_nothing(tmp_path: Path) -> None:
    from remote.transfer.fetch.engine import Fetcher

    listing = {"runs": {"r_1": {"entries": [["huge.bin", "f", 1 << 55, 1, 0o644, ""]]}}}
    (tmp_path / "wire").write_bytes(doc_wire(json.dumps(listing).encode()))
    host = ["sh", "-c", 'cat "$0"; exec cat >/dev/null', str(tmp_path / "wire")]  # answers, then reads on
    [result] = Fetcher(lambda: Stream(host), 1).run([("r_1", tmp_path / "home" / "r_1")])
    assert result.error and "more than this disk holds" in result.error
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [Path("wire")], "nothing planned: not even a folder"


@pytest.mark.parametrize(("wire", "ranged"), [(b'{"len": 100}\nabc', False), (b'{"len": 10', False), (RANGE_HEAD % 10 + b"abc", True)])
def test_a_host_that_stops_answering_mid_answer_ends_the_stream(tmp_path: Path, wire: bytes, ranged: bool) -> None:
    """fetch and down waited for ever on a host that stopped answering mid-stream (its sessions frozen,
    the link alive): a read that waits for a byte longer than the stream's deadline ends it."""
    import threading
    import time

    (tmp_path / "wire").write_bytes(wire)
    stream = Stream(["sh", "-c", f'cat "{tmp_path / "wire"}"; exec sleep 600'], stall_s=0.4)  # then silence, ssh still up
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            if ranged:
                stream.read_range(lambda view: None, memoryview(bytearray(65536)), 10)
            else:
                stream.read_doc(Listed, "the host's listing")
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    started = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    try:
        assert outcome, "the read still waits"
        assert isinstance(outcome[0], StreamError) and "did not answer for 0.4 s" in str(outcome[0])
        assert time.monotonic() - started < 10
    finally:
        stream.close(kill=True)


def test_a_host_that_stops_reading_ends_the_stream() -> None:
    """A request the host never reads (its side frozen, the pipe full) blocked the write for ever."""
    import threading

    stream = Stream(["sh", "-c", "exec sleep 600"], stall_s=0.4)  # reads nothing
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            stream.send({"op": "read", "items": [["r_1", "x" * 1000, 0, 1]] * 4000})  # megabytes: more than a pipe holds
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    writer = threading.Thread(target=send, daemon=True)
    writer.start()
    writer.join(timeout=30)
    try:
        assert outcome and isinstance(outcome[0], StreamError) and "did not answer for 0.4 s" in str(outcome[0])
    finally:
        stream.close(kill=True)
