"""A project's identity on a shared host (gpu_train/identity.py) and the scope every default keeps to (issue 38)."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_train import identity
from gpu_train.contract import AgentSettings
from gpu_train.errors import UsageError
from gpu_train.identity import ProjectIds, Scope, folder_name, name_of, new_id, project_folder, running_run, shown_path
from gpu_train.ownership import PROJECT_ID_PATTERN, in_scope
from remote.tasks.render import render_status

A, B = "nanogpt-0123abcd", "nanogpt-89abcdef"


def test_an_id_is_the_folders_name_and_8_random_hex_digits() -> None:
    made = {new_id(Path("/x/nano GPT")) for _ in range(50)}
    assert len(made) == 50
    assert all(re.fullmatch(r"nano_GPT-[0-9a-f]{8}", m) for m in made)
    assert folder_name(Path("/x/.hidden")) == "hidden" and folder_name(Path("/x/" + "a" * 90)) == "a" * 40
    assert name_of("nano_GPT-0123abcd") == "nano_GPT" and name_of("nanogpt") == "nanogpt" and name_of(None) == "?"


def test_two_folders_two_ids_one_folder_one_id_and_a_copy_a_new_one(tmp_path: Path) -> None:
    one, two = tmp_path / "a" / "nanogpt", tmp_path / "b" / "nanogpt"  # two clones of one project
    for d in (one, two):
        d.mkdir(parents=True)
    ids = ProjectIds(one / ".gpu-train")
    first = ids.id_for(one)
    assert ids.id_for(one) == first == ProjectIds(one / ".gpu-train").id_for(one)  # kept, read back
    assert ProjectIds(two / ".gpu-train").id_for(two) != first
    copy = tmp_path / "c" / "nanogpt"
    shutil.copytree(one, copy)  # cp -r, its .gpu-train/ with it
    assert ProjectIds(copy / ".gpu-train").id_for(copy) != first
    other_user = ProjectIds(tmp_path / "bob-state")  # another user's laptop state, the same path
    assert other_user.id_for(one) != first


def test_two_first_trains_at_once_get_one_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two first `train`s of a project at once (a script starting several): the one that asks second gets the
    id the first made, not one of its own (the table written last kept one id, and the other run was then
    another project's to `stop` and `status`)."""
    real, writing, release = identity.atomic_write, threading.Event(), threading.Event()

    def first_one_slow(where: Path, text: str, **kw: Any) -> None:
        if not writing.is_set():  # the first train, caught between its read and its write
            writing.set()
            assert release.wait(30)
        real(where, text, **kw)

    monkeypatch.setattr(identity, "atomic_write", first_one_slow)
    got: dict[str, str] = {}
    first = threading.Thread(target=lambda: got.update(a=ProjectIds(tmp_path / "state").id_for(tmp_path)))
    first.start()
    assert writing.wait(30)
    second = threading.Thread(target=lambda: got.update(b=ProjectIds(tmp_path / "state").id_for(tmp_path)))
    second.start()
    second.join(1)  # (without the lock it has read no id and written its own by now)
    release.set()
    first.join(30)
    second.join(30)
    assert got["a"] == got["b"] == ProjectIds(tmp_path / "state").get(tmp_path)


def test_a_damaged_ids_file_is_an_empty_one(tmp_path: Path) -> None:
    ids = ProjectIds(tmp_path)
    (tmp_path / "projects.json").write_text("{not json")
    made = ids.id_for(tmp_path)
    assert json.loads((tmp_path / "projects.json").read_text())["projects"] == {str(tmp_path.resolve()): made}


@pytest.mark.parametrize(
    "files, known, at, want",
    [
        ((), (), "", ""),  # a project without requirements: its root
        (("requirements.txt",), (), "src/deep", ""),
        (("requirements.txt", "ex/a/requirements.txt"), (), "ex/a/data", "ex/a"),  # a monorepo's example
        (("ex/b/pyproject.toml",), (), "ex/b", "ex/b"),
        (("ex/b/pyproject.toml",), (), "ex", ""),  # above it: the root
        ((), ("ex/c",), "ex/c/sub", "ex/c"),  # trained from before with --dir
    ],
)
def test_the_project_of_a_path_is_the_nearest_folder_with_its_own_requirements(tmp_path: Path, files, known, at, want) -> None:
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    (tmp_path / at).mkdir(parents=True, exist_ok=True)
    assert project_folder(tmp_path / at, tmp_path, [tmp_path / k for k in known]) == (tmp_path / want).resolve()


