"""The `gpu-train` entry point (gpu_train/launcher.py): its exit skips Python's last full collection."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_what_a_command_made_is_frozen_out_of_the_last_collection() -> None:
    """Python's full collection at exit walked every object a command made (hundreds of thousands) only to
    free none before the process ended: 30-120 ms after status printed its table. The entry point
    freezes them once the command is done, whether it ended well or not; atexit handlers still run."""
    for argv in (["gpu-train", "--version"], ["gpu-train", "no-such-task"]):
        code = (
            "import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 10000, flush=True))\n"
            f"sys.argv = {argv!r}\n"
            "from gpu_train.launcher import main\n"
            "main()\n"
        )
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "frozen True" in out.stdout, (argv, out.stdout, out.stderr)
