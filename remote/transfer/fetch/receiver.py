"""The laptop's side of a fetch on disk: what is here, where partial data waits, installing a file.

Nothing half-written is ever at the destination: a file is assembled in the partial folder beside
it (``.DEST.gpu-train-partial/``, on the same file system) and renamed into place only when every
byte is verified. Paths come from the host's listing, so each is checked before use: a plain
relative path, and no folder on the way that is a symbolic link or a file (a host cannot make us
write outside the destination, not even through a link it created there).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import shutil
import stat
from pathlib import Path

from remote.transfer.fetch.generator import PREVIOUS, Local

CHUNK = 256 * 1024  # bigger writes cost several times more CPU per byte (measured on ext4)


class UnsafePath(Exception):
    """A path from the host that would lead outside the destination; never written."""


def partial_dir(dest: Path) -> Path:
    """Beside the destination, never inside it: a half-fetched file is never where results are read."""
    return dest.parent / f".{dest.name}.gpu-train-partial"


def previous_dir(dest: Path, workdir: bool) -> Path:
    """Where replaced files' previous content is kept: RUN/.previous/ (RUN/.previous/workdir/ for the
    working directory's outputs, fetched into RUN/workdir/)."""
    return dest.parent / PREVIOUS / dest.name if workdir else dest / PREVIOUS


def check_rel(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"refusing the host's path {rel[:120]!r}: not a plain relative path")
    return parts


def _kind(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "f"
    if stat.S_ISDIR(st.st_mode):
        return "d"
    return "l" if stat.S_ISLNK(st.st_mode) else "o"


class Tree:
    """A destination folder, and the folders in it already seen to be real folders (not links).

    Remembering them makes checking a path one ``lstat`` (its last part) instead of one per folder
    on the way: tens of thousands of small files live in a few hundred folders.
    """

    def __init__(self, base: Path):
        self.base = str(base)
        self.known: set[str] = set()
        self.made: set[str] = set()  # folders this tree made itself (for the base: "")

    def planned(self, rel: str) -> Local | None:
        """``state(rel)`` for planning: nothing, without a system call, in a folder this fetch made (it
        was empty, and planning puts only folders and links there, each an entry of its own); anywhere
        else an lstat, so the file system's own name rules (case-insensitive ones too) decide. A fresh
        destination of 60,000 files costs no lstat per file. Whatever is there is checked again when a
        file is installed."""
        folder = rel.rpartition("/")[0]
        if folder in self.made:
            check_rel(rel)
            return None
        return self.state(rel)

    def state(self, rel: str) -> Local | None:
        """What is at ``rel`` (not following a final link); kind 'o' when a folder on the way is not one."""
        parts = check_rel(rel)
        folder = "/".join(parts[:-1])
        if folder and folder not in self.known:
            path = self.base
            for i, part in enumerate(parts[:-1]):
                path += "/" + part
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    return None
                if not stat.S_ISDIR(st.st_mode):
                    return Local("o")  # a link or a file where the host has a folder: never written through
                self.known.add("/".join(parts[: i + 1]))
        try:
            st = os.lstat(f"{self.base}/{rel}")
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return Local("o")
        target = os.readlink(f"{self.base}/{rel}") if stat.S_ISLNK(st.st_mode) else ""
        return Local(_kind(st), st.st_size, st.st_mtime_ns, target)

    def folder(self, rel: str) -> str:
        """Create ``rel`` folder by folder, refusing any link or file on the way; its path."""
        if rel in self.known:
            return f"{self.base}/{rel}"
        if "" not in self.known:
            if not os.path.isdir(self.base):
                os.makedirs(self.base)
                self.made.add("")
            self.known.add("")
        path, sub = self.base, ""
        for part in check_rel(rel) if rel else []:
            path, sub = f"{path}/{part}", f"{sub}/{part}" if sub else part
            if sub in self.known:
                continue
            try:
                os.mkdir(path, 0o755)
                self.made.add(sub)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise UnsafePath(f"{path} is in the way (not a folder); the host's {rel!r} was not written") from None
            self.known.add(sub)
        return path

    def install(self, part: str, rel: str, planned: Local | None, keep: Tree | None = None) -> bool:
        """Rename the verified ``part`` (mode and time already set) to ``rel``; with ``keep``, the file
        it replaces stays at ``rel`` in that tree (a hard link made first: ``rel`` is never absent).

        False (and the part left where it is) when the destination changed since the fetch was
        planned: whatever was written there meanwhile is not ours to replace.
        """
        folder, _, name = rel.rpartition("/")
        path = self.folder(folder) + "/" + name if folder else f"{self.base}/{name}"
        if self.state(rel) != planned:
            return False
        if keep is not None:
            kept = keep.folder(folder) + "/" + name if folder else f"{keep.folder('')}/{name}"
            tmp = f"{kept}.gpu-train-keep"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.link(path, tmp, follow_symlinks=False)
            os.replace(tmp, kept)  # one previous version per file: an older one goes
        os.replace(part, path)
        return True

    def link(self, rel: str, target: str, planned: Local | None) -> bool:
        """A symbolic link as the host has it (rsync -a does the same); it is never written through."""
        folder, _, name = rel.rpartition("/")
        path = self.folder(folder) + "/" + name if folder else f"{self.base}/{name}"
        if self.state(rel) != planned:
            return False
        tmp = f"{path}.gpu-train-link"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, path)
        return True

    def set_time(self, rel: str, mtime_ns: int) -> None:
        here = self.state(rel)
        if here is not None and here.kind == "d":
            os.utime(f"{self.base}/{rel}", ns=(mtime_ns, mtime_ns), follow_symlinks=False)


