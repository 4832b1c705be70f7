"""Hostile stack files, bad options and a cluster losing a node, through the real `fab` against real sshds.

Each case asserts that nothing ran (marker files), nothing was written outside its place, and that
the message names the problem. A lying host (crafted agent answers) has its own module, test_lying_host.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd
from tests.conftest import EXAMPLE, FAB, Lab

LAB_ADDRESS = "127.0.10.2"  # this suite's loopback addresses are 127.0.10.x (the `lab` fixture reads it)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr + result.stdout, "\n" + result.stderr


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# -- hostile stack files: refused before anything runs ------------------------------------------
@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("hosts", "['root@{addr}\\n  ProxyCommand touch {mark}']", "hosts"),
        ("hosts", "['-oProxyCommand=touch {mark}@{addr}']", "hosts"),
        ("remoteRoot", "'/tmp/x\"; touch {mark}; \"'", "remoteRoot"),
        ("remoteRoot", "'~/$(touch {mark})'", "remoteRoot"),
        ("sshKey", '"/k\\n  ProxyCommand touch {mark}"', "sshKey"),
        ("python", "'-c'", "python"),
        ("maxResumes", "-2", "maxResumes"),
        ("idleStopMinutes", "-5", "idleStopMinutes"),
    ],
)
@pytest.mark.parametrize("task", [["ssh"], ["train", "--command", "true"]])
def test_hostile_stack_values_run_nothing(lab: Lab, setting: str, value: str, words: str, task: list[str]) -> None:
    mark = lab.tmp / "marker"
    value = value.format(addr=lab.sshd.address, mark=mark)
    stack = lab.stacks / "Pulumi.lab.yaml"
    lines = [ln for ln in stack.read_text().splitlines() if f"gpu-train:{setting}:" not in ln]
    stack.write_text("\n".join(lines) + f"\n  gpu-train:{setting}: {value}\n")
    before = files_under(lab.home)
    args = [*task, "--dir", str(EXAMPLE)] if task[0] == "train" else task
    result = lab.fab(*args)
    assert result.returncode == 2, result.stderr
    assert f"gpu-train:{words}" in result.stderr
    no_traceback(result)
    assert not mark.exists() and not lab.remote.exists()
    assert files_under(lab.home) == before  # no ssh config entry, no known_hosts line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--command", "true", "--nproc", "abc"], "--nproc"),
        (["train", "--command", "true", "--port", "abc"], "--port"),
        (["train", "--command", "true", "--timeout", "abc"], "--timeout"),
        (["train", "--script", "train.py", "--args", "it's"], "--args"),
        (["logs", "--lines", "x"], "--lines"),
        (["fetch", "--run", "../../x"], "--run"),
        (["fetch", "--run", "$(touch MARK)"], "--run"),
        (["logs", "--run", "../x"], "--run"),
        (["stop", "--run", "a/b"], "--run"),
        (["tunnel", "--port", "abc"], "--port"),  # (an int default let Invoke parse it: a ValueError traceback)
        (["tunnel", "--local-port", "abc"], "--local-port"),
        (["tensorboard", "--local-port", "99999"], "--local-port"),
        (["fetch", "--streams", "abc"], "--streams"),
        (["down", "--streams", "0"], "--streams"),
    ],
)
def test_bad_options_are_messages(lab: Lab, args: list[str], words: str) -> None:
    mark = lab.tmp / "MARK"
    args = [a.replace("MARK", str(mark)) for a in args]
    if args[0] == "train":
        args += ["--dir", str(EXAMPLE)]
    result = lab.fab(*args)
    assert result.returncode != 0 and words in result.stderr, result.stderr
    no_traceback(result)
    assert not mark.exists() and not (lab.cwd / "runs").exists()


def test_a_file_that_is_not_a_key_is_said_at_once(lab: Lab) -> None:
    bad = lab.tmp / "not-a-key"
    bad.write_text("hello\n")
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.sshd.client_key), str(bad)))
    result = lab.fab("status", timeout=10)
    assert result.returncode == 3 and "is not an SSH private key" in result.stderr and "sshKey" in result.stderr
    no_traceback(result)


def test_closed_pipe_is_quiet(lab: Lab, plain: str) -> None:
    lab.train("--dir", plain, "--command", "true", "--name", "a")
    fab = [sys.executable, "-m", "fabric", "--search-root", str(Path(__file__).parents[2]), "status"]
    script = f"{shlex.join(fab)} | true; echo rc=${{PIPESTATUS[0]}} >&2"
    result = subprocess.run(["bash", "-c", script], env=lab.env, cwd=lab.cwd, capture_output=True, text=True, timeout=60)
    no_traceback(result)
    assert "Exception ignored" not in result.stderr


def test_old_rsync_argument_parsing_changes_nothing(lab: Lab) -> None:
    """RSYNC_OLD_ARGS=1 makes a new rsync parse as old ones did (remote paths through the shell)."""
    code = lab.tmp / "code"
    code.mkdir()
    (code / "a b $(touch MARK).py").write_text("x = 1\n")
    (code / "train.py").write_text("import os; open(os.environ['JOB_DIR'] + '/out $(x).txt', 'w').write('ok')\n")
    env = {**lab.env, "RSYNC_OLD_ARGS": "1"}
    out = subprocess.run(
        [*fab_argv(lab), "train", "--dir", str(code), "--script", "train.py", "--name", "old"],
        env=env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    run = out.stdout.split()[1]
    lab.wait(run)
    assert (lab.remote / "runs" / run / "code" / "a b $(touch MARK).py").is_file()
    got = subprocess.run([*fab_argv(lab), "fetch", "--run", run], env=env, cwd=lab.cwd, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert (lab.cwd / "runs" / "lab" / run / "out $(x).txt").read_text() == "ok"
    assert not list(lab.tmp.rglob("MARK")) and not (lab.cwd / "MARK").exists()


def fab_argv(lab: Lab) -> list[str]:
    from tests.conftest import FAB, ROOT

    return [FAB, "--search-root", str(ROOT)]


# -- a cluster starts whole or not at all ---------------------------------------------------------
@pytest.mark.e2e
def test_a_node_lost_mid_sync_fails_the_launch_and_stops_the_others(tmp_path: Path) -> None:
    nodes = [Sshd(tmp_path / f"n{i}", f"127.0.10.{3 + i}") for i in range(3)]
    for n in nodes[1:]:
        n.client_key = nodes[0].client_key
    for n in nodes:
        n.start()
    roots = [tmp_path / f"node{i}" for i in range(3)]
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    hosts = ", ".join(f"'{n.spec}'" for n in nodes)
    (stacks / "Pulumi.trio.yaml").write_text(
        f"config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [{hosts}]\n  gpu-train:sshKey: {nodes[0].client_key}\n"
        f"  gpu-train:remoteRoot: {tmp_path}/node{{node}}\n  gpu-train:python: {sys.executable}\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    for i in range(4):
        (code / f"blob{i}.bin").write_bytes(os.urandom(8 << 20))  # enough to be mid-sync when node 1 dies
    (code / "job.sh").write_text("sleep 30\n")
    home = tmp_path / "home"
    env = {**os.environ, "GPU_TRAIN_STACKS_DIR": str(stacks), "GPU_TRAIN_HOME": str(home), "GPU_TRAIN_STACK": "trio"}
    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [FAB, "--search-root", str(ROOT), "train", "--dir", str(code), "--command", "sh job.sh", "--name", "trio"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any((roots[1] / "staging").glob("*/*blob*")) or any((roots[1] / "staging").glob("*/.*blob*")):
                break  # rsync is writing node 1's code (its temp files are dot files)
            time.sleep(0.005)
        assert proc.poll() is None, "fab train ended before the sync to node 1 began:\n" + "".join(proc.communicate())
        nodes[1].stop()  # the daemon and every session it serves, mid-sync
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, out + err
        assert "started" not in out and "node 1" in err, out + err
        no_traceback(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        for i in (0, 2):  # the others were stopped or never started: no half a cluster left running
            for state in (roots[i] / "runs").glob("*/state.json"):
                assert json.loads(state.read_text())["state"] in ("stopped", "failed"), state.read_text()
        manifests = home / "trio" / "code-manifests.json"
        assert not manifests.exists() or json.loads(manifests.read_text()) == {}  # nothing recorded as pushed
    finally:
        if proc.poll() is None:
            proc.kill()
        for n in nodes:
            n.stop()
        for r in roots:
            subprocess.run(["pkill", "-f", str(r)], check=False)


def test_a_128_character_name_runs_under_a_short_screen_name(lab: Lab, plain: str) -> None:
    name = "n" * (128 - len("_20260101_000000"))
    run = lab.train("--dir", plain, "--command", "echo long-name-ok", "--name", name)
    assert len(run) == 128
    assert lab.wait(run)["state"] == "succeeded" and "long-name-ok" in lab.log(run)


@pytest.mark.parametrize("task", [["ssh", "--command", "true"], ["fetch"], ["train", "--command", "true"]])
def test_a_hostile_ssh_config_runs_nothing(lab: Lab, task: list[str]) -> None:
    # sshConfig may name any file (a shared lab one): its User goes before the destination on ssh and
    # rsync command lines, where "-oProxyCommand=..." would run a command on the laptop.
    mark = lab.tmp / "marker"
    config = lab.tmp / "shared_ssh_config"
    config.write_text(f'Host labbox\n  HostName {lab.sshd.address}\n  Port {lab.sshd.port}\n  User "-oProxyCommand=touch {mark}"\n')
    stack = lab.stacks / "Pulumi.lab.yaml"
    lines = [ln for ln in stack.read_text().splitlines() if not ln.strip().startswith(("gpu-train:hosts", "- "))]
    stack.write_text("\n".join(lines) + f"\n  gpu-train:hosts: [labbox]\n  gpu-train:sshConfig: {config}\n")
    args = [*task, "--dir", str(EXAMPLE)] if task[0] == "train" else task
    result = lab.fab(*args)
    no_traceback(result)
    assert result.returncode != 0 and "starts with '-'" in result.stderr, result.stderr
    assert not mark.exists()
