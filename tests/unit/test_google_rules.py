"""The rules only Google's cloud would enforce, enforced by the fake the way Google documents them, and the
code meeting each: the recovery's record, its Local SSD group stop, its 24 h retry window, host
maintenance (DENSE reservations: tests/unit/test_reservations.py). Each test here failed against the code before issue 37."""

from __future__ import annotations

import time

import pytest

from agent import recovery_call
from gpu_train import recovery
from gpu_train.catalog.loader import load_catalog
from infra import recovery as recovery_program
from tests.google_discovery import schema_fields
from tests.google_fake import FakeGoogle, Trigger
from tests.unit.test_recovery import cloud_event, conf, entry, record, vm
from tests.webhook import Webhook

CATALOG = load_catalog()


@pytest.fixture
def google():
    fake = FakeGoogle("127.0.37.1")
    hook = Webhook()
    yield fake, hook
    fake.close()
    hook.close()


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "not in time"
        time.sleep(0.02)


# -- the recovery function --------------------------------------------------------------------------------
def test_the_record_is_written_where_the_function_may_write_it(google) -> None:
    """setMetadata on a VM that runs as a service account needs actAs on that account, which the function's
    identity lacks: the fake answers Google's 403, and the record (labels) must still be there."""
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    fake.state["start_answers"]["gpu-train-s"] = ["capacity"]
    c = conf(fake, hook, ["gpu-train-s"])
    with pytest.raises(recovery_call.Retry):
        recovery_call.on_event_with(cloud_event(entry(stamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60)))), c)
    assert record(fake, "gpu-train-s")["state"] == "coming back"
    assert not [r for r in fake.state["requests"] if r[1].endswith("/setMetadata")]


def test_a_refused_record_write_is_retried_not_taken_for_done(google) -> None:
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    fake.state["instances"]["proj-1"][0]["serviceAccounts"] = []  # (setMetadata would pass: the label write is the one refused)
    fake.state["refuse_labels"] = True
    ev = recovery.Event("preempted", "proj-1", "us-central1-a", "gpu-train-s", time.time() - 60)
    with pytest.raises(recovery_call.Retry, match="setLabels gpu-train-s: 403"):
        recovery_call.recover(ev, conf(fake, hook, ["gpu-train-s"]))
    assert not [c for c in fake.state["calls"] if c[1].endswith("/start")]  # nothing started on a record not kept


def test_the_group_stop_of_a_local_ssd_node_discards_it_and_checks_the_answer(google) -> None:
    fake, hook = google
    nodes = ["gpu-train-s-0", "gpu-train-s-1"]
    fake.state["instances"]["proj-1"] = [vm(nodes[0], status="RUNNING", local_ssd=True), vm(nodes[1], local_ssd=True)]
    c = conf(fake, hook, nodes)
    ev = recovery.Event("preempted", "proj-1", "us-central1-a", nodes[1], time.time() - 30)
    assert recovery_call.recover(ev, c)[0] == recovery.RETRY
    wait_for(lambda: fake.state["instances"]["proj-1"][0]["status"] == "TERMINATED")
    assert fake.state["instances"]["proj-1"][0]["localSsdDiscarded"]
    stop = next(r for r in fake.state["requests"] if r[1].endswith("/stop"))
    assert stop[2] == {"discardLocalSsd": ["true"]} and stop[4] == []


def test_a_refused_group_stop_is_retried(google) -> None:
    fake, hook = google
    nodes = ["gpu-train-s-0", "gpu-train-s-1"]
    fake.state["instances"]["proj-1"] = [vm(nodes[0], status="RUNNING", local_ssd=True), vm(nodes[1], local_ssd=True)]
    del fake.state["instances"]["proj-1"][0]["disks"][1:]  # the API's view and the function's disagree: a 400 ...
    fake.state["instances"]["proj-1"][0]["disks"].append({"type": "SCRATCH"})
    ev = recovery.Event("preempted", "proj-1", "us-central1-a", nodes[1], time.time() - 30)

    class Blind(recovery_call.Compute):  # ... as when the function reads a document without the disks
        def get(self, name):
            doc = super().get(name)
            return doc and {k: v for k, v in doc.items() if k != "disks"}

    api = Blind("proj-1", "us-central1-a", fake.url, fake.url + "/computeMetadata/v1/")
    with pytest.raises(recovery_call.Retry, match=r"instances.stop gpu-train-s-0: 400 VM has a Local SSD attached"):
        recovery_call.recover(ev, conf(fake, hook, nodes), api=api)


def test_it_gives_up_and_says_so_within_the_triggers_24_hours(google) -> None:
    """The trigger retries for 24 h, not 7 days: with recoverHours 24 the function must give up (record it,
    tell the webhook) while deliveries still come, or the VM's record says "coming back" for ever."""
    fake, hook = google
    fake.state["instances"]["proj-1"] = [vm("gpu-train-s")]
    fake.state["start_answers"]["gpu-train-s"] = ["capacity"] * 1000
    fake.state["capacity_delay_s"] = 0
    c = {**conf(fake, hook, ["gpu-train-s"], hours=24), "opPollS": 0.005}
    published = time.time()
    data = cloud_event(entry(stamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(published))))
    trigger = Trigger(lambda d, now: recovery_call.on_event_with(d, c, now))
    assert trigger.publish(data, published)  # the last delivery is the function's "done": it gave up
    last, outcome = trigger.deliveries[-1]
    assert outcome == "ok" and last < Trigger.WINDOW_S
    rec = record(fake, "gpu-train-s")
    assert rec["state"] == "gave up" and "24 h retry window" in recovery.describe(rec), rec
    assert "gave up" in hook.wait_for("retry window")


