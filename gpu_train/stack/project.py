"""Where a researcher's project is, and where its stack files are found.

`gpu-train` runs from the user's own project (a git repo with their code, not this clone), so the
stacks, the fetched runs and the local caches belong to that project. Stack files are looked up
in a search path: the project's ``stacks/`` first, then ``--stacks-dir`` / ``$GPU_TRAIN_STACKS_DIR``,
then this clone's examples. Standard library only: the config model and the tasks both use it.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from pathlib import Path

from gpu_train.atomic import atomic_write

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_STACKS = REPO / "stacks"
MARKERS = ("stacks", ".git")  # a directory holding one of these is a project's root


def command_name(argv0: str) -> str:
    """The command the user typed, for the fixes our messages suggest: ``fab`` when Fabric's own
    program runs the tasks (``fab``, ``python -m fabric``), else ``gpu-train`` (its console script,
    and the command that works from anywhere, for the scripts and the agent)."""
    path = Path(argv0)
    if path.name == "fab" or (path.name == "__main__.py" and path.parent.name == "fabric"):
        return "fab"
    return "gpu-train"


def repo_script(name: str, cwd: Path | None = None, repo: Path = REPO) -> str:
    """How to run one of this clone's ``scripts/NAME`` from ``cwd``: ``scripts/NAME`` inside the clone,
    else its full path (the user's project has no scripts/ of ours)."""
    here = (cwd or Path.cwd()).resolve()
    script = repo.resolve() / "scripts" / name
    if here == repo.resolve():
        return f"scripts/{name}"
    if here.is_relative_to(repo.resolve()):
        return os.path.relpath(script, here)
    return str(script)


# A project's own .git/config may name commands git runs for a plain read: core.fsmonitor runs for
# ls-files and check-ignore. A project is others' input (a shared folder, an archive): never those.
GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "--no-pager")


