"""A run's scalars from its host in one round trip (the agent's `scalars`: agent/metrics.py), for
`sweep status`/`sweep best` and the dashboard's curves."""

from __future__ import annotations

from collections.abc import Iterable

from gpu_train.contract import SCALAR_POINTS, Scalars
from remote.tasks.session import Session


def fetch_scalars(session: Session, runs: Iterable[str] = (), tags: Iterable[str] = (), points: int = SCALAR_POINTS) -> Scalars:
    """The runs' series (each a run id, a unique prefix or a base name; none: every run on the host) whose
    tags ``tags`` name (a tag, a glob, or FOLDER/TAG; none: all), at most ``points`` points each."""
    args = ["scalars", "--points", str(points)]
    for run in runs:
        args += ["--run", run]
    for tag in tags:
        args += ["--tag", tag]
    return Scalars.from_json(session.call(*args), f"{session.target.host}'s scalars")
