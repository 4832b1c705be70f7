"""Which project a folder is, on a host many projects share: its id, made once, and the folder a job trains from.

A host keeps every project's runs, venvs and pushed data side by side under one REMOTE_ROOT, and may be
shared by several users (one login or several), several projects and several clones of one project. A
folder's name cannot tell them apart (two clones of nanoGPT are both ``nanogpt``), so a project is
identified by an id made once, ``NAME-XXXXXXXX`` (its folder's name and 8 random hex digits), kept on this
laptop in the project's own state (``STATE_HOME/projects.json``, STATE_HOME being ``$GPU_TRAIN_HOME`` or the
project's ``.gpu-train/``), keyed by the folder's absolute path:

- two projects, or two clones of one project, are two folders: two ids;
- two users have two laptops (or two homes): two state files, two ids, even for one folder path;
- a copied folder (``cp -r``, its ``.gpu-train/`` with it) has another path: a new id; a moved one too
  (its earlier runs stay on the host: ``status --all-projects`` shows them, ``--run`` names them).

The id names the project's things on the host (``REMOTE_ROOT/envs/ID``, ``REMOTE_ROOT/data/ID``), in the
bucket (``PREFIX/data/ID/``), in each run's record (``RunRecord.project``), and is what every default of
``stop``, ``logs``, ``fetch``, ``status``, ``resume`` and ``prune`` keeps to (``gpu_train.contract.in_scope``).
A laptop-side cache that must not be shared between projects (addresses, host keys) can key on it too.

In a monorepo the folder a job trains from, not the repository, is the project: the nearest folder at or
above a path with a ``requirements.txt`` or ``pyproject.toml`` (or one trained from before), up to the
project root. Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpu_train.atomic import atomic_write
from gpu_train.contract import ACTIVE
from gpu_train.errors import UsageError
from gpu_train.ownership import PROJECT_ID_PATTERN, in_scope

R = TypeVar("R", bound=Mapping[str, Any])  # a run as a status document has it
IDS_FILE = "projects.json"  # in the state home: {"version": 1, "projects": {ABSOLUTE_PATH: ID}}
PROJECT_FILES = ("requirements.txt", "pyproject.toml")  # a folder holding one is a project of its own
ID_RE = re.compile(PROJECT_ID_PATTERN)
NAME_MAX = 40


def folder_name(folder: Path) -> str:
    """A folder's name as a host path segment: letters, digits, ``.``, ``_``, ``-`` (the rest ``_``),
    never leading with a dot or a dash, at most 40 characters."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.name).lstrip(".-")
    return name[:NAME_MAX] or "project"


def new_id(folder: Path, token: str | None = None) -> str:
    """A fresh id for ``folder``: its name and 8 random hex digits (``token`` for the tests)."""
    made = f"{folder_name(folder)}-{token or secrets.token_hex(4)}"
    assert ID_RE.fullmatch(made), made
    return made


def name_of(project_id: str | None) -> str:
    """The readable part of an id (``nanogpt`` of ``nanogpt-3f9a1c2e``); a name from before ids as it is."""
    if not project_id:
        return "?"
    return project_id.rsplit("-", 1)[0] if ID_RE.fullmatch(project_id) else project_id


def project_folder(path: Path, root: Path, known: Iterable[Path] = ()) -> Path:
    """The project ``path`` belongs to: the deepest folder at or above it, up to ``root``, that holds a
    requirements.txt or pyproject.toml or was trained from before (``known``); else ``root``. A
    ``path`` outside ``root`` is looked at up to the filesystem's root instead."""
    path, root = path.resolve(), root.resolve()
    known_set = {k.resolve() for k in known}
    inside = path == root or path.is_relative_to(root)
    for candidate in (path, *path.parents):
        if candidate in known_set or any((candidate / f).is_file() for f in PROJECT_FILES):
            return candidate
        if inside and candidate == root:
            break
    return root if inside else path


def training_folder(cwd: Path, root: Path, known: Iterable[Path], given: str | None, script: str | None) -> tuple[Path, str | None]:
    """(the folder a `train` syncs and runs in, the --script as a path in it): ``given`` (--dir, a path from
    ``cwd`` as the shell has it) as it is; else the project folder of ``cwd``, or of the script where the
    --script path (in that folder) leads into a deeper folder with requirements of its own (a monorepo's
    example: its own requirements, venv, data and working directory)."""
    if given:
        return (cwd / Path(given).expanduser()).resolve(), script
    folder = project_folder(cwd, root, known) if cwd.resolve().is_relative_to(root.resolve()) else root.resolve()
    if script and not Path(script).is_absolute() and (folder / script).is_file():
        deeper = project_folder((folder / script).parent, root, known)
        if deeper != folder and deeper.is_relative_to(folder):
            return deeper, (folder / script).resolve().relative_to(deeper).as_posix()
    return folder, script


