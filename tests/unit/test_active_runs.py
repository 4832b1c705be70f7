"""A launch asks twice which runs are at work (the name's, then every one for the host's notes): it reads
only those whose record says so, not every finished run a host keeps (agent/status.py::active_runs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent import launch, status
from agent.procs import proc_start_time


def _run(root: Path, run: str, state: str, pid: int | None = None, project: str = "p-1") -> None:
    d = root / "runs" / run
    d.mkdir(parents=True)
    record = {"id": run, "base": run.rsplit("_", 2)[0], "state": state, "project": project, "created": 1.0}
    if pid is not None:
        record.update(pid=pid, pidStart=proc_start_time(pid))
    (d / "state.json").write_text(json.dumps(record))
    (d / "spec.json").write_text("{not json")  # what `describe` would choke on


def test_a_launch_reads_no_finished_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(200):
        _run(tmp_path, f"old_20250101_{i:06d}", "succeeded")
    _run(tmp_path, "train_20250101_000000", "failed")
    monkeypatch.setattr(status, "describe", lambda run_dir: pytest.fail(f"described {run_dir}"))
    monkeypatch.setattr(launch, "describe", lambda run_dir: pytest.fail(f"described {run_dir}"), raising=False)
    assert status.busy_runs(str(tmp_path), "train", "p-1") == []
    assert launch.host_notes(str(tmp_path))["warnings"] == []


def test_a_run_at_work_is_still_found(tmp_path: Path) -> None:
    _run(tmp_path, "train_20250101_000000", "running", pid=os.getpid())
    _run(tmp_path, "train_20250101_000001", "running", pid=None)  # its process gone: interrupted, not at work
    _run(tmp_path, "other_20250101_000000", "running", pid=os.getpid())
    found = status.busy_runs(str(tmp_path), "train", "p-1")
    assert found == ["train_20250101_000000"]
    assert status.busy_runs(str(tmp_path), "train", "p-2") == []  # another project's run of that name is no clash
    assert sorted(os.path.basename(d) for d, _ in status.active_runs(str(tmp_path))) == ["other_20250101_000000", "train_20250101_000000"]
