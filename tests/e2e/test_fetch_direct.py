"""The e2e tier of tests/unit/test_fetch_direct.py (the same subject; its helpers are there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remote.transfer.fetch import direct as fd
from tests.fetch_host import Host, MiB, tree


def test_a_fetch_writes_big_files_directly_and_they_arrive_whole(
    host: Host, tmp_path: Path, small_ranges, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files sent whole and in ranges, of odd sizes (a tail of less than a block), small ones among them:
    byte for byte the host's, and the big ones did go directly (where this folder's disk allows it)."""
    job = host.job()
    sizes = {"a.pt": 3 * MiB + 1234, "b.pt": 700 * 1024 + 100, "c.pt": 2 * MiB, "s.json": 1000, "t.bin": 64 * 1024 - 1}
    for name, size in sizes.items():
        (job / name).write_bytes(os.urandom(size))
    direct: list[int] = []
    write = fd.Writer.write

    def spy(self: fd.Writer, view: memoryview, pos: int) -> int:
        before = self.written  # the bytes this writer wrote directly
        n = write(self, view, pos)
        direct.append(self.written - before)
        return n

    monkeypatch.setattr(fd.Writer, "write", spy)
    dest = tmp_path / "home"
    assert host.fetch(dest).complete
    assert tree(dest) == tree(job)
    if fd.writes_direct(tmp_path):
        # a.pt's twelve whole 256 KiB ranges (its last, 1234 bytes, is small), b.pt but its last 100 bytes,
        # c.pt's eight ranges
        assert sum(direct) == 3 * MiB + 700 * 1024 + 2 * MiB
    else:
        assert not any(direct)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):  # tmpfs: the ordinary way
        import tempfile

        with tempfile.TemporaryDirectory(dir=shm) as where:
            direct.clear()
            assert host.fetch(Path(where) / "home").complete
            assert tree(Path(where) / "home") == tree(job) and not any(direct)
