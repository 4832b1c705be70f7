"""Pushed data linked into a run's working directory is not that run's output once the run has ended:
a later `push` (which rewrites DATA_DIR's files) must not make every earlier run show, fetch and guard
the dataset as if its job had written it (agent/outputs.py::written_through)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent import outputs
from agent.store import update_state
from gpu_train.contract import FAILED, INTERRUPTED, RUNNING, SUCCEEDED


def a_run(tmp_path: Path, state: str, ended: float | None, interrupted_at: float | None = None) -> tuple[str, Path]:
    root, run_dir = tmp_path / "root", tmp_path / "root" / "runs" / "r1"
    data = root / "data" / "proj" / "data"
    data.mkdir(parents=True)
    (data / "input.txt").write_text("the pushed data\n")
    (run_dir / "code").mkdir(parents=True)
    os.symlink(data, run_dir / "code" / "data")
    update_state(str(run_dir), id="r1", state=state, created=time.time() - 100, ended=ended, interrupted_at=interrupted_at)
    return str(root), data


@pytest.mark.parametrize(
    ("state", "ended_in", "interrupted_in", "counted"),  # seconds from now (ids stay the same on every worker)
    [
        (RUNNING, None, None, True),  # the job may have written it: it is counted (and comes home)
        (SUCCEEDED, 60, None, True),  # changed before the end: the job's
        (SUCCEEDED, -60, None, False),  # changed after the end: a later push's
        (FAILED, -60, None, False),
        (INTERRUPTED, None, -60, False),
        (INTERRUPTED, None, 60, True),
    ],
)
def test_a_later_push_is_not_an_ended_runs_output(tmp_path: Path, state: str, ended_in, interrupted_in, counted: bool) -> None:
    now = time.time()
    ended = None if ended_in is None else now + ended_in
    interrupted_at = None if interrupted_in is None else now + interrupted_in
    root, data = a_run(tmp_path, state, ended, interrupted_at)
    (data / "input.txt").write_text("pushed again, later\n")  # its ctime: now
    rows = [row[0] for row in outputs.listing(root, os.path.join(root, "runs", "r1"))]
    assert ("data/input.txt" in rows) is counted, rows
