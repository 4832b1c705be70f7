"""The parallel fetch's test host: a loopback sshd holding REMOTE_ROOT/runs/RUN/job, a fetcher pointed
at it, and the tree comparison the fetch tests use (fixtures ``host`` and ``small_ranges`` in tests/fixtures/sshd.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_train.stack.config import SshHost
from remote.loopback import Sshd
from remote.ssh.target import Target
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch.engine import Fetcher
from remote.transfer.fetch.progress import Progress
from remote.transfer.fetch.stream import Opener, Stream

MiB = 1 << 20


class Host:
    """A loopback sshd holding REMOTE_ROOT/runs/RUN/job, and a fetcher pointed at it."""

    def __init__(self, tmp: Path, **sshd: Any):
        self.sshd = Sshd(tmp / "sshd", "127.0.16.3", log_level="INFO", **sshd).start()
        self.known = tmp / "known_hosts"
        self.learn_key()
        self.host = SshHost(self.sshd.user, self.sshd.address, self.sshd.port, keys=(str(self.sshd.client_key),))
        self.root = tmp / "root"
        self.target = Target(
            "t",
            (self.host,),
            str(self.sshd.client_key),
            self.known,
            True,
            str(self.root),
            None,
            venv=False,
            expect_gpus=0,
            hourly_cost_usd=None,
            is_gcp=False,
            cache=tmp / "cache",
        )
        self.streams_opened = 0

    def learn_key(self) -> None:
        scan = subprocess.run(["ssh-keyscan", "-p", str(self.sshd.port), self.sshd.address], capture_output=True, text=True, check=True)
        self.known.write_text(scan.stdout)

    def logins(self) -> int:
        """Connections sshd has let in so far (each a key exchange and a login)."""
        return (self.sshd.dir / "sshd.log").read_text().count("Accepted publickey")

    def job(self, run: str = "r_1") -> Path:
        path = self.root / "runs" / run / "job"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def opener(self) -> Counted:
        """Streams as `fab fetch` opens them (channels of one connection), counted."""
        return Counted(self, Opener(self.target, self.host))

    def open_stream(self) -> Stream:
        self.streams_opened += 1
        return Opener(self.target, self.host, mux=False)()

    def run(self, runs: list[tuple[str, Path]], streams: int = 4, progress: Progress | None = None):
        opener = self.opener()
        try:
            return Fetcher(opener, streams, progress).run(runs)
        finally:
            opener.close()

    def fetch(self, dest: Path, run: str = "r_1", streams: int = 4, progress: Progress | None = None):
        [result] = self.run([(run, dest)], streams, progress)
        return result


class Counted:
    """An Opener whose streams the host counts (``streams_opened``)."""

    def __init__(self, host: Host, opener: Opener) -> None:
        self.host, self.opener = host, opener

    def __call__(self) -> Stream:
        self.host.streams_opened += 1
        return self.opener()

    def close(self) -> None:
        self.opener.close()


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


def every_stream_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stream takes work until all the fetch's streams are open: a fetch opens another stream only
    while enough work is left, and on loopback the first ones would otherwise finish test-sized work
    before the last logged in. For the tests that count streams and logins."""
    transfer, work = Fetcher._transfer, Fetcher._work

    def gated_transfer(self, opened, queue, n, lookahead):
        self.gate = threading.Barrier(n, timeout=60)
        return transfer(self, opened, queue, n, lookahead)

    def gated_work(self, *args):
        self.gate.wait()
        return work(self, *args)

    monkeypatch.setattr(Fetcher, "_transfer", gated_transfer)
    monkeypatch.setattr(Fetcher, "_work", gated_work)
