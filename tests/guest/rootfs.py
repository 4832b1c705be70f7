"""The guest tier's Debian root file system: can the tier run here, and building it (once, cached
outside the repo; ``python -m tests.guest.harness build``, as ``scripts/test`` runs it as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOTFS = Path(os.environ.get("GPU_TRAIN_GUEST_ROOTFS", "/var/cache/gpu-train-guest/bookworm"))
SUITE = "bookworm"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "sudo", "screen", "rsync", "openssh-server", "python3", "procps", "cron", "iproute2")
HOST_PACKAGES = {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap"}
# The same Debian with Debian's Docker on it (a Deep Learning VM image that has Docker): container runs
# through a power-off (tests/guest/test_container_reboot.py). Built from ROOTFS once, beside it.
DOCKER_ROOTFS = ROOTFS.with_name(ROOTFS.name + "-docker")


# -- can the tier run here? -------------------------------------------------------------------
def skip_reason(rootfs: Path = ROOTFS) -> str | None:
    """Why the guest tier cannot run on this machine, or None when it can."""
    if sys.platform != "linux":
        return "the guest tier boots systemd with systemd-nspawn: Linux only"
    if os.geteuid() != 0:
        return "the guest tier needs root (systemd-nspawn boots the guest): run scripts/test as root"
    for tool, package in HOST_PACKAGES.items():
        if not shutil.which(tool):
            return f"{tool} is missing: apt-get install {package} (scripts/test does, as root)"
    if not (rootfs / "sbin" / "init").exists() and not (rootfs / "lib" / "systemd" / "systemd").exists():
        return f"no guest root file system at {rootfs}: scripts/test builds it (as root), or: python -m tests.guest.harness build"
    return None


def build_rootfs(rootfs: Path = ROOTFS) -> None:
    """debootstrap Debian bookworm into ``rootfs``: built beside it, renamed into place when complete,
    so an interrupted build never leaves a half root file system that looks usable."""
    import fcntl

    rootfs.parent.mkdir(parents=True, exist_ok=True)
    with open(rootfs.parent / f".{rootfs.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once: one builds, the other waits for it
        if (rootfs / "sbin" / "init").exists():
            return
        partial = rootfs.with_name(rootfs.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        print(f"building the guest root file system at {rootfs} (debootstrap, once) ...", file=sys.stderr, flush=True)
        log = rootfs.parent / f"{rootfs.name}.debootstrap.log"
        with open(log, "w") as out:
            code = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(partial)],
                stdout=out,
                stderr=subprocess.STDOUT,
            ).returncode
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"debootstrap failed (exit {code}; log {log}):\n{tail}")
        shutil.rmtree(rootfs, ignore_errors=True)
        partial.rename(rootfs)


def build_docker_rootfs(rootfs: Path = DOCKER_ROOTFS, base: Path = ROOTFS) -> None:
    """``base`` with docker.io installed by its own apt (in systemd-nspawn, from Debian's mirror as
    debootstrap's packages came), into ``rootfs``: built beside it and renamed when complete."""
    import fcntl

    with open(rootfs.parent / f".{rootfs.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (rootfs / "usr" / "sbin" / "dockerd").exists():
            return
        partial = rootfs.with_name(rootfs.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        print(f"building the guest root file system with Docker at {rootfs} (once) ...", file=sys.stderr, flush=True)
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(partial)], check=True)
        log = rootfs.parent / f"{rootfs.name}.apt.log"
        install = "apt-get update -qq && apt-get install -y -q --no-install-recommends docker.io && apt-get clean"
        nspawn = ["systemd-nspawn", "-q", "-D", str(partial), "--register=no", "--keep-unit", "--setenv=DEBIAN_FRONTEND=noninteractive"]
        with open(log, "w") as out:
            code = subprocess.run([*nspawn, "sh", "-c", install], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        if code != 0 or not (partial / "usr" / "sbin" / "dockerd").exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"apt-get install docker.io in the guest failed (exit {code}; log {log}):\n{tail}")
        shutil.rmtree(rootfs, ignore_errors=True)
        partial.rename(rootfs)


def main(argv: list[str]) -> int:
    """`python -m tests.guest.harness build [ROOTFS]`: build the cached root file systems when missing."""
    if not argv or argv[0] != "build":
        print("usage: python -m tests.guest.harness build [ROOTFS]", file=sys.stderr)
        return 2
    rootfs = Path(argv[1]) if len(argv) > 1 else ROOTFS
    build_rootfs(rootfs)
    print(f"guest root file system ready at {rootfs}", file=sys.stderr)
    if rootfs == ROOTFS:
        build_docker_rootfs()  # (the same with docker.io: tests/guest/test_container_reboot.py)
    return 0
