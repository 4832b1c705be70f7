"""The e2e tier of tests/unit/test_stack_select.py (the same subject; its helpers are there)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.unit.test_project import sshd  # noqa: F401 (a fixture)
from tests.unit.test_stack_select import OurProject


def test_a_second_stack_does_not_make_stack_mandatory(tmp_path: Path, sshd) -> None:
    proj = OurProject(tmp_path)
    server = sshd("127.0.14.9")
    proj.stack(
        "lab",
        f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
        f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n",
    )
    assert proj.run("ssh", "--", "echo", "one-stack", check=True).stdout.strip() == "one-stack"
    proj.stack("gone", f"  gpu-train:hosts: ['root@127.0.14.9:1']\n  gpu-train:sshKey: {server.client_key}\n")
    none = proj.run("ssh", "--", "echo", "x")
    assert none.returncode == 2 and "gpu-train stack gone" in none.stderr  # the fix names the new task

    chosen = proj.run("stack", "lab", check=True)
    assert "current stack: lab (selected" in chosen.stdout and "* lab" in chosen.stdout and "  gone" in chosen.stdout
    assert proj.run("ssh", "--", "echo", "selected", check=True).stdout.strip() == "selected"
    sub = proj.dir / "src"
    sub.mkdir()
    assert proj.run("ssh", "--", "echo", "below", check=True, cwd=sub).stdout.strip() == "below"  # the project's
    other = proj.run("ssh", "--stack", "gone", "--", "echo", "x")  # --stack still wins for one command
    assert other.returncode == 3 and "127.0.14.9:1" in other.stderr

    typo = proj.run("stack", "lob")
    assert typo.returncode == 2 and "did you mean lab?" in typo.stderr
    assert proj.run("stack", check=True).stdout.startswith("current stack: lab (selected")

    (proj.dir / "stacks" / "Pulumi.lab.yaml").unlink()
    stale = proj.run("ssh", "--", "echo", "x")
    assert stale.returncode == 2 and "selected stack 'lab' has no stack file" in stale.stderr
    assert "gpu-train stack NAME" in stale.stderr
    cleared = proj.run("stack", "--clear", check=True)
    assert "current stack: gone (the project's only stack)" in cleared.stdout