@dataclass(frozen=True)
class Scope:
    """The runs a command's defaults keep to: those of ``ids`` (the current project and the projects in
    folders beneath it), and runs from before ids whose project is ``legacy`` (the old name: the project
    root's folder name). ``everything``: every project's runs (``--all-projects``)."""

    current: str
    ids: tuple[str, ...]
    legacy: str | None = None
    everything: bool = False

    def keeps(self, project: str | None) -> bool:
        """Whether a run of ``project`` is the scope's."""
        return self.everything or in_scope(project, self.ids, self.legacy)

    def split(self, runs: Sequence[R]) -> tuple[list[R], list[R]]:
        """(the scope's runs, the others') of a status document's runs, in order."""
        return [r for r in runs if self.keeps(r.get("project"))], [r for r in runs if not self.keeps(r.get("project"))]

    def agent_args(self) -> list[str]:
        """The agent's options for this scope (none: every run)."""
        if self.everything:
            return []
        args = [a for i in self.ids for a in ("--project", i)]
        return args + (["--legacy", self.legacy] if self.legacy else [])


def running_run(runs: list[dict[str, Any]], scope: Scope) -> str | None:
    """The run `stop` without --run means, of a status document's runs: the scope's one run at work; None when
    nothing at all is at work; UsageError naming them when several of the scope's are (which one?) or only
    other projects' runs are: never a quiet "nothing stopped" while the run the user meant goes on."""
    active = [r for r in runs if r.get("state") in ACTIVE or any(n.get("state") in ACTIVE for n in r.get("nodes") or ())]
    mine: list[str] = sorted(r["id"] for r in active if scope.keeps(r.get("project")))  # (a cluster's: any node still at work)
    if len(mine) == 1:
        return mine[0]
    if mine:
        raise UsageError(f"{len(mine)} runs of this project are running ({', '.join(mine)}): name the one to stop with --run ID")
    if active:
        others = ", ".join(sorted(r["id"] for r in active))
        raise UsageError(f"no run of this project is running; other projects' runs are ({others}): name one with --run ID to stop it")
    return None


class ProjectIds:
    """The ids this laptop made, by folder (``STATE_HOME/projects.json``); a missing or unreadable file
    is an empty one (ids are made anew: the earlier runs stay on the host, under their old id)."""

    def __init__(self, state_home: Path):
        self.path = state_home / IDS_FILE

    def _read(self) -> dict[str, str]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        table = doc.get("projects") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            return {}
        return {str(k): v for k, v in table.items() if isinstance(v, str) and ID_RE.fullmatch(v)}

    def known(self) -> list[Path]:
        return [Path(p) for p in self._read()]

    def get(self, folder: Path) -> str | None:
        return self._read().get(str(folder.resolve()))

    def id_for(self, folder: Path) -> str:
        """``folder``'s id, made and kept the first time it is asked for: made under a lock on the table, read
        again once the lock is held (two first `train`s at once, a script starting several, each made an id; the
        one written last won, and the other's run carried an id its folder no longer had: `stop` and `status`
        took it for another project's run)."""
        key = str(folder.resolve())
        if (known := self._read().get(key)) is not None:
            return known
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # (this user's own state: held for milliseconds)
            table = self._read()
            if key not in table:
                table[key] = new_id(folder)
                atomic_write(self.path, json.dumps({"version": 1, "projects": table}, indent=1, sort_keys=True) + "\n")
            return table[key]
        finally:
            os.close(lock)

    def scope(self, folder: Path, legacy: str | None, everything: bool = False) -> Scope:
        """The scope of ``folder``: its own id (made if need be) and those of known folders beneath it."""
        current = self.id_for(folder)
        base = folder.resolve()
        beneath = sorted(i for p, i in self._read().items() if Path(p) != base and Path(p).is_relative_to(base))
        return Scope(current, (current, *beneath), legacy, everything)


def project_for(state_home: Path, path: Path, root: Path) -> tuple[Path, str]:
    """(the project folder of ``path``, its id): the folder as ``project_folder`` finds it, with the
    folders trained from before counted."""
    ids = ProjectIds(state_home)
    folder = project_folder(path, root, ids.known())
    return folder, ids.id_for(folder)


def shown_path(folder: Path, cwd: Path) -> str:
    """``folder`` as the user would type it from ``cwd``: relative when inside it, else absolute."""
    folder, cwd = folder.resolve(), cwd.resolve()
    if folder == cwd:
        return "."
    return os.path.relpath(folder, cwd) if folder.is_relative_to(cwd) else str(folder)
