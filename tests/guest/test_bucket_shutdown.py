"""A spot VM going down with a bucket: the checkpoint the job writes on SIGTERM reaches the bucket,
verified, inside Compute Engine's 30 s, under a real systemd stopping the run's unit as a shutdown
does (KillMode=control-group, TimeoutStopSec=25 s, then SIGKILL: agent/units.py).

The bucket is a real gcp-storage-emulator on this machine's loopback (the guest shares its network);
the run's user's SSH sessions carry STORAGE_EMULATOR_HOST, which the agent passes into the run's unit.
The job's Python is the guest's /opt/conda one, which sees this machine's site-packages
(google-cloud-storage included), as a Deep Learning VM's ships it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agent import composite
from tests.conftest import gcp_raw
from tests.gcs import Emulator, area
from tests.guest.fabuser import FabUser
from tests.guest.startup import startup_script_of

CKPT_MB = 256  # past composite.PARALLEL_FROM: the last upload goes in parallel parts
# The job (the guest's /opt/conda Python): up, then on SIGTERM (the machine going down) writes its last
# checkpoint in its own process, as torch.save does, and ends.
JOB = (
    "/opt/conda/bin/python -c 'import os, signal, sys, time\n"
    "def save(*_):\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    '    path = os.path.join(os.environ["JOB_DIR"], "last.ckpt")\n'
    f'    open(path + ".tmp", "wb").write(os.urandom({CKPT_MB << 20}))\n'
    '    os.replace(path + ".tmp", path)\n'
    '    print("saved", flush=True)\n'
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    'print("up", flush=True)\n'
    "while True: time.sleep(0.2)\n'"
)


@pytest.fixture
def emulator(tmp_path: Path):
    emu = Emulator("ckpt", tmp_path / "emulator.log")
    yield emu
    emu.stop()


def test_the_checkpoint_written_on_sigterm_is_in_the_bucket_before_the_spot_vm_is_gone(
    make_guest, public_key: Path, tmp_path: Path, plain: str, emulator: Emulator
) -> None:
    assert CKPT_MB << 20 >= composite.PARALLEL_FROM
    guest = make_guest(startup_script_of(gcp_raw(sshUser="trainer", spot=True)))
    guest.add_python_with_torch()
    guest.write("/etc/ssh/sshd_config.d/storage-emulator.conf", f"SetEnv STORAGE_EMULATOR_HOST={emulator.url}\n")
    guest.boot()
    user = FabUser(tmp_path / "user", guest, public_key.with_suffix(""), extra="  gpu-train:bucket: gs://ckpt/team\n")
    run = user.train("--dir", plain, "--command", JOB, "--name", "lastckpt")
    user.wait_state(run, ("running",))
    user.wait_for("the job", lambda: "up" in user.log(run))
    unit = f"gpu-train-{run}.service"
    assert guest.sh(f"systemctl show -P TimeoutStopUSec {unit}").stdout.strip() == "25s"

    took = guest.power_off()
    prefix = f"team/.gpu-train-runs/{area(user.stacks / 'Pulumi.vm.yaml')}/{run}/"
    in_bucket = emulator.objects(prefix)
    run_dir = user.root / "runs" / run
    said = "\n".join(
        f"--- {name}:\n{(run_dir / name).read_text(errors='replace')[-3000:]}"
        for name in ("log", "upload.log", "bucket.json", "state.json")
        if (run_dir / name).exists()
    )
    said += (
        f"\n--- power off took {took:.1f} s; journal:\n"
        + subprocess.run(
            [
                "journalctl",
                "--directory",
                str(guest.path("/var/log/journal")),
                "-b",
                "0",
                "--no-pager",
                "-o",
                "short-monotonic",
                "-u",
                unit,
                "-u",
                "gpu-train-shutdown.service",
            ],
            capture_output=True,
            text=True,
        ).stdout[-5000:]
    )
    assert took < 30, f"power off took {took:.1f} s: a spot VM is gone at 30 s\n{said}"
    on_disk = (run_dir / "job" / "last.ckpt").read_bytes()
    assert in_bucket.get(f"{prefix}last.ckpt") == on_disk, f"the last checkpoint is not in the bucket\n{said}"
    record = json.loads((run_dir / "bucket.json").read_text())
    assert record["final"] and record["files"]["last.ckpt"]["size"] == CKPT_MB << 20, said
    assert "last.ckpt: 8 parts sent in parallel" in (run_dir / "upload.log").read_text(), said
    assert emulator.objects("team/.gpu-train-parts/") == {}  # the parts are gone
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "interrupted" and state["interruptedAt"] >= record["at"], said  # the wrapper waited for it
    saved_at = record["files"]["last.ckpt"]["mtimeNs"] / 1e9
    print(f"\nthe last pass: {record['at'] - saved_at:.1f} s from the checkpoint's last write to its verified record")
    print(f"power off with a {CKPT_MB} MiB checkpoint written on SIGTERM and uploaded in the last pass: {took:.1f} s")
