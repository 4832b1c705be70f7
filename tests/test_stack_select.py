"""A project with several stacks: `gpu-train stack NAME` remembers one (as `pulumi stack select`), so
--stack is not needed on every command; --stack and $GPU_TRAIN_STACK still win for one command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpu_train.stack import project
from tests.conftest import ROOT
from tests.test_project import Project, sshd  # noqa: F401  (the fixture)


@pytest.mark.parametrize(("given", "env", "selected", "own", "expected"), [
    ("a", "b", "c", ["d"], ("a", "--stack")),
    (None, "b", "c", ["d"], ("b", "$GPU_TRAIN_STACK")),
    (None, None, "c", ["c", "d"], ("c", "selected: gpu-train stack NAME")),
    (None, None, "c", ["d"], ("c", "selected: gpu-train stack NAME")),  # the caller checks it still exists
    (None, None, None, ["d"], ("d", "the project's only stack")),
    (None, None, None, ["c", "d"], (None, "")),  # Pulumi's selected stack, else an error naming both
    (None, None, None, [], (None, "")),
])
def test_which_stack_a_task_uses(given, env, selected, own, expected) -> None:
    assert project.choose_stack(given, env, selected, own) == expected


def test_the_selection_is_written_whole_and_forgotten(tmp_path: Path) -> None:
    assert project.selected_stack(tmp_path) is None
    project.select_stack(tmp_path, "lab")
    assert project.selected_stack(tmp_path) == "lab" and (tmp_path / ".gpu-train" / "stack").read_text() == "lab\n"
    assert [p.name for p in (tmp_path / ".gpu-train").iterdir()] == ["stack"]  # no temporary file left
    project.select_stack(tmp_path, None)
    assert project.selected_stack(tmp_path) is None


class OurProject(Project):
    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "PYTHONPATH": str(ROOT)}  # this checkout's code, as the lab's fab_env does


def test_a_second_stack_does_not_make_stack_mandatory(tmp_path: Path, sshd) -> None:  # noqa: F811
    proj = OurProject(tmp_path)
    server = sshd("127.0.14.9")
    proj.stack("lab", f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
                      f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n")
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
