"""Back by itself: the recovery's decisions as tables, and the function itself against a fake Compute API."""

from __future__ import annotations

import base64
import json
import time

import pytest

from agent import notify, recovery_call
from gpu_train import recovery
from gpu_train.recovery import DONE, RETRY, Event
from tests.google_compute import rfc3339
from tests.google_fake import FakeGoogle
from tests.webhook import Webhook

T0 = 1_790_000_000.0  # the preemption
EV = Event("preempted", "proj-1", "us-central1-a", "gpu-train-s", T0)


def entry(method: str = "compute.instances.preempted", name: str = "gpu-train-s", stamp: str = "2026-09-21T14:13:20.325309Z"):
    """A system-event LogEntry as the sink sends it (cloudaudit.googleapis.com%2Fsystem_event)."""
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": "Instance was preempted."},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/proj-1/zones/us-central1-a/instances/{name}",
            "request": {"@type": f"type.googleapis.com/{method}"},
        },
        "resource": {"type": "gce_instance", "labels": {"instance_id": "1844488", "project_id": "proj-1", "zone": "us-central1-a"}},
        "timestamp": stamp,
        "severity": "INFO",
        "logName": "projects/proj-1/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "operation": {"id": "systemevent-1694860946116", "producer": method, "first": True, "last": True},
    }


@pytest.mark.parametrize(
    "method,kind",
    [
        ("compute.instances.preempted", "preempted"),
        ("compute.instances.hostError", "host error"),
        ("compute.instances.guestTerminate", None),  # idle auto-stop: the guest's own
        ("v1.compute.instances.stop", None),  # vm-stop, running: false
        ("compute.instances.terminateOnMaxRunDuration", None),
    ],
)  # maxRunHours
def test_only_preemptions_and_host_errors_are_events(method: str, kind: str | None) -> None:
    ev = recovery.event_of(entry(method))
    assert (ev.kind if ev else None) == kind
    if ev:
        assert (ev.project, ev.zone, ev.instance) == ("proj-1", "us-central1-a", "gpu-train-s")
        assert ev.at == pytest.approx(1790000000.325309)


@pytest.mark.parametrize(
    "stamp,expected",
    [
        ("2026-09-21T14:13:20Z", 1790000000.0),
        ("2026-09-21T07:13:20.5-07:00", 1790000000.5),
        ("2026-09-21T14:13:20.123456789Z", 1790000000.123456),
        ("yesterday", None),
        (None, None),
    ],
)
def test_google_timestamps(stamp, expected) -> None:
    got = recovery.parse_time(stamp)
    assert got == (pytest.approx(expected) if expected else None)


def inst(status: str = "TERMINATED", label: str | None = "on", started: float | None = T0 - 3600, record: dict | None = None) -> dict:
    doc: dict = {
        "kind": "compute#instance",
        "name": "n",
        "status": status,
        "labels": {"gpu-train-stack": "s"},
        "metadata": {"kind": "compute#metadata", "fingerprint": "fp", "items": [{"key": "startup-script", "value": "#!"}]},
    }
    if label:
        doc["labels"][recovery.LABEL] = label
    if started:
        doc["lastStartTimestamp"] = rfc3339(started)
    if record is not None:
        doc["labels"].update(recovery.record_labels(record))
    return doc


GROUP = {"at": T0, "state": "stopping for the group", "event": "preempted"}
# (the node's document, is it the event's node?) -> its action: every kind of stop
NODES = [
    (inst(), True, recovery.START),  # preempted, TERMINATED since
    (inst(status="STOPPING"), True, recovery.WAIT),
    (inst(status="RUNNING"), True, recovery.NONE),  # back already (vm-start, a duplicate delivery)
    (inst(started=T0 + 600), True, recovery.NONE),  # came back, then stopped again: idle auto-stop, vm-stop
    (inst(label="off"), True, recovery.NONE),  # running: false / vm-stop while it was down
    (inst(label=None), True, recovery.NONE),  # a stack without recovery
    (None, True, recovery.GONE),  # `down` deleted it
    (inst(status="SUSPENDED"), True, recovery.NONE),  # a suspend is never ours
    (inst(status="RUNNING"), False, recovery.STOP),  # a cluster's survivor: the group restarts together
    (inst(), False, recovery.NONE),  # a node that stopped on its own before (idle auto-stop)
    (inst(record=GROUP), False, recovery.START),  # the survivor this recovery stopped
    (inst(status="RUNNING", record=GROUP), False, recovery.NONE),  # ... still stopping: its next look
]


