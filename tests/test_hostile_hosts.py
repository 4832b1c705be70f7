"""Hostile stack files, a lying host and bad options, through the real `fab` against real sshds.

Each case asserts that nothing ran (marker files), nothing was written outside its place, and that
the message names the problem. The lying host is an sshd whose key is bound to a forced command:
agent calls get crafted documents, rsync runs for real (so a fetch would really write files).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, Lab

LAB_ADDRESS = "127.0.10.2"  # this suite's loopback addresses are 127.0.10.x (the `lab` fixture reads it)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# -- hostile stack files: refused before anything runs ------------------------------------------
@pytest.mark.parametrize(("setting", "value", "words"), [
    ("hosts", "['root@{addr}\\n  ProxyCommand touch {mark}']", "hosts"),
    ("hosts", "['-oProxyCommand=touch {mark}@{addr}']", "hosts"),
    ("remoteRoot", "'/tmp/x\"; touch {mark}; \"'", "remoteRoot"),
    ("remoteRoot", "'~/$(touch {mark})'", "remoteRoot"),
    ("sshKey", "\"/k\\n  ProxyCommand touch {mark}\"", "sshKey"),
    ("python", "'-c'", "python"),
    ("maxResumes", "-2", "maxResumes"),
    ("idleStopMinutes", "-5", "idleStopMinutes"),
])
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


def test_a_file_that_is_not_a_key_is_said_at_once(lab: Lab) -> None:
    bad = lab.tmp / "not-a-key"
    bad.write_text("hello\n")
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.sshd.client_key), str(bad)))
    result = lab.fab("status", timeout=10)
    assert result.returncode == 3 and "is not an SSH private key" in result.stderr and "sshKey" in result.stderr
    no_traceback(result)


def test_closed_pipe_is_quiet(lab: Lab) -> None:
    lab.train("--dir", str(EXAMPLE), "--command", "true", "--name", "a")
    fab = [sys.executable, "-m", "fabric", "--search-root", str(Path(__file__).parent.parent), "status"]
    script = f"{shlex.join(fab)} | true; echo rc=${{PIPESTATUS[0]}} >&2"
    result = subprocess.run(["bash", "-c", script], env=lab.env, cwd=lab.cwd, capture_output=True, text=True,
                            timeout=60)
    no_traceback(result)
    assert "Exception ignored" not in result.stderr


def test_old_rsync_argument_parsing_changes_nothing(lab: Lab) -> None:
    """RSYNC_OLD_ARGS=1 makes a new rsync parse as old ones did (remote paths through the shell)."""
    code = lab.tmp / "code"
    code.mkdir()
    (code / "a b $(touch MARK).py").write_text("x = 1\n")
    (code / "train.py").write_text("import os; open(os.environ['JOB_DIR'] + '/out $(x).txt', 'w').write('ok')\n")
    env = {**lab.env, "RSYNC_OLD_ARGS": "1"}
    out = subprocess.run([*fab_argv(lab), "train", "--dir", str(code), "--script", "train.py", "--name", "old"],
                         env=env, cwd=lab.cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run = out.stdout.split()[1]
    lab.wait(run)
    assert (lab.remote / "runs" / run / "code" / "a b $(touch MARK).py").is_file()
    got = subprocess.run([*fab_argv(lab), "fetch", "--run", run], env=env, cwd=lab.cwd, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert (lab.cwd / "runs" / "lab" / run / "out $(x).txt").read_text() == "ok"
    assert not list(lab.tmp.rglob("MARK")) and not (lab.cwd / "MARK").exists()


def fab_argv(lab: Lab) -> list[str]:
    from tests.conftest import FAB, ROOT

    return [FAB, "--search-root", str(ROOT)]
