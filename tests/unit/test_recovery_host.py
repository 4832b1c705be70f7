"""What the recovery's record becomes where users look (`status`, `ls`, a stopped VM's message), and the
host's own notification of a run's end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent import notify, wrap
from gpu_train import contract, recovery
from gpu_train.views import listing
from remote.ssh import vmprobe
from remote.tasks.render import run_table
from tests.google_fake import TOKEN, FakeGoogle
from tests.webhook import Webhook

T0 = 1_790_000_000.0


def record(state: str, attempts: int = 0, why: str = "", **more) -> dict:
    return {"event": "preempted", "at": T0, "state": state, "attempts": attempts, "why": why, **more}


def inst(rec: dict | None, status: str = "TERMINATED", name: str = "gpu-train-s") -> dict:
    return {
        "name": name,
        "status": status,
        "lastStopTimestamp": "2026-09-21T07:13:45.000-07:00",
        "labels": {"gpu-train-stack": "s", **(recovery.record_labels(rec) if rec is not None else {})},
    }


@pytest.mark.parametrize("interrupted,expected", [(T0 + 20, True), (T0 - 30, True), (T0 + 3600, False), (None, False)])
def test_a_run_keeps_the_return_of_the_stop_that_interrupted_it(interrupted, expected) -> None:
    ret = recovery.run_return(record("coming back", 3), interrupted, T0 + 1020)
    assert (ret is not None) == expected
    if ret:
        assert ret == {"event": "preempted", "at": T0, "back": T0 + 1020, "attempts": 3}
    assert recovery.run_return({}, T0, T0 + 5) is None  # no record: a reboot, an idle stop, vm-stop
    why = "not back after 24.0 h and 40 attempt(s) (gpu-train:recoverHours = 24)"
    late = recovery.run_return(record("gave up", 40, why), T0 + 20, T0 + 90000)
    assert late is not None and late["gaveUp"] == why  # the run's record says why it was not brought back
    assert f"not brought back ({why}); resumed" in recovery.describe_return(late)


def test_status_shows_each_return() -> None:
    run = {
        "id": "train_20260921_141300",
        "state": "running",
        "resumes": 1,
        "preemptions": 1,
        "durationS": 4000,
        "returns": [{"event": "preempted", "at": T0, "back": T0 + 1020, "attempts": 3}],
    }
    (row,) = run_table([run])[1:]
    clock = time.strftime("%H:%M", time.localtime(T0))
    back = time.strftime("%H:%M", time.localtime(T0 + 1020))
    assert f"preempted {clock}, resumed {back} (3 attempts)" in row and "preempted 1x" in row


def test_ls_and_a_stopped_vm_say_what_the_recovery_is_doing() -> None:
    coming = inst(record("coming back", 3, "zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED)"))
    clock = time.strftime("%H:%M", time.localtime(T0))
    said = f"preempted {clock}, coming back (attempt 3, zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED))"
    assert listing.recovery_notes([coming], T0 + 600) == [said]
    assert listing.recovery_notes([coming, inst(None, "RUNNING", "gpu-train-s-1")], T0 + 600) == [f"gpu-train-s: {said}"]
    assert listing.recovery_notes([inst(None)], T0 + 600) == []
    back = inst(record("resumed", 3, resumedAt=T0 + 1020), "RUNNING")
    assert listing.recovery_notes([back], T0 + 3600)[0].endswith(f"resumed {time.strftime('%H:%M', time.localtime(T0 + 1020))}")
    assert listing.recovery_notes([back], T0 + 2 * 86400) == []  # old news
    started_by_hand = inst(record("gave up", 40, "not back after 24.0 h"), "RUNNING")
    assert listing.recovery_notes([started_by_hand], T0 + 90000) == []
    assert listing.recovery_notes([inst(record("gave up", 40, "not back after 24.0 h"))], T0 + 90000) != []
    vm = {"name": "gpu-train-s", "zone": "us-central1-a", "project": "proj-1", "spot": True, "idleStopMinutes": 30}
    msg = vmprobe.stopped_message(coming, "s", vm, T0 + 600)
    assert msg is not None and said in msg and "recovery starts it" in msg
    gave_up = inst(record("gave up", 40, "not back after 24.0 h and 40 attempt(s) (gpu-train:recoverHours = 24)"))
    msg = vmprobe.stopped_message(gave_up, "s", vm, T0 + 86400)
    assert msg is not None and "recoverHours = 24" in msg and "gcloud compute instances start" in msg
    plain = vmprobe.stopped_message(inst(None), "s", vm, T0 + 600)
    assert plain is not None and "recovery" not in plain  # an idle stop or vm-stop: as before


def run_dir(root: Path, rank: int | None, state: dict) -> Path:
    d = root / "runs" / "train_20260921_141300"
    (d / "job").mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps({"runId": d.name, "base": "train", "node": None if rank is None else {"rank": rank}}))
    (d / "state.json").write_text(json.dumps(state))
    (d / "log").write_text("step 99 loss 0.1\nsaved ckpt_000099.pt\n")
    return d


@pytest.mark.parametrize("rank,told", [(None, True), (0, True), (1, False)])
def test_the_host_tells_the_webhook_how_a_run_ended_once_per_cluster(tmp_path: Path, rank, told: bool) -> None:
    hook = Webhook()
    try:
        d = run_dir(tmp_path, rank, {"state": "succeeded", "exitCode": 0, "created": T0, "ended": T0 + 3725})
        notify.keep(str(tmp_path), d.name, hook.url)  # as the run's launch keeps it
        wrap.announce_end(str(d))
        if told:
            (text,) = hook.texts()
            assert text.startswith("gpu-train: train_20260921_141300 succeeded (exit 0) after 1h02m on ")
            assert text.endswith(": saved ckpt_000099.pt")
        else:
            assert hook.texts() == []
    finally:
        hook.close()


def test_a_run_end_with_no_webhook_or_a_dead_one_is_quiet(tmp_path: Path) -> None:
    d = run_dir(tmp_path, None, {"state": "failed", "exitCode": 1, "created": T0, "ended": T0 + 5})
    wrap.announce_end(str(d))  # no webhook kept: nothing to do
    notify.keep(str(tmp_path), d.name, "http://127.0.15.9:9/nobody-listens")
    started = time.monotonic()
    wrap.announce_end(str(d))
    assert time.monotonic() - started < notify.TIMEOUT_S + 1


def test_the_webhook_travels_in_the_spec() -> None:
    spec = contract.JobSpec(run_id="r_20260921_141300", base="r", notify="https://ntfy.sh/t")
    assert contract.JobSpec.from_json(spec.to_json()).notify == "https://ntfy.sh/t"
    assert "notify" not in contract.JobSpec(run_id="r_20260921_141300", base="r").to_json()


@pytest.mark.parametrize(
    "ended,nnodes,lost",
    [(T0 + 40, 2, True), (T0 - 60, 4, True), (T0 + 40, 1, False), (T0 + 3600, 2, False), (T0 - 600, 2, False), (None, 2, False)],
)
def test_a_cluster_part_that_failed_as_its_group_lost_a_node(ended, nnodes: int, lost: bool) -> None:
    assert recovery.lost_its_group(record("coming back", 1), ended, nnodes) is lost
    assert recovery.lost_its_group({}, T0, 2) is False  # no recovery behind it: a failure of its own


@pytest.fixture
def booted(tmp_path: Path, monkeypatch):
    """A REMOTE_ROOT on a "VM" whose metadata server holds the recovery's record; relaunches are noted."""
    from agent import lifecycle
    from tests.guest.metadata import MetadataServer

    server = MetadataServer().start()
    (tmp_path / "agent.json").write_text(json.dumps({"gcp": True, "metadataUrl": server.url}))
    google = FakeGoogle("127.0.37.2")  # the VM reads its own labels from the Compute API, with its own token
    monkeypatch.setenv(recovery.COMPUTE_URL_ENV, google.url)
    for path, value in (("project/project-id", "proj-1"), ("instance/zone", "projects/123/zones/us-central1-a"), ("instance/name", "n")):
        server.set(path, value)
    server.set("instance/service-accounts/default/token", json.dumps({"access_token": TOKEN, "expires_in": 3599}))
    google.state["instances"]["proj-1"] = [
        {"name": "n", "zone": "projects/proj-1/zones/us-central1-a", "status": "RUNNING", "labels": {"gpu-train-stack": "s"}}
    ]
    server.google = google
    started: list[str] = []
    monkeypatch.setattr(lifecycle, "start_wrapper", lambda root, run_id: started.append(run_id))

    def add(name: str, state: dict, nnodes: int | None = None) -> None:
        d = tmp_path / "runs" / name
        (d / "job").mkdir(parents=True)
        node = {"rank": 1, "nnodes": nnodes} if nnodes else None
        (d / "spec.json").write_text(json.dumps({"runId": name, "base": "train", "node": node}))
        (d / "state.json").write_text(json.dumps(state))

    yield tmp_path, server, add, started
    server.stop()
    google.close()


