"""The laptop's side of a fetch on disk: what is here, where partial data waits, installing a file.

Nothing half-written is ever at the destination: a file is assembled in the partial folder beside
it (``.DEST.gpu-train-partial/``, on the same file system) and renamed into place only when every
byte is verified. Paths come from the host's listing, so each is checked before use: a plain
relative path, and no folder on the way that is a symbolic link or a file (a host cannot make us
write outside the destination, not even through a link it created there).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
from pathlib import Path

from remote.fetch_plan import Local

CHUNK = 256 * 1024  # bigger writes cost several times more CPU per byte (measured on ext4)


class UnsafePath(Exception):
    """A path from the host that would lead outside the destination; never written."""


def partial_dir(dest: Path) -> Path:
    """Beside the destination, never inside it: a half-fetched file is never where results are read."""
    return dest.parent / f".{dest.name}.gpu-train-partial"


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
        self.listed: dict[str, dict[str, os.DirEntry] | Local | None] = {}

    def planned(self, rel: str) -> Local | None:
        """``state(rel)`` for planning a whole tree: each folder is read once (one listing, not an
        ``lstat`` per file: a fresh destination of 60,000 files costs nothing here). What is there is
        checked again when a file is installed, so a listing a moment old never replaces anything."""
        parts = check_rel(rel)
        names = self._names("/".join(parts[:-1]))
        if not isinstance(names, dict):
            return names
        entry = names.get(parts[-1])
        if entry is None:
            return None
        st = entry.stat(follow_symlinks=False)
        return Local(_kind(st), st.st_size, st.st_mtime_ns, os.readlink(entry.path) if stat.S_ISLNK(st.st_mode) else "")

    def _names(self, folder: str) -> dict[str, os.DirEntry] | Local | None:
        """The entries of ``folder`` by name; None when it is not there, Local("o") when it or a folder on
        the way is not a real folder (a link, a file: never written through)."""
        if folder in self.listed:
            return self.listed[folder]
        parent, _, name = folder.rpartition("/")
        found: dict[str, os.DirEntry] | Local | None = None
        above = self._names(parent) if folder else {}
        if isinstance(above, dict):
            entry = above.get(name) if folder else None
            if folder and entry is not None and not entry.is_dir(follow_symlinks=False):
                found = Local("o")
            elif not folder or entry is not None:
                try:
                    with os.scandir(f"{self.base}/{folder}" if folder else self.base) as it:
                        found = {e.name: e for e in it}
                    if folder:
                        self.known.add(folder)
                except FileNotFoundError:
                    found = None
        else:
            found = above
        self.listed[folder] = found
        return found

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
        os.makedirs(self.base, exist_ok=True)
        path, sub = self.base, ""
        for part in check_rel(rel) if rel else []:
            path, sub = f"{path}/{part}", f"{sub}/{part}" if sub else part
            if sub in self.known:
                continue
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise UnsafePath(f"{path} is in the way (not a folder); the host's {rel!r} was not written") from None
            self.known.add(sub)
        return path

    def install(self, part: str, rel: str, planned: Local | None) -> bool:
        """Rename the verified ``part`` (mode and time already set) to ``rel``.

        False (and the part left where it is) when the destination changed since the fetch was
        planned: whatever was written there meanwhile is not ours to replace.
        """
        folder, _, name = rel.rpartition("/")
        path = self.folder(folder) + "/" + name if folder else f"{self.base}/{name}"
        if planned is None:  # nothing was there: nothing may be there now (no exception raised per file)
            if os.access(path, os.F_OK, follow_symlinks=False):
                return False
        elif self.state(rel) != planned:
            return False
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


def local_state(base: Path, rel: str) -> Local | None:
    return Tree(base).state(rel)


def ensure_dir(base: Path, rel: str | None) -> Path:
    return Path(Tree(base).folder(rel or ""))


def part_path(dest: Path, rel: str) -> str:
    """Where ``rel`` is assembled: named by a hash of its path, so a later fetch finds it to resume."""
    return f"{_partial_str(dest)}/{hashlib.sha256(rel.encode()).hexdigest()[:32]}.part"


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


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            h.update(data)
    return h.hexdigest()


