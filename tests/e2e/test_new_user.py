"""The e2e tier of tests/unit/test_new_user.py (the same subject; its helpers are there)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.test_project import (
    GPU_TRAIN,
    Project,
    proj,  # noqa: F401 (a fixture)
    sshd,  # noqa: F401 (a fixture)
)


def lab(proj: Project, server) -> None:
    proj.stack(
        "lab",
        f"  gpu-train:hosts: [{server.spec!r}]\n  gpu-train:sshKey: {server.client_key}\n"
        f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n",
    )


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every descendant of ``pid``, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        for p in frontier:
            with contextlib.suppress(OSError):
                found.append((p, (Path("/proc") / str(p) / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
    return found


def host_processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process here (the host is this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
    return found


def in_group(pgid: int) -> list[int]:
    """The live processes whose process group is ``pgid`` (what a terminal's Ctrl-C reaches); zombies
    are dead already (a container's PID 1 may never reap the orphans)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else []
            if fields and int(fields[3]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("whom", ["terminal", "process"])
def test_ctrl_c_during_the_code_sync_starts_nothing(proj: Project, sshd, whom: str) -> None:
    """Ctrl-C at a terminal reaches the whole process group (rsync too); `kill -INT PID` only gpu-train,
    whose rsync must then be ended by gpu-train itself. Either way: "interrupted", 130, no run."""
    lab(proj, sshd(f"127.0.25.{1 if whom == 'terminal' else 2}"))
    (proj.dir / "weights").mkdir()
    for i in range(40):  # code, not data: 160 MiB that the sync sends over the task's SSH connection
        (proj.dir / "weights" / f"w{i}.bin").write_bytes(os.urandom(4 << 20))
    p = subprocess.Popen(
        [GPU_TRAIN, "train", "--script", "hello.py"],
        cwd=proj.dir,
        env=proj.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not any("rsync" in c and "staging/" in c for _, c in children(p.pid)):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    while not any((proj.remote / "staging").rglob("w*.bin")):  # well inside the sync: files are arriving
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.02)
    if whom == "terminal":
        os.killpg(p.pid, signal.SIGINT)
    else:
        p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - sent < 15, "Ctrl-C took long to be obeyed"
    assert p.returncode == 130, (p.returncode, out, err)
    assert "interrupted during the code sync: nothing was started" in err, err
    assert "Traceback" not in err and "started" not in out
    gone = time.monotonic() + 0.5  # what the Ctrl-C reached has ended within half a second of gpu-train
    while in_group(p.pid) and time.monotonic() < gone:
        time.sleep(0.02)
    left = {pid: (Path("/proc") / str(pid) / "stat").read_text() for pid in in_group(p.pid)}
    assert not left, f"gpu-train left processes behind: {left}"
    deadline = time.monotonic() + 30  # the host never starts it later either: its agent, waiting for "go", has ended
    while any(str(proj.remote) in c for _, c in host_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(str(proj.remote) in c for _, c in host_processes())
    runs = proj.remote / "runs"
    assert not runs.exists() or not list(runs.iterdir())
    assert "hello_" not in proj.run("status").stdout


def test_script_paths_from_a_subdirectory(proj: Project, sshd) -> None:
    lab(proj, sshd("127.0.25.3"))
    src = proj.dir / "src"
    src.mkdir()
    (src / "sub_train.py").write_text("print('sub')\n")
    (proj.dir / "train.py").write_text("print('top')\n")
    wrong = proj.run("train", "--script", "sub_train.py", cwd=src)
    assert wrong.returncode == 2, wrong.stderr
    assert f"no such file in {proj.dir}, the folder the job runs in (--script paths are relative to it)" in wrong.stderr
    assert "use --script src/sub_train.py" in wrong.stderr
    typo = proj.run("train", "--script", "trian.py")
    assert typo.returncode == 2 and "did you mean train.py" in typo.stderr
    right = proj.run("train", "--script", "src/sub_train.py", "--follow", cwd=src, check=True)
    assert "sub" in right.stdout.split()


@pytest.mark.e2e
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_loopback_serves_a_stack_until_ctrl_c(proj: Project, tmp_path: Path, stop: signal.Signals) -> None:
    """`python -m remote.loopback` (README: trying an SSH stack with no other machine); Ctrl-C or a kill stops its sshd."""
    p = subprocess.Popen(
        [sys.executable, "-m", "remote.loopback", "--address", "127.0.25.5", "--dir", str(tmp_path / "lo")],
        cwd=proj.dir,
        env=proj.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("then:"):
                break
        text = "".join(lines)
        stack = text[text.index("config:") : text.index("\n\n", text.index("config:"))] + "\n"
        (proj.dir / "stacks").mkdir()
        (proj.dir / "stacks" / "Pulumi.local.yaml").write_text(stack)
        said = proj.run("ssh", "--stack", "local", "--", 'echo "from the loopback host|${OMP_NUM_THREADS-unset}|$HOME"', check=True)
        # the user's jobs get their threads (no OMP_NUM_THREADS=1, which the tests' hosts set); a stack from
        # `init --host` (remoteRoot ~/.gpu-train) keeps its runs in the server's folder, not the real home
        home = str((tmp_path / "lo" / "127.0.25.5" / "home").resolve())
        assert said.stdout.strip().split("|") == ["from the loopback host", "unset", home]
    finally:
        p.send_signal(stop)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and "stopped" in out
    port = int(stack.split("127.0.25.5:")[1].split("'")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.25.5", port), timeout=2).close()


def test_a_loopback_sshds_sessions_start_in_its_own_home(sshd, tmp_path: Path) -> None:
    """As on a fresh VM: HOME is the server's own folder and every command starts there (sshd itself
    starts sessions in the user's real home, where an rsync path of ~/x would land)."""
    server = sshd("127.0.25.7")
    out = subprocess.run(
        [
            "ssh",
            "-i",
            str(server.client_key),
            "-p",
            str(server.port),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            f"{server.user}@{server.address}",
            'echo "$PWD|$HOME"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    home = str(server.dir / "home")
    assert out == f"{home}|{home}"