def open_part(part: str, mode: int | None, umask: int) -> tuple[int, bool]:
    """A part file open for writing, and whether its mode still needs setting.

    ``mode`` is given for a file sent whole in one piece (most small files): it is made new with that
    mode (and our own read and write while it is written), which saves a chmod per file where the
    umask keeps the mode and no default ACL changes it; a part an earlier attempt left is of no use
    to it. Otherwise (pieces of a bigger file) the part is opened as it is, private.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
    if mode is None:
        return _open_in_folder(part, flags, 0o600), True
    try:
        fd = _open_in_folder(part, flags | os.O_EXCL, mode | 0o600)
    except FileExistsError:
        os.unlink(part)
        fd = os.open(part, flags | os.O_EXCL, mode | 0o600)
    return fd, (mode | 0o600) & ~umask != mode or default_acl(os.path.dirname(part))


def _open_in_folder(path: str, flags: int, mode: int) -> int:
    """os.open, making the (partial) folder first where it is not there yet."""
    try:
        return os.open(path, flags, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, mode)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (setting and restoring it
    would briefly change it for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


@functools.lru_cache(maxsize=64)
def default_acl(folder: str) -> bool:
    """Whether files made in ``folder`` may get other modes than the umask gives (a default ACL there),
    or we cannot tell (no extended attributes here): then a fetched file's mode is always set."""
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return True
    try:
        getxattr(folder, "system.posix_acl_default")
    except OSError as e:
        return e.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)
    return True


def local_state(base: Path, rel: str) -> Local | None:
    return Tree(base).state(rel)


def ensure_dir(base: Path, rel: str | None) -> Path:
    return Path(Tree(base).folder(rel or ""))


def part_path(dest: Path, rel: str) -> str:
    """Where ``rel`` is assembled: named by a hash of its path, so a later fetch finds it to resume."""
    return f"{_partial_str(dest)}/{hashlib.sha256(os.fsencode(rel)).hexdigest()[:32]}.part"  # a name as its bytes


@functools.lru_cache(maxsize=64)
def _partial_str(dest: Path) -> str:
    """partial_dir as text, once per destination (a fetch of 60,000 files asked 60,000 times: 0.75 s)."""
    return str(partial_dir(dest))


def prepare_part(part: str, basis: str | None, size: int) -> None:
    """The part file at its final size, starting as a copy of ``basis`` (the local file being updated)
    when it has none of its own yet."""
    os.makedirs(os.path.dirname(part), exist_ok=True)
    if basis is not None and basis != part and not os.path.exists(part):
        shutil.copyfile(basis, part, follow_symlinks=False)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def block_hashes(path: str, length: int, block: int) -> list[str]:
    """SHA-256 of each ``block`` of the first ``length`` bytes of ``path``."""
    out = []
    with open(path, "rb") as f:
        for _ in range(0, length, block):
            h, want = hashlib.sha256(), block
            while want:
                data = f.read(min(CHUNK, want))
                if not data:
                    break
                h.update(data)
                want -= len(data)
            out.append(h.hexdigest())
    return out


def same_bytes(a: str, b: str, start: int, end: int) -> bool:
    """Whether two files hold the same bytes in [start, end) (what lies before ``start`` is known equal)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        fa.seek(start)
        fb.seek(start)
        left = end - start
        while left > 0:
            x, y = fa.read(min(CHUNK, left)), fb.read(min(CHUNK, left))
            if x != y or not x:  # different, or one ends early
                return False
            left -= len(x)
        return True


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            h.update(data)
    return h.hexdigest()


def capacity(dest: Path) -> int:
    """The size of the disk ``dest`` (or its nearest existing folder) is on: no fetch stores more."""
    path = Path(dest)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).total