def find_project(cwd: Path | None = None) -> Path | None:
    """The nearest directory at or above ``cwd`` with a ``stacks/`` or ``.git``; None when there is none."""
    here = (cwd or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if any((candidate / m).exists() for m in MARKERS):
            return candidate
    return None


def project_root(cwd: Path) -> Path:
    """The nearest directory at or above ``cwd`` with a ``stacks/`` or ``.git``; else ``cwd``
    (``Environment.project_root`` adds ``$GPU_TRAIN_PROJECT``, which names it outright)."""
    return find_project(cwd) or cwd.resolve()


def no_stack(own: list[str], project: Path | None, cwd: Path, cli: str) -> tuple[str, str]:
    """(what is wrong, the fix) when no stack was named: ``own`` are the project's stacks, ``project``
    the project found from ``cwd`` upwards (None: none, so the usual fix, init, must be run elsewhere)."""
    if project is None:
        return (
            f"no stack selected, and no project here: no stacks/ directory or .git in {cwd} or any directory above it",
            f"cd into your project, or make this one: `{cli} init --host USER@HOST` (or --gcp-project ID) writes "
            f"stacks/ here; or point at stack files: --stacks-dir DIR (or GPU_TRAIN_STACKS_DIR) and --stack NAME",
        )
    if own:
        return (
            f"no stack selected (this project has {', '.join(own)})",
            f"select one for this project: `{cli} stack {own[0]}`; or pass --stack NAME for one command",
        )
    return (
        f"no stack selected (the project {project} has no stack files in stacks/)",
        f"create one: `{cli} init --host USER@HOST` (or --gcp-project ID), or pass --stack NAME "
        "(one of this clone's examples, or of --stacks-dir)",
    )


SELECTED = Path(".gpu-train") / "stack"  # under the project: the stack `gpu-train stack NAME` selected


def choose_stack(given: str | None, env: str | None, selected: str | None, own: list[str]) -> tuple[str | None, str]:
    """Which stack a task uses, and why: --stack, then $GPU_TRAIN_STACK, then the project's selected
    stack (`gpu-train stack NAME`), then the project's only stack; (None, "") leaves it to Pulumi's."""
    for name, why in ((given, "--stack"), (env, "$GPU_TRAIN_STACK"), (selected, "selected: gpu-train stack NAME")):
        if name:
            return name, why
    if len(own) == 1:
        return own[0], "the project's only stack"
    return None, ""


def selected_stack(root: Path) -> str | None:
    """The stack the project ``root`` has selected (its .gpu-train/stack), if any."""
    try:
        return (root / SELECTED).read_text(encoding="utf-8").strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def select_stack(root: Path, name: str | None) -> None:
    """Remember ``name`` as the project's stack (None forgets it); written whole or not at all."""
    path = root / SELECTED
    if name is None:
        path.unlink(missing_ok=True)
        return
    atomic_write(path, name + "\n", mode=0o644)


def stack_dirs(project: Path, extra: Path | None) -> list[Path]:
    """The directories searched for ``Pulumi.NAME.yaml``, in order, without repeats: the ``project``'s
    stacks/, ``extra`` ($GPU_TRAIN_STACKS_DIR, --stacks-dir), this clone's examples."""
    dirs = [project / "stacks"]
    if extra is not None:
        dirs.append(extra)
    dirs.append(EXAMPLE_STACKS)
    seen: list[Path] = []
    for d in dirs:
        if d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def project_name(root: Path) -> str:
    """The project's name on a host (REMOTE_ROOT/envs/NAME, REMOTE_ROOT/data/NAME): its directory's name."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", root.name).lstrip(".-")
    return name[:64] or "project"


def state_folder(user_home: Path, root: Path) -> Path:
    """A project's records in the user's own folder: projects/NAME-HASH, HASH of its absolute path, so a copy
    of the project elsewhere (with whatever .gpu-train/ it carried) starts with records of its own."""
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return user_home / "projects" / f"{project_name(root)}-{key}"


def stack_path(name: str, dirs: list[Path]) -> Path | None:
    """The first ``Pulumi.NAME.yaml`` (or ``.yml``) along ``dirs``; None when there is none."""
    for d in dirs:
        for suffix in (".yaml", ".yml"):
            path = d / f"Pulumi.{name}{suffix}"
            if path.is_file():
                return path
    return None


def stack_names(dirs: list[Path]) -> list[str]:
    """Every stack name found along ``dirs`` (first occurrence wins), sorted."""
    names: set[str] = set()
    for d in dirs:
        if d.is_dir():
            for p in d.glob("Pulumi.*.y*ml"):
                names.add(p.name.removeprefix("Pulumi.").rsplit(".", 1)[0])
    return sorted(names)


def did_you_mean(word: str, choices: list[str]) -> list[str]:
    """Close matches for a mistyped name: those it is a prefix of first, then similar spellings."""
    prefixed = [c for c in choices if c.startswith(word)]
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.5)
    return list(dict.fromkeys(prefixed[:3] + close))[:3]


def listed_stack_files(project: Path, extra: Path | None) -> list[Path]:
    """The stacks to list (`ls`, `check`): the project's and ``extra``'s ($GPU_TRAIN_STACKS_DIR); this
    clone's examples only inside the clone with no other directory named."""
    dirs = stack_dirs(project, extra)
    own = [d for d in dirs if d.resolve() != EXAMPLE_STACKS.resolve()]
    if not own and extra is None:
        own = dirs[:1]  # inside the clone: its stacks/ are the project's
    return [p for p in (stack_path(n, own) for n in stack_names(own)) if p is not None]


def pulumi_config_args(path: Path) -> list[str]:
    """`--config-file PATH` for a stack file the Pulumi CLI would not find itself (it reads this
    clone's stacks/, Pulumi.yaml's stackConfigDir): a stack in the user's project."""
    return [] if is_example(path) else ["--config-file", str(path.resolve())]


def is_example(path: Path) -> bool:
    """Whether a stack file is one of this clone's examples (Pulumi finds those without --config-file)."""
    return path.resolve().parent == EXAMPLE_STACKS.resolve()