@pytest.mark.parametrize("doc,is_event_node,action", NODES)
def test_every_kind_of_stop(doc, is_event_node, action) -> None:
    assert recovery.node_action(doc, EV, is_event_node)[0] == action


def test_a_cluster_starts_only_once_every_node_is_down() -> None:
    nodes = ["gpu-train-s-0", "gpu-train-s-1", "gpu-train-s-2"]
    ev = Event("preempted", "proj-1", "us-central1-a", nodes[1], T0)
    first = recovery.plan(ev, nodes, {nodes[0]: inst("RUNNING"), nodes[1]: inst(), nodes[2]: inst("RUNNING")})
    assert (first.stop, first.start, first.outcome) == ([nodes[0], nodes[2]], [], RETRY)
    stopping = recovery.plan(ev, nodes, {nodes[0]: inst("STOPPING", record=GROUP), nodes[1]: inst(), nodes[2]: inst(record=GROUP)})
    assert (stopping.start, stopping.waiting, stopping.outcome) == ([], [nodes[0]], RETRY)
    down = recovery.plan(ev, nodes, {n: inst(record=GROUP) for n in nodes})
    assert (down.start, down.outcome) == (nodes, DONE)
    assert recovery.plan(ev, ["other"], {}).start == []  # not this stack's VM


OP = {"kind": "compute#operation", "name": "operation-1", "status": "DONE"}
CAP = {
    **OP,
    "error": {
        "errors": [
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": "The zone ... does not have enough resources available to fulfill the request.",
            }
        ]
    },
    "httpErrorStatusCode": 503,
}


def http_error(code: int, message: str, reason: str = "") -> dict:
    return {"error": {"code": code, "message": message, "errors": [{"reason": reason, "message": message}]}}


# every answer instances.start can give: the call's HTTP status, the operation at its end
STARTS = [
    (200, OP, None, "started"),
    (200, CAP, None, "retry"),
    (200, {**OP, "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}]}}, None, "retry"),
    (200, {**OP, "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS'"}]}}, None, "retry"),
    (200, {**OP, "status": "RUNNING"}, None, "retry"),  # not done within the function's wait
    (200, {**OP, "error": {"errors": [{"code": "UNSUPPORTED_OPERATION", "message": "no"}]}}, None, "give up"),
    (400, None, http_error(400, "The resource is not ready", "resourceNotReady"), "retry"),
    (403, None, http_error(403, "Required 'compute.instances.start' permission", "forbidden"), "give up"),
    (404, None, http_error(404, "The resource was not found", "notFound"), "give up"),
    (429, None, http_error(429, "Rate limit exceeded", "rateLimitExceeded"), "retry"),
    (503, None, http_error(503, "Backend error", "backendError"), "retry"),
]


@pytest.mark.parametrize("status,operation,error,verdict", STARTS)
def test_every_start_answer(status, operation, error, verdict) -> None:
    assert recovery.start_answer(status, operation, error)[0] == verdict


