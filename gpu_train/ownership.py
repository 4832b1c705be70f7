"""Whose run it is, on a host many projects share: a project's id and the rule every default keeps to.

Part of the contract between the laptop and the agent (both import it; the agent's zipapp carries it): the
laptop makes the ids (gpu_train/identity.py) and sends the current project's as a command's scope; the host
records each run's (RunRecord.project) and keeps to the scope when it picks a run by default. Standard
library only, Python 3.8+.
"""

from __future__ import annotations

import os
import re

# A project's id on a shared host (gpu_train/identity.py): its folder's name and 8 hex digits made once on
# the laptop, NAME-XXXXXXXX. It names REMOTE_ROOT/envs/ID, REMOTE_ROOT/data/ID and the bucket's data/ID/,
# and each run's record carries it. Runs from before ids carry the project root's folder name instead.
PROJECT_ID_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,39}-[0-9a-f]{8}"


def in_scope(project: str | None, ids: tuple[str, ...] | list[str], legacy: str | None) -> bool:
    """Whether a run of ``project`` is one a command's defaults keep to: a project of ``ids`` (the current
    one and those in folders beneath it), or, for a run from before ids (no project, or a bare name), the
    name ``legacy``. No ids and no legacy name: every run (``--all-projects``)."""
    if not ids and legacy is None:
        return True
    if project in ids:
        return True
    return legacy is not None and (project is None or project == legacy)


def project_dirs(root: str, project: str | None) -> tuple[str, str]:
    """(the project's venv, its data folder) under REMOTE_ROOT: envs/ID, data/ID (``default`` for a run with none).
    Data pushed before ids (data/NAME) is read where it is until the project pushes its own to data/ID."""
    name = project or "default"
    data = f"{root}/data/{name}"
    if re.fullmatch(PROJECT_ID_PATTERN, name) and not os.path.isdir(data):
        earlier = f"{root}/data/{name.rsplit('-', 1)[0]}"
        data = earlier if os.path.isdir(earlier) else data
    return f"{root}/envs/{name}", data
