"""Which command lines `gpu-train status` asks the host for early (remote/ssh/early.py), and an early
call no channel took is ended at exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from remote.ssh import early, mux


@pytest.mark.parametrize(
    ("words", "plain", "stack"),
    [
        (["status"], True, None),
        (["status", "--json"], True, None),
        (["status", "-j", "--all-projects"], True, None),
        (["status", "--stack", "lab"], True, "lab"),
        (["status", "--stack=lab", "--json"], True, "lab"),
        (["status", "-s", "a100"], True, "a100"),
        (["status", "--stack"], False, None),  # a flag without its value: the task says so
        (["status", "--json=yes"], False, None),
        (["status", "--help"], False, None),
        (["status", "--stacks-dir", "x"], False, None),  # a core option after the task: not status's
        (["status", "train"], False, None),  # a second task
        (["--stacks-dir", "x", "status"], False, None),  # where the stacks are read changes
        (["train", "--stack", "lab"], False, None),
        ([], False, None),
    ],
)
def test_only_a_plain_status_is_asked_early(words: list[str], plain: bool, stack: str | None) -> None:
    assert early.status_stack(words) == (plain, stack)


def test_an_early_call_no_channel_took_is_ended_at_exit() -> None:
    code = (
        "import sys; from remote.ssh import mux\n"
        "mux.start_early(['sleep', '30'])\n"
        "print([p.pid for p in mux._EARLY.values()][0], flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True)
    pid = int(out.stdout)
    assert subprocess.run(["ps", "-p", str(pid), "-o", "stat="], capture_output=True, text=True).stdout.strip() in ("", "Z")


def test_a_channel_takes_over_only_the_exact_call() -> None:
    mux.start_early(["sh", "-c", "echo early"])
    try:
        other = mux.MuxChannel(["sh", "-c"])
        other.exec_command("echo mine")  # another command: a process of its own
        assert other.makefile().read() == b"mine\n"
        same = mux.MuxChannel(["sh", "-c"])
        same.exec_command("echo early")
        assert same.makefile().read() == b"early\n" and not mux._EARLY
    finally:
        mux._end_unused()


def test_the_flags_asked_early_are_exactly_status_own() -> None:
    """early.py cannot load the tasks (that is the time it saves), so it names status's flags itself: a
    flag added to the task, or one renamed, must be named there too (else that status is not asked early,
    or a flag status no longer takes would be)."""
    from remote.cli import _flags
    from remote.tasks import ns

    (context,) = [c for c in ns.to_contexts() if c.name == "status"]
    assert _flags(context) == early.STATUS_FLAGS
