"""Tasks raise; one place maps an error to an exit.

The code raises the errors of gpu_train/errors.py (by meaning: bad input, no way to the host, a
command that failed with its result, Ctrl-C). Only the entry points turn one into an exit status, through
``outcome``: ``exit_for`` (remote/errors.py: the task wrapper and the program make Invoke's ``Exit``
with it), the hook beside it, and ``leave`` (a script's main). A new ``raise Exit(...)`` or
``sys.exit(2)`` elsewhere would be a second mapping, so it fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from invoke import Exit

from gpu_train.errors import (
    CommandExit,
    CommandFailed,
    ExitStatus,
    GpuTrainError,
    Interrupted,
    Unreachable,
    UsageError,
    as_error,
    joined,
    outcome,
    shared_status,
)
from remote.errors import HostKeyError, RemoteError, exit_for
from tests.conftest import ROOT, parse_source

SCANNED = ("gpu_train", "remote", "infra", "scripts")  # the agent (agent/) answers the host's protocol: not scanned
CONVERTERS = {
    "remote/errors.py": "exit_for makes Invoke's Exit; the hook ends what escapes",
    "gpu_train/errors.py": "leave: a script's main ends on an error",
    "infra/__main__.py": "Pulumi's entry point, before gpu-train is importable",
    "gpu_train/launcher.py": "the command's entry point, installed alone where the clone's code is not",
}
EXITS = {("sys", "exit"), ("os", "_exit")}


def source_files() -> list[Path]:
    files = [p for d in SCANNED for p in (ROOT / d).rglob("*.py") if "agent" not in p.relative_to(ROOT).parts[:2]]
    return [*sorted(files), ROOT / "fabfile.py"]


def exits_outside_the_mapping(path: Path) -> list[str]:
    """Each ``Exit(...)``, and each ``sys.exit``/``SystemExit``/``os._exit`` not handed a ``main()``'s status."""
    found = []
    for node in ast.walk(parse_source(path)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name == "Exit":
            found.append(f"line {node.lineno}: Exit(...)")
        elif name == "SystemExit" or (owner, name) in EXITS:
            arg = node.args[0] if node.args else None
            of_main = isinstance(arg, ast.Call) and getattr(arg.func, "id", getattr(arg.func, "attr", "")) == "main"
            if not of_main:
                found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_only_the_mapping_exits() -> None:
    assert len(source_files()) > 100 and ROOT / "remote" / "tasks" / "fetch.py" in source_files()  # (the scan sees the tree)
    bad = {
        str(p.relative_to(ROOT)): lines
        for p in source_files()
        if str(p.relative_to(ROOT)) not in CONVERTERS and (lines := exits_outside_the_mapping(p))
    }
    assert not bad, (
        "raise an error of gpu_train/errors.py (UsageError, Unreachable, CommandFailed, ...) instead; "
        f"only {', '.join(CONVERTERS)} turn errors into exits: {bad}"
    )


OWN_STATUSES = {
    "remote/transfer/rsh.py": "rsync's ssh: it answers with ssh's own statuses (255: the connection failed)",
    "remote/loopback.py": "a throwaway sshd for tests and the demo: imports nothing of gpu-train's",
}


def bare_statuses(path: Path) -> list[str]:
    """In a script (a module that ends with ``sys.exit(main())``): each ``return 1``, where ``ExitStatus.FAILED`` says it."""
    tree = parse_source(path)
    if not any(
        isinstance(n, ast.Call) and "main(" in ast.unparse(n) and ast.unparse(n.func) in ("sys.exit", "SystemExit") for n in ast.walk(tree)
    ):
        return []
    return [
        f"line {n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant) and type(n.value.value) is int
    ]


def test_scripts_say_their_statuses_by_name() -> None:
    bad = {
        str(p.relative_to(ROOT)): lines
        for p in source_files()
        if str(p.relative_to(ROOT)) not in OWN_STATUSES and (lines := bare_statuses(p))
    }
    assert not bad, f"return ExitStatus.X (gpu_train/errors.py), not a number: {bad}"


def test_the_scan_finds_an_exit(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import sys\nfrom invoke import Exit\n"
        "def f():\n    raise Exit('no', code=2)\n"
        "def g():\n    sys.exit(3)\n"
        "def h():\n    raise SystemExit('words')\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    assert [line.split(":")[0] for line in exits_outside_the_mapping(module)] == ["line 4", "line 6", "line 8"]
    module.write_text("import sys\ndef main():\n    return 2\nif __name__ == '__main__':\n    sys.exit(main())\n")
    assert bare_statuses(module) == ["line 3: return 2"]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (GpuTrainError("the work was tried and failed"), ExitStatus.FAILED),
        (UsageError("--streams 0: from 1 to 64"), ExitStatus.USAGE),
        (Unreachable("cannot reach h over SSH"), ExitStatus.UNREACHABLE),
        (HostKeyError("the host key of h changed"), ExitStatus.UNREACHABLE),
        (RemoteError("the agent failed on h"), ExitStatus.FAILED),
        (Interrupted("interrupted before the code sync"), ExitStatus.INTERRUPTED),
        (KeyboardInterrupt(), ExitStatus.INTERRUPTED),
        (CommandFailed("pulumi destroy failed", command="pulumi destroy", exited=255), ExitStatus.FAILED),
        (CommandExit(exited=3, command="run_20260101_000000"), 3),  # the job's own exit code, passed on
        (CommandExit(exited=0, command="r"), ExitStatus.FAILED),  # a failed job that exited 0 (killed, lost)
        (CommandExit(exited=None, command="r"), ExitStatus.FAILED),
        (CommandExit(exited=-1, command="nvidia-smi"), ExitStatus.FAILED),  # no exit status (a signal)
        (CommandExit(exited=300, command="r"), ExitStatus.FAILED),
        (ValueError("a bug"), ExitStatus.FAILED),
    ],
)
def test_each_error_means_one_status(error: BaseException, status: int) -> None:
    assert outcome(error)[0] == status
    made = exit_for(error)
    assert isinstance(made, Exit) and made.code == status and made.message == outcome(error)[1]


