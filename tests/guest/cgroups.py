"""Each guest's own cgroups, which the harness starts systemd-nspawn in.

nspawn (--keep-unit) puts the guest in a "payload" cgroup beside its own, found from its place in cgroup
v2's hierarchy, even on this cgroup v1 machine (where that hierarchy is not mounted and every process sits
at its root), and mirrors it into v1's name=systemd hierarchy, where the guest's systemd keeps its units.
Started from the root, every guest got the same /payload: one guest stopping a unit or going down
removed the folders the others' units live in ("Failed to attach to cgroup /system.slice/X: No such
file or directory", status 219/CGROUP; seen under -n 4). So each guest starts in cgroups of its own,
as each VM has its own machine.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

CGROUP2_MOUNT = Path("/run/gpu-train-guest-cgroup2")  # where cgroup2 is mounted when the machine has not


def _hierarchies() -> list[Path]:
    """The folders for the guests' cgroups: in cgroup v2's hierarchy (mounted for it here if need be)
    and in v1's name=systemd one, where each exists."""
    roots = []
    for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (v2 / "cgroup.controllers").exists():
            roots.append(v2)
            break
    else:
        CGROUP2_MOUNT.mkdir(parents=True, exist_ok=True)
        if (CGROUP2_MOUNT / "cgroup.controllers").exists() or subprocess.run(
            ["mount", "-t", "cgroup2", "none", str(CGROUP2_MOUNT)], capture_output=True
        ).returncode == 0:
            roots.append(CGROUP2_MOUNT)
    if (Path("/sys/fs/cgroup/systemd") / "cgroup.procs").exists():
        roots.append(Path("/sys/fs/cgroup/systemd"))
    return [root / "gpu-train-guests" for root in roots if os.access(root, os.W_OK)]


def own_cgroups(name: str) -> list[Path]:
    """A cgroup of the guest's own in each hierarchy (their cgroup.procs files); none where none can be made."""
    made = []
    for base in _hierarchies():
        with contextlib.suppress(OSError):
            (base / name).mkdir(parents=True, exist_ok=True)
            made.append(base / name / "cgroup.procs")
    return made


def drop_cgroups(name: str) -> None:
    """Remove a guest's cgroups once it is down (deepest folders first; a cgroup folder goes with rmdir)."""
    for base in _hierarchies():
        for folder, _, _ in sorted(os.walk(base / name), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
