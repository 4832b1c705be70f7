"""One mapping from an error to its exit status and message, for every entry point."""

from __future__ import annotations

import pytest

from gpu_train.errors import ExitStatus, GpuTrainError, outcome
from gpu_train.jobs import JobError
from gpu_train.stack.config import ConfigError, Problem
from remote.errors import HostKeyError, KeyFileError, RemoteError


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        (ConfigError([Problem("zone", "is required", "set it")], "s"), ExitStatus.USAGE, "gpu-train:zone: is required"),
        (JobError("--name 1x: use letters"), ExitStatus.USAGE, "--name 1x"),
        (RemoteError("the agent failed on h"), ExitStatus.FAILED, "the agent failed on h"),
        (HostKeyError("the host key of h changed"), ExitStatus.UNREACHABLE, "changed"),
        (KeyFileError("no private key at /k"), ExitStatus.UNREACHABLE, "/k"),
        (KeyboardInterrupt(), ExitStatus.INTERRUPTED, "interrupted"),
        (KeyError("x"), ExitStatus.FAILED, "(KeyError; GPU_TRAIN_DEBUG=1 shows where)"),
        (ValueError("y" * 5000), ExitStatus.FAILED, "y ... (ValueError"),
    ],
)
def test_outcome(error: BaseException, status: ExitStatus, words: str) -> None:
    got_status, message = outcome(error)
    assert got_status == status and words in message


def test_a_base_error_carries_its_problems() -> None:
    problems = [Problem("zone", "is required"), Problem("nodes", "at most 256")]
    error = ConfigError(problems, "s")
    assert isinstance(error, GpuTrainError) and isinstance(error, ValueError)
    assert error.problems == problems and "2 problems" in str(error)
    assert GpuTrainError(problems=["a", "b"]).problems == ["a", "b"] and str(GpuTrainError(problems=["a", "b"])) == "a\nb"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain words", "plain words"),
        ("title\x1b]0;pwned\x07 here", "title\\x1b]0;pwned\\x07 here"),
        ("clear\x1b[2J", "clear\\x1b[2J"),
        ("C1 \x9b6n answer-back", "C1 \\x9b6n answer-back"),
        ("bidi \u202eevil", "bidi \\u202eevil"),
        ("line one\n    fix: two\tcolumns", "line one\\n    fix: two\\tcolumns"),
        ("ünïcode and 日本", "ünïcode and 日本"),
    ],
)
def test_printable_writes_out_control_characters(text: str, shown: str) -> None:
    from gpu_train.errors import printable

    assert printable(text) == shown


def test_outcome_keeps_line_breaks_but_not_escape_sequences() -> None:
    _, message = outcome(RemoteError("host says \x1b[31mred\x1b[0m\n  and more"))
    assert message == "host says \\x1b[31mred\\x1b[0m\n  and more"