def test_the_record_says_what_happened() -> None:
    rec = recovery.updated_record({}, EV, "coming back", T0 + 60, "zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED)", attempt=True)
    rec = recovery.updated_record(rec, EV, "coming back", T0 + 120, rec["why"], attempt=True)
    rec = recovery.updated_record(rec, EV, "coming back", T0 + 300, rec["why"], attempt=True)
    said = recovery.describe(rec, local=False)
    assert said == (f"preempted {recovery.clock(T0, False)}, coming back (attempt 3, zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED))")
    back = recovery.updated_record(rec, EV, "resumed", T0 + 1020)
    assert recovery.describe(back, local=False).endswith(f"resumed {recovery.clock(T0 + 1020, False)}")
    later = Event("preempted", EV.project, EV.zone, EV.instance, T0 + 7200)
    new = recovery.updated_record(back, later, "coming back", T0 + 7300)
    assert new["attempts"] == 0 and "resumedAt" not in new  # a new event starts a new record
    for one in (rec, back, new):  # labels keep it: what the function writes is what `status` and the host read
        assert recovery.record_of({"labels": recovery.record_labels(one)}) == {k: v for k, v in one.items() if k != "updated"} | {
            "updated": one["updated"]
        }
        assert all(len(v) <= 63 and set(v) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-") for v in recovery.record_labels(one).values())
    assert recovery.give_up_reason(EV, T0 + 3 * 3600, 2, 40) == "not back after 3.0 h and 40 attempt(s) (gpu-train:recoverHours = 2)"
    assert recovery.give_up_reason(EV, T0 + 3600, 2, 4) is None


# -- notifications ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url,kind,body",
    [
        ("https://hooks.slack.com/services/T/B/x", "application/json", {"text": "hi"}),
        ("https://discord.com/api/webhooks/1/x", "application/json", {"content": "hi", "allowed_mentions": {"parse": []}}),
        ("https://ntfy.sh/my-topic", "text/plain; charset=utf-8", "hi"),
    ],
)
def test_each_webhook_gets_its_own_body(url, kind, body) -> None:
    req = notify.request_for(url, "hi")
    assert req.get_method() == "POST" and req.get_header("Content-type") == kind
    assert (json.loads(req.data) if kind == "application/json" else req.data.decode()) == body


def test_a_failing_webhook_never_fails_the_sender(tmp_path) -> None:
    hook = Webhook()
    try:
        assert notify.send(hook.url, "gpu-train: ok")
        hook.status = 500
        assert not notify.send(hook.url, "gpu-train: refused")
        assert not notify.send("http://127.0.15.9:1/nothing", "gpu-train: nobody there", timeout=2)
        assert not notify.send(None, "x")
    finally:
        hook.close()
    notify.keep(str(tmp_path), "r_20260101_000000", "https://ntfy.sh/secret-topic")
    kept = tmp_path / notify.KEPT / "r_20260101_000000.url"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert notify.kept(str(tmp_path), "r_20260101_000000") == "https://ntfy.sh/secret-topic"
    kept.chmod(0o644)  # readable by others: not trusted, not used
    assert notify.kept(str(tmp_path), "r_20260101_000000") is None
    # A run launched before each run kept its own: the host's one webhook of then, trusted the same way.
    (tmp_path / notify.NOTIFY_FILE).write_text("https://ntfy.sh/old-topic\n")
    (tmp_path / notify.NOTIFY_FILE).chmod(0o600)
    assert notify.kept(str(tmp_path), "old_20250101_000000") == "https://ntfy.sh/old-topic"
    (tmp_path / notify.NOTIFY_FILE).chmod(0o640)
    assert notify.kept(str(tmp_path), "old_20250101_000000") is None


# -- the function, run here against the fake Compute API ------------------------------------------------------
@pytest.fixture
def google():
    fake = FakeGoogle()
    hook = Webhook()
    yield fake, hook
    fake.close()
    hook.close()


def vm(name: str, status: str = "TERMINATED", label: str = "on", started: float = T0 - 3600, local_ssd: bool = False) -> dict:
    """An instance as instances.get gives it: the stack's VMs run as a service account of their own (so
    setMetadata needs actAs on it, which the function lacks) and A2 Ultra, A3 and A4 bring Local SSD."""
    return {
        "kind": "compute#instance",
        "id": "77",
        "name": name,
        "status": status,
        "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a",
        "labels": {"gpu-train-stack": "s", recovery.LABEL: label},
        "lastStartTimestamp": rfc3339(started),
        "lastStopTimestamp": rfc3339(T0 + 25),
        "metadata": {"kind": "compute#metadata", "fingerprint": "fp-0", "items": [{"key": "startup-script", "value": "#!/bin/bash"}]},
        "labelFingerprint": "lf-0",
        "serviceAccounts": [{"email": "gpu-train-s-vm@proj-1.iam.gserviceaccount.com", "scopes": []}],
        "disks": [{"type": "PERSISTENT", "boot": True}] + [{"type": "SCRATCH", "interface": "NVME"}] * (16 if local_ssd else 0),
        "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": "203.0.113.50"}]}],
    }


