"""maxRunHours' stop (Flex-start's end among them): when it comes, the job warned before it through the
notice file (the real watcher against a metadata server on loopback), and `status` saying when."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent import watch
from gpu_train.contract import RUN_LIMIT, RUN_LIMIT_NOTICE_S, AgentSettings, run_limit_at
from remote.tasks.render import agent_lines


@pytest.mark.parametrize(
    ("now", "uptime", "hours", "stop"),
    [
        (10_000.0, 600.0, 1, 10_000 - 600 + 3600),  # booted 10 minutes ago: stops 50 minutes from now
        (10_000.0, 600.0, 0.5, 10_000 - 600 + 1800),  # fractions of an hour
        (10_000.0, None, 1, None),  # no uptime (off Linux): unknown
        (10_000.0, 600.0, None, None),  # no cap
    ],
)
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
    target = SimpleNamespace(stack="t4", agent_settings=AgentSettings())
    (line,) = [x for x in agent_lines(doc, target) if x.startswith("run-time cap")]  # type: ignore[arg-type]  # (a SimpleNamespace stands in for the Target)
    assert "stops the VM at 2023-11-14 22:43 UTC (start + 1.5 h), in 30m00s" in line
    assert f"$GPU_TRAIN_NOTICE appears {RUN_LIMIT_NOTICE_S // 60} min before" in line


@pytest.mark.parametrize(
    ("wanted", "has", "said"),
    [
        (30.0, 0, "  the stack says idleStopMinutes: 30; the host has off until the next train or `gpu-train setup --stack lab`"),
        (0.0, 30, "  the stack says idleStopMinutes: 0; the host has 30 until the next train or `gpu-train setup --stack lab`"),
        (30.0, 30, None),
    ],
)
def test_status_says_a_stack_idle_stop_the_host_has_not_heard_of(wanted: float, has: float, said: str | None) -> None:
    """`gpu-train:idleStopMinutes: 30` added to an SSH stack: status said "idle stop: off" and nothing more, as if the
    setting were ignored; the host learns it at the next train or setup."""
    target = SimpleNamespace(stack="lab", agent_settings=AgentSettings(idle_stop_minutes=wanted))
    lines = agent_lines({"agent": {"idleStopMinutes": has, "installed": True}}, target)  # type: ignore[arg-type]  # (a SimpleNamespace stands in for the Target)
    assert [x for x in lines if "the stack says" in x] == ([said] if said else [])
