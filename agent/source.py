"""Which copy of the agent a run's wrapper runs from, and keeping it there while the run lives.

The bootstrap unpacks each version of the zipapp into REMOTE_ROOT/bin/.agent-CRC-SIZE (agent/bootstrap.py),
where Python keeps the compiled modules; from the zipapp itself Python compiles every module anew at each
start (about 85 ms of CPU for the wrapper's). A version's folder goes a day after its last use, but a run
may train for days past an upgrade and its wrapper imports modules late (its end's, its webhook's): the
wrapper holds a shared lock on its folder, and the bootstrap removes only folders it can lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import zlib

from gpu_train.contract import UNPACKED

from .store import agent_path

_held: list[int] = []  # the folder this process imports from, open and locked for its life


def running_folder() -> str | None:
    """The unpacked folder this agent imports from, or None (the zipapp; the source tree in the tests)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.basename(here).startswith(UNPACKED) and os.path.isfile(os.path.join(here, "__main__.py")):
        return here
    return None


def for_wrapper(root: str) -> str:
    """What a run's wrapper runs (after ``python -I -S``): this call's unpacked folder; else (`boot` and `tick`,
    which cron and systemd start from the zipapp) the installed zipapp's own folder where the bootstrap
    unpacked it; else the zipapp; else (the root-installed copy's `boot`, before any call installed one) this
    agent itself. Never the zipapp where its folder is there: the next version's call replaces that file,
    and Python reads a zip's modules by the offsets it read at the start (a later import fails: "bad local
    file header"; a sweep's trial then starts none after it)."""
    folder = running_folder()
    if folder is not None:
        return folder
    agent = agent_path(root)
    if not os.path.isfile(agent):
        return os.path.abspath(sys.argv[0])
    return unpacked_folder(root, agent) or agent


def unpacked_folder(root: str, zipapp: str) -> str | None:
    """The folder the bootstrap unpacked the zipapp at ``zipapp`` into (named by its version, as
    bootstrap.version names it: the CRC-32 and size of its bytes), or None where there is none."""
    try:
        with open(zipapp, "rb") as f:
            data = f.read()
    except OSError:
        return None
    folder = os.path.join(root, "bin", f"{UNPACKED}{zlib.crc32(data):08x}-{len(data)}")
    return folder if os.path.isfile(os.path.join(folder, "__main__.py")) else None


def hold() -> None:
    """A shared lock on the folder this process runs from, until it exits (bootstrap.remove_unheld)."""
    folder = running_folder()
    if folder is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)  # (not inherited by the job: Python opens it close-on-exec)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held.append(fd)
