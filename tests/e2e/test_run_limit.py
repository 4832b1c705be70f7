"""The e2e tier of tests/unit/test_run_limit.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent import procs, watch
from gpu_train.contract import RUN_LIMIT, RUN_LIMIT_NOTICE_S
from tests.guest.metadata import MetadataServer


@pytest.fixture
def host(tmp_path: Path):
    """A REMOTE_ROOT on a 'VM' (gcp) with one running run, and a metadata server on loopback."""
    metadata = MetadataServer("127.0.0.1").start()
    root = tmp_path / "root"
    (root / "runs" / "r1").mkdir(parents=True)
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    state = {"state": "running", "pid": job.pid, "pidStart": procs.proc_start_time(job.pid)}
    (root / "runs" / "r1" / "state.json").write_text(json.dumps(state))
    (root / "runs" / "r1" / "log").write_text("")

    def settings(**kw: object) -> None:
        (root / "agent.json").write_text(json.dumps({"gcp": True, "metadataUrl": metadata.url, **kw}))

    yield root, metadata, settings
    job.kill()
    job.wait()
    metadata.stop()


def hours_until(seconds: float) -> float:
    """maxRunHours that stops this machine ``seconds`` from now (its real uptime counts)."""
    uptime = procs.uptime_s()
    assert uptime is not None
    return (uptime + seconds) / 3600


def test_a_job_whose_stop_is_near_is_told_at_once(host) -> None:
    root, _, settings = host
    settings(maxRunHours=hours_until(RUN_LIMIT_NOTICE_S / 2))  # 5 minutes left: inside the notice window
    watch.cmd_watch(str(root), rounds=1)
    notice = json.loads((root / "runs" / "r1" / "notice").read_text())
    assert notice["events"] == [RUN_LIMIT] and abs(notice["stopsAt"] - (time.time() + RUN_LIMIT_NOTICE_S / 2)) < 5
    assert "early warning: RUN_LIMIT" in (root / "runs" / "r1" / "log").read_text()


def test_the_watcher_tells_the_job_when_the_moment_comes(host) -> None:
    root, metadata, settings = host
    settings(maxRunHours=hours_until(RUN_LIMIT_NOTICE_S + 1.5))  # the warning is due in 1.5 s
    watcher = threading.Thread(target=watch.cmd_watch, args=(str(root),), kwargs={"rounds": 2}, daemon=True)
    watcher.start()
    notice = root / "runs" / "r1" / "notice"
    assert not notice.exists()
    deadline = time.monotonic() + 10
    while not notice.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(notice.read_text())["events"] == [RUN_LIMIT]
    metadata.set("instance/preempted", "FALSE ")  # answer the held requests, so the watcher ends
    metadata.set("instance/maintenance-event", "NONE ")
    watcher.join(10)


def test_no_cap_no_notice(host) -> None:
    root, _, settings = host
    settings(maxRunHours=hours_until(3 * 3600))  # hours away
    watch.cmd_watch(str(root), rounds=1)
    assert not (root / "runs" / "r1" / "notice").exists()
