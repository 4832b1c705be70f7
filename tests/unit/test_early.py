"""Which command lines `gpu-train status` asks the host for early (remote/ssh/early.py), and an early
call no channel took is ended at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote.ssh import early, mux


@pytest.mark.parametrize(
    ("words", "asked"),
    [
        (["status"], ("status", {})),
        (["status", "--json"], ("status", {"json_": True})),
        (["status", "-j", "--all-projects"], ("status", {"json_": True, "all_projects": True})),
        (["status", "--stack", "lab"], ("status", {"stack": "lab"})),
        (["status", "--stack=lab", "--json"], ("status", {"stack": "lab", "json_": True})),
        (["status", "-s", "a100"], ("status", {"stack": "a100"})),
        (["status", "--stack"], None),  # a flag without its value: the task says so
        (["status", "--json=yes"], None),
        (["status", "--json", "-j"], None),  # one option twice: the task decides what that means
        (["status", "--help"], None),
        (["status", "--stacks-dir", "x"], None),  # a core option after the task: not status's
        (["status", "train"], None),  # a second task
        (["--stacks-dir", "x", "status"], None),  # where the stacks are read changes
        (["train", "--stack", "lab"], None),
        ([], None),
        (["logs"], ("logs", {})),
        (["logs", "-f", "-r", "job_1", "--lines=5"], ("logs", {"follow": True, "run": "job_1", "lines": "5"})),
        (["logs", "--all-projects", "-s", "lab"], ("logs", {"all_projects": True, "stack": "lab"})),
        (["logs", "--node", "1"], None),  # another node: the task's
        (["logs", "-a"], None),  # every node
        (["logs", "--follow=1"], None),
        (["logs", "--lines"], None),
    ],
)
def test_only_a_plain_status_or_logs_is_asked_early(words: list[str], asked: tuple[str, dict] | None) -> None:
    assert early.plain(words) == asked


@pytest.mark.parametrize(
    ("options", "args"),
    [
        ({}, ["logs", "--project", "p-1", "--lines", "50"]),
        ({"lines": "0", "follow": True}, ["logs", "--project", "p-1", "--follow"]),
        ({"run": "job_20260101_000000", "lines": "7"}, ["logs", "--run", "job_20260101_000000", "--project", "p-1", "--lines", "7"]),
        ({"lines": "-3"}, None),  # not a count: the task refuses it
        ({"lines": "\u0663"}, None),  # a digit, but not one the task reads
        ({"run": "../x"}, None),  # not a run id: nothing is asked with it
    ],
)
def test_the_early_log_call_is_the_one_the_task_makes(options: dict, args: list[str] | None) -> None:
    assert early.agent_args("logs", options, ["--project", "p-1"]) == args


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


@pytest.mark.parametrize("task", sorted(early.FLAGS))
def test_the_flags_read_early_are_exactly_the_tasks_own(task: str) -> None:
    """early.py cannot load the tasks (that is the time it saves), so it names their flags itself: a
    flag added to a task, or one renamed, must be named there too (else that command is not asked early,
    or a flag the task no longer takes would be)."""
    from remote.cli import _flags
    from remote.tasks import ns

    (context,) = [c for c in ns.to_contexts() if c.name == task]
    assert _flags(context) == {flag: takes_value for flag, (_, takes_value) in early.FLAGS[task].items()}
    options = {context.flags[flag].name for flag in context.flags}  # (Invoke's option names: all_projects)
    assert {option for option, _ in early.FLAGS[task].values()} == options


def test_train_follow_asks_for_the_whole_log_of_a_run_being_launched() -> None:
    assert early.follow_call("job_20260101_000000") == ["logs", "--run", "job_20260101_000000", "--follow", "--await-run"]


def test_the_early_calls_never_start_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack only Pulumi's CLI could name (its selected stack), or a GCP stack's outputs not kept here, is
    left to the task: the early path would otherwise run Pulumi (about a second) once more for nothing."""
    from gpu_train.environment import Environment
    from gpu_train.stack.problems import ConfigError
    from remote.ssh.target import resolve, stack_outputs

    bin_dir, log = tmp_path / "bin", tmp_path / "pulumi.log"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f'#!/bin/sh\necho "$@" >> {log}\necho lab\n')
    (bin_dir / "pulumi").chmod(0o755)
    (tmp_path / "stacks").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("GPU_TRAIN_STACK", raising=False)
    monkeypatch.setenv("GPU_TRAIN_STACKS_DIR", str(tmp_path / "stacks"))
    monkeypatch.setenv("GPU_TRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for words in (["status"], ["logs", "-f"]):
        early.start(words)
    with pytest.raises(ConfigError):
        stack_outputs("lab", tmp_path / "home" / "lab", ask_pulumi=False)
    assert not log.exists()
    with pytest.raises(ConfigError):  # the task asks it (no stack file `lab` here: refused after)
        resolve(Environment.from_os(), None)
    assert log.read_text().split() == ["stack", "--show-name"]
