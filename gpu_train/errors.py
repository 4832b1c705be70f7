"""What an error means to the person who ran a command: one base error that carries its problems,
the exit statuses every entry point uses, and the one place that maps an error to both.

Entry points (the fab tasks, the fab hook in remote/errors.py, scripts/plan, preflight, up) say
``ExitStatus.X``, never a bare number, and turn an error into (status, message) with ``outcome``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from enum import IntEnum
from typing import Any


class ExitStatus(IntEnum):
    OK = 0
    FAILED = 1  # the work was tried and failed: a host's error, a job that failed, a fetch that did not finish
    USAGE = 2  # bad input (a stack, an option): nothing was created, copied or started
    UNREACHABLE = 3  # no way to the host: SSH down, a host key that does not match, no key file
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    BROKEN_PIPE = 141  # the reader of our output went away (128 + SIGPIPE), as `yes | head` ends


class GpuTrainError(Exception):
    """An error the user can act on: its message says what is wrong and how to fix it.

    ``problems`` are the lines of it (one per thing wrong); ``status`` is the exit status it means.
    """

    status: ExitStatus = ExitStatus.FAILED

    def __init__(self, message: str = "", problems: Sequence[Any] = ()):
        self.problems: list[Any] = list(problems)
        super().__init__(message or "\n".join(map(str, self.problems)))


def printable(text: str, keep: str = "") -> str:
    """``text`` with its control characters (but those in ``keep``) written out, as ``\\x1b``.

    Messages carry words from hosts, stack files and APIs to a terminal: an escape sequence among
    them could retitle the window, hide lines, or on some terminals answer back as typed input.
    Written out, it is only text to read.
    """
    if text.isprintable():
        return text
    return "".join(c if c in keep or unicodedata.category(c) not in ("Cc", "Cf") else repr(c)[1:-1]
                   for c in text)


def printable_doc(value: Any) -> Any:
    """A host's JSON document with every string in it (keys too) :func:`printable`: its words reach the terminal."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_doc(k): printable_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_doc(v) for v in value]
    return value


def outcome(error: BaseException) -> tuple[ExitStatus, str]:
    """The exit status and the message for an error that ended a command (the one mapping)."""
    status, message = _outcome(error)
    return status, printable(message, keep="\n\t")


def _outcome(error: BaseException) -> tuple[ExitStatus, str]:
    if isinstance(error, GpuTrainError):
        return error.status, str(error)
    if isinstance(error, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED, "interrupted"
    if isinstance(error, BrokenPipeError):
        return ExitStatus.BROKEN_PIPE, ""
    text = str(error).strip() or type(error).__name__
    if len(text) > 2000:
        text = text[:2000] + " ..."
    return ExitStatus.FAILED, f"{text} ({type(error).__name__}; GPU_TRAIN_DEBUG=1 shows where)"
