"""The parallel fetch against a real sshd: identical trees, incremental, resumable, never clobbering."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpu_train.config import SshHost
from remote import fetch_local as fl
from remote import fetch_plan as fp
from remote import fetch_stream
from remote.fetch_engine import Fetcher
from remote.fetch_progress import Progress
from remote.fetch_stream import Opener, Stream
from remote.loopback import Sshd
from remote.target import Target

MiB = 1 << 20


class Host:
    """A loopback sshd holding REMOTE_ROOT/runs/RUN/job, and a fetcher pointed at it."""

    def __init__(self, tmp: Path, **sshd: object):
        self.sshd = Sshd(tmp / "sshd", "127.0.16.3", log_level="INFO", **sshd).start()  # type: ignore[arg-type]
        self.known = tmp / "known_hosts"
        self.learn_key()
        self.host = SshHost(self.sshd.user, self.sshd.address, self.sshd.port, keys=(str(self.sshd.client_key),))
        self.root = tmp / "root"
        self.target = Target("t", (self.host,), str(self.sshd.client_key), self.known, True, str(self.root), None,
                             venv=False, expect_gpus=0, hourly_cost_usd=None, is_gcp=False, cache=tmp / "cache")
        self.streams_opened = 0

    def learn_key(self) -> None:
        scan = subprocess.run(["ssh-keyscan", "-p", str(self.sshd.port), self.sshd.address], capture_output=True,
                              text=True, check=True)
        self.known.write_text(scan.stdout)

    def logins(self) -> int:
        """Connections sshd has let in so far (each a key exchange and a login)."""
        return (self.sshd.dir / "sshd.log").read_text().count("Accepted publickey")

    def job(self, run: str = "r_1") -> Path:
        path = self.root / "runs" / run / "job"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def opener(self) -> Opener:
        """Streams as `fab fetch` opens them (channels of one connection), counted."""
        opener = Opener(self.target, self.host)

        def open_stream() -> Stream:
            self.streams_opened += 1
            return opener()

        open_stream.close = opener.close  # type: ignore[attr-defined]
        return open_stream  # type: ignore[return-value]

    def open_stream(self) -> Stream:
        self.streams_opened += 1
        return Opener(self.target, self.host, mux=False)()

    def run(self, runs: list[tuple[str, Path]], streams: int = 4, progress: Progress | None = None):
        opener = self.opener()
        try:
            return Fetcher(opener, streams, progress).run(runs)
        finally:
            opener.close()  # type: ignore[attr-defined]

    def fetch(self, dest: Path, run: str = "r_1", streams: int = 4, progress: Progress | None = None):
        [result] = self.run([(run, dest)], streams, progress)
        return result


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path)
    yield h
    h.sshd.stop()


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges at test sizes: files over 1 MiB travel in 256 KiB ranges."""
    monkeypatch.setattr(fp, "SPLIT_BYTES", MiB)
    monkeypatch.setattr(fp, "RANGE_BYTES", 256 * 1024)


