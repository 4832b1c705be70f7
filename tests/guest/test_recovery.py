"""Back by itself, end to end in a booted guest: a preempted spot VM is started again by the stack's recovery
function (run here, against the fake Compute API, whose start boots the guest again), the run resumes from its
checkpoint and finishes with nobody at the laptop, the webhook hears of it all; a later idle stop stays stopped.

The guest is "preempted" as Compute Engine does it: the metadata server's ``instance/preempted`` turns TRUE,
then an orderly power-off; the fake API then says TERMINATED, and the recovery gets the system event's log
entry as the sink would send it. What the function writes in the instance's metadata reaches the guest's
metadata server, as Compute Engine's does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent import recovery_call
from gpu_train import recovery
from tests.conftest import gcp_raw
from tests.google_compute import rfc3339
from tests.google_fake import TOKEN, FakeGoogle
from tests.guest.fabuser import EXAMPLE, FabUser
from tests.guest.harness import MetadataServer
from tests.guest.metadata import METADATA_ENV
from tests.guest.startup import startup_script_of
from tests.webhook import Webhook

QUICK_TICK = "[Timer]\nOnBootSec=\nOnUnitActiveSec=1s\nAccuracySec=50ms\n"  # as in test_lifecycle
NAME, PROJECT, ZONE = "gpu-train-guest", "proj-1", "us-central1-a"


def log_entry(method: str, at: float) -> dict:
    """The system event as Cloud Logging writes it, wrapped as the trigger delivers it (messagePublished)."""
    import base64

    entry = {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "methodName": method,
            "serviceName": "compute.googleapis.com",
            "resourceName": f"projects/{PROJECT}/zones/{ZONE}/instances/{NAME}",
            "authenticationInfo": {"principalEmail": "system@google.com"},
        },
        "resource": {"type": "gce_instance", "labels": {"project_id": PROJECT, "zone": ZONE}},
        "timestamp": rfc3339(at),
        "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Fsystem_event",
    }
    return {"message": {"data": base64.b64encode(json.dumps(entry).encode()).decode(), "messageId": "7"}}


def test_a_preempted_vm_comes_back_by_itself_and_an_idle_stop_stays_stopped(
    make_guest, metadata_server: MetadataServer, public_key: Path, tmp_path: Path
) -> None:
    hook, google = Webhook(), FakeGoogle()
    try:
        raw = gcp_raw(sshUser="trainer", spot=True, idleStopMinutes=0.05)  # 3 s idle (its ticks start below)
        guest = make_guest(startup_script_of(raw))
        # The booted agent reads the recovery's record (the instance's labels) from the Compute API, with the
        # VM's own token: the fake is that API, and the metadata server says who the VM is.
        guest.write(
            "/etc/systemd/system.conf.d/gpu-train-guest.conf",
            f"[Manager]\nDefaultEnvironment={METADATA_ENV}={metadata_server.url} OMP_NUM_THREADS=1 "
            f"{recovery.COMPUTE_URL_ENV}={google.url}\n",
        )
        for path, value in (("project/project-id", PROJECT), ("instance/zone", f"projects/123/zones/{ZONE}"), ("instance/name", NAME)):
            metadata_server.set(path, value)
        metadata_server.set("instance/service-accounts/default/token", json.dumps({"access_token": TOKEN, "expires_in": 3599}))
        guest.add_python_with_torch()
        guest.write("/etc/systemd/system/gpu-train-tick.timer.d/quick.conf", QUICK_TICK)
        guest.boot()
        user = FabUser(tmp_path / "user", guest, public_key.with_suffix(""), extra=f"  gpu-train:notify: {hook.url}\n")
        inst = {
            "kind": "compute#instance",
            "id": "4242",
            "name": NAME,
            "status": "RUNNING",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}",
            "labels": {"gpu-train-stack": "guest", recovery.LABEL: "on"},
            "lastStartTimestamp": rfc3339(time.time()),
            "metadata": {"kind": "compute#metadata", "fingerprint": "fp-0", "items": []},
            "labelFingerprint": "lf-0",
            "serviceAccounts": [{"email": f"gpu-train-guest@{PROJECT}.iam.gserviceaccount.com"}],
        }
        google.state["instances"][PROJECT] = [inst]

        def on_start(_name: str) -> None:  # Compute Engine powers the VM on (its labels hold the function's record)
            metadata_server.set("instance/preempted", "FALSE")
            guest.boot()

        google.state["on_start"] = on_start
        conf = recovery_call.settings_from_env(
            {
                "GPU_TRAIN_STACK": "guest",
                "GPU_TRAIN_GCP_PROJECT": PROJECT,
                "GPU_TRAIN_ZONE": ZONE,
                "GPU_TRAIN_NODES": NAME,
                "GPU_TRAIN_RECOVER_HOURS": "24",
                "GPU_TRAIN_NOTIFY": hook.url,
                "GPU_TRAIN_COMPUTE_URL": google.url,
                "GPU_TRAIN_METADATA_URL": google.url + "/computeMetadata/v1/",
                "GPU_TRAIN_OP_WAIT_S": "180",
            }
        )

        run = user.train("--dir", str(EXAMPLE), "--script", "train.py", "--args", "--steps 300 --checkpoint-every 100000 --step-time 0.03")
        assert "notify" not in json.loads((user.root / "runs" / run / "spec.json").read_text())
        assert guest.sh(f"stat -c %a ~trainer/gpu-train/notify/{run}.url").stdout.strip() == "600"  # the run's own webhook
        at_step = user.wait_step(run, 30)

        # Preempted: the notice, then Compute Engine's orderly power-off; the instance is TERMINATED.
        metadata_server.set("instance/preempted", "TRUE")
        preempted_at = time.time()
        guest.power_off()
        inst.update(status="TERMINATED", lastStopTimestamp=rfc3339(time.time()))
        log = user.log(run)
        assert "signal 15: saved ckpt_" in log and user.state(run)["state"] == "interrupted"

        # The zone has no capacity at first: the function says so and asks to be called again.
        google.state["start_answers"][NAME] = ["capacity"]
        event = log_entry("compute.instances.preempted", preempted_at)
        with pytest.raises(recovery_call.Retry, match="zone out of capacity"):
            recovery_call.on_event_with(event, conf)
        said = recovery.describe(recovery.record_of(inst))
        assert "coming back (attempt 1, zone out of capacity" in said, said
        assert not guest.up
        # The trigger's next delivery: started, and the guest boots.
        assert recovery_call.on_event_with(event, conf).startswith("started")
        assert guest.up
        user.wait_for("the resumed job", lambda: "resumed from ckpt_" in user.log(run)[len(log) :])
        done = user.fab("logs", "--follow", "--run", run, timeout=300)
        assert done.returncode == 0, done.stderr
        info = user.run_status(run)
        assert info["state"] == "succeeded" and info["resumes"] == 1 and info["preemptions"] == 1
        (back,) = info["returns"]
        assert back["event"] == "preempted" and back["attempts"] == 2 and back["at"] == pytest.approx(preempted_at, abs=1)
        assert "resumed" in user.fab("status", check=True).stdout
        saved = sorted((user.root / "runs" / run / "job" / "checkpoints").glob("ckpt_*.pt"))
        assert saved and int(saved[-1].stem.split("_")[1]) >= at_step

        hook.wait_for(f"{NAME} preempted at")
        hook.wait_for(f"back: {NAME} started again")
        ended = hook.wait_for(f"{run} succeeded (exit 0)")
        assert " after 0h0" in ended and ended.count(": ") >= 2  # its duration and its last line

        # Idle now: the stack's idle stop powers it off. A late delivery of the old preemption (at least once)
        # or any stop event must not start it again.
        starts = [c for c in google.state["calls"] if c[1].endswith("/start")]
        user.end_shared_connection()  # the tasks' shared connection is an SSH session the idle clock waits for
        guest.sh("systemctl start gpu-train-tick.service")
        guest.wait_down(timeout=60)
        inst.update(status="TERMINATED", lastStopTimestamp=rfc3339(time.time()))
        outcome = recovery_call.on_event_with(event, conf)
        assert "stopped again after it came back" in outcome
        assert (
            recovery_call.on_event_with(log_entry("compute.instances.guestTerminate", time.time()), conf)
            == "not a preemption, host error or host maintenance"
        )
        assert [c for c in google.state["calls"] if c[1].endswith("/start")] == starts
        time.sleep(2)
        assert not guest.up and inst["status"] == "TERMINATED"
    finally:
        hook.close()
        google.close()
