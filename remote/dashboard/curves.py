"""A run's curves, and a sweep's, for the dashboard: the agent's `scalars` (contract.Scalars: the reader
`sweep` uses too), asked once per change of the run's files.

The host reads the scalars (TensorBoard event files, JSONL and CSV metrics files) itself, so the page gets them in
one round trip; they are asked again only when the run's files changed since (its JOB_DIR and working
directory summaries in the pollers' last look), so an open tab costs the host nothing while a run writes
nothing new, and any number of tabs cost the same as one.
"""

from __future__ import annotations

import threading
from typing import Any

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, outcome

POINTS = 400  # points a series at most, evenly thinned by the host


def fingerprint(run: dict[str, Any]) -> tuple[object, ...]:
    """What changes when the run writes: its state and its trees' summaries."""
    return (run.get("state"), *(tuple(sorted((run.get(k) or {}).items())) for k in ("jobSummary", "workdirSummary")))


class Curves:
    """Scalars per (stack, run), kept with the fingerprint they were read at."""

    def __init__(self, env: Environment):
        self.env = env
        self.kept: dict[tuple[str, str], tuple[tuple[object, ...], list[dict[str, Any]]]] = {}
        self.lock = threading.Lock()

    def of(self, stack: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """{"runs": {id: [ScalarSeries]}, "problems": [...]} for ``runs`` (status documents of one stack),
        asking the host only for those whose files changed since they were last read."""
        with self.lock:
            stale = [r for r in runs if (kept := self.kept.get((stack, r["id"]))) is None or kept[0] != fingerprint(r)]
        problems: list[str] = []
        if stale:
            answer, problem = self._ask(stack, [r["id"] for r in stale])
            if problem:
                problems.append(problem)
            else:
                found = {run.get("id"): list(run.get("series") or []) for run in answer.get("runs") or []}
                with self.lock:
                    for r in stale:
                        self.kept[(stack, r["id"])] = (fingerprint(r), found.get(r["id"], []))
                problems += list(answer.get("problems") or [])
        with self.lock:
            return {"runs": {r["id"]: self.kept.get((stack, r["id"]), ((), []))[1] for r in runs}, "problems": problems}

    def _ask(self, stack: str, ids: list[str]) -> tuple[dict[str, Any], str | None]:
        from remote.tasks.scalars import fetch_scalars
        from remote.tasks.session import Session

        session = Session(self.env, stack)
        try:
            return fetch_scalars(session, ids, points=POINTS).to_json(), None
        except GpuTrainError as e:
            return {}, outcome(e)[1]
        finally:
            session.close()
