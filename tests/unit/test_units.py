"""Pure decisions of the run units (agent/units.py), by tables."""

from __future__ import annotations

import pytest

from agent import units


@pytest.mark.parametrize(("length", "kept"), [(1, True), (79, True), (80, True), (81, False), (128, False)])
def test_screen_names_fit_screen(length: int, kept: bool) -> None:
    run = ("a" * length)[: length - 16] + "_20260101_000000" if length > 16 else "a" * length
    name = units.screen_name(run)
    assert len(name) <= 80
    assert (name == run) is kept
    if not kept:
        assert name.startswith(run[:70]) and units.screen_name(run) == name  # stable
        assert units.screen_name(run[:-1] + "x") != name  # distinct runs, distinct sessions


def test_systemd_run_makes_a_unit_of_the_run() -> None:
    argv = units.systemd_run_argv(
        "train_20260101_000000",
        "trainer",
        25,
        ["/usr/bin/python3", "agent", "wrap", "R"],
        {"PATH": "/opt/conda/bin:/usr/bin", "LANG": "C.UTF-8"},
    )
    assert argv[:3] == ["systemd-run", "--quiet", "--collect"]
    assert "--unit=gpu-train-train_20260101_000000.service" in argv and "--uid=trainer" in argv
    for prop in (
        "KillMode=control-group",
        "TimeoutStopSec=25s",
        "SendSIGKILL=yes",
        "Before=gpu-train-shutdown.service",
        "After=dbus.service",
    ):
        assert f"--property={prop}" in argv
    assert "--setenv=PATH=/opt/conda/bin:/usr/bin" in argv
    tail = argv[argv.index("--") + 1 :]
    assert tail == ["/usr/bin/screen", "-DmS", "train_20260101_000000", "/usr/bin/python3", "agent", "wrap", "R"]


@pytest.mark.parametrize(("grace", "shown"), [(25, "25s"), (110, "110s"), (0.2, "1s"), (7.6, "8s")])
def test_grace_in_whole_seconds(grace: float, shown: str) -> None:
    assert f"--property=TimeoutStopSec={shown}" in units.systemd_run_argv("r", "u", grace, ["x"], {})


def test_boot_key_names_this_boot() -> None:
    key = units.boot_key()
    assert key == units.boot_key() and ":" in key and key != ":"


@pytest.mark.parametrize(
    ("title", "counted"),
    [
        (b"sshd: trainer [priv]", True),  # one privileged monitor per logged-in connection
        (b"sshd-session: bob [priv]", True),  # OpenSSH 9.8 and later
        (b"sshd: trainer", False),  # the same connection's unprivileged child
        (b"sshd: trainer@notty", False),
        (b"sshd: unknown [priv]", False),  # not logged in
        (b"sshd: 1.2.3.4 [preauth]", False),
        (b"sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups", False),
    ],
)
def test_ssh_sessions_by_sshd_process_titles(title: bytes, counted: bool) -> None:
    from agent.procs import SSHD_SESSION_RE

    assert bool(SSHD_SESSION_RE.match(title)) is counted


@pytest.mark.parametrize(
    ("said", "stopping"),
    [
        ("running\n", False),
        ("degraded\n", False),
        ("starting\n", False),
        ("initializing", False),
        ("maintenance", False),
        ("stopping\n", True),
        ("", True),  # no answer: late in a shutdown the bus is gone ("Failed to connect to bus"), so going down
        ("offline\n", True),
        ("unknown\n", True),
    ],
)
def test_a_run_sigtermed_from_outside_counts_as_a_shutdown_unless_the_machine_is_up(said: str, stopping: bool) -> None:
    # A run recorded "stopped" is never resumed: when in doubt it is a shutdown (resumed at the next boot).
    assert units.stopping_from(said) is stopping
