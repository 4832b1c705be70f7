"""A file replaced whole or not at all: the one way gpu-train writes its own files, laptop and host.

One rule for every writer: the new content goes to a temporary file beside the target (one per writer,
created exclusively, never through a link), is flushed and fsync'd, then renamed over the target, and
the folder is fsync'd after the rename. A reader sees the old file or the new one, never half of one,
and after a power loss (a spot VM's soft-off) the rename is on disk with the bytes it names.

Standard library only and Python 3.8+: the agent's zipapp carries this module (agent/bundle.py CARRIED).
(The agent's bootstrap, agent/bootstrap.py, runs before any module can be imported and keeps its own
few lines for the zipapp it installs.)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | Path, mode: int = 0o600) -> Iterator[str]:
    """A temporary path to write ``path``'s new content into; on a clean exit it is fsync'd and renamed
    over ``path`` (then the folder fsync'd), on an exception removed with ``path`` untouched. ``mode`` from
    the temporary file's first byte (a secret is never readable by others, not even half-written)."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed writer with our pid and thread
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)  # the writer may have replaced the file (a download to the path): the mode stays
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def atomic_write(path: str | Path, data: str | bytes, mode: int = 0o600, *, keep_mode: bool = True) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8). A symbolic link (a dotfiles ~/.ssh/config) is
    written where it points, not replaced by a file; an existing file keeps its mode when ``keep_mode``
    (a new one gets ``mode``); a missing folder is made 0700."""
    real = os.path.realpath(path)
    os.makedirs(os.path.dirname(real), mode=0o700, exist_ok=True)
    if keep_mode:
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(real).st_mode & 0o777
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    with replacing(real, mode) as tmp, open(tmp, "wb") as f:
        f.write(raw)


def _fsync_folder(folder: str) -> None:
    """The rename made durable (a folder that cannot be opened for it, on some file systems, is left)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