def conf(fake: FakeGoogle, hook: Webhook, nodes: list[str], hours: float = 24) -> dict:
    return recovery_call.settings_from_env(
        {
            "GPU_TRAIN_STACK": "s",
            "GPU_TRAIN_GCP_PROJECT": "proj-1",
            "GPU_TRAIN_ZONE": "us-central1-a",
            "GPU_TRAIN_NODES": ",".join(nodes),
            "GPU_TRAIN_RECOVER_HOURS": str(hours),
            "GPU_TRAIN_NOTIFY": hook.url,
            "GPU_TRAIN_COMPUTE_URL": fake.url,
            "GPU_TRAIN_METADATA_URL": fake.url + "/computeMetadata/v1/",
            "GPU_TRAIN_OP_WAIT_S": "20",
            "GPU_TRAIN_OP_POLL_S": "0.02",  # the fake finishes each operation at once: no 1 s polls
        }
    )


def record(fake: FakeGoogle, name: str) -> dict:
    return recovery.record_of(next(i for i in fake.state["instances"]["proj-1"] if i["name"] == name))


def cloud_event(log_entry: dict) -> dict:
    return {
        "message": {"data": base64.b64encode(json.dumps(log_entry).encode()).decode(), "messageId": "1"},
        "subscription": "projects/proj-1/subscriptions/eventarc-x",
    }


def test_a_preempted_vm_is_started_after_the_zone_had_no_capacity(google) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    fake.state["start_answers"]["gpu-train-s"] = ["capacity", "capacity"]
    c = conf(fake, hook, ["gpu-train-s"])
    event = recovery.event_of(entry(stamp=rfc3339(time.time() - 60)))
    for attempt in (1, 2):
        with pytest.raises(recovery_call.Retry, match="zone out of capacity"):
            recovery_call.on_event_with(cloud_event(entry(stamp=rfc3339(event.at))), c)
        rec = record(fake, "gpu-train-s")
        assert (rec["state"], rec["attempts"]) == ("coming back", attempt)
    said = recovery.describe(rec)
    assert said.endswith("coming back (attempt 2, zone out of capacity (ZONE_RESOURCE_POOL_EXHAUSTED))"), said
    assert recovery_call.on_event_with(cloud_event(entry(stamp=rfc3339(event.at))), c).startswith("started")
    rec = record(fake, "gpu-train-s")
    assert (rec["state"], rec["attempts"]) == ("resumed", 3)
    assert fake.state["instances"]["proj-1"][0]["status"] == "RUNNING"
    # the other labels are kept as they were, and the metadata is never touched
    labels = fake.state["instances"]["proj-1"][0]["labels"]
    assert {"gpu-train-stack", recovery.LABEL} <= set(labels) and all(len(v) <= 63 for v in labels.values())
    assert [i["key"] for i in fake.state["instances"]["proj-1"][0]["metadata"]["items"]] == ["startup-script"]
    assert "gpu-train-s preempted at" in hook.wait_for("bringing it back") and hook.wait_for("back: gpu-train-s")
    assert len(hook.received) == 2  # preempted, back: not one per attempt
    # a second delivery of the same event changes nothing
    starts = [c for c in fake.state["calls"] if c[1].endswith("/start")]
    recovery_call.on_event_with(cloud_event(entry(stamp=rfc3339(event.at))), c)
    assert [c for c in fake.state["calls"] if c[1].endswith("/start")] == starts


@pytest.mark.parametrize(
    "doc",
    [
        vm("gpu-train-s", label="off"),  # running: false, vm-stop
        vm("gpu-train-s", started=T0 + 600),
    ],
)  # came back, then idle auto-stop
def test_a_meant_stop_stays_stopped(google, doc) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = [doc]
    outcome, _ = recovery_call.recover(EV, conf(fake, hook, ["gpu-train-s"]), now=T0 + 900)
    assert outcome == DONE
    assert not [c for c in fake.state["calls"] if c[0] == "POST" and "/instances/" in c[1]]
    assert hook.received == []


