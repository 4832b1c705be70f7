"""The data disk in a booted guest: the startup script the program declares formats a new disk once,
mounts it on REMOTE_ROOT/runs at every boot, and a "replaced VM" (a fresh root file system, the same
disk) finds the runs there and resumes the one that was running.

The disk is a loop device bound into the guest at the path Compute Engine gives an attached disk
(/dev/disk/by-id/google-DEVICE_NAME). A run is started with the real `fab train` over SSH. That the
relaunched job then runs on is the boot step's own promise (its tests); here: the disk is mounted
before the boot step looks, so the step finds the run on it and relaunches it, on the same VM after a
reboot and on a replaced one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_train.gcp import vm
from tests.conftest import ROOT, gcp_raw
from tests.guest.fabuser import EXAMPLE, FabUser, last_step
from tests.guest.harness import Guest
from tests.guest.startup import startup_script_of

FAB = str(Path(sys.executable).parent / "fab")
REMOTE_ROOT = "/home/trainer/gpu-train"
RUNS = f"{REMOTE_ROOT}/runs"
# Counts on from its checkpoint, one step each 0.2 s, writing the checkpoint atomically.
JOB = (
    'n=$(cat "$JOB_DIR/ckpt" 2>/dev/null || echo 0); while :; do n=$((n+1)); echo $n > "$JOB_DIR/ckpt.new"; '
    'mv "$JOB_DIR/ckpt.new" "$JOB_DIR/ckpt"; sleep 0.2; done'
)


@pytest.fixture
def data_disk(tmp_path: Path) -> Iterator[str]:
    """A new, empty 128 MB disk: a loop device over a sparse file."""
    image = tmp_path / "data-disk.img"
    subprocess.run(["truncate", "-s", "128M", str(image)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if loop.returncode != 0:
        pytest.skip(f"no loop device for the data disk: {loop.stderr.strip()}")
    yield loop.stdout.strip()
    subprocess.run(["losetup", "-d", loop.stdout.strip()], capture_output=True)


def attached(disk: str) -> list[str]:
    return [f"--bind={disk}:/dev/disk/by-id/google-{vm.DATA_DEVICE_NAME}"]


def fab(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GPU_TRAIN_STACKS_DIR": str(tmp / "stacks"),
        "GPU_TRAIN_HOME": str(tmp / "home"),
        "GPU_TRAIN_STACK": "vm",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [FAB, "--search-root", str(ROOT), *args], env=env, cwd=tmp, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )


def wait_for(what: str, check, guest: Guest, run: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    state = guest.sh(f"cat {RUNS}/{run}/state.json", check=False).stdout
    before = guest.journal(boot=-1)  # the shutdown before this boot, where there was one
    raise AssertionError(
        f"waited {timeout:g} s for {what}; state {state}\n--- this boot ---\n{guest.journal()[-6000:]}"
        + (f"\n--- the boot before ---\n{before[-8000:]}" if before.strip() else "")
    )


def state(guest: Guest, run: str) -> dict:
    out = guest.sh(f"cat {RUNS}/{run}/state.json 2>/dev/null", check=False).stdout
    try:
        return json.loads(out)
    except ValueError:
        return {}


def checkpoint(guest: Guest, run: str) -> int:
    out = guest.sh(f"cat {RUNS}/{run}/job/ckpt 2>/dev/null || echo 0", check=False).stdout.strip()
    return int(out or 0)


def test_runs_live_on_the_data_disk_and_survive_a_replaced_vm(make_guest, data_disk: str, tmp_path: Path, public_key: Path) -> None:
    script = startup_script_of(gcp_raw(sshUser="trainer"))
    first = make_guest(script, address="127.0.11.10", nspawn_args=attached(data_disk))
    first.boot()
    # A new disk: formatted once, mounted at /mnt/disks/gpu-train-data, its gpu-train/ on REMOTE_ROOT.
    assert "formatted the new data disk" in first.journal("google-startup-scripts.service")
    mounts = first.sh(f"findmnt -n -o SOURCE,TARGET {REMOTE_ROOT}").stdout
    assert f"google-{vm.DATA_DEVICE_NAME}[/gpu-train]" in mounts, mounts
    assert first.sh(f"stat -c %U {REMOTE_ROOT}").stdout.strip() == "trainer"
    assert first.failed_units() == [], first.journal()
    uuid = first.sh(f"blkid -s UUID -o value /dev/disk/by-id/google-{vm.DATA_DEVICE_NAME}").stdout.strip()

    # A run that checkpoints, started as a user would.
    code = tmp_path / "code"
    code.mkdir()
    # the guest stands in for a GCP VM, where jobs run in the host's Python (venv: false)
    first.ssh_stack(tmp_path / "stacks", "vm", public_key.with_suffix(""), extra="  gpu-train:venv: false\n")
    started = fab(tmp_path, "train", "--dir", str(code), "--command", JOB, "--name", "counter")
    assert started.returncode == 0, started.stdout + started.stderr
    run = started.stdout.split()[1]
    wait_for("a few checkpoints", lambda: checkpoint(first, run) >= 5, first, run)
    # Rebooting the same VM: the disk is mounted again (not formatted again) before gpu-train-boot
    # looks for interrupted runs, so it finds this one there and relaunches it.
    first.reboot()
    assert "formatted" not in first.journal("google-startup-scripts.service")
    wait_for("the boot step to relaunch the run", lambda: state(first, run).get("resumes") == 1, first, run)
    reached = checkpoint(first, run)
    assert reached >= 5
    first.power_off()
    first.cleanup()  # the old VM and its boot disk are gone

    # The replacement: a fresh root file system (a new boot disk), the same data disk.
    second = make_guest(script, address="127.0.11.11", nspawn_args=attached(data_disk))
    assert not second.path(REMOTE_ROOT).exists()  # nothing on the new boot disk
    second.boot()
    journal = second.journal("google-startup-scripts.service")
    assert "formatted" not in journal, journal
    assert second.sh(f"blkid -s UUID -o value /dev/disk/by-id/google-{vm.DATA_DEVICE_NAME}").stdout.strip() == uuid
    assert second.sh(f"test -f {RUNS}/{run}/state.json", check=False).returncode == 0, second.sh(f"ls -la {RUNS}").stdout
    assert checkpoint(second, run) >= reached  # the checkpoints are all there
    # gpu-train-boot on the new VM found the run on the disk and relaunched it, from its checkpoint.
    wait_for("the boot step to relaunch the run on the new VM", lambda: state(second, run).get("resumes") == 2, second, run)
    assert second.failed_units() == [], second.journal()


def test_a_disk_that_holds_anything_else_is_never_formatted(make_guest, tmp_path: Path) -> None:
    """Only a disk with nothing on it is formatted: one holding something else (here swap space)
    is neither formatted nor mounted, and the boot goes on."""
    image = tmp_path / "odd.img"
    subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
    subprocess.run(["mkswap", "-q", str(image)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    try:
        before = image.read_bytes()[: 1 << 20]
        guest = make_guest(startup_script_of(gcp_raw(sshUser="trainer")), address="127.0.11.12", nspawn_args=attached(loop.stdout.strip()))
        guest.boot()
        assert "formatted the new data disk" not in guest.journal("google-startup-scripts.service")
        assert guest.sh(f"mountpoint -q {REMOTE_ROOT}", check=False).returncode != 0
        assert guest.failed_units() == [], guest.journal()
        guest.power_off()
        assert image.read_bytes()[: 1 << 20] == before
    finally:
        subprocess.run(["losetup", "-d", loop.stdout.strip()], capture_output=True)


def test_a_training_run_carries_on_from_its_checkpoint_on_a_replaced_vm(
    make_guest, data_disk: str, tmp_path: Path, public_key: Path
) -> None:
    """The whole promise with a real job: examples/train.py (torch) trains on the data disk; the VM is
    powered off (its last checkpoint saved on SIGTERM) and replaced by a new one (a fresh root file system,
    the same disk). The new VM's boot unit relaunches the run, which resumes from that checkpoint (not from
    step 0), counts one resume, and runs to success."""
    script = startup_script_of(gcp_raw(sshUser="trainer", spot=False))
    first = make_guest(script, address="127.0.21.10", nspawn_args=attached(data_disk))
    first.add_python_with_torch()
    first.boot()
    user = FabUser(tmp_path / "user", first, public_key.with_suffix(""))
    run = user.train("--dir", str(EXAMPLE), "--script", "train.py", "--args", "--steps 160 --checkpoint-every 100000 --step-time 0.05")
    wait_for("training to reach step 30", lambda: last_step(log(first, run)) >= 30, first, run, timeout=180)
    first.power_off()  # Compute Engine's orderly stop: the job gets SIGTERM and saves a last checkpoint
    first.cleanup()  # the old VM and its boot disk are gone

    second = make_guest(script, address="127.0.21.11", nspawn_args=attached(data_disk))
    second.add_python_with_torch()
    assert not second.path(REMOTE_ROOT).exists()  # the new boot disk holds nothing of the run
    second.boot()
    relaunched = FabUser(tmp_path / "user2", second, public_key.with_suffix(""))
    wait_for("the run to be relaunched and resume", lambda: "resumed from ckpt_" in log(second, run), second, run, timeout=180)
    text = log(second, run)
    saved = re.search(r"signal 15: saved ckpt_0*(\d+)\.pt", text)
    assert saved, text[-3000:]  # written on the first VM, at its power-off
    resumed = re.search(r"resumed from ckpt_0*(\d+)\.pt \(step (\d+)\)", text)
    assert resumed and int(resumed.group(1)) == int(saved.group(1)) >= 30, text[-3000:]
    after = text[resumed.end() :]
    steps = [int(s) for s in re.findall(r"^step (\d+) loss", after, re.M)]
    assert not steps or steps[0] > int(saved.group(1)), after[:2000]  # on from the checkpoint, not from step 0
    assert state(second, run)["resumes"] == 1
    done = relaunched.fab("logs", "--follow", "--run", run, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    info = relaunched.run_status(run)
    assert info["state"] == "succeeded" and info["resumes"] == 1, info
    assert second.failed_units() == [], second.journal()


def log(guest: Guest, run: str) -> str:
    """The run's log, read inside the guest (the data disk is mounted in the guest's own namespace)."""
    return guest.sh(f"cat {RUNS}/{run}/log 2>/dev/null", check=False).stdout
