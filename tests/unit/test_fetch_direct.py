"""Big fetched files written past the page cache (remote/transfer/fetch/direct.py): where, and that a refusal
by the kernel only means the ordinary way."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from remote.transfer.fetch import direct as fd

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 27 0:30 / /tmp rw,nosuid - tmpfs tmpfs rw
31 27 0:31 / /home/me/nfs rw shared:5 - nfs4 server:/export rw,vers=4.2
32 27 0:32 / /mnt/my\\040disk rw - xfs /dev/sdb1 rw
33 27 0:33 / /mnt/data rw master:1 - btrfs /dev/sdc rw
34 33 0:34 / /mnt/data rw - fuse.sshfs me@h: rw
35 27 0:35 / /media/x rw - ext4 /dev/sdd rw
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/", "ext4"),
    ("/home/me/runs", "ext4"),
    ("/tmp/x", "tmpfs"),
    ("/home/me/nfs/runs/a", "nfs4"),  # optional fields (shared:5) before the separator
    ("/mnt/my disk/runs", "xfs"),  # a space, escaped in mountinfo
    ("/mnt/data/runs", "fuse.sshfs"),  # mounted over the btrfs: the last one mounted there
    ("/mnt/data2", "ext4"),  # a longer name is not inside /mnt/data
    ("/media/x", "ext4"),
])  # fmt: skip
def test_the_file_system_holding_a_path(path: str, kind: str) -> None:
    assert fd.file_system(path, MOUNTINFO) == kind


def test_direct_only_on_a_local_disks_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = fd.file_system(os.path.realpath(tmp_path), Path(fd.MOUNTINFO).read_text())
    assert fd.writes_direct(tmp_path / "not" / "yet") is (here in fd.DIRECT_FS)  # the nearest folder that exists
    if Path("/dev/shm").is_dir():
        assert not fd.writes_direct(Path("/dev/shm"))  # tmpfs: no disk to write to
    monkeypatch.setattr(fd, "MOUNTINFO", str(tmp_path / "none"))
    assert not fd.writes_direct(tmp_path)  # not Linux's /proc: the ordinary way


def direct_capable(path: Path) -> bool:
    probe = path / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except (OSError, AttributeError):
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


def test_whole_blocks_go_directly_the_tail_and_refused_writes_the_ordinary_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not direct_capable(tmp_path):
        pytest.skip("no O_DIRECT here")
    buf = memoryview(mmap.mmap(-1, 64 * 1024))
    data = os.urandom(64 * 1024)
    buf[:] = data
    path = tmp_path / "f"
    fdesc = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        writer = fd.Writer(fdesc, fd.set_direct(fdesc, True))
        assert writer.direct
        assert writer.write(buf[:12288], 0) == 12288 and writer.direct
        assert writer.write(buf[:5000], 12288) == 4096 and writer.direct  # the whole blocks only
        assert writer.write(buf[4096 : 4096 + 904], 16384) == 904 and not writer.direct  # the tail: flag off
        assert writer.write(buf[8192:16384], 17288) == 8192
        # An offset the disk does not take (its blocks are 512 bytes or more): ext4 refuses the write
        # (EINVAL), and it goes the ordinary way (btrfs would quietly go through its cache itself).
        monkeypatch.setattr(fd, "DIRECT_ALIGN", 256)
        writer = fd.Writer(fdesc, fd.set_direct(fdesc, True))
        assert writer.write(buf[:512], 25856) == 512
        if fd.file_system(os.path.realpath(path), Path(fd.MOUNTINFO).read_text()) == "ext4":
            assert not writer.direct
    finally:
        os.close(fdesc)
    expect = data[:12288] + data[:4096] + data[4096:5000] + data[8192:16384]
    expect += bytes(25856 - len(expect)) + data[:512]
    assert path.read_bytes() == expect


def test_direct_writes_that_prove_slow_give_way_to_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that seeks (here: every direct write counts as slow) gets the rest through its cache, once
    enough was written to judge; data whole either way. Writes of 256 KiB, as a fetch's chunks are."""
    if not direct_capable(tmp_path):
        pytest.skip("no O_DIRECT here")
    chunk = 256 * 1024
    monkeypatch.setattr(fd, "SLOW_AFTER", 3 * chunk)
    buf = memoryview(mmap.mmap(-1, chunk))
    buf[:] = os.urandom(chunk)
    path = tmp_path / "f"
    fdesc = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fast = fd.Writer(fdesc, fd.set_direct(fdesc, True))
        for i in range(4):
            assert fast.write(buf, i * chunk) == chunk
        # a healthy disk stays direct, unless this one proved slow by the writer's own rule (judged on what it wrote direct)
        assert fast.direct or fast.spent > fd.SLOW_S * fast.written / chunk
        monkeypatch.setattr(fd, "SLOW_S", 0.0)
        slow = fd.Writer(fdesc, fd.set_direct(fdesc, True))
        states = []
        for i in range(4, 8):
            assert slow.write(buf, i * chunk) == chunk
            states.append(slow.direct)
        assert states == [True, True, False, False]  # judged after 768 KiB, not on one write
    finally:
        os.close(fdesc)
    assert path.read_bytes() == bytes(buf) * 8
