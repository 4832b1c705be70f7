"""The e2e tier of tests/unit/test_project.py (the same subject; its helpers are there)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_project import GPU_TRAIN, Project, proj, sshd, started_run  # noqa: F401 (fixtures)


# -- the loop from a project directory --------------------------------------------------------
@pytest.mark.long  # a user's whole first session: venv, pip, push, fetch
def test_init_train_crash_push_fetch_train_again(proj: Project, sshd) -> None:
    server = sshd("127.0.14.1")
    init = proj.run("init", "--host", server.spec, "--key", str(server.client_key), check=True)
    stack = proj.dir / "stacks" / "Pulumi.lab.yaml"
    assert f"wrote {stack}" in init.stdout and "next:" in init.stdout
    assert ".gpu-train/" in (proj.dir / ".gitignore").read_text() and "runs/" in (proj.dir / ".gitignore").read_text()
    assert proj.run("init", "--host", server.spec).returncode == 1  # never replaces a stack
    with stack.open("a") as f:  # what the user edits: where gpu-train lives on the host, and its Python (the
        # system's, not a venv's: a venv's Python is used as it is, and this test is about the project's own venv)
        f.write(f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: /usr/bin/python3\n")

    typo = proj.run("trian")
    assert typo.returncode == 2 and "Did you mean train?" in typo.stderr
    wrong = proj.run("status", "--stack", "lob")
    assert wrong.returncode == 2 and "did you mean lab?" in wrong.stderr

    sub = proj.dir / "src"
    sub.mkdir()
    first = proj.run("train", "--script", "hello.py", "--follow", cwd=sub, check=True)  # the project is found from below
    made = sorted(p for p in (proj.remote / "envs").iterdir() if p.is_dir())  # (beside it: its .lock)
    assert len(made) == 1 and re.fullmatch(r"my-model-[0-9a-f]{8}", made[0].name), made  # the project's id
    env = made[0]
    assert f"hello from the job in {env}" in first.stdout  # the project's own venv
    assert "creating the project's virtual environment" in first.stdout
    assert "left out in ..: data/ 3.0 MiB, ignored by .gitignore" in first.stderr  # from src/: the path as typed there
    assert "gpu-train push ../data (the job finds it in $DATA_DIR/data" in first.stderr
    assert "first contact with" in first.stderr
    hello = started_run(first)

    crash = proj.run("train", "--script", "crash.py", "--name", "no-data", "--follow")
    assert crash.returncode == 1 and "loading" in crash.stdout and "Traceback" in crash.stdout
    crashed = started_run(crash)
    assert crashed.startswith("no_data_")
    table = proj.run("status", check=True).stdout.splitlines()
    header = next(line for line in table if "RUN" in line)
    assert header.split() == ["RUN", "STATE", "EXIT", "DURATION", "OUTPUTS", "LAST", "LINE"]
    row = next(line for line in table if crashed in line)
    assert "failed" in row and "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'" in row
    assert proj.run("status", "--json", check=True).stdout.lstrip().startswith("{")

    pushed = proj.run("push", "data", check=True)
    assert "$DATA_DIR/data" in pushed.stdout
    assert (proj.remote / "data" / env.name / "data" / "train.csv").stat().st_size == 3 * 1024 * 1024
    again = proj.run("train", "--script", "crash.py", "--follow", check=True)  # data/ is there now
    assert "3145728 bytes of data" in again.stdout and "creating the project's virtual environment" not in again.stdout
    assert "DATA_DIR has ['data']" in proj.run("train", "--script", "uses_data.py", "--follow", check=True).stdout

    assert "loading" in proj.run("logs", "--run", "no_da", check=True).stdout  # a prefix of the run id
    unknown = proj.run("logs", "--run", "hellp")
    assert unknown.returncode == 1 and f"did you mean {hello}" in unknown.stderr

    proj.run("fetch", "--run", hello, check=True)
    assert (proj.dir / "runs" / "lab" / hello).is_dir()
    last = proj.run("train", "--script", "hello.py", "--follow", check=True)
    assert "runs/" in last.stderr and "fetched results" in last.stderr
    code = proj.remote / "runs" / started_run(last) / "code"
    assert (code / "hello.py").is_file() and not (code / "runs").exists() and not (code / ".gpu-train").exists()
    assert (code / "data").is_symlink()  # DATA_DIR's data/, not a copy of the laptop's

    (proj.dir / "requirements.txt").write_text("./no-such-package-dir\n")
    bad = proj.run("train", "--script", "hello.py", "--follow")
    assert bad.returncode == 1 and "[gpu-train] pip: " in bad.stdout and "pip.log" in bad.stdout
    assert "pip install -r requirements.txt failed" in proj.run("status", check=True).stdout

    (proj.dir / "requirements.txt").write_text("")
    (proj.dir / "slow.py").write_text("import time\nprint('tick', flush=True)\ntime.sleep(120)\n")
    follower = subprocess.Popen(
        [GPU_TRAIN, "train", "--script", "slow.py", "--follow"],
        cwd=proj.dir,
        env=proj.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    for line in follower.stdout:
        if line.strip() == "tick":
            break
    follower.send_signal(signal.SIGINT)  # Ctrl-C: detach, the job goes on
    _, err = follower.communicate(timeout=30)
    assert follower.returncode == 130 and "detached" in err and "Traceback" not in err
    slow = next(line for line in proj.run("status", check=True).stdout.splitlines() if "slow_" in line)
    assert "running" in slow
    watcher = subprocess.Popen(  # `logs --follow` detaches the same way (it said "interrupted", a run's state)
        [GPU_TRAIN, "logs", "--follow", "--run", "slow"],
        cwd=proj.dir,
        env=proj.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    for line in watcher.stdout:
        if line.strip() == "tick":
            break
    watcher.send_signal(signal.SIGINT)
    _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 130 and "detached: slow goes on" in err and "Traceback" not in err, err
    assert "running" in next(line for line in proj.run("status", check=True).stdout.splitlines() if "slow_" in line)
    proj.run("stop", "--run", "slow", "--grace", "1", check=True)  # a base name: its newest run

    one = proj.run("ssh", "--", "echo $((6*7)); exit 3")
    assert one.returncode == 3 and one.stdout.strip() == "42"


# -- researchers' SSH -----------------------------------------------------------------------------
def _start_agent(tmp: Path) -> tuple[str, int]:
    sock = str(tmp / "agent.sock")
    out = subprocess.run(["ssh-agent", "-a", sock, "-s"], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    return sock, pid


def test_passphrase_key_through_a_real_ssh_agent(proj: Project, sshd, tmp_path: Path) -> None:
    key = tmp_path / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse", "-f", str(key)], check=True)
    server = sshd("127.0.14.2", key)
    proj.stack(
        "lab",
        f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {key}\n"
        f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n",
    )
    locked = proj.run("status")
    assert locked.returncode == 3 and f"ssh-add {key}" in locked.stderr and "passphrase" in locked.stderr

    sock, pid = _start_agent(tmp_path)
    try:
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho 'correct horse'\n")
        askpass.chmod(0o700)
        subprocess.run(
            ["ssh-add", str(key)],
            env={**proj.env, "SSH_AUTH_SOCK": sock, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
        )
        proj.agent_sock = sock
        run = started_run(proj.run("train", "--script", "hello.py", check=True))  # paramiko, signing through the agent
        proj.run("logs", "--run", run, "--follow", check=True)
        proj.run("fetch", "--run", run, check=True)  # OpenSSH (rsync), through the same agent
        assert (proj.dir / "runs" / "lab" / run).is_dir()
    finally:
        os.kill(pid, signal.SIGTERM)


def test_alias_and_proxyjump_from_an_ssh_config(proj: Project, sshd, tmp_path: Path) -> None:
    box, jump = sshd("127.0.14.3"), sshd("127.0.14.4")
    conf = tmp_path / "ssh_config"
    conf.write_text(
        f"Host labbox\n  HostName {box.address}\n  Port {box.port}\n  User {box.user}\n"
        f"  IdentityFile {box.client_key}\n  ProxyJump jumpbox\n\n"
        f"Host jumpbox\n  HostName {jump.address}\n  Port {jump.port}\n  User {jump.user}\n"
        f"  IdentityFile {jump.client_key}\n"
    )
    proj.stack(
        "lab",
        f"  gpu-train:hosts: [labbox]\n  gpu-train:sshConfig: {conf}\n"
        f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n",
    )
    first = proj.run("train", "--script", "hello.py", check=True)
    assert f"first contact with [{jump.address}]:{jump.port}" in first.stderr  # the jump host was used
    run = started_run(first)
    proj.run("logs", "--run", run, "--follow", check=True)
    proj.run("fetch", "--run", run, check=True)  # OpenSSH through a ProxyCommand built the same way
    assert (proj.dir / "runs" / "lab" / run).is_dir()

    jump.stop()
    down = proj.run("status")
    assert down.returncode == 3 and f"connection refused by {jump.address}:{jump.port} (jumpbox)" in down.stderr
    assert "jump host on the way to labbox" in down.stderr
