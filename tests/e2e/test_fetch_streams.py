"""The e2e tier of tests/unit/test_fetch_streams.py (the same subject; its helpers are there)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import stream as fetch_stream
from tests.fetch_host import Host, MiB, every_stream_opens, tree


def test_many_streams_go_beyond_one_connections_sessions(host: Host, tmp_path: Path, small_ranges, monkeypatch: pytest.MonkeyPatch) -> None:
    """--streams 12 works: eight channels of the first connection, the rest connections of their own
    (a stock sshd allows MaxSessions = 10 channels per connection)."""
    monkeypatch.setattr(fp, "STREAM_WORTH", 64 * 1024)  # every stream worth opening at test sizes
    monkeypatch.setattr(fp, "NEAR_RTT_S", 0)  # as if the host were far: loopback would take two
    every_stream_opens(monkeypatch)
    job = host.job()
    (job / "big.pt").write_bytes(os.urandom(4 * MiB))
    for i in range(12):
        (job / f"c{i}.pt").write_bytes(os.urandom(2 * MiB))
    dest = tmp_path / "home"
    result = host.fetch(dest, streams=12)
    assert result.complete, result
    assert host.streams_opened == 12
    assert tree(dest) == tree(job)
    # The listing on the shared connection; eight on the fetch's own (each waits for it to be up, or it
    # would log in on its own); three more with their own: five logins, not twelve.
    assert host.logins() == 5


def test_a_fetch_soon_after_another_rides_on_its_connection(host: Host, tmp_path: Path) -> None:
    """The second fetch (a new Opener, as a new `fab fetch` makes) logs in no more: with the host's sshd
    stopped, so that no new login can happen (it would time out), it still fetches what changed."""
    job = host.job()
    (job / "a.pt").write_bytes(os.urandom(50_000))
    dest = tmp_path / "home"
    assert host.fetch(dest).complete
    (job / "b.pt").write_bytes(os.urandom(50_000))
    os.kill(host.sshd.proc.pid, signal.SIGSTOP)  # the listener: connections made before go on
    try:
        result = host.fetch(dest)
    finally:
        os.kill(host.sshd.proc.pid, signal.SIGCONT)
    assert result.complete and result.files == 1, result
    assert tree(dest) == tree(job)


def test_a_shared_connection_whose_host_restarted_is_replaced(host: Host, tmp_path: Path) -> None:
    job = host.job()
    (job / "a.pt").write_bytes(os.urandom(50_000))
    dest = tmp_path / "home"
    assert host.fetch(dest).complete
    host.sshd.stop()  # every session dies with it, the shared connection's too
    host.sshd.start()
    (job / "b.pt").write_bytes(os.urandom(50_000))
    result = host.fetch(dest)
    assert result.complete and result.files == 1, result
    assert tree(dest) == tree(job)


@pytest.mark.e2e
def test_a_host_that_refuses_a_channel_on_the_shared_connection_is_fetched_without_it(tmp_path: Path) -> None:
    """Another session holds the shared connection, and the host allows one session per connection
    (a stock sshd allows ten: eleven fetches at once): OpenSSH logs in on a connection of its own."""
    from remote.ssh.openssh import openssh_options

    host = Host(tmp_path, max_sessions=1)
    try:
        job = host.job()
        (job / "a.pt").write_bytes(os.urandom(50_000))
        shared = fetch_stream.shared_control_path(openssh_options(host.target, host.host), f"{host.host.user}@{host.host.host}")
        assert shared is not None
        holder = subprocess.Popen(
            [
                "ssh",
                *openssh_options(host.target, host.host),
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={shared}",
                "-o",
                "ControlPersist=60",
                "--",
                f"{host.host.user}@{host.host.host}",
                "sleep 30",
            ],
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(shared) and time.monotonic() < deadline:
                time.sleep(0.05)
            dest = tmp_path / "home"
            result = host.fetch(dest)
        finally:
            holder.kill()
            subprocess.run(["ssh", "-o", f"ControlPath={shared}", "-O", "exit", "x"], capture_output=True)
        assert result.complete, result
        assert tree(dest) == tree(job)
    finally:
        host.sshd.stop()


def test_a_near_host_gets_two_streams_a_far_one_all(host: Host, tmp_path: Path, small_ranges, monkeypatch: pytest.MonkeyPatch) -> None:
    """One round trip, timed, decides: on loopback two streams for big files and one for small ones;
    where a round trip is long, all four."""
    monkeypatch.setattr(fp, "STREAM_WORTH", 64 * 1024)
    monkeypatch.setattr(fp, "NEAR_RTT_S", 10.0)  # loopback is near even while a busy machine slows its answer
    every_stream_opens(monkeypatch)
    job, small = host.job(), host.job("r_2")
    for i in range(8):
        (job / f"c{i}.pt").write_bytes(os.urandom(MiB))
        (small / f"s{i}.json").write_bytes(os.urandom(100 * 1024))
    assert host.fetch(tmp_path / "near").complete
    assert host.streams_opened == 2
    assert host.fetch(tmp_path / "near-small", run="r_2").complete
    assert host.streams_opened == 2 + 1
    monkeypatch.setattr(fp, "NEAR_RTT_S", 0)  # every round trip counts as long
    assert host.fetch(tmp_path / "far").complete
    assert host.streams_opened == 3 + 4
    assert host.fetch(tmp_path / "far-small", run="r_2").complete
    assert host.streams_opened == 7 + 4
    assert tree(tmp_path / "near") == tree(tmp_path / "far") == tree(job)
    assert tree(tmp_path / "near-small") == tree(tmp_path / "far-small") == tree(small)


def test_a_near_host_sends_every_small_file_over_the_first_stream(host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixed big and small files on a near host: those under 32 KiB all go over the first stream (one thread's
    per-file work), the big ones over any; far away every stream takes both."""
    monkeypatch.setattr(fp, "STREAM_WORTH", 64 * 1024)
    monkeypatch.setattr(fp, "NEAR_RTT_S", 10.0)  # loopback is near even while a busy machine slows its answer
    monkeypatch.setattr(fp, "LOOKAHEAD_NEAR", 1)  # a piece per request: every stream takes its turn
    monkeypatch.setattr(fp, "LOOKAHEAD", 1)
    every_stream_opens(monkeypatch)
    taken: list[tuple[bool, list[int]]] = []
    take = fp.PieceQueue.take

    def spy(self: fp.PieceQueue, lead: bool, want: int) -> list[fp.Piece]:
        out = take(self, lead, want)
        taken.append((lead, [p.length for p in out]))
        return out

    monkeypatch.setattr(fp.PieceQueue, "take", spy)
    job = host.job()
    for i in range(4):
        (job / f"c{i}.pt").write_bytes(os.urandom(MiB))
    for i in range(20):
        (job / f"s{i:02d}.json").write_bytes(os.urandom(10 * 1024))
    assert host.fetch(tmp_path / "near").complete
    by_lead = [n for lead, sizes in taken if lead for n in sizes]
    by_others = [n for lead, sizes in taken if not lead for n in sizes]
    assert by_lead[:20] == [10 * 1024] * 20  # the small ones first, all on the first stream
    assert by_others and all(n == MiB for n in by_others)
    taken.clear()
    monkeypatch.setattr(fp, "NEAR_RTT_S", 0)  # every round trip counts as long
    assert host.fetch(tmp_path / "far").complete
    assert [n for _, sizes in taken for n in sizes] == [MiB] * 4 + [10 * 1024] * 20  # largest first, any stream
    assert sum(1 for lead, sizes in taken if not lead and sizes) >= 3  # the other streams took their turns
    assert tree(tmp_path / "near") == tree(tmp_path / "far") == tree(job)