def tree(root: Path) -> dict[str, tuple]:
    """Everything that `rsync -a --safe-links` would carry: kinds, bytes, link targets, file times, safe modes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        st = p.lstat()
        if p.is_symlink() and not fp.safe_link(rel, os.readlink(p)):
            continue
        if p.is_symlink():
            out[rel] = ("l", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("d",)
        else:
            out[rel] = ("f", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mtime_ns, fp.safe_mode(st.st_mode & 0o7777))
    return out


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


@pytest.mark.parametrize(("name", "size", "change"), [
    ("metrics.jsonl", 2 * MiB, grow_tail),
    ("model.pt", 4 * MiB, change_in_place),
], ids=["a file that grew sends its new tail", "ranges changed in place send only those blocks"])
def test_a_changed_file_sends_only_what_changed(host: Host, tmp_path: Path, small_ranges, name, size, change) -> None:
    job = host.job()
    path = job / name
    path.write_bytes(os.urandom(size))
    dest = tmp_path / "home"
    host.fetch(dest)
    bound = change(path)
    result = host.fetch(dest)
    assert result.complete and result.files == 1
    assert result.bytes <= bound
    assert tree(dest) == tree(job)


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
        answers = [s.read_range(lambda v: None, buf)[0] for _ in range(3)]
    finally:
        s.close()
    assert all("error" in a for a in answers), answers


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a//b", "", "./a", "a/."])
def test_local_paths_from_the_host_are_checked(rel: str) -> None:
    with pytest.raises(fl.UnsafePath):
        fl.check_rel(rel)


def test_never_written_through_a_link_or_a_file_on_the_way(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "via").symlink_to(outside)
    (dest / "file").write_text("x")
    assert fl.local_state(dest, "via/evil") == fp.Local("o")
    assert fl.local_state(dest, "file/evil") == fp.Local("o")
    with pytest.raises(fl.UnsafePath):
        fl.ensure_dir(dest, "via/sub")
    assert list(outside.iterdir()) == []


def test_many_streams_go_beyond_one_connections_sessions(host: Host, tmp_path: Path, small_ranges,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--streams 12 works: eight channels of the first connection, the rest connections of their own
    (a stock sshd allows MaxSessions = 10 channels per connection)."""
    monkeypatch.setattr(fp, "STREAM_WORTH", 64 * 1024)  # every stream worth opening at test sizes
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


@pytest.fixture
def short_tmp():
    """A temporary folder with a short path (pytest's own are too long for a socket's)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gt-"))
    yield path
    shutil.rmtree(path)


def test_the_shared_connection_is_per_key_and_host_in_a_folder_of_ours(short_tmp: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = short_tmp
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path))
    a = fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h")
    assert a is not None and Path(a).parent == tmp_path / f"gpu-train-ssh-{os.getuid()}"
    assert (Path(a).parent.stat().st_mode & 0o777) == 0o700
    assert a == fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h")
    others = {fetch_stream.shared_control_path(["-i", "/k/two", "-o", "UserKnownHostsFile=/s/a"], "u@h"),
              fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/b"], "u@h"),
              fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h2")}
    assert a not in others and len(others) == 3
    Path(a).parent.chmod(0o755)  # a folder others can read (or one planted by someone else): not used
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    Path(a).parent.rmdir()
    Path(a).parent.symlink_to(tmp_path)
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    for name, mode in (("open", 0o777), ("per%cent", 0o700)):  # others may rename in it; ssh would expand %
        (tmp_path / name).mkdir(mode=mode)
        (tmp_path / name).chmod(mode)
        monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda name=name: str(tmp_path / name))
        assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    (tmp_path / "open").chmod(0o1777)  # sticky, as /tmp: only a file's owner may rename it
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path / "open"))
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is not None
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path / ("x" * 90)))
    (tmp_path / ("x" * 90)).mkdir()
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None  # too long for a socket's path


@pytest.mark.e2e
def test_a_host_that_refuses_a_channel_on_the_shared_connection_is_fetched_without_it(tmp_path: Path) -> None:
    """Another session holds the shared connection, and the host allows one session per connection
    (a stock sshd allows ten: eleven fetches at once): OpenSSH logs in on a connection of its own."""
    from remote.ssh import openssh_options

    host = Host(tmp_path, max_sessions=1)
    try:
        job = host.job()
        (job / "a.pt").write_bytes(os.urandom(50_000))
        shared = fetch_stream.shared_control_path(openssh_options(host.target, host.host), f"{host.host.user}@{host.host.host}")
        assert shared is not None
        holder = subprocess.Popen(["ssh", *openssh_options(host.target, host.host), "-o", "ControlMaster=auto", "-o",
                                   f"ControlPath={shared}", "-o", "ControlPersist=60", "--",
                                   f"{host.host.user}@{host.host.host}", "sleep 30"], stdin=subprocess.DEVNULL)
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
