"""The laptop's side of a fetch on disk: what is here, where partial data waits, installing a file.

Nothing half-written is ever at the destination: a file is assembled in the partial folder beside
it (``.DEST.gpu-train-partial/``, on the same file system) and renamed into place only when every
byte is verified. Paths come from the host's listing, so each is checked before use: a plain
relative path, and no folder on the way that is a symbolic link or a file (a host cannot make us
write outside the destination, not even through a link it created there).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from remote.fetch_plan import Local, safe_mode

CHUNK = 1 << 20


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


def local_state(base: Path, rel: str) -> Local | None:
    """What is at ``base/rel`` (not following a final link); kind 'o' when a folder on the way is not one."""
    parts = check_rel(rel)
    path = base
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return Local("o")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            return Local("o")  # a link or a file where the host has a folder: never written through
    target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
    return Local(_kind(st), st.st_size, st.st_mtime_ns, target)


def ensure_dir(base: Path, rel: str | None) -> Path:
    """Create ``base/rel`` folder by folder, refusing any link or file on the way; the folder's path."""
    base.mkdir(parents=True, exist_ok=True)
    path = base
    for part in check_rel(rel) if rel else []:
        path = path / part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise UnsafePath(f"{path} is in the way (not a folder); the host's {rel!r} was not written") from None
    return path


def part_path(dest: Path, rel: str) -> Path:
    """Where ``rel`` is assembled: named by a hash of its path, so a later fetch finds it to resume."""
    return partial_dir(dest) / (hashlib.sha256(rel.encode()).hexdigest()[:32] + ".part")


def prepare_part(part: Path, basis: Path | None, size: int) -> None:
    """The part file at its final size, starting as a copy of ``basis`` (the local file being updated)
    when it has none of its own yet."""
    part.parent.mkdir(parents=True, exist_ok=True)
    if basis is not None and basis != part and not part.exists():
        shutil.copyfile(basis, part, follow_symlinks=False)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def block_hashes(path: Path, length: int, block: int) -> list[str]:
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


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            h.update(data)
    return h.hexdigest()


def install(part: Path, base: Path, rel: str, mode: int, mtime_ns: int, planned: Local | None) -> bool:
    """Rename the verified ``part`` to ``base/rel`` with the host's time and a safe mode.

    False (and the part left where it is) when the destination changed since the fetch was
    planned: whatever was written there meanwhile is not ours to replace.
    """
    os.chmod(part, safe_mode(mode))
    os.utime(part, ns=(mtime_ns, mtime_ns))
    parts = check_rel(rel)
    folder = ensure_dir(base, "/".join(parts[:-1]) or None)
    if local_state(base, rel) != planned:
        return False
    os.replace(part, folder / parts[-1])
    return True


def make_link(base: Path, rel: str, target: str, planned: Local | None) -> bool:
    """A symbolic link as the host has it (rsync -a does the same); it is never written through."""
    parts = check_rel(rel)
    folder = ensure_dir(base, "/".join(parts[:-1]) or None)
    if local_state(base, rel) != planned:
        return False
    tmp = folder / f".{parts[-1]}.gpu-train-link"
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, folder / parts[-1])
    return True


def set_dir_time(base: Path, rel: str, mtime_ns: int) -> None:
    if local_state(base, rel) is not None and local_state(base, rel).kind == "d":  # type: ignore[union-attr]
        os.utime(base / rel, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