def test_streams_that_cannot_be_started_leave_the_work_to_those_open(host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No process to be had for a second stream (the system's limits): the first takes the whole queue."""
    from remote.transfer.fetch.engine import Fetcher

    monkeypatch.setattr(fp, "NEAR_RTT_S", 0)  # four streams wanted
    monkeypatch.setattr(fp, "STREAM_WORTH", 64 * 1024)
    monkeypatch.setattr(fp, "LOOKAHEAD", 64 * 1024)  # work is left in the queue when the second would open
    job = host.job()
    for i in range(6):
        (job / f"c{i}.pt").write_bytes(os.urandom(MiB + i))
    opener, tries = host.opener(), []

    def open_stream() -> fetch_stream.Stream:
        tries.append(1)
        if len(tries) > 1:
            raise OSError(11, "Resource temporarily unavailable")
        return opener()

    dest = tmp_path / "home"
    try:
        [result] = Fetcher(open_stream, 4).run([("r_1", dest)])
    finally:
        opener.close()
    assert result.complete and result.files == 6, result
    assert len(tries) == 2 and tree(dest) == tree(job)


def test_a_bug_in_a_stream_fails_the_fetch_with_its_name_not_quietly(host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error in a stream's thread is the fetch's error (before, the thread ended quietly,
    its pieces never came, and the first stream was then asked for hashes with answers still pending)."""
    from remote.transfer.fetch.engine import Fetcher

    job = host.job()
    for i in range(3):
        (job / f"c{i}.pt").write_bytes(os.urandom(100_000))
    receive = Fetcher._receive

    def broken(self: Fetcher, stream: fetch_stream.Stream, piece: fp.Piece, *args: Any) -> None:
        if piece.key == 1:
            raise RuntimeError("a bug")
        return receive(self, stream, piece, *args)

    monkeypatch.setattr(Fetcher, "_receive", broken)
    dest = tmp_path / "home"
    result = host.fetch(dest)
    assert result.error is not None and "a stream failed: RuntimeError: a bug" in result.error, result
    for p in dest.rglob("*"):  # what arrived is whole
        assert p.read_bytes() == (job / p.name).read_bytes()
    monkeypatch.setattr(Fetcher, "_receive", receive)
    assert host.fetch(dest).complete and tree(dest) == tree(job)