U, F, B = ExitStatus.UNREACHABLE, ExitStatus.FAILED, ExitStatus.USAGE


@pytest.mark.parametrize(
    ("statuses", "shared"),
    [
        ([U], U),  # one node (one host) out of reach: UNREACHABLE, as a single host's task says it
        ([U, U], U),  # every node out of reach
        ([F, F], F),
        ([B, B, B], B),
        ([3, 3], 3),  # a status the nodes share is theirs, whatever it is (a job's exit code passed on)
        ([U, F], F),  # a mix: tried, and failed for more than one reason; each node's line says which
        ([F, U, U], F),
        ([U, B], F),
        ([ExitStatus.INTERRUPTED, U], F),
        ([], F),
    ],
)
def test_several_failures_exit_with_the_status_they_share_else_failed(statuses: list[int], shared: int) -> None:
    assert shared_status(statuses) == shared


def test_a_clusters_failures_joined_keep_their_meaning() -> None:
    """The one error for a cluster's nodes (remote/tasks/session.py nodes_failed), through the one mapping."""
    from remote.tasks.outcomes import Unsettled
    from remote.tasks.session import nodes_failed

    down = Unreachable("cannot reach 10.0.0.2: connection refused")
    unsettled = Unsettled("the connection to 10.0.0.3 ended before the launch's answer, and asking again failed")
    both = nodes_failed([{"runId": "r"}, down, unsettled], "; r was stopped on node 0 (no half a cluster)")
    assert outcome(both) == (ExitStatus.UNREACHABLE, f"node 1: {down}; node 2: {unsettled}; r was stopped on node 0 (no half a cluster)")
    mixed = nodes_failed([down, RemoteError("sweep 'lost' is still going here (1 trial(s) left)")])
    assert outcome(mixed)[0] == ExitStatus.FAILED and exit_for(mixed).code == ExitStatus.FAILED
    assert outcome(joined([UsageError("a"), UsageError("b")], "a; b")) == (ExitStatus.USAGE, "a; b")


