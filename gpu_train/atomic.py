"""Writing a laptop file whole or not at all: the one way gpu-train replaces its own files."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text``: written to a temporary file beside it (one per writer), then
    renamed over it, so a reader sees the old file or the new one, never half of one. An existing
    file keeps its mode (a new one gets ``mode``); a symbolic link (a dotfiles ~/.ssh/config) is
    written where it points, not replaced by a file."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    keep = path.stat().st_mode & 0o777 if path.exists() else mode
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, keep)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
