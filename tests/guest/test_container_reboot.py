"""A container run through an orderly power-off and the next boot, on a real systemd with a real Docker:
the booted guest is a VM image that has Docker (Debian's docker.io, tests/guest/rootfs.py), its startup
script the program's for a stack with gpu-train:image (Docker readied at every boot: daemon.json with the
cgroupfs driver, the user in the docker group, the restart, the pull unit). Power off mid-training: the
run's unit stops before Docker's, the job's SIGTERM handler in the container gets its time (the spot
grace, 25 s), the container is removed; at boot the run resumes in the same image ID though its tag
moved meanwhile.

Docker in systemd-nspawn on this cgroup v1 host needs three things of the guest, none of gpu-train's:
every capability (``--capability=all``: without it dockerd's host-network sandbox fails, "failed to create
default sandbox: operation not permitted"), the keyring calls nspawn's seccomp filter refuses (runc's
session keyring: "unable to join session keyring: unable to create session key: operation not
permitted"), and the v1 controllers' hierarchies writable (nspawn mounts them read-only: runc's
"mkdir /sys/fs/cgroup/cpuset/docker/ID: read-only file system"): a unit of the guest's remounts them
read-write before Docker starts (``mount -o remount,bind,rw``; SYSTEMD_NSPAWN_API_VFS_WRITABLE leaves
them read-only). Docker's containers then get cgroups of the host's hierarchies, under a parent of
this guest's own (daemon.json's cgroup-parent), removed afterwards. Storage is vfs (overlay2 refuses
the guest's overlay root).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import gcp_raw
from tests.guest.fabuser import FabUser
from tests.guest.rootfs import DOCKER_ROOTFS, ROOTFS, build_docker_rootfs
from tests.guest.startup import startup_script_of

DOCKER_IN_NSPAWN = ["--capability=all", "--system-call-filter=add_key", "--system-call-filter=keyctl"]
CGROUPS_RW = """[Unit]
Description=the v1 cgroup hierarchies writable for Docker (nspawn mounts them read-only)
DefaultDependencies=no
Before=containerd.service docker.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for c in /sys/fs/cgroup/*/; do mountpoint -q "$c" && mount -o remount,bind,rw "$c"; done; true'
[Install]
WantedBy=multi-user.target
"""
pytestmark = pytest.mark.long
V1 = ("blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids")
JOB = r"""import json, os, signal, sys, time
job, n = os.environ["JOB_DIR"], os.environ["GPU_TRAIN_RESUMES"]
def saved(signum, frame):
    time.sleep(3)  # a checkpoint that takes its time
    open(os.path.join(job, "saved-%s" % n), "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
seen = {"marker": open("/etc/gt-marker").read().strip(), "resumes": n, "uid": os.getuid()}
json.dump(seen, open(os.path.join(job, "seen-%s.json" % n), "w"))
print("up %s" % n, flush=True)
while n == "0":
    time.sleep(0.1)
"""


def import_image(guest, tag: str, marker: str) -> str:
    """``tag``: the guest tier's Debian (bound in at /opt/rootfs) with /etc/gt-marker, imported in the guest."""
    slim = " ".join(f"--exclude=./{p}" for p in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/lib/apt/lists"))
    guest.sh(
        f"mkdir -p /tmp/m{marker}/etc && echo {marker} > /tmp/m{marker}/etc/gt-marker && "
        f"tar -c {slim} -C /opt/rootfs . -C /tmp/m{marker} ./etc/gt-marker | docker import --change 'USER 4321' - {tag}",
        timeout=300,
    )
    return guest.sh(f"docker image inspect --format '{{{{.Id}}}}' {tag}").stdout.strip()


def drop_docker_cgroups(parent: str) -> None:
    """The containers' cgroups in the host's v1 hierarchies, under the guest's cgroup-parent (deepest first)."""
    for controller in V1:
        base = Path("/sys/fs/cgroup") / controller / parent.lstrip("/")
        for folder in [*(w[0] for w in sorted(os.walk(base), key=lambda w: -len(w[0]))), str(base.parent)]:  # (the parent if empty)
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def test_power_off_gives_the_container_its_grace_and_boot_resumes_it_in_the_same_image(make_guest, public_key, tmp_path) -> None:
    if not (DOCKER_ROOTFS / "usr" / "sbin" / "dockerd").exists():
        build_docker_rootfs()  # (once, about a minute: Debian's docker.io from its mirror, as debootstrap's packages)
    raw = gcp_raw(sshUser="trainer", remoteRoot="~/gpu-train", spot=True, image="gt/job:1")
    guest = make_guest(startup_script_of(raw), rootfs=DOCKER_ROOTFS, nspawn_args=[*DOCKER_IN_NSPAWN, f"--bind-ro={ROOTFS}:/opt/rootfs"])
    parent = f"/gpu-train-guests/{guest.name}-docker"
    try:
        guest.write("/etc/systemd/system/gpu-train-guest-cgroups.service", CGROUPS_RW)
        guest.path("/etc/systemd/system/multi-user.target.wants").mkdir(parents=True, exist_ok=True)
        os.symlink(
            "../gpu-train-guest-cgroups.service", guest.path("/etc/systemd/system/multi-user.target.wants/gpu-train-guest-cgroups.service")
        )
        guest.write("/etc/docker/daemon.json", json.dumps({"cgroup-parent": parent, "storage-driver": "vfs"}))
        guest.boot(timeout=240)
        assert "native.cgroupdriver=cgroupfs" in guest.path("/etc/docker/daemon.json").read_text()  # the startup script's
        assert "docker" in guest.sh("id -nG trainer").stdout.split()
        image = import_image(guest, "gt/job:1", "A")
        moved = import_image(guest, "gt/other:1", "B")
        user = FabUser(tmp_path / "user", guest, public_key.with_suffix(""))
        code = tmp_path / "code"
        code.mkdir()
        (code / "train.py").write_text(JOB)

        run = user.train("--dir", str(code), "--image", "gt/job:1", "--script", "train.py")
        user.wait_for("the job in its container", lambda: (user.root / "runs" / run / "job" / "seen-0.json").exists(), timeout=180)
        assert user.state(run)["imageId"] == image
        assert f"gpu-train-{run}" in guest.sh("docker ps --format '{{.Names}}'").stdout
        guest.sh("docker tag gt/other:1 gt/job:1")  # the tag moves while the run runs: its resume must not follow it
        took = guest.power_off()
        job = user.root / "runs" / run / "job"
        assert (job / "saved-0").read_text() == "SIGTERM", user.log(run)[-3000:]  # its handler's 3 s, within the grace
        assert took < 30, f"power off took {took:.1f} s: a spot VM has 30 s"
        assert user.state(run)["state"] == "interrupted"

        guest.boot(timeout=240)
        user.wait_for("the resumed job", lambda: (job / "seen-1.json").exists(), timeout=180)
        seen = json.loads((job / "seen-1.json").read_text())
        assert (seen["marker"], seen["resumes"]) == ("A", "1"), seen  # the pinned image, not the moved tag's B
        done = user.wait_state(run, ("succeeded", "failed"), timeout=120)
        assert done["state"] == "succeeded" and done["resumes"] == 1 and done["imageId"] == image != moved, user.log(run)[-3000:]
        assert f"gpu-train-{run}" not in guest.sh("docker ps -a --format '{{.Names}}'").stdout  # nothing left of it
    finally:
        guest.cleanup()
        drop_docker_cgroups(parent)
