"""What the host's kernel and tools say: processes, process groups, GPUs, uptime, SSH sessions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from gpu_train.answers import GpuRow
from gpu_train.codec import answer


def proc_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, to tell it from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return "alive"
        except OSError:
            return None


def alive(pid: int | None, started: str | None) -> bool:
    if not pid:
        return False
    now_start = proc_start_time(pid)
    return now_start is not None and (started in (None, "alive") or now_start == started)


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def gpus() -> list[GpuRow]:
    """Per-GPU utilisation and memory from nvidia-smi, or [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "index,name,utilization.gpu,memory.used,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            rows.append(
                answer(
                    GpuRow,
                    index=int(parts[0]),
                    name=parts[1],
                    utilization=float(parts[2]),
                    memoryUsedMiB=float(parts[3]),
                    memoryTotalMiB=float(parts[4]),
                )
            )
    return rows


def gpu_apps() -> list[dict[str, Any]]:
    """The processes computing on the GPUs (nvidia-smi's compute apps), or [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    apps = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            memory = float(parts[2]) if parts[2].replace(".", "", 1).isdigit() else None  # "[N/A]" in some containers
            apps.append({"pid": int(parts[0]), "name": os.path.basename(parts[1]), "memoryMiB": memory})
    return apps


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def uptime_s() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


# Where a Deep Learning VM image may keep the Python that has PyTorch: older images had conda in
# /opt/conda; current ones (the -nvidia-580 families) are not documented to, so each is tried.
PYTHON_CANDIDATES = ("/opt/conda/bin/python", "/opt/python/bin/python3", "/usr/local/bin/python3", "/usr/bin/python3")


def python_candidates() -> list[str]:
    """Executables that may be the job's Python, in order, each once (by real path)."""
    found, seen = [], set()
    for c in (*PYTHON_CANDIDATES, shutil.which("python3"), shutil.which("python")):
        if c and os.access(c, os.X_OK) and os.path.realpath(c) not in seen:
            seen.add(os.path.realpath(c))
            found.append(c)
    return found


def imports_torch(python: str) -> bool:
    try:
        return (
            subprocess.run(
                [python, "-c", "import torch"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def detect_python(configured: str | None, candidates: list[str] | None = None, imports: Callable[[str], bool] = imports_torch) -> str:
    """The job's Python: configured, else the first candidate that can `import torch` (probed by
    ``imports``, since images differ in where they keep it), else the first candidate at all, else this one."""
    if configured:
        return os.path.expanduser(configured)
    found = python_candidates() if candidates is None else [c for c in candidates if os.access(c, os.X_OK)]
    return next((c for c in found if imports(c)), found[0] if found else sys.executable)


def ssh_sessions(port: int) -> int:
    """Established TCP connections to the SSH port (open sessions, `fab logs --follow` included)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) > 3 and parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


SSHD_SESSION_RE = re.compile(rb"^sshd(-session)?: (?!unknown )\S+ \[priv\]$")


def sshd_sessions() -> int:
    """Open SSH connections by sshd's own processes, whatever port it listens on: one privileged
    monitor ("sshd: USER [priv]") per logged-in connection, with or without a shell or a command."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].strip()
        except OSError:
            continue
        if SSHD_SESSION_RE.match(title):
            count += 1
    return count
