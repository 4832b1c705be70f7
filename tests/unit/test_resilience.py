"""Never lose a checkpoint, never pay for an idle GPU: resume after reboots, checkpoint on shutdown,
idle auto-stop, crash loops, fetch while training. Real sshd, screen and torch on loopback; a reboot
is simulated by SIGKILLing every process of the job's screen session, then running `boot`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import lifecycle, procs
from remote.loopback import descendants
from tests.conftest import Lab
from tests.guest.metadata import MetadataServer, free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def agent_cmd(lab: Lab, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(lab.remote / "bin" / "gpu-train-agent"), "--root", str(lab.remote), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def screen_pids(lab: Lab, run: str) -> list[int]:
    """The SCREEN process of a run's session and everything below it (wrapper, job). Only this lab's:
    a test beside it (xdist) may run a run of the same id under its own REMOTE_ROOT."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].upper().endswith(b"SCREEN") and run.encode() in cmd and str(lab.remote).encode() in cmd:
                pids.append(int(entry))
    return [p for pid in pids for p in (pid, *descendants(pid))]


def reboot(lab: Lab, run: str) -> None:
    """Every process of the job's screen session dies at once, as in a power cut."""
    victims = screen_pids(lab, run)
    assert victims, f"no screen session for {run}"
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(["screen", "-wipe"], capture_output=True)


def state(lab: Lab, run: str) -> dict:
    return json.loads((lab.remote / "runs" / run / "state.json").read_text())


# -- idle rules -------------------------------------------------------------------------------
T0 = 1_000_000.0


@pytest.mark.parametrize(
    ("now", "since", "minutes", "jobs", "sessions", "util", "expected_since", "stop", "why"),
    [
        (T0, None, 0, 0, 0, 0.0, None, False, "idle stop is off"),
        (T0, None, 30, 0, 0, 0.0, T0, False, "idle 0 min, stops at 30"),
        (T0 + 29 * 60, T0, 30, 0, 0, 0.0, T0, False, "idle 29 min, stops at 30"),
        (T0 + 30 * 60, T0, 30, 0, 0, 0.0, T0, True, "idle 30 min, limit 30: powering off"),
        (T0 + 90 * 60, T0, 30, 0, 0, 4.9, T0, True, "powering off"),  # under 5% counts as idle
        (T0 + 90 * 60, T0, 30, 1, 0, 0.0, None, False, "busy: 1 job(s) running"),
        (T0 + 90 * 60, T0, 30, 0, 2, 0.0, None, False, "busy: 2 SSH session(s) open"),
        (T0 + 90 * 60, T0, 30, 0, 0, 5.0, None, False, "busy: GPU 5% busy"),
        (T0 + 90 * 60, T0, 30, 2, 1, 80.0, None, False, "busy: 2 job(s) running, 1 SSH session(s) open, GPU 80% busy"),
        (T0 + 5 * 60, T0 + 4 * 60, 30, 0, 0, 0.0, T0 + 4 * 60, False, "idle 1 min"),  # the clock restarted
    ],
)
def test_idle_decision(now, since, minutes, jobs, sessions, util, expected_since, stop, why) -> None:
    got_since, got_stop, got_why = lifecycle.idle_decision(now, since, minutes, jobs, sessions, util)
    assert (got_since, got_stop) == (expected_since, stop)
    assert why in got_why


@pytest.mark.parametrize(
    ("server", "state", "events", "counted"),
    [
        ("TRUE", "running", None, True),  # the metadata server's word at shutdown
        ("FALSE", "running", None, False),
        (None, "running", ["PREEMPTED"], True),  # gpu-train-watch told the job; nothing answers the shutdown's query
        ("slow", "running", ["PREEMPTED"], True),  # ... or it answers too late (after the query's 2 s)
        (None, "running", ["TERMINATE_ON_HOST_MAINTENANCE", "PREEMPTED"], True),
        ("FALSE", "running", ["TERMINATE_ON_HOST_MAINTENANCE"], False),  # a maintenance is not a preemption
        (None, "running", None, False),
        (None, "succeeded", ["PREEMPTED"], False),  # an ended run's leftover says nothing about this stop
    ],
)
def test_a_preemption_is_counted_from_the_metadata_server_or_from_what_the_watcher_told_a_run(
    tmp_path: Path, server: str | None, state: str, events: list[str] | None, counted: bool
) -> None:
    root = tmp_path / "root"
    (root / "runs" / "r1").mkdir(parents=True)
    metadata = MetadataServer("127.0.0.1").start() if server is not None else None
    if metadata is None:  # a port where nothing listens: the query fails at once
        url = f"http://127.0.0.1:{free_port('127.0.0.1')}/computeMetadata/v1/"
    else:
        url = metadata.url
        metadata.set("instance/preempted", "TRUE" if server == "slow" else server)
        if server == "slow":
            metadata.stall("instance/preempted", 3)
    (root / "agent.json").write_text(json.dumps({"gcp": True, "metadataUrl": url}))
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        doc = {"state": state, "pid": job.pid, "pidStart": procs.proc_start_time(job.pid), "unit": "gpu-train-r1.service"}
        (root / "runs" / "r1" / "state.json").write_text(json.dumps(doc))
        if events:
            (root / "runs" / "r1" / "notice").write_text(json.dumps({"event": events[0], "events": events}))
        started = time.monotonic()
        result = lifecycle.cmd_shutdown(str(root), grace=0)
        assert time.monotonic() - started < 2.5  # the job's grace is not spent waiting for the server
    finally:
        job.kill()
        job.wait()
        if metadata is not None:
            metadata.stop()
    assert result["preempted"] is counted
    if state == "running":
        assert json.loads((root / "runs" / "r1" / "state.json").read_text())["preempted"] is counted
    if metadata is not None:
        assert "/computeMetadata/v1/instance/preempted" in metadata.requests  # it did ask


# -- reboots, shutdown, crash loops -----------------------------------------------------------
def wait_state(lab: Lab, run: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    """The run's state file once it says one of ``states`` (the host's own record, read directly:
    `fab status` says the same, and is asserted once at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            current = state(lab, run)
            if current.get("state") in states:
                return current
        time.sleep(0.05)
    raise AssertionError(f"{run} did not reach {states}: {state(lab, run)}")


@pytest.fixture
def crontab_restored(tmp_path):
    """`fab setup` edits the real user's crontab: afterwards, the lines of this test's REMOTE_ROOTs (under its
    tmp_path) go, and nothing else. Putting back the whole crontab as it was before (as this did) wiped the
    lines other tests running at the same time had written meanwhile; it takes the agent's lock as `setup`
    and `down` do, so no change of theirs is lost either."""
    from agent import hostcheck

    if not shutil.which("crontab"):
        pytest.skip("crontab is not installed (scripts/test installs cron)")
    yield
    mine = f"# gpu-train {tmp_path}/"  # (a root inside it: test_x1 is not test_x10)
    with hostcheck.crontab_lock():
        lines = hostcheck.crontab() or []
        kept = [line for line in lines if mine not in line]
        if kept != lines:
            subprocess.run(["crontab", "-"], input="".join(f"{line}\n" for line in kept), text=True, check=True)
