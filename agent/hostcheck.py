"""What a host says at launch about itself: whether a reboot resumes its runs, whether it is busy.

An SSH host resumes runs after a reboot through an ``@reboot`` line in the user's crontab (`setup`
writes it, `down` takes it away); it works only while a cron daemon runs. Another process on the
GPUs, or another run of ours, slows the new run or makes it run out of memory: `train` says so.
Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from gpu_train.answers import GpuRow
from gpu_train.contract import BOOT_CRON_STOPPED, BOOT_NO_CRONTAB, BOOT_OFF, BOOT_ON

CRON_DAEMONS = ("cron", "crond", "cronie", "busybox-crond")  # /proc/PID/comm of the usual daemons


def cron_tag(root: str) -> str:
    return f"# gpu-train {root}"


def crontab() -> list[str] | None:
    """The user's crontab lines ([] when none); None where there is no crontab command."""
    if not shutil.which("crontab"):
        return None
    return subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()


def cron_lines(root: str, agent: str, tick: bool) -> list[str]:
    """This root's lines: `boot` at reboot, and `tick` every minute when idle stop is on."""
    base = f"{shlex.quote(sys.executable)} {shlex.quote(agent)} --root {shlex.quote(root)}"
    tag = cron_tag(root)
    return [f"@reboot {base} boot >/dev/null 2>&1 {tag}", *([f"* * * * * {base} tick >/dev/null 2>&1 {tag}"] if tick else [])]


def set_cron(root: str, lines: list[str]) -> list[str]:
    """Make ``lines`` this root's only crontab lines (none: take them away); returns the lines removed."""
    with crontab_lock():
        current = crontab() or []
        tag = cron_tag(root)
        keep = [line for line in current if not line.endswith(tag)]
        if keep + lines != current:
            subprocess.run(["crontab", "-"], input="\n".join([*keep, *lines]) + "\n", text=True, check=True)
    return [line for line in current if line.endswith(tag) and line not in lines]


@contextlib.contextmanager
def crontab_lock(folder: str = "/tmp") -> Iterator[None]:
    """One change of the user's crontab at a time: the crontab is one per user, shared by every REMOTE_ROOT
    (every project) of theirs, and a change is read, edited and written whole; two at once (two projects set
    up together) kept only the last one's lines, and the other's runs no longer resumed after a reboot.
    The lock file is the user's own (FOLDER/gpu-train-crontab-UID.lock, never through a link); one another
    user made there is not trusted with the wait, and the change goes on without it, as before."""
    try:
        fd = os.open(os.path.join(folder, f"gpu-train-crontab-{os.getuid()}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        if os.fstat(fd).st_uid == os.getuid():
            fcntl.flock(fd, fcntl.LOCK_EX)  # (held for one `crontab -l` and one `crontab -`)
        yield
    finally:
        os.close(fd)


def cron_running(proc: str = "/proc") -> bool:
    """Whether a cron daemon runs on this host (any user's: the system's daemon runs as root)."""
    for pid in os.listdir(proc):
        if pid.isdigit():
            try:
                with open(os.path.join(proc, pid, "comm")) as f:
                    if f.read().strip() in CRON_DAEMONS:
                        return True
            except OSError:
                continue
    return False


def boot_resume(root: str) -> str:
    """Whether a reboot resumes this root's runs (contract.BOOT_*)."""
    lines = crontab()
    if lines is None:
        return BOOT_NO_CRONTAB
    if not any(line.startswith("@reboot ") and line.endswith(cron_tag(root)) for line in lines):
        return BOOT_OFF
    return BOOT_ON if cron_running() else BOOT_CRON_STOPPED


def busy_warnings(apps: list[dict[str, Any]], gpus: list[GpuRow], runs: list[str]) -> list[str]:
    """What may slow or starve a new run: processes on the GPUs (nvidia-smi's compute apps, or a GPU
    that is working with none listed, as inside a container), and runs of ours still going."""
    said = []
    if apps:
        shown = ", ".join(f"pid {a['pid']} {a['name']}" + (f" ({a['memoryMiB']:.0f} MiB)" if a.get("memoryMiB") else "") for a in apps[:4])
        said.append(
            f"the GPUs are in use by {len(apps)} process{'es' if len(apps) > 1 else ''} already: {shown}"
            + (" ..." if len(apps) > 4 else "")
            + "; the new run shares them (memory, speed)"
        )
    else:
        working = [g for g in gpus if g["utilization"] >= 5]
        if working:
            said.append(
                "GPU "
                + ", ".join(f"{g['index']} is {g['utilization']:.0f}% busy" for g in working)
                + " with no process this user can see (another user's or container's)"
            )
    if runs:
        said.append(
            f"{len(runs)} other run{'s' if len(runs) > 1 else ''} of gpu-train still running here: "
            f"{', '.join(runs[:4])}" + (" ..." if len(runs) > 4 else "")
        )
    return said
