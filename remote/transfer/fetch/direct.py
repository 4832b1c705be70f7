"""Big fetched files written past the page cache (O_DIRECT), where the laptop's disk is local.

A checkpoint fetched home is written once and seldom read back at once. Through the page cache
every 4 KiB of it costs the laptop a fresh page (taken, filled, later written back and dropped), and
it pushes out what the user had cached. Written with O_DIRECT it goes from the stream's own buffer
straight to the disk. Measured on this project's 2-core VM (1 GiB on loopback, `bench/fetch.py`
figure 3): the page-cache copy was the largest single cost of the whole fetch (18% of all CPU time
in `perf`, rsync's receiver paying the same), and writing directly took the fetch from 4.15 to 3.34 s
(medians of 8, in turns; rsync -a 4.36 s), and it varied less (3.24-3.50 s against 3.71-4.48 s):
a fresh page's cost on a VM depends on what the host has given back. `dd` of 1 GiB took 0.2 s of CPU
time directly against 0.5-0.9 s through the cache.

Only where it is safe and cheap: Linux (elsewhere there is no O_DIRECT), a file system of a local
disk (ext4, xfs, btrfs, f2fs: on NFS or FUSE every direct write would wait for a round trip),
pieces of at least DIRECT_MIN (a small file is not worth a flag change), and only the whole
DIRECT_ALIGN blocks of a piece: a file's unaligned tail goes through the page cache as before.
Where the kernel refuses the flag or a direct write (EINVAL), the rest of that piece is written the
ordinary way, and so it is where direct writes take longer than SLOW_S per 256 KiB: a disk that seeks (a
spinning one, which the kernel's "rotational" flag does not tell reliably: virtio disks and USB
bridges report it for SSDs too) writes synchronous pieces from several streams slower than its page
cache would gather them. A file of several pieces is read back once for its whole-file check: from the disk,
where it was written directly. Whether a file was written directly or not, it is verified and installed alike.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from pathlib import Path

from remote.transfer.fetch.receiver import CHUNK

DIRECT_MIN = 4 << 20  # pieces this big are written directly
DIRECT_ALIGN = 4096  # a direct write's offset, length and buffer: multiples of any disk's logical block
DIRECT_FS = frozenset({"ext4", "xfs", "btrfs", "f2fs"})  # local disks' file systems
SLOW_S = 0.004  # direct writes slower than this per 256 KiB (64 MB/s): the rest of the piece through the cache
SLOW_AFTER = 2 << 20  # judged over at least this many bytes
# A stream's buffer, so the size of a direct write: each costs a system call and, on a VM, a notice to
# the host's disk (a virtio kick). 1 GiB on loopback, medians of 6 in turns: 256 KiB 3.29 s, 1 MiB
# 2.95 s, 4 MiB 3.16 s. Writes through the page cache stay CHUNK-sized (bigger ones cost more per byte).
BUFFER = 1 << 20
MOUNTINFO = "/proc/self/mountinfo"


def file_system(path: str, mountinfo: str) -> str | None:
    """The type of the file system holding ``path`` (absolute, resolved), from mountinfo's text: the
    longest mount point that contains it, the last mounted where several share one."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            mount, fs_type = _unescape(fields[4]), fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):
            continue
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best:
            best, kind = len(mount), fs_type
    return kind


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def writes_direct(folder: Path) -> bool:
    """Whether big files fetched into ``folder`` (or the nearest folder of it that exists) are written
    directly: Linux, and a local disk's file system."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        text = os.fsdecode(Path(MOUNTINFO).read_bytes())
    except OSError:
        return False
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return file_system(os.path.realpath(path), text) in DIRECT_FS


def set_direct(fd: int, on: bool) -> bool:
    """O_DIRECT on (or off) for an open file; False where the kernel refuses it."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError:
        return False
    return True


class Writer:
    """Writes one piece into its part file (``fd``): directly while it may, else the ordinary way.

    Directly, only whole DIRECT_ALIGN blocks at an aligned offset (each ``view`` starts at an aligned
    address: the caller's buffer is page-aligned); what is left, everything after a refused direct
    write, and everything after direct writes proved slow (SLOW_S per 256 KiB on average, over at
    least SLOW_AFTER bytes: one write held up by a busy machine proves nothing), through the page cache.
    """

    def __init__(self, fd: int, direct: bool):
        self.fd, self.direct = fd, direct
        self.spent, self.written = 0.0, 0  # the direct writes' time and bytes

    def write(self, view: memoryview, pos: int) -> int:
        """Bytes of ``view`` written at ``pos`` (at least one); OSError for a failure (a full disk)."""
        if self.direct:
            n = len(view) // DIRECT_ALIGN * DIRECT_ALIGN if pos % DIRECT_ALIGN == 0 else 0
            if n:
                started = time.monotonic()
                try:
                    n = os.pwrite(self.fd, view[:n], pos)
                except OSError as e:
                    if e.errno != errno.EINVAL:  # EINVAL: the file system took the flag, not the write
                        raise
                else:
                    self.spent += time.monotonic() - started
                    self.written += n
                    if self.written >= SLOW_AFTER and self.spent > SLOW_S * self.written / (256 * 1024):
                        self.stop()  # a disk slower directly than through its cache
                    return n
            self.stop()
        return os.pwrite(self.fd, view[:CHUNK], pos)

    def stop(self) -> None:
        self.direct = False
        set_direct(self.fd, False)