def test_a_bound_past_the_window_is_refused() -> None:
    from gpu_train.gcp.validate import check
    from gpu_train.stack.config import ConfigError
    from tests.conftest import gcp_raw

    with pytest.raises(ConfigError, match="recoverHours"):
        check(gcp_raw(spot=True, recoverHours=48), "s", CATALOG)


@pytest.mark.parametrize(
    ("settings", "events"),
    [
        ({"spot": True}, set(recovery.EVENTS)),
        ({"flexStart": True, "maxRunHours": 8, "machineType": "a3-highgpu-8g", "gpuType": None, "gpuCount": None}, set(recovery.EVENTS)),
    ],
)
def test_host_maintenance_is_an_event_where_the_vm_will_not_restart_itself(settings: dict, events: set) -> None:
    text = recovery_program.log_filter("proj-1", "us-central1-a", ["gpu-train-s"])
    assert "compute.instances.terminateOnHostMaintenance" in text and all(e in text for e in events)
    # the filter's fields are LogEntry's (logging.v2's discovery document)
    assert {"logName", "protoPayload"} <= schema_fields("logging.v2", "LogEntry")
    ev = recovery.event_of(entry(method="compute.instances.terminateOnHostMaintenance"))
    assert ev is not None and ev.kind == "host maintenance"


def test_plan_prints_the_vms_scopes_as_declared(public_key) -> None:
    from infra.ops import plan
    from tests.conftest import gcp_raw

    raw = gcp_raw(spot=True, bucket="gs://team-bucket/runs")
    raw["gpu-train:sshPublicKey"] = str(public_key)
    text, _ = plan.plan(raw, "s")
    assert "(scopes: logging.write, monitoring.write, devstorage.read_write, compute.readonly)" in text, text


def _preview(public_key, stack: str = "s", **settings):
    from infra import program
    from infra.ops import preview
    from tests.conftest import gcp_raw

    raw = gcp_raw(**settings)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    result = preview.run(program.main, stack=stack, config=raw)
    assert result.error is None, result.error
    return result


def test_a_stack_named_google_gets_a_bucket_cloud_storage_takes(public_key) -> None:
    from gpu_train.gcp import names
    from gpu_train.stack.bucket import name_problem

    result = _preview(public_key, stack="my-google-run", spot=True)
    (source,) = [b.inputs for b in result.of_type("storage/bucket:Bucket")]
    assert name_problem(source["name"]) is None and "google" not in source["name"], source["name"]
    assert source["softDeletePolicy"] == {"retentionDurationSeconds": 0}
    assert names.check("my-google-run") == []


def test_the_function_is_built_as_an_account_of_the_stacks_own(public_key) -> None:
    result = _preview(public_key, spot=True)
    (fn,) = result.of_type("cloudfunctionsv2/function:Function")
    builder = next(a.inputs for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-recovery-build-sa")
    email = f"{builder['accountId']}@proj-1.iam.gserviceaccount.com"
    assert fn.inputs["buildConfig"]["serviceAccount"] == f"projects/proj-1/serviceAccounts/{email}"
    roles = {(g.inputs["role"], g.inputs["member"]) for g in result.of_type("IAMMember")}
    assert ("roles/cloudbuild.builds.builder", f"serviceAccount:{email}") in roles
    assert ("roles/storage.objectViewer", f"serviceAccount:{email}") in roles


@pytest.mark.parametrize(("keep", "policy"), [(False, {"retentionDurationSeconds": 0}), (True, None)])
def test_a_created_bucket_has_soft_delete_off_unless_kept(public_key, keep: bool, policy) -> None:
    result = _preview(public_key, bucket="gs://team-runs-bucket/runs", bucketCreate=True, bucketSoftDelete=keep)
    (created,) = [b.inputs for b in result.of_type("storage/bucket:Bucket") if b.inputs["name"] == "team-runs-bucket"]
    assert created.get("softDeletePolicy") == policy


def test_a_spot_vm_can_have_its_notice_earlier_and_plan_says_the_grace(public_key) -> None:
    from infra.ops import plan

    result = _preview(public_key, spot=True, preemptionNoticeSeconds=120)
    (inst,) = result.of_type("compute/instance:Instance")
    assert inst.inputs["scheduling"]["preemptionNoticeDuration"] == {"seconds": 120}
    raw = _raw(public_key, spot=True, preemptionNoticeSeconds=120)
    text, _ = plan.plan(raw, "s")
    assert "Shutdown grace: spot VM: at a preemption, a notice 120 s before it (metadata `preempted`, $GPU_TRAIN_NOTICE)" in text
    refused, code = plan.plan(_raw(public_key, preemptionNoticeSeconds=120), "s")  # a standard VM gets no notice
    assert code != 0 and "gpu-train:preemptionNoticeSeconds" in refused and "spot VMs only" in refused, refused


def _raw(public_key, **settings) -> dict:
    from tests.conftest import gcp_raw

    raw = gcp_raw(**settings)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    return raw
