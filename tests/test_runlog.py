"""The run's own log (the job's stdout and stderr: a traceback, the loss curve it prints) comes home with
every fetch, as runs/STACK/RUN/.gpu-train/log: beside a JOB_DIR file called `log`, while it grows, and
before `down` destroys the only copy. Through the real `fab`, against a real sshd on loopback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpu_train.contract import RUN_FILES, RUN_LOG
from remote.agent import fetchserve
from tests.conftest import Lab

LAB_ADDRESS = "127.0.41.2"  # this module's loopback addresses: 127.0.41.x (the `lab` fixture reads it)

# A job that prints its loss curve: about 100 KB at once (past the size a fetch compares by blocks), then
# more lines for a few seconds (the log grows while a fetch reads it), and a file of its own named `log`.
JOB = (f"{sys.executable} -u -c \"import os, time\n"
       "open(os.path.join(os.environ['JOB_DIR'], 'log'), 'w').write('the job\\'s own file\\n')\n"
       "for i in range(4000): print(f'step {i} loss {1 / (i + 1):.8f}')\n"
       "for i in range(4000, 4400): print(f'step {i} loss {1 / (i + 1):.8f}'); time.sleep(0.01)\n"
       "print('done')\"")


def test_the_log_comes_home_with_every_fetch_while_it_grows(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", JOB, "--name", "curve")
    host_log = lab.remote / "runs" / run / "log"
    deadline = time.monotonic() + 60
    while "step 4000 " not in lab.log(run):
        assert time.monotonic() < deadline, lab.log(run)
        time.sleep(0.1)
    during = lab.fab("fetch", "--run", run)  # the job prints on meanwhile
    assert during.returncode == 0, during.stderr
    dest = lab.cwd / "runs" / "lab" / run
    home = dest / RUN_FILES / RUN_LOG
    early = home.read_bytes()
    assert len(early) > 100_000 and host_log.read_bytes().startswith(early)  # the start the host had
    assert f"its log (the job's stdout and stderr) -> {home}" in during.stderr

    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    done = lab.fab("fetch", "--run", run, check=True)
    assert home.read_bytes() == host_log.read_bytes() and b"done\n" in home.read_bytes(), done.stderr
    assert home.stat().st_mtime_ns == host_log.stat().st_mtime_ns
    assert not (dest / ".previous").exists()  # it grew: nothing of the laptop's copy was lost
    assert (dest / "log").read_text() == "the job's own file\n"  # JOB_DIR's `log`, untouched by the run's
    again = lab.fab("fetch", "--run", run, check=True)
    assert "its log" not in again.stderr and f"{run}: up to date" in again.stderr


def test_down_refuses_while_the_log_is_not_home(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "echo 'Traceback: the only copy of it'; exit 3", "--name", "crash")
    assert lab.wait(run)["state"] == "failed"
    dest = lab.cwd / "runs" / "lab" / run
    dest.mkdir(parents=True)
    (dest / RUN_FILES).write_text("a file where the log's folder goes")
    refused = lab.fab("down")
    assert refused.returncode == 1 and "refusing: not everything is home" in refused.stderr
    assert f"{run}: its log: " in refused.stderr, refused.stderr
    (dest / RUN_FILES).unlink()
    lab.fab("down", check=True)
    assert "Traceback: the only copy of it" in (dest / RUN_FILES / RUN_LOG).read_text()


def test_the_host_serves_the_log_and_nothing_else_of_the_runs_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r_20260101_000000"
    (run_dir / "job").mkdir(parents=True)
    (run_dir / "log").write_text("line\n")
    (run_dir / "env").write_text("WANDB_API_KEY=secret\n")
    source = f"r_20260101_000000/{RUN_FILES}"
    [row] = fetchserve.list_runs(str(tmp_path), [source])[source]["entries"]
    assert row[:3] == [RUN_LOG, "f", 5]
    assert fetchserve.job_path(str(tmp_path), source, RUN_LOG) == f"{run_dir}/log"
    for rel in ("env", "spec.json", "job/x", "../r_20260101_000000/env"):
        with pytest.raises(fetchserve.Refused):
            fetchserve.job_path(str(tmp_path), source, rel)
    (run_dir / "log").unlink()
    os.symlink(run_dir / "env", run_dir / "log")  # a link planted as the log is not followed
    assert fetchserve.list_runs(str(tmp_path), [source])[source]["entries"][0][1] == "?"


@pytest.mark.parametrize(("path", "reserved"), [
    (".gpu-train", True), (".gpu-train/log", True), ("log", False), (".gpu-trainer/x", False), ("x/.gpu-train", False)])
def test_the_logs_folder_is_a_name_the_runs_folder_keeps(path: str, reserved: bool) -> None:
    from remote.transfer.fetch import generator as fp

    assert fp.reserved(path) is reserved  # a JOB_DIR entry of that name is reported, never fetched over the log
    assert fp.appends_only(f"r_20260101_000000/{RUN_FILES}") and not fp.appends_only("r_20260101_000000/workdir")


# -- DURATION: the time a run's job ran, over all its starts ------------------------------------
T0 = 1_000_000.0


@pytest.mark.parametrize(("state", "current", "log_mtime", "at", "seconds"), [
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
])
def test_duration_sums_the_legs_a_run_ran(state: dict, current: str, log_mtime: float | None, at: float,
                                          seconds: float | None) -> None:
    from gpu_train.contract import RunRecord
    from remote.agent.status import run_seconds

    assert run_seconds(RunRecord.from_json(state), current, log_mtime, at) == seconds


def test_a_resumed_runs_duration_counts_every_leg_and_not_the_wait(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "echo leg; sleep 2; echo done", "--name", "legs")
    state_file = lab.remote / "runs" / run / "state.json"
    deadline = time.monotonic() + 30
    while "leg" not in lab.log(run):
        assert time.monotonic() < deadline, lab.log(run)
        time.sleep(0.1)
    time.sleep(1)
    lab.fab("stop", "--run", run, "--grace", "1", check=True)
    first = json.loads(state_file.read_text())
    assert first["state"] == "stopped"
    time.sleep(3)  # stopped: not run time
    lab.fab("resume", "--run", run, check=True)
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    second = json.loads(state_file.read_text())
    legs = (first["ended"] - first["started"]) + (second["ended"] - second["started"])
    shown = lab.run_state(run)["durationS"]
    assert abs(shown - legs) < 0.2, (shown, legs)  # both legs (the last alone is about 2 s)
    assert shown < second["ended"] - first["started"] - 2.5  # not the 3 s it waited
    assert "resumed 1x" in lab.fab("status", check=True).stdout


def test_a_log_that_grows_while_it_is_read_comes_home_as_listed_and_then_its_tail(host, tmp_path: Path) -> None:
    """Deterministic: the host's files grow between the listing and the reads. The log (an append-only
    source) comes home as far as it was listed; a JOB_DIR file that changed so is "changed while being
    read" as before. The next fetch sends the log's new end only."""
    from remote.transfer.fetch.engine import Fetcher
    from tests.fetch_host import MiB

    job = host.job()
    run_dir = job.parent
    (job / "metrics.jsonl").write_bytes(b"{}\n" * 1000)
    lines = b"".join(b"step %d loss %.8f\n" % (i, 1 / (i + 1)) for i in range(40_000))  # about 1 MiB
    (run_dir / "log").write_bytes(lines)

    class Growing(Fetcher):
        def _plan(self, results, listing):
            planned = super()._plan(results, listing)
            for path in (run_dir / "log", job / "metrics.jsonl"):  # the job prints on, after the listing
                with path.open("ab") as f:
                    f.write(b"step 40000 loss 0.00002500\n")
            return planned

    dest = tmp_path / "home"
    opener = host.opener()
    try:
        files, log = Growing(opener, 4).run([("r_1", dest), (f"r_1/{RUN_FILES}", dest / RUN_FILES)])
    finally:
        opener.close()
    assert log.complete and log.changed == [] and (dest / RUN_FILES / RUN_LOG).read_bytes() == lines
    assert files.changed == ["metrics.jsonl"]  # not an append-only source: as before
    [again] = host.run([(f"r_1/{RUN_FILES}", dest / RUN_FILES)])
    assert again.complete and (dest / RUN_FILES / RUN_LOG).read_bytes() == (run_dir / "log").read_bytes()
    assert again.bytes <= 2 * 64 * 1024 < MiB  # the new end (and the block it starts in), not the whole log
    assert not (dest / ".previous").exists() and not (dest.parent / ".previous").exists()
