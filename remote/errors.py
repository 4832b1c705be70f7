"""What goes wrong on the laptop's side of the hosts, and how it reaches the user.

The errors of the way to a host and of the host itself (``RemoteError`` and the ones no retry
cures), and where the tasks' errors become exits: an error is a message and an exit code.

The tasks raise the errors of gpu_train/errors.py; ``exit_for`` (the task wrapper in
remote/tasks/__init__.py, the program in remote/cli.py) is the only maker of Invoke's ``Exit``. What
is not one of ours (a closed pipe in `fab status | head`, a bug) would print a Python traceback: instead
a closed stdout ends quietly, as a Unix filter does, and anything else is one line naming the error,
with the traceback kept for those who ask (GPU_TRAIN_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from gpu_train.environment import Environment
from gpu_train.errors import ExitStatus, GpuTrainError, Unreachable, outcome

if TYPE_CHECKING:
    from invoke import Exit


class RemoteError(GpuTrainError):
    """Something on the host or the way to it failed; the message says what and what to do."""


class HostKeyError(RemoteError, Unreachable):
    """A failure no retry or refreshed address can cure (the tasks stop at once)."""


class KeyFileError(HostKeyError):
    """Our own private key cannot be used."""


class VmStopped(HostKeyError):
    """The Compute API says the VM is stopped: no wait and no refreshed address will reach it."""


def exit_for(error: BaseException) -> Exit:
    """Invoke's Exit for an error: its message and exit status, as gpu_train.errors maps them."""
    from invoke import Exit

    status, message = outcome(error)
    return Exit(message, code=status)


# A process manager's stop (SIGTERM; `timeout`, systemd, a container's end) and a closed terminal (SIGHUP).
STOP_SIGNALS = ("SIGTERM", "SIGHUP")


@contextlib.contextmanager
def stops_as_ctrl_c() -> Iterator[None]:
    """While a task runs, SIGTERM and SIGHUP end it as Ctrl-C does (KeyboardInterrupt in the main thread):
    its own Ctrl-C handling stops what it started (`tensorboard --fetched`'s TensorBoard, the server on the
    host, a sync's rsync), where their default action would end this process alone and leave its children
    running. A signal that was not at its default (ignored under nohup, an embedding program's handler) is
    left as it was; so is every signal outside the main thread. The previous handlers come back after."""
    saved: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)  # (no SIGHUP on Windows)
            if number is not None and signal.getsignal(number) == signal.SIG_DFL:
                saved[number] = signal.signal(number, _interrupt)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)  # type: ignore[arg-type]  # (what getsignal gave back)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None, debug: bool = False) -> None:
    if issubclass(kind, BrokenPipeError):
        # The reader went away: nothing more can be said on stdout, and Python's own flush at exit
        # would raise again. Point stdout at /dev/null and leave as `yes | head` does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os._exit(ExitStatus.BROKEN_PIPE)
    status, message = outcome(value)
    if debug and not isinstance(value, KeyboardInterrupt):
        traceback.print_exception(kind, value, tb)
    elif isinstance(value, GpuTrainError | KeyboardInterrupt):
        print(message, file=sys.stderr)  # a message for the user, with its fix: no "error:" label needed
    else:
        print(f"error: {message}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(status)


def install() -> Environment:
    """Make the hook the interpreter's, then build the command's Environment (a bad GPU_TRAIN_* value is
    already said by the hook): called by the entry points (fabfile.py, `gpu-train`) before any task runs."""
    sys.excepthook = _hook
    env = Environment.from_os()
    sys.excepthook = functools.partial(_hook, debug=env.debug)
    return env
