"""A project with several stacks: `gpu-train stack NAME` remembers one (as `pulumi stack select`), so
--stack is not needed on every command; --stack and $GPU_TRAIN_STACK still win for one command."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_train.stack import project
from tests.conftest import ROOT
from tests.unit.test_project import Project, sshd  # noqa: F401  (the fixture)


@pytest.mark.parametrize(
    ("given", "env", "selected", "own", "expected"),
    [
        ("a", "b", "c", ["d"], ("a", "--stack")),
        (None, "b", "c", ["d"], ("b", "$GPU_TRAIN_STACK")),
        (None, None, "c", ["c", "d"], ("c", "selected: gpu-train stack NAME")),
        (None, None, "c", ["d"], ("c", "selected: gpu-train stack NAME")),  # the caller checks it still exists
        (None, None, None, ["d"], ("d", "the project's only stack")),
        (None, None, None, ["c", "d"], (None, "")),  # Pulumi's selected stack, else an error naming both
        (None, None, None, [], (None, "")),
    ],
)
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
