"""`train`'s flags as one typed object, checked before anything is sent: the folder to sync and run in
(a monorepo's example is a project of its own), --env-file texts, --pools' jobs, each number within its
bounds. `start_run` (remote/tasks/launching.py) starts what it says; a sweep's trials start from one too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.environment import Environment
from gpu_train.errors import UsageError
from remote.tasks import trust
from remote.tasks.session import say

if TYPE_CHECKING:
    from gpu_train.pooljobs import PoolJob


@dataclass(frozen=True)
class TrainOptions:
    """What `train` was asked to start, checked: each field is one of its flags (help: the task's)."""

    code_dir: Path
    script: str | None = None
    command: str | None = None
    name: str | None = None
    args: str = ""
    env: tuple[str, ...] = ()
    env_files: dict[str, str] = field(default_factory=dict)  # --env-file texts by the name given
    pass_job_dir: bool = False
    resume_args: str = ""
    resume_if: str | None = None
    image: str | None = None  # --image, else the stack's gpu-train:image (`none`: on the host)
    entrypoint: str = ""
    pools: dict[str, PoolJob] = field(default_factory=dict)  # --pools: the worker and ps pools' own jobs (gpu_train.pooljobs)
    launcher: str | None = None
    nproc: int | None = None
    port: int = 29500
    ps: int | None = None
    stack: str | None = None
    timeout: float | None = None
    follow: bool = False  # --follow: node 0's log is asked for as its launch is answered (early.start_follow)
    project: str | None = None  # the project's id (gpu_train/identity.py), when given; else project_folder's
    project_folder: Path | None = None  # whose id the run carries: the synced folder, or the project root's folder

    @classmethod
    def read(
        cls,
        environment: Environment,
        *,
        dir: str | None = None,
        env: Sequence[str] | None = None,
        env_file: Sequence[str] | None = None,
        nproc: object = None,
        port: str | None = None,
        timeout: object = None,
        pass_job_dir: object = False,
        args: str | None = "",
        resume_args: str | None = "",
        pools: str | None = None,
        **rest: Any,
    ) -> TrainOptions:
        """The flags as Invoke gives them (strings, None for unset), checked before anything is sent:
        a bad value is a UsageError naming the flag."""
        code_dir, script, project_folder = training_folder_of(environment, dir, rest.pop("script", None))
        return cls(
            code_dir=code_dir,
            script=script,
            project_folder=project_folder,
            env=tuple(env or ()),
            env_files=_read_env_files(list(env_file or [])),
            pools=_read_pools(pools) if pools else {},
            nproc=trust.number("--nproc", nproc, int, 1, 1024),
            port=trust.number("--port", port or 29500, int, 1, 65535),
            timeout=trust.number("--timeout", timeout, float, 0) if timeout else None,
            pass_job_dir=bool(pass_job_dir),
            args=args or "",
            resume_args=resume_args or "",
            **rest,
        )


def training_folder_of(environment: Environment, given: str | None, script: str | None) -> tuple[Path, str | None, Path]:
    """(the folder to sync and run in, --script as a path in it, the project's folder, whose id the run
    carries: made only once the stack passed, in start_run): identity.training_folder.
    A folder inside the project root is a project of its own (a monorepo's example); code from outside
    it is the project root's. Said when it is a folder below the one the user is in."""
    from gpu_train.identity import ProjectIds, project_folder, shown_path, training_folder

    root, ids = environment.project_root, ProjectIds(environment.state_home)
    code_dir, script = training_folder(environment.cwd, root, ids.known(), given, script)
    if not code_dir.is_dir():
        raise UsageError(f"--dir {given}: no such directory ({code_dir}; --dir is a path from where you are)")
    inside = code_dir == root or code_dir.is_relative_to(root)
    project = code_dir if inside else project_folder(root, root, ids.known())
    if inside and code_dir != environment.cwd.resolve() and code_dir.is_relative_to(environment.cwd.resolve()):  # a monorepo's
        own = [f for f in ("requirements.txt", "pyproject.toml") if (code_dir / f).is_file()]
        say(
            f"project {shown_path(code_dir, environment.cwd)} ({', '.join(own) if own else 'no requirements file'}): "
            "its code is synced and the job runs there"
        )
    return code_dir, script, project


def _read_pools(name: str) -> dict[str, PoolJob]:
    """--pools FILE's pools, read and checked before anything is sent (gpu_train.pooljobs)."""
    import yaml

    from gpu_train.pooljobs import read_pools

    try:
        doc = yaml.safe_load(Path(name).expanduser().read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--pools {name}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except yaml.YAMLError as e:
        raise UsageError(f"--pools {name}: not YAML or JSON ({e})") from None
    return read_pools(doc, name)


def _read_env_files(paths: list[str]) -> dict[str, str]:
    """--env-file texts by the name given, read before anything is sent."""
    texts = {}
    for name in paths:
        try:
            texts[name] = Path(name).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--env-file {name}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    return texts
