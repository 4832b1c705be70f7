"""The last line of defence of the `fab` entry point: an error is a message and an exit code.

The tasks turn every error they expect into Invoke's ``Exit`` with a message. What escapes them
(a closed pipe in `fab status | head`, a bug) would print a Python traceback: instead a closed
stdout ends quietly, as a Unix filter does, and anything else is one line naming the error, with
the traceback kept for those who ask (GPU_TRAIN_DEBUG=1).
"""

from __future__ import annotations

import os
import sys
import traceback

SIGPIPE_EXIT = 128 + 13


def _hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
    if issubclass(kind, BrokenPipeError):
        # The reader went away: nothing more can be said on stdout, and Python's own flush at exit
        # would raise again. Point stdout at /dev/null and leave as `yes | head` does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os._exit(SIGPIPE_EXIT)
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        os._exit(130)
    if os.environ.get("GPU_TRAIN_DEBUG"):
        traceback.print_exception(kind, value, tb)  # type: ignore[arg-type]
    else:
        text = str(value).strip() or kind.__name__
        if len(text) > 2000:
            text = text[:2000] + " ..."
        print(f"error: {text} ({kind.__name__}; GPU_TRAIN_DEBUG=1 shows where)", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def install() -> None:
    """Make the hook the interpreter's: called when fabfile.py is loaded, before any task runs."""
    sys.excepthook = _hook