def test_boot_relaunches_the_group_and_keeps_each_return(booted) -> None:
    from agent import lifecycle

    root, server, add, started = booted
    server.google.state["instances"]["proj-1"][0]["labels"].update(recovery.record_labels(record("coming back", 2, "starting")))
    add("part_20260921_141300", {"state": "failed", "exitCode": 1, "ended": T0 + 35, "resumes": 0}, nnodes=2)
    add("solo_20260921_141300", {"state": "failed", "exitCode": 1, "ended": T0 + 35}, nnodes=None)
    add("late_20260921_141300", {"state": "failed", "exitCode": 1, "ended": T0 + 5000}, nnodes=2)
    add("cut_20260921_141300", {"state": "interrupted", "interruptedAt": T0 + 10, "preempted": True})
    done = lifecycle.cmd_boot(str(root))
    assert sorted(started) == ["cut_20260921_141300", "part_20260921_141300"], done
    cut = json.loads((root / "runs" / "cut_20260921_141300" / "state.json").read_text())
    assert [(r["event"], r["at"], r["attempts"]) for r in cut["returns"]] == [("preempted", T0, 2)]
    assert cut["preemptions"] == 1 and cut["resumes"] == 1
    part = json.loads((root / "runs" / "part_20260921_141300" / "state.json").read_text())
    assert part["state"] == "starting" and part["resumes"] == 1 and part["exitCode"] is None
    assert "relaunched with the group" in (root / "agent.log").read_text()
    for name in ("solo_20260921_141300", "late_20260921_141300"):  # failures of their own stay failed
        assert json.loads((root / "runs" / name / "state.json").read_text())["state"] == "failed"
