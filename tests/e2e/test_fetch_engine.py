"""The e2e tier of tests/unit/test_fetch_engine.py (the same subject; its helpers are there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote.loopback import Sshd
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import receiver as fl
from remote.transfer.fetch.progress import Progress
from tests.fetch_host import Host, MiB, tree


def mixed_tree(job: Path) -> None:
    (job / "ckpt").mkdir()
    (job / "ckpt" / "big.pt").write_bytes(os.urandom(3 * MiB + 12345))  # ranges over several streams
    (job / "ckpt" / "exactly.pt").write_bytes(os.urandom(MiB))  # at the threshold: one piece
    for i in range(60):
        (job / "ckpt" / f"s{i:02d}.bin").write_bytes(os.urandom(i * 997))
    (job / "empty").write_bytes(b"")
    (job / "deep" / "er" / "est").mkdir(parents=True)
    (job / "deep" / "er" / "est" / "note.txt").write_text("hi\n")
    (job / "empty-folder").mkdir()
    (job / "latest").symlink_to("ckpt/big.pt")
    (job / "outside").symlink_to("../../state.json")  # out of the run: not made at home (rsync --safe-links)
    (job / "absolute").symlink_to("/etc/passwd")
    (job / "run.sh").write_text("#!/bin/sh\n")
    (job / "run.sh").chmod(0o4775)  # setuid and group-writable on the host: neither comes home


def test_mixed_tree_is_identical_and_a_second_fetch_sends_nothing(host: Host, tmp_path: Path, small_ranges) -> None:
    job = host.job()
    mixed_tree(job)
    dest = tmp_path / "home" / "r_1"
    first = host.fetch(dest)
    assert first.error is None and first.complete, first
    assert tree(dest) == tree(job)
    assert (dest / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert not fl.partial_dir(dest).exists()
    assert first.bytes == sum(p.stat().st_size for p in job.rglob("*") if p.is_file() and not p.is_symlink())
    assert sorted(first.unsafe) == ["absolute -> /etc/passwd", "outside -> ../../state.json"]
    opened = host.streams_opened
    again = host.fetch(dest)
    assert again.up_to_date and again.bytes == 0
    assert host.streams_opened == opened + 1  # the listing's stream only


def test_modes_are_the_hosts_whatever_the_laptops_umask(host: Host, tmp_path: Path) -> None:
    """Small files are made with their final mode (no chmod each) only where the umask keeps it."""
    job = host.job()
    for name, mode in (("a.sh", 0o755), ("b.json", 0o644), ("c.key", 0o600), ("d.txt", 0o664)):
        (job / name).write_text(name)
        (job / name).chmod(mode)
    for umask in (0o022, 0o077, 0o002):
        old = os.umask(umask)
        try:
            assert host.fetch(tmp_path / f"u{umask:03o}").complete
        finally:
            os.umask(old)
        modes = {p.name: p.stat().st_mode & 0o7777 for p in (tmp_path / f"u{umask:03o}").iterdir()}
        assert modes == {"a.sh": 0o755, "b.json": 0o644, "c.key": 0o600, "d.txt": 0o644}, umask


def grow_tail(path: Path) -> int:
    """Append 100 kB (a log that grew); what a fetch may send: the tail and at most the last partial block again."""
    with path.open("ab") as f:
        f.write(os.urandom(100_000))
    return 100_000 + fp.block_size(path.stat().st_size)


def change_in_place(path: Path) -> int:
    """Overwrite a few bytes in three blocks (a checkpoint updated in place); at most those blocks, and one spare."""
    block = fp.block_size(path.stat().st_size)
    with path.open("r+b") as f:
        for at in (block * 3 + 10, 2 * MiB, 4 * MiB - 5):
            f.seek(at)
            f.write(b"changed")
    return 4 * block


@pytest.mark.parametrize(
    ("name", "size", "change"),
    [
        ("metrics.jsonl", 2 * MiB, grow_tail),
        ("model.pt", 4 * MiB, change_in_place),
    ],
    ids=["a file that grew sends its new tail", "ranges changed in place send only those blocks"],
)
def test_a_changed_file_sends_only_what_changed(host: Host, tmp_path: Path, small_ranges, name, size, change) -> None:
    job = host.job()
    path = job / name
    path.write_bytes(os.urandom(size))
    dest = tmp_path / "home"
    host.fetch(dest)
    before = (dest / name).read_bytes()
    bound = change(path)
    result = host.fetch(dest)
    assert result.complete and result.files == 1
    assert result.bytes <= bound
    kept = {k: v for k, v in tree(dest).items() if k.startswith(".previous")}
    assert {k: v for k, v in tree(dest).items() if k not in kept} == tree(job)
    if change is grow_tail:  # nothing of the laptop's copy is lost: it is the start of the new one
        assert not kept and result.kept == []
    else:  # the content it had is kept, once
        assert (dest / ".previous" / name).read_bytes() == before and result.kept == [name]


def test_a_local_file_newer_than_the_hosts_is_never_replaced(host: Host, tmp_path: Path) -> None:
    job = host.job()
    (job / "a.txt").write_text("host's first\n")
    (job / "b.txt").write_text("host\n")
    dest = tmp_path / "home"
    host.fetch(dest)
    (dest / "a.txt").write_text("my edit\n")  # newer than the host's
    (job / "a.txt").write_text("host's second, but older\n")
    os.utime(job / "a.txt", (1_000_000, 1_000_000))
    (job / "b.txt").write_text("host changed\n")
    os.utime(job / "b.txt", ns=((dest / "b.txt").stat().st_mtime_ns + 10**9,) * 2)
    result = host.fetch(dest)
    assert (dest / "a.txt").read_text() == "my edit\n"
    assert result.kept_newer == ["a.txt"]
    assert (dest / "b.txt").read_text() == "host changed\n"


class Meanwhile(Progress):
    """Runs ``action`` once, when the first bytes arrive: after the plan, before any file is installed."""

    def __init__(self, action) -> None:
        super().__init__(live=False)
        self.action = action

    def add(self, n: int) -> None:
        super().add(n)
        action, self.action = self.action, None
        if action:
            action()


def test_a_file_that_cannot_be_written_here_is_named_and_the_rest_arrive(host: Host, tmp_path: Path) -> None:
    """A part file that cannot be made (here a folder in its place; a full disk alike) fails that file
    alone, with its reason, and the stream goes on with the others; the next fetch completes."""
    job = host.job()
    for i in range(5):
        (job / f"f{i}.json").write_text(f"{i}\n")
    dest = tmp_path / "home"
    os.makedirs(fl.part_path(dest, "f2.json"))
    Path(fl.part_path(dest, "f3.json")).write_text("an earlier attempt's")  # of no use: replaced
    os.chmod(fl.part_path(dest, "f3.json"), 0o444)
    result = host.fetch(dest)
    assert not result.complete and result.error is not None and result.error.startswith("f2.json could not be written here: ")
    assert sorted(p.name for p in dest.iterdir()) == ["f0.json", "f1.json", "f3.json", "f4.json"]
    assert (dest / "f3.json").read_text() == "3\n" and (dest / "f3.json").stat().st_mode & 0o777 == 0o644
    os.rmdir(fl.part_path(dest, "f2.json"))
    assert host.fetch(dest).complete and tree(dest) == tree(job)


def test_what_appears_at_the_destination_during_a_fetch_is_kept(host: Host, tmp_path: Path) -> None:
    job = host.job()
    for name in ("new.txt", "link.txt", "edited.txt"):
        (job / name).write_text("host\n")
    dest = tmp_path / "home"
    dest.mkdir()
    (dest / "edited.txt").write_text("old\n")
    os.utime(dest / "edited.txt", (1_000_000, 1_000_000))  # older than the host's: planned to be replaced

    def meanwhile() -> None:
        (dest / "new.txt").write_text("mine\n")
        (dest / "link.txt").symlink_to("nowhere")  # a dangling link is something there too
        (dest / "edited.txt").write_text("my edit\n")

    result = host.fetch(dest, progress=Meanwhile(meanwhile))
    assert (dest / "new.txt").read_text() == "mine\n" and (dest / "edited.txt").read_text() == "my edit\n"
    assert os.readlink(dest / "link.txt") == "nowhere"
    assert sorted(result.kept_newer) == ["edited.txt", "link.txt", "new.txt"]


class KillAt(Progress):
    """Kills the sshd (and every session it serves) once ``at`` bytes have arrived."""

    def __init__(self, sshd: Sshd, at: int):
        super().__init__(live=False)
        self.sshd, self.at = sshd, at

    def add(self, n: int) -> None:
        super().add(n)
        if self.done_bytes >= self.at and self.sshd.proc is not None:
            self.sshd.stop()


@pytest.mark.parametrize("at", [0, 300_000, 2 * MiB, 5 * MiB])
def test_sshd_killed_mid_fetch_then_fetched_again(host: Host, tmp_path: Path, small_ranges, at: int) -> None:
    job = host.job()
    mixed_tree(job)
    (job / "ckpt" / "second.pt").write_bytes(os.urandom(3 * MiB))
    dest = tmp_path / "home"
    if at == 0:
        host.sshd.stop()  # down before the listing
        broken = host.fetch(dest)
    else:
        broken = host.fetch(dest, progress=KillAt(host.sshd, at))
    assert broken.error and "again" in broken.error
    for p in dest.rglob("*"):  # whatever arrived is complete and verified; nothing partial is here
        if p.is_file() and not p.is_symlink():
            assert p.read_bytes() == (job / p.relative_to(dest)).read_bytes()
    host.sshd.start()
    again = host.fetch(dest)
    assert again.complete, again
    assert tree(dest) == tree(job)
    assert not fl.partial_dir(dest).exists()  # no leftover beside it after success
    if at >= 2 * MiB:  # the part files were a basis: not everything was sent again
        total = sum(p.stat().st_size for p in job.rglob("*") if p.is_file())
        assert again.bytes < total


def test_many_runs_in_one_listing(host: Host, tmp_path: Path) -> None:
    for r in range(30):
        job = host.job(f"r_{r}")
        for i in range(20):
            (job / f"f{i}.bin").write_bytes(os.urandom(1000 + r))
    runs = [(f"r_{r}", tmp_path / "home" / f"r_{r}") for r in range(30)] + [("r_missing", tmp_path / "x")]
    results = host.run(runs)
    assert host.streams_opened <= 4  # one listing for all runs, then the streams
    assert [r.files for r in results[:30]] == [20] * 30
    assert "no run r_missing" in (results[30].error or "")
    for r in range(30):
        assert tree(tmp_path / "home" / f"r_{r}") == tree(host.job(f"r_{r}"))
    assert all(r.up_to_date for r in host.run(runs[:30]))


def test_host_refuses_paths_out_of_the_job_dir(host: Host) -> None:
    host.job()
    s = host.open_stream()
    try:
        s.send({"op": "read", "items": [["r_1", "../state.json", 0, 10], ["../../x", "a", 0, 1], ["r_1", "/etc/passwd", 0, 1]]})
        buf = memoryview(bytearray(64))
        answers = [s.read_range(lambda v: None, buf, n)[0] for n in (10, 1, 1)]
    finally:
        s.close()
    assert all("error" in a for a in answers), answers


def test_a_file_name_that_is_not_utf8_comes_home_as_the_same_bytes(host: Host, tmp_path: Path) -> None:
    """Linux file names are bytes: one that is not UTF-8 (an old archive's Latin-1) arrives as itself."""
    job = host.job()
    name = os.fsdecode(b"caf\xe9.pt")
    (job / name).write_bytes(os.urandom(100_000))
    (job / "plain.txt").write_text("x\n")
    dest = tmp_path / "home"
    result = host.fetch(dest)
    assert result.complete and result.files == 2, result
    assert sorted(os.listdir(os.fsencode(dest))) == [b"caf\xe9.pt", b"plain.txt"]
    assert tree(dest) == tree(job)
    assert host.fetch(dest).up_to_date