def test_a_folders_scope_holds_the_projects_beneath_it(tmp_path: Path) -> None:
    ids = ProjectIds(tmp_path / "state")
    sub_a, sub_b = ids.id_for(tmp_path / "ex" / "a"), ids.id_for(tmp_path / "ex" / "b")
    root = ids.scope(tmp_path, "repo")
    assert root.ids[0] == root.current and set(root.ids[1:]) == {sub_a, sub_b} and root.legacy == "repo"
    assert ids.scope(tmp_path / "ex" / "a", None).ids == (sub_a,)
    assert root.agent_args() == [a for i in root.ids for a in ("--project", i)] + ["--legacy", "repo"]
    assert Scope(A, (A,), "x", everything=True).agent_args() == []


@pytest.mark.parametrize(
    "project, ids, legacy, keeps",
    [
        (A, (A,), None, True),
        (B, (A,), "nanogpt", False),  # the other clone's run
        ("nanogpt", (A,), "nanogpt", True),  # a run from before ids, of this name
        (None, (A,), "nanogpt", True),  # from before projects were recorded at all
        ("other", (A,), "nanogpt", False),
        (B, (), None, True),  # no scope: every run
    ],
)
def test_in_scope(project, ids, legacy, keeps) -> None:
    assert in_scope(project, ids, legacy) is keeps
    assert re.fullmatch(PROJECT_ID_PATTERN, A)


def run(rid: str, state: str, project: str | None = A) -> dict:
    return {"id": rid, "state": state, "project": project, "created": 1.0}


@pytest.mark.parametrize(
    "runs, pick, why",
    [
        ([run("a_1", "succeeded"), run("a_2", "running")], "a_2", None),  # the running one, not the newest
        ([run("a_1", "running"), run("b_1", "running", B)], "a_1", None),  # another project's is not ours
        ([run("a_1", "succeeded")], None, None),  # nothing at work anywhere
        ([{**run("c_1", "failed"), "nodes": [{"state": "running"}, {"state": "failed"}]}], "c_1", None),  # node 0 still works
        ([run("a_1", "running"), run("a_2", "starting")], None, "2 runs of this project are running (a_1, a_2)"),
        ([run("a_1", "succeeded"), run("b_1", "running", B)], None, "no run of this project is running; other projects' runs are (b_1)"),
    ],
)
def test_stop_without_run_picks_the_projects_running_run(runs, pick, why) -> None:
    if why:
        with pytest.raises(UsageError, match=re.escape(why)):
            running_run(runs, Scope(A, (A,)))
    else:
        assert running_run(runs, Scope(A, (A,))) == pick


class Target:
    stack, host, is_gcp = "lab", "me@box", False
    agent_settings = AgentSettings()


def test_status_shows_whose_a_run_is_and_counts_the_others() -> None:
    doc = {"host": "box", "root": "/r", "runs": [run("a_1", "succeeded"), run("c_1", "running", "lm-0000aaaa")]}
    text = render_status(doc, Target(), current=A, others=3)
    assert "PROJECT" in text and "lm-0000aaaa" in text and A in text
    assert text.splitlines()[-1] == "3 runs of other projects on this host: gpu-train status --all-projects"
    mine = render_status({**doc, "runs": doc["runs"][:1]}, Target(), current=A)
    assert "PROJECT" not in mine


def test_a_path_is_shown_as_typed_from_where_the_user_is(tmp_path: Path) -> None:
    assert shown_path(tmp_path / "ex" / "a", tmp_path) == "ex/a"
    assert shown_path(tmp_path, tmp_path) == "."
    assert shown_path(tmp_path, tmp_path / "ex") == str(tmp_path.resolve())