def test_a_deleted_stack_is_left_alone(google) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = []
    assert recovery_call.recover(EV, conf(fake, hook, ["gpu-train-s"]), now=T0 + 60)[0] == DONE


def test_it_gives_up_after_the_stacks_bound_and_says_why(google) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    outcome, why = recovery_call.recover(EV, conf(fake, hook, ["gpu-train-s"], hours=2), now=T0 + 2.5 * 3600)
    assert outcome == DONE and "recoverHours = 2" in why
    rec = record(fake, "gpu-train-s")
    assert rec["state"] == "gave up" and "recoverHours = 2" in recovery.describe(rec)
    assert "gave up" in hook.wait_for("recoverHours")
    assert not [c for c in fake.state["calls"] if c[1].endswith("/start")]


def test_every_node_of_a_cluster_comes_back_together(google) -> None:
    fake, hook = google
    nodes = ["gpu-train-s-0", "gpu-train-s-1"]
    fake.state["instances"]["proj-1"] = [vm(nodes[0], status="RUNNING"), vm(nodes[1])]
    c = conf(fake, hook, nodes)
    ev = Event("preempted", "proj-1", "us-central1-a", nodes[1], time.time() - 30)
    outcome, why = recovery_call.recover(ev, c)
    assert outcome == RETRY and nodes[0] in why
    deadline = time.time() + 10
    while fake.state["instances"]["proj-1"][0]["status"] != "TERMINATED" and time.time() < deadline:
        time.sleep(0.05)
    assert record(fake, nodes[0])["state"] == "stopping for the group"
    assert recovery_call.recover(ev, c)[0] == DONE
    assert [i["status"] for i in fake.state["instances"]["proj-1"]] == ["RUNNING", "RUNNING"]
    assert [record(fake, n)["state"] for n in nodes] == ["resumed", "resumed"]


def test_an_api_that_keeps_failing_is_retried_only_within_the_bound(google) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    c = conf(fake, hook, ["gpu-train-s"], hours=1)
    c["compute"] = "http://127.0.15.1:9"  # nothing listens: every call fails
    recent = cloud_event(entry(stamp=rfc3339(time.time() - 60)))
    with pytest.raises(OSError):
        recovery_call.on_event_with(recent, c)  # an error to the trigger: delivered again
    old = cloud_event(entry(stamp=rfc3339(time.time() - 7200)))
    said = recovery_call.on_event_with(old, c)
    assert said.startswith("gave up after an error") and "recoverHours = 1" in said
    assert "gave up" in hook.wait_for("recoverHours = 1")


def test_a_start_that_ended_after_the_functions_wait_is_announced_on_the_next_look(google) -> None:
    fake, hook = google
    rec = recovery.updated_record({}, EV, "coming back", T0 + 60, "the start is still in progress", attempt=True)
    doc = vm("gpu-train-s", status="RUNNING", started=T0 + 200)
    doc["labels"].update(recovery.record_labels(rec))
    fake.state["instances"]["proj-1"] = [doc]
    assert recovery_call.recover(EV, conf(fake, hook, ["gpu-train-s"]), now=T0 + 400)[0] == DONE
    assert record(fake, "gpu-train-s")["state"] == "resumed"
    assert "back: gpu-train-s" in hook.wait_for("started again")


@pytest.mark.parametrize("where", ["projects/proj-2/zones/us-central1-a", "projects/proj-1/zones/europe-west4-a"])
def test_an_event_of_another_project_or_zone_is_not_this_stacks(google, where: str) -> None:
    """The function took project and zone from the event: whoever could publish to its topic chose where it
    started (and stopped) VMs of the same name."""
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    forged = entry(stamp=rfc3339(time.time() - 60))
    forged["protoPayload"]["resourceName"] = f"{where}/instances/gpu-train-s"
    said = recovery_call.on_event_with(cloud_event(forged), conf(fake, hook, ["gpu-train-s"]))
    assert said.endswith("is not stack s's project and zone: ignored")
    assert fake.state["calls"] == [] and hook.received == []
