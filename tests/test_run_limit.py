"""maxRunHours' stop (Flex-start's end among them): when it comes, the job warned before it through the
notice file (the real watcher against a metadata server on loopback), and `status` saying when."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpu_train.contract import RUN_LIMIT, RUN_LIMIT_NOTICE_S, AgentSettings, run_limit_at
from remote.agent import procs, watch
from remote.tasks.render import agent_lines
from tests.guest.metadata import MetadataServer


@pytest.mark.parametrize(("now", "uptime", "hours", "stop"), [
    (10_000.0, 600.0, 1, 10_000 - 600 + 3600),  # booted 10 minutes ago: stops 50 minutes from now
    (10_000.0, 600.0, 0.5, 10_000 - 600 + 1800),  # fractions of an hour
    (10_000.0, None, 1, None),  # no uptime (off Linux): unknown
    (10_000.0, 600.0, None, None),  # no cap
])
def test_the_stop_is_boot_plus_the_cap(now: float, uptime: float | None, hours: float | None, stop: float | None) -> None:
    assert run_limit_at(now, uptime, hours) == stop


def test_the_notice_names_the_run_limit_with_its_moment() -> None:
    values = {**watch.WATCHED, watch.RUN_LIMIT_KEY: "12345.0"}
    assert watch.notice_for(values) == {"event": RUN_LIMIT, "events": [RUN_LIMIT], "stopsAt": 12345.0}
    values["instance/maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"
    assert watch.notice_for(values)["events"] == ["TERMINATE_ON_HOST_MAINTENANCE", RUN_LIMIT]
    assert watch.notice_for(dict(watch.WATCHED)) is None
    assert watch.run_limit_warning(AgentSettings(gcp=False, max_run_hours=1), 1000.0, 10.0) is None  # an SSH host: no cap


def test_status_says_when_the_vm_stops() -> None:
    doc = {"now": 1_700_000_000.0, "uptimeS": 3600.0, "agent": {"maxRunHours": 1.5, "idleStopMinutes": 0}}
    (line,) = [x for x in agent_lines(doc, None) if x.startswith("run-time cap")]
    assert "stops the VM at 2023-11-14 22:43 UTC (start + 1.5 h), in 30m00s" in line
    assert f"$GPU_TRAIN_NOTICE appears {RUN_LIMIT_NOTICE_S // 60} min before" in line


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
