"""Connection reuse over a real sshd on loopback: a task after another opens a channel on this user's
shared OpenSSH connection (remote/ssh/mux.py) and logs in no more; train (sync and launch), status and
logs --follow work over it, without paramiko. This suite's loopback addresses are 127.0.24.x.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_train.environment import Environment
from remote.loopback import Sshd
from remote.ssh import mux
from remote.ssh.target import resolve
from tests.conftest import fab_env, run_fab
from tests.pyindex import OFFLINE_INDEX

ADDRESS = "127.0.24.1"
IMPORTED = re.compile(r"import time:\s+\d+ \|\s+\d+ \| *(\S+)$")


def lab_env(sshd: Sshd, tmp_path: Path) -> dict[str, str]:
    """A stack `lab` on ``sshd`` and an empty project: the environment a user's commands run in."""
    sshd.stack_file(tmp_path / "stacks", "lab", tmp_path / "remote", "/usr/bin/python3")
    (tmp_path / "proj").mkdir()
    return fab_env(tmp_path / "stacks", tmp_path / "home", "lab", tmp_path / "proj")


def shared_up(env: dict[str, str]) -> str:
    """The shared connection a first task started beside its login, once it listens: its socket."""
    target = resolve(Environment.from_os(env), "lab").for_node(0)
    path = mux.control_path(target, target.host)
    assert path is not None
    deadline = time.monotonic() + 20
    while not mux.master_up(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mux.master_up(path), "the shared connection did not come up"
    return path


@pytest.mark.e2e
def test_a_second_task_rides_on_the_first_ones_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sshd = Sshd(tmp_path / "sshd", ADDRESS, setenv=f"PIP_INDEX_URL={OFFLINE_INDEX}", log_level="INFO").start()
    path = None
    try:
        env = lab_env(sshd, tmp_path)
        (tmp_path / "proj" / "job.py").write_text("print('job ran', flush=True)\n")

        def logins() -> int:
            return (sshd.dir / "sshd.log").read_text().count("Accepted publickey")

        run_fab(env, tmp_path / "proj", "status", check=True)  # first contact: a login, and the shared one beside it
        path = shared_up(env)
        assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
        before = logins()

        status = json.loads(run_fab(env, tmp_path / "proj", "status", "--json", check=True).stdout)
        assert status["runs"] == []
        train = run_fab(env, tmp_path / "proj", "train", "--script", "job.py", "--follow", check=True)
        assert "job ran" in train.stdout  # code synced, launched and its log streamed, all over the shared connection
        logs = run_fab(env, tmp_path / "proj", "logs", check=True)
        assert "job ran" in logs.stdout
        assert logins() == before  # three tasks, no login
    finally:
        sshd.stop()
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


@pytest.mark.e2e
def test_tasks_on_the_shared_connection_load_no_paramiko(tmp_path: Path) -> None:
    """`gpu-train` is Invoke's program and only a login imports paramiko (remote/cli.py): status, train of
    new and of unchanged code, logs and fetch on the shared connection load neither paramiko nor Fabric,
    about 60 ms of each command's start (issue 36), and still do their work. Read from the real
    command's own `python -X importtime` report."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.2", setenv=f"PIP_INDEX_URL={OFFLINE_INDEX}").start()
    try:
        env = lab_env(sshd, tmp_path)
        (tmp_path / "proj" / "job.py").write_text("print('job ran', flush=True)\n")
        run_fab(env, tmp_path / "proj", "status", check=True)  # first contact: a login, and the shared one beside it
        shared_up(env)

        def modules(*args: str) -> tuple[set[str], str]:
            out = subprocess.run(
                [sys.executable, "-X", "importtime", str(Path(sys.executable).parent / "gpu-train"), *args],
                env=env,
                cwd=tmp_path / "proj",
                capture_output=True,
                text=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            return {m.group(1).split(".")[0] for line in out.stderr.splitlines() if (m := IMPORTED.match(line))}, out.stdout

        seen = {}
        seen["train"], said = modules("train", "--script", "job.py", "--follow")
        assert "job ran" in said
        seen["train again"], said = modules("train", "--script", "job.py", "--follow")  # the code unchanged: reused
        assert "job ran" in said
        seen["status"], said = modules("status", "--json")
        runs = json.loads(said)["runs"]
        assert len(runs) == 2
        seen["logs"], said = modules("logs")
        assert "job ran" in said
        seen["fetch"], _ = modules("fetch", "--run", runs[0]["id"], "--dest", str(tmp_path / "got"))
        assert (tmp_path / "got").is_dir()
        assert all("remote" in mods and "invoke" in mods for mods in seen.values())  # the report was read
        loaded = {task: sorted(mods & {"paramiko", "fabric", "cryptography"}) for task, mods in seen.items()}
        assert not any(loaded.values()), loaded
    finally:
        sshd.stop()


def counting_ssh(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """``env`` with an `ssh` first on PATH that logs each of its uses (-G: a resolution; call: anything else) to the file returned."""
    logged, bin_dir = tmp_path / "ssh.log", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\n[ "$1" = -G ] && echo -G >> {logged} || echo call >> {logged}\nexec /usr/bin/ssh "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}"}, logged


@pytest.mark.e2e
def test_status_asks_the_host_while_the_command_loads(tmp_path: Path) -> None:
    """`gpu-train status` starts its agent call on the shared connection before the tasks load
    (remote/ssh/early.py), and the task takes that very call over: one `ssh` for it, started before the
    task resolved its stack, and the same answer. Read from an `ssh` on PATH that logs each command line."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.3").start()
    try:
        env = lab_env(sshd, tmp_path)
        run_fab(env, tmp_path / "proj", "train", "--command", "echo hi", "--name", "early", check=True)
        shared_up(env)
        env, logged = counting_ssh(env, tmp_path)
        gpu_train = str(Path(sys.executable).parent / "gpu-train")

        def status(*args: str) -> tuple[dict, list[str]]:
            logged.unlink(missing_ok=True)
            argv = [gpu_train, "status", "--json", *args]
            out = subprocess.run(argv, env=env, cwd=tmp_path / "proj", capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout), logged.read_text().split()

        doc, calls = status()
        assert [r["id"].split("_")[0] for r in doc["runs"]] == ["early"]
        assert calls == ["-G", "call", "-G"]  # resolved, asked, resolved again by the task, which asked nothing more
        doc, calls = status("--stack", "lab")
        assert calls == ["-G", "call", "-G"] and len(doc["runs"]) == 1
        logged.unlink()
        out = subprocess.run([gpu_train, "status", "--nope"], env=env, cwd=tmp_path / "proj", capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--nope" in out.stderr  # a flag status does not take: refused, nothing asked
        assert not logged.exists()
    finally:
        sshd.stop()


@pytest.mark.e2e
def test_logs_asks_the_host_while_the_command_loads(tmp_path: Path) -> None:
    """`gpu-train logs` (and `logs --follow`) start their agent call early as status does, built by the
    function the task builds it with (early.logs_call), and the task takes it over: one `ssh`, started
    before the task resolved its stack; with --node (not asked early) only the task asks."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.4").start()
    try:
        env = lab_env(sshd, tmp_path)
        run_fab(env, tmp_path / "proj", "train", "--command", "echo hi from the job", "--name", "early", "--follow", check=True)
        shared_up(env)
        env, logged = counting_ssh(env, tmp_path)
        gpu_train = str(Path(sys.executable).parent / "gpu-train")

        def logs(*args: str) -> tuple[str, list[str]]:
            logged.unlink(missing_ok=True)
            out = subprocess.run([gpu_train, "logs", *args], env=env, cwd=tmp_path / "proj", capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout + out.stderr, logged.read_text().split()

        said, calls = logs()
        assert "hi from the job" in said and calls == ["-G", "call", "-G"]  # asked, then the task resolved and asked nothing more
        said, calls = logs("--follow", "--lines", "0")
        assert "hi from the job" in said and "succeeded" in said and calls == ["-G", "call", "-G"]
        said, calls = logs("--node", "0")
        assert "hi from the job" in said and calls == ["-G", "call"]  # left to the task: resolved once, then asked
    finally:
        sshd.stop()


@pytest.mark.e2e
def test_train_follow_asks_for_the_log_while_the_launch_answers(tmp_path: Path) -> None:
    """`train --follow` on the shared connection starts the follow's call once the host said it is ready
    and was told to go, before the launch's answer is read (early.start_follow), and the follow takes it
    over: its channel, the agent's start and its first read overlap that round trip. An `ssh` on PATH
    holds each launch's answer (after its first line, "ready") until a log call has started: it is
    released by that call, or after 5 s says it came late (the old order: the log asked for afterwards)."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.5").start()
    try:
        env = lab_env(sshd, tmp_path)
        run_fab(env, tmp_path / "proj", "train", "--command", "true", "--name", "warm", check=True)
        shared_up(env)
        logged, started, rc, bin_dir = tmp_path / "ssh.log", tmp_path / "logs-started", tmp_path / "rc", tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "ssh").write_text(
            "#!/bin/sh\n"
            'case "$*" in\n'
            f'*" launch - "*) {{ /usr/bin/ssh "$@"; echo $? > {rc}; }} | {{\n'
            '  IFS= read -r first; printf "%s\\n" "$first"; i=0\n'
            f"  while [ ! -e {started} ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done\n"
            f"  [ -e {started} ] && echo held >> {logged} || echo late >> {logged}; cat; }}; exit $(cat {rc}) ;;\n"
            f'*" logs "*) touch {started}; exec /usr/bin/ssh "$@" ;;\n'
            '*) exec /usr/bin/ssh "$@" ;;\n'
            "esac\n"
        )
        (bin_dir / "ssh").chmod(0o755)
        env = {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
        for name in ("reused", "sent"):  # the code reused, then new code sent
            if name == "sent":
                (tmp_path / "proj" / "new.txt").write_text("new")
            logged.unlink(missing_ok=True)
            started.unlink(missing_ok=True)
            out = run_fab(env, tmp_path / "proj", "train", "--command", "echo followed; exit 3", "--name", name, "--follow")
            assert out.returncode == 3 and "followed" in out.stdout, out.stdout + out.stderr  # the job's exit code, its line
            assert logged.read_text().split() == ["held"], name
    finally:
        sshd.stop()


@pytest.mark.e2e
def test_train_opens_its_launch_while_it_plans_the_code(tmp_path: Path) -> None:
    """`train` on the shared connection opens each node's launch (its channel, the agent's start) before it
    lists the code to plan the sync (early.start_launches), and the launch takes that call over: the
    listing's `rsync --list-only` on PATH waits for a launch call to have started (after 5 s it says it
    came late: the old order), and the run starts and runs as before, code unchanged and changed."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.6").start()
    try:
        env = lab_env(sshd, tmp_path)
        run_fab(env, tmp_path / "proj", "train", "--command", "true", "--name", "warm", check=True)
        shared_up(env)
        logged, started, bin_dir = tmp_path / "calls.log", tmp_path / "launch-started", tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "ssh").write_text(
            f'#!/bin/sh\ncase "$*" in *" launch - "*) echo launch >> {logged}; touch {started} ;; esac\nexec /usr/bin/ssh "$@"\n'
        )
        (bin_dir / "rsync").write_text(
            "#!/bin/sh\n"
            'case "$*" in *--list-only*) i=0\n'
            f"  while [ ! -e {started} ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done\n"
            f"  [ -e {started} ] && echo held >> {logged} || echo late >> {logged} ;; esac\n"
            'exec /usr/bin/rsync "$@"\n'
        )
        for tool in ("ssh", "rsync"):
            (bin_dir / tool).chmod(0o755)
        env = {**env, "PATH": f"{bin_dir}:{env['PATH']}"}
        for name in ("reused", "sent"):
            if name == "sent":
                (tmp_path / "proj" / "new.txt").write_text("code-sent-42")
            logged.unlink(missing_ok=True)
            started.unlink(missing_ok=True)
            out = run_fab(env, tmp_path / "proj", "train", "--command", "cat new.txt 2>/dev/null; echo ran", "--name", name, "--follow")
            assert out.returncode == 0 and "ran" in out.stdout, out.stdout + out.stderr
            assert ("code-sent-42" in out.stdout) == (name == "sent")
            assert logged.read_text().split() == ["launch", "held"], name  # one launch call: the early one, taken over
    finally:
        sshd.stop()


@pytest.mark.e2e
def test_a_launch_opened_early_and_refused_says_the_refusal(tmp_path: Path) -> None:
    """The launch opened while the code is planned (early.start_launches) meets a REMOTE_ROOT it refuses (here
    one others may write): its agent refuses and ends before any spec is sent, and the train says that
    refusal with its fix, as a login's train does, not the pipe it could not send the spec on ("cannot
    start the gpu-train agent: [Errno 32] Broken pipe")."""
    sshd = Sshd(tmp_path / "sshd", "127.0.24.7").start()
    try:
        env = lab_env(sshd, tmp_path)
        run_fab(env, tmp_path / "proj", "train", "--command", "true", "--name", "warm", check=True)
        shared_up(env)
        os.chmod(tmp_path / "remote", 0o777)
        out = run_fab(env, tmp_path / "proj", "train", "--command", "true", "--name", "refused")
        assert out.returncode != 0 and "is writable by group or others (mode 0777)" in out.stderr, out.stderr
        assert "Broken pipe" not in out.stderr
    finally:
        sshd.stop()