def test_bad_input_is_a_usage_error_wherever_it_is_found() -> None:
    """Each error of bad input (a stack, a job's options, a GPU_TRAIN_* value, a job to import, a GPU name) is one."""
    from gpu_train.environment import SettingError
    from gpu_train.importing.importer import JobImportError
    from gpu_train.jobs import JobError
    from gpu_train.stack.problems import ConfigError
    from gpu_train.views.offers import OfferError

    for kind in (ConfigError, JobError, SettingError, JobImportError, OfferError):
        assert issubclass(kind, UsageError) and kind.status == ExitStatus.USAGE, kind


def test_a_failed_command_carries_its_result() -> None:
    error = CommandExit(exited=7, command="nvidia-smi", host="h", stderr="no devices")
    assert (error.command, error.exited, error.host, error.stderr, str(error)) == ("nvidia-smi", 7, "h", "no devices", "")


def test_a_node_failure_keeps_its_status_and_words() -> None:
    unreachable = Unreachable("cannot reach h")
    assert as_error(unreachable) is unreachable
    bug = as_error(KeyError("x"))
    assert bug.status == ExitStatus.FAILED and "(KeyError; GPU_TRAIN_DEBUG=1 shows where)" in str(bug)


def test_the_task_wrapper_maps_once() -> None:
    """A task's error leaves it as Invoke's Exit with the mapped status and its words written out."""
    from remote.tasks import _exits

    def body(c):
        raise Unreachable("host \x1b]0;title\x07 is down")

    with pytest.raises(Exit) as caught:
        _exits(body)(None)
    assert caught.value.code == ExitStatus.UNREACHABLE and caught.value.message == "host \\x1b]0;title\\x07 is down"


@pytest.mark.parametrize(("status", "unreachable"), [(255, True), (1, False)])
def test_a_fetch_knows_an_unreachable_host_by_ssh_s_status(tmp_path: Path, status: int, unreachable: bool) -> None:
    """`fetch` falls back to the bucket when ssh could not reach the host: read from ssh's exit status, not from words."""
    from remote.transfer.fetch.engine import Fetcher
    from remote.transfer.fetch.stream import Stream

    ssh = ["sh", "-c", f"echo 'ssh: connect to host 127.0.0.9 port 9: Connection refused' >&2; exit {status}"]
    [result] = Fetcher(lambda: Stream(ssh), 1).run([("r_20260101_000000", tmp_path / "r")])
    assert (result.ssh_exit, result.unreachable) == (status, unreachable) and f"(ssh exit {status}: ssh: connect" in str(result.error)


@pytest.mark.parametrize(
    ("before", "inside"),
    [
        ("default", "interrupt"),  # a process manager's SIGTERM, a closed terminal's SIGHUP: Ctrl-C
        ("ignored", "ignored"),  # nohup: SIGHUP stays ignored
        ("own", "own"),  # an embedding program's own handler is its own
    ],
)
def test_stop_signals_are_ctrl_c_while_a_task_runs(before: str, inside: str) -> None:
    import os
    import signal

    from remote.errors import _interrupt, stops_as_ctrl_c

    def own(signum: int, frame: object) -> None:
        pass

    kinds = {"default": signal.SIG_DFL, "ignored": signal.SIG_IGN, "own": own, "interrupt": _interrupt}
    saved = {s: signal.signal(s, kinds[before]) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with stops_as_ctrl_c():
            assert all(signal.getsignal(s) == kinds[inside] for s in saved)
            if inside == "interrupt":
                for s in saved:
                    with pytest.raises(KeyboardInterrupt):
                        os.kill(os.getpid(), s)  # (its handler runs before the next line)
        assert all(signal.getsignal(s) == kinds[before] for s in saved)  # as it was, after
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
