"""The run's own log (the job's stdout and stderr: a traceback, the loss curve it prints) comes home with
every fetch, as runs/STACK/RUN/.gpu-train/log: beside a JOB_DIR file called `log`, while it grows, and
before `down` destroys the only copy. Through the real `fab`, against a real sshd on loopback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent import fetchserve
from gpu_train.contract import RUN_FILES, RUN_LOG


def test_the_host_serves_the_log_and_nothing_else_of_the_runs_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r_20260101_000000"
    (run_dir / "job").mkdir(parents=True)
    (run_dir / "log").write_text("line\n")
    (run_dir / "env").write_text("WANDB_API_KEY=secret\n")
    source = f"r_20260101_000000/{RUN_FILES}"
    [row] = fetchserve.list_runs(str(tmp_path), [source])[source]["entries"]
    assert row[:3] == (RUN_LOG, "f", 5)
    assert fetchserve.job_path(str(tmp_path), source, RUN_LOG) == f"{run_dir}/log"
    for rel in ("env", "spec.json", "job/x", "../r_20260101_000000/env"):
        with pytest.raises(fetchserve.Refused):
            fetchserve.job_path(str(tmp_path), source, rel)
    (run_dir / "log").unlink()
    os.symlink(run_dir / "env", run_dir / "log")  # a link planted as the log is not followed
    assert fetchserve.list_runs(str(tmp_path), [source])[source]["entries"][0][1] == "?"


@pytest.mark.parametrize(
    ("path", "reserved"),
    [(".gpu-train", True), (".gpu-train/log", True), ("log", False), (".gpu-trainer/x", False), ("x/.gpu-train", False)],
)
def test_the_logs_folder_is_a_name_the_runs_folder_keeps(path: str, reserved: bool) -> None:
    from remote.transfer.fetch import generator as fp

    assert fp.reserved(path) is reserved  # a JOB_DIR entry of that name is reported, never fetched over the log
    assert fp.appends_only(f"r_20260101_000000/{RUN_FILES}") and not fp.appends_only("r_20260101_000000/workdir")


# -- DURATION: the time a run's job ran, over all its starts ------------------------------------
T0 = 1_000_000.0


@pytest.mark.parametrize(
    ("state", "current", "log_mtime", "at", "seconds"),
    [
        ({"created": T0}, "starting", None, T0 + 5, 5.0),  # launched, installing: from the launch
        ({"created": T0, "started": T0 + 10}, "running", None, T0 + 70, 60.0),
        ({"created": T0, "started": T0 + 10, "ended": T0 + 110}, "succeeded", None, T0 + 999, 100.0),
        # relaunched after a preemption: 100 s before; the new leg's job not started yet, then running
        ({"created": T0, "ranS": 100.0}, "starting", None, T0 + 5000, 100.0),
        ({"created": T0, "ranS": 100.0, "started": T0 + 4000}, "running", None, T0 + 4030, 130.0),
        ({"created": T0, "ranS": 100.0, "started": T0 + 4000, "ended": T0 + 4050}, "failed", None, T0 + 9e4, 150.0),
        # interrupted as the wrapper saw it go (a preemption's SIGTERM), not counting the time down since
        ({"created": T0, "started": T0 + 10, "interruptedAt": T0 + 40}, "interrupted", T0 + 39, T0 + 9e4, 30.0),
        # a hard kill records nothing: the log's last write; an older leg's interruptedAt does not count
        ({"created": T0, "started": T0 + 10}, "interrupted", T0 + 25, T0 + 9e4, 15.0),
        ({"created": T0, "ranS": 30.0, "started": T0 + 500, "interruptedAt": T0 + 40}, "interrupted", T0 + 520, T0 + 9e4, 50.0),
        ({}, "starting", None, T0, None),
    ],
)
def test_duration_sums_the_legs_a_run_ran(state: dict, current: str, log_mtime: float | None, at: float, seconds: float | None) -> None:
    from agent.status import run_seconds
    from gpu_train.contract import RunRecord

    assert run_seconds(RunRecord.from_json(state), current, log_mtime, at) == seconds
