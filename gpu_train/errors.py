"""What an error means to the person who ran a command: errors by meaning that carry their problems
(and a failed command its result), the exit statuses, and the one place that maps an error to both.

Code raises these errors; only the entry points turn one into an exit, through ``outcome``: the task
wrapper and the hook (remote/errors.py), each script's main (``leave``). tests/unit/test_exits.py holds it.
"""

from __future__ import annotations

import codecs
import re
import sys
import unicodedata
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NoReturn


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

    status: int = ExitStatus.FAILED

    def __init__(self, message: str = "", problems: Sequence[Any] = ()):
        self.problems: list[Any] = list(problems)
        super().__init__(message or "\n".join(map(str, self.problems)))


class UsageError(GpuTrainError):
    """Bad input (an option, an argument, a file named): nothing was created, copied or started."""

    status = ExitStatus.USAGE


class Unreachable(GpuTrainError):
    """No way to the host: SSH down, a host key that does not match, no key file."""

    status = ExitStatus.UNREACHABLE


class Interrupted(GpuTrainError):
    """Ctrl-C, caught where the message can say what was done and what goes on."""

    status = ExitStatus.INTERRUPTED


class CommandFailed(GpuTrainError):
    """A command that ran and failed (``pulumi``, a job, a command on a host), carrying its result as
    Invoke's ``UnexpectedExit`` carries its ``Result``: the command, where, its exit code, its stderr's end."""

    def __init__(
        self,
        message: str = "",
        *,
        command: str = "",
        exited: int | None = None,
        host: str = "",
        stderr: str = "",
        problems: Sequence[Any] = (),
    ):
        super().__init__(message, problems)
        self.command, self.exited, self.host, self.stderr = command, exited, host, stderr


class CommandExit(CommandFailed):
    """A command whose exit code the task ends with (`logs --follow` ends as its job did, `nvidia-smi`
    as nvidia-smi), as a shell passes a command's on; one that is no exit status (none, a signal) is FAILED."""

    def __init__(self, message: str = "", **result: Any):
        super().__init__(message, **result)
        self.status = self.exited if self.exited is not None and 0 < self.exited < 256 else ExitStatus.FAILED


def as_error(error: BaseException) -> GpuTrainError:
    """Any exception as the error the user would be told of (a node's failure among others)."""
    if isinstance(error, GpuTrainError):
        return error
    status, message = outcome(error)
    failed = GpuTrainError(message)
    failed.status = status
    return failed


def shared_status(statuses: Sequence[int]) -> int:
    """The exit status of several failures at once (a cluster's nodes'): the one they all have (every node out
    of reach: UNREACHABLE), else FAILED: the work was tried and failed for more than one reason (one node out
    of reach, another's host refusing: FAILED; the message has a line per node saying which)."""
    shared = set(statuses)
    return shared.pop() if len(shared) == 1 else ExitStatus.FAILED


def joined(errors: Sequence[GpuTrainError], message: str) -> GpuTrainError:
    """Several failures (a cluster's nodes') as one error: ``message``, with their ``shared_status``."""
    error = GpuTrainError(message)
    error.status = shared_status([e.status for e in errors])
    return error


def printable(text: str, keep: str = "") -> str:
    """``text`` with its control characters (but those in ``keep``) written out, as ``\\x1b``.

    Messages carry words from hosts, stack files and APIs to a terminal: an escape sequence among
    them could retitle the window, hide lines, or on some terminals answer back as typed input.
    Written out, it is only text to read.
    """
    if text.isprintable():
        return text
    return "".join(c if c in keep or unicodedata.category(c) not in ("Cc", "Cf") else repr(c)[1:-1] for c in text)


def printable_doc(value: Any) -> Any:
    """A host's JSON document with every string in it (keys too) :func:`printable`: its words reach the terminal."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_doc(k): printable_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_doc(v) for v in value]
    return value


def outcome(error: BaseException) -> tuple[int, str]:
    """The exit status and the message for an error that ended a command (the one mapping)."""
    status, message = _outcome(error)
    return status, printable(message, keep="\n\t")


def leave(error: BaseException) -> NoReturn:
    """A script's main ends on ``error``: its message on stderr, its status as the exit status."""
    status, message = outcome(error)
    if message:
        print(message, file=sys.stderr)
    sys.exit(status)


def _outcome(error: BaseException) -> tuple[int, str]:
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


# -- a job's output on the user's terminal --------------------------------------------------------
# `logs`, `logs --follow` and `train --follow` pass a job's log through. A job (or anything it runs)
# may write escape sequences: OSC 52 sets the clipboard, others retitle the window, move the cursor
# over earlier lines, or answer back as typed input. Kept as they are: text, \t, \n, \r (progress
# bars) and SGR colour (ESC [ ... m). Dropped: CSI cursor moves and erases (ESC [ n A ... ESC [ n K, see
# CURSOR_MOVES), which tqdm's nested bars write (ESC [ A after each inner bar); not sent, they can
# overwrite nothing, and written out they made every Trainer eval read as `\x1b[A`. Every other
# control character, escape sequence, C1 control (U+0080-U+009F) and bidirectional override is
# written out as text (\x1b]52;...).
# Cursor up/down/forward/back, next/previous line, to a column, to a place (H, f), erase in display
# (J) and in line (K). agent/store.py's CURSOR_MOVES is the same (status's LAST LINE; the agent
# imports no laptop module); tests/unit/test_terminal.py holds them equal.
CURSOR_MOVES = r"\x1b\[[0-9;]{0,64}[A-HJKf]"
# SGR, a cursor move, or any other control: C0 (but \t \n \r), ESC, DEL, C1, and the bidirectional overrides.
_TOKEN = re.compile(r"\x1b\[[0-9;:]{0,64}m|" + CURSOR_MOVES + r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_OPEN = re.compile(r"\x1b(\[[0-9;:]{0,64})?\Z")  # a sequence the next chunk may complete


def _written_out(m: re.Match[str]) -> str:
    text = m[0]
    if text.startswith("\x1b["):
        return text if text.endswith("m") else ""  # colour kept; a cursor move or erase dropped
    return text.encode("unicode_escape").decode("ascii")


def shown(text: str) -> str:
    """``text`` as a terminal may show it (whole text, no chunks)."""
    return _TOKEN.sub(_written_out, text)


class TerminalStream:
    """Bytes of a log, chunk by chunk, made safe for a terminal; a sequence or a UTF-8 character cut
    between two chunks is held until the next. Bytes that are not UTF-8 are written out (``\\x9b``)."""

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
        self._held = ""

    def feed(self, data: bytes) -> bytes:
        text = self._held + self._decode.decode(data)
        m = _OPEN.search(text)
        self._held, text = (text[m.start() :], text[: m.start()]) if m else ("", text)
        return shown(text).encode()

    def end(self) -> bytes:
        text, self._held = self._held + self._decode.decode(b"", final=True), ""
        return shown(text).encode()
