"""remoteRoot's default, ~/.gpu-train, cannot be a clone (the old one, ~/gpu-train, is where the README
clones gpu-train itself); an SSH host with runs under the old default keeps them there and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_train.contract import REMOTE_ROOT_BEFORE, REMOTE_ROOT_DEFAULT
from remote.ssh import target
from tests.unit.test_project import sshd, started_run  # noqa: F401  (the fixture)


@pytest.mark.parametrize(
    ("answer", "root"),
    [
        ("new\n", REMOTE_ROOT_DEFAULT),
        ("before\n", REMOTE_ROOT_BEFORE),
        ("", None),
        ("Welcome!\nnew\n", None),
    ],
)
def test_what_first_contact_answers(answer: str, root: str | None) -> None:
    assert target.root_from_answer(answer) == root


def test_the_question_keeps_the_old_root_only_with_runs_of_ours(tmp_path: Path) -> None:
    import subprocess

    def ask(make: list[str]) -> str:
        home = tmp_path / f"h{len(list(tmp_path.iterdir()))}"
        home.mkdir()
        for rel in make:
            p = home / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.mkdir() if rel.endswith("/") else p.write_text("")
        return subprocess.run(
            ["sh", "-c", target.ROOT_QUESTION], env={"HOME": str(home)}, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert ask([]) == "new"
    assert ask(["gpu-train/README.md", "gpu-train/runs/"]) == "new"  # a clone with a runs/ folder: not ours
    assert ask(["gpu-train/runs/", "gpu-train/bin/gpu-train-agent"]) == "before"
    assert ask(["gpu-train/runs/", "gpu-train/bin/gpu-train-agent", ".gpu-train/"]) == "new"
