"""A shared project's files against the laptop (issue 28 A, C): a committed ssh_config that would run
commands, and links a job plants in its outputs, through the real `fab` against a real sshd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Lab, run_fab
from tests.e2e.test_hostile_hosts import no_traceback

LAB_ADDRESS = "127.0.10.8"  # 127.0.10.x: the hostile suites


def _use_ssh_config(lab: Lab, config: Path) -> None:
    stack = lab.stacks / "Pulumi.lab.yaml"
    lines = [ln for ln in stack.read_text().splitlines() if not ln.strip().startswith(("gpu-train:hosts", "- "))]
    stack.write_text("\n".join(lines) + f"\n  gpu-train:hosts: [labbox]\n  gpu-train:sshConfig: {config}\n")


@pytest.mark.parametrize("how", ["match", "include", "swapped"])
def test_a_shared_ssh_config_that_runs_commands_runs_nothing(lab: Lab, how: str) -> None:
    # A committed stack naming a committed ssh_config: `ssh -G -F FILE` ran its Match exec on the
    # laptop for any task (issue 28 A). An Include pulls in any file, so it is refused as well.
    mark = lab.tmp / "marker"
    config = lab.tmp / "project_ssh_config"
    block = f"Host labbox\n  HostName {lab.sshd.address}\n  Port {lab.sshd.port}\n  User {lab.sshd.user}\n"
    evil = f'Match exec "touch {mark}; false"\n'
    if how == "include":
        (lab.tmp / "more.conf").write_text(evil)
        config.write_text(f"Include {lab.tmp}/more.conf\n{block}")
    else:
        config.write_text((evil if how == "match" else "") + block)
    _use_ssh_config(lab, config)
    if how == "swapped":  # an honest file checked, then changed: ssh reads the copy that was checked
        assert lab.fab("status").returncode == 0
        config.write_text(evil + block)
    result = lab.fab("status")
    no_traceback(result)
    assert result.returncode == 2 and "gpu-train:sshConfig" in result.stderr, result.stderr
    assert ("Match exec" if how != "include" else "include") in result.stderr
    assert "~/.ssh/config" in result.stderr  # the fix
    assert not mark.exists()


def test_the_users_own_ssh_config_is_read_as_it_is(lab: Lab, tmp_path: Path) -> None:
    # ~/.ssh/config is the user's own, read by every ssh anyway: its Match exec is theirs to run.
    home = tmp_path / "userhome"
    (home / ".ssh").mkdir(parents=True)
    mark = lab.tmp / "ran"
    config = home / ".ssh" / "config"
    config.write_text(
        f'Match exec "touch {mark}"\nHost labbox\n  HostName {lab.sshd.address}\n  Port {lab.sshd.port}\n  User {lab.sshd.user}\n'
    )
    _use_ssh_config(lab, config)
    result = run_fab({**lab.env, "HOME": str(home)}, lab.cwd, "status")
    assert result.returncode == 0, result.stderr
    assert mark.exists()


def test_no_fetched_link_resolves_outside_the_run(lab: Lab, plain: str) -> None:
    # Anything the job runs (a malicious dependency) may plant links in its outputs. Each alone stays
    # inside, but one goes through the other: `notes.txt -> a/b/c/d/up/../../../../victim` where
    # `a/b/c/d/up -> ../../../..` (issue 28 C; rsync's CVE-2024-12088).
    victim = lab.tmp / "victim"
    victim.write_text("a laptop file")
    plant = (
        "mkdir -p $JOB_DIR/a/b/c/d && ln -s ../../../.. $JOB_DIR/a/b/c/d/up && "
        "ln -s a/b/c/d/up/../../../../victim $JOB_DIR/notes.txt && echo ok > $JOB_DIR/real.txt"
    )
    run = lab.train("--dir", plain, "--command", plant)
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    result = lab.fab("fetch", "--run", run)
    no_traceback(result)
    local = (lab.cwd / "runs" / "lab" / run).resolve()
    assert (local / "real.txt").read_text() == "ok\n", result.stderr
    for link in [p for p in local.rglob("*") if p.is_symlink()]:
        assert os.path.realpath(link).startswith(f"{local}/") or os.path.realpath(link) == str(local), link
    assert not (local / "notes.txt").is_symlink() and "notes.txt" in result.stdout + result.stderr
