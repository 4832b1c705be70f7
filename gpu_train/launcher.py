"""The `gpu-train` command's entry point: the tasks, from the clone gpu-train runs from.

Installed, gpu-train claims one import name, ``gpu_train``. Its other folders (``remote``, ``infra``:
the tasks, the agent, the Pulumi program, which Pulumi runs from the clone) are importable only
through the clone's own editable install (scripts/setup), never as generic top-level names in
someone else's environment. A wheel installed elsewhere says so instead of failing on an import.
"""

from __future__ import annotations

import gc
import sys


def main() -> None:
    try:
        if sys.argv[1:2] in (["status"], ["logs"]):  # asked of the host now, while the tasks load (remote/ssh/early.py)
            from remote.ssh.early import start

            start(sys.argv[1:])
        from remote.cli import main as run
    except ModuleNotFoundError as e:
        if e.name not in ("remote", "remote.cli", "remote.ssh", "remote.ssh.early"):
            raise
        sys.exit(
            "gpu-train runs from its clone: git clone URL ~/gpu-train && ~/gpu-train/scripts/setup "
            "(that puts the `gpu-train` of the clone's .venv on PATH)"
        )
    try:
        run()
    finally:
        # Python's last full collection at exit walks every object the command made (the tasks, Invoke,
        # the contract: hundreds of thousands) only to find nothing to free before the process ends:
        # 30-120 ms of every command. Frozen objects are left out of it; atexit handlers still run.
        gc.freeze()
