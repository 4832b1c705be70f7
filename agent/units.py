"""Each run in a systemd unit of its own, where the host has systemd (every GCP VM).

A run's wrapper, and so its job and its `pip install`, lives in ``gpu-train-RUN.service``, started
with ``systemd-run``: it belongs to no SSH session, no boot unit and no screen daemon, so nothing
ends it but its own end, ``fab stop`` or a shutdown. A shutdown stops it as Compute Engine allows:
SIGTERM to every process of the run at once, ``shutdownGraceS`` to finish (25 s on spot, 110 s on
standard VMs), then SIGKILL; and only after ``gpu-train-shutdown.service`` has recorded the run as
interrupted (the unit is ordered before it, so it stops after it). The unit's main process is
``screen -DmS NAME``, so ``screen -r NAME`` still shows the job.

Where systemd is not the init, or this user may not start system units (not root, no passwordless
sudo), the wrapper runs under a detached screen as before, and ``fab setup``'s crontab resumes it.
Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import subprocess

SCREEN_NAME_MAX = 80  # screen: "Session-name is too long (max length is 80 symbols)"
SHUTDOWN_UNIT = "gpu-train-shutdown.service"


def screen_name(run_id: str) -> str:
    """The run's screen session name: the run id, or where it is longer than screen allows, its
    beginning and a hash of the whole (stable, unique; `screen -r BEGINNING` finds it)."""
    if len(run_id) <= SCREEN_NAME_MAX:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"{run_id[: SCREEN_NAME_MAX - 9]}_{digest}"


def unit_name(run_id: str) -> str:
    """Run ids are letters, digits and underscores (at most 128): a valid unit name as they are."""
    return f"gpu-train-{run_id}.service"


def has_systemd() -> bool:
    """systemd is the init (what sd_booted() checks)."""
    return os.path.isdir("/run/systemd/system")


def privilege() -> list[str] | None:
    """The prefix that lets this user start and stop system units: [] as root, sudo -n where sudo
    needs no password (Compute Engine's google-sudoers), None otherwise."""
    if os.geteuid() == 0:
        return []
    if not shutil.which("sudo"):
        return None
    try:
        ok = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None
    return ["sudo", "-n"] if ok else None


def available() -> bool:
    """Runs get units of their own here: systemd is the init, and this user may start units."""
    return has_systemd() and shutil.which("systemd-run") is not None and privilege() is not None


def systemd_run_argv(
    run_id: str,
    user: str,
    grace_s: float,
    wrapper: list[str],
    env: dict[str, str],
    screen: str = "/usr/bin/screen",
    stop_post: list[list[str]] | None = None,
) -> list[str]:
    """``systemd-run`` for a run's unit: the wrapper under ``screen -DmS`` (screen stays in the
    foreground as the unit's main process), as ``user``, stopped with SIGTERM to the whole run, then
    SIGKILL after ``grace_s``. ``stop_post``: a container run's stop and removal by name (its container
    lives in the engine's cgroup, not the unit's: SIGKILL to the `docker run` client would leave it
    running); its unit stops before the engine's at shutdown. systemd runs ExecStopPost as soon as the
    main process (screen) is gone, while the rest of the run may still be saving (the guest test saw it):
    so the first command is `docker stop --time GRACE`, which waits for the job, never a bare removal."""
    post = (
        [*(f"ExecStopPost=-{exec_line(c)}" for c in stop_post or ()), "After=docker.service", "After=podman.service"] if stop_post else []
    )
    props = [
        *post,
        "KillMode=control-group",  # SIGTERM to the job, its workers, pip and the wrapper at once
        f"TimeoutStopSec={max(1, round(grace_s))}s",
        "SendSIGKILL=yes",
        "After=network-online.target",  # a job may upload its last checkpoint while stopping
        "After=dbus.service",  # at shutdown the bus outlives the run: the wrapper asks systemd over it
        f"Before={SHUTDOWN_UNIT}",  # so at shutdown it stops after gpu-train-shutdown marked it
    ]
    return [
        "systemd-run",
        "--quiet",
        "--collect",
        f"--unit={unit_name(run_id)}",
        f"--uid={user}",
        f"--description=gpu-train run {run_id}",
        *(f"--property={p}" for p in props),
        *(f"--setenv={k}={v}" for k, v in sorted(env.items())),
        "--",
        screen,
        "-DmS",
        screen_name(run_id),
        *wrapper,
    ]


def exec_line(argv: list[str]) -> str:
    """``argv`` as a unit's Exec line: a word with anything but plain characters double-quoted (the
    removal's words are an engine's path, its verbs and a container name: no ``%`` or ``$`` for systemd
    to expand)."""

    def word(w: str) -> str:
        if w and all(c.isalnum() or c in "@+=:,./_-" for c in w):
            return w
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return " ".join(word(w) for w in argv)


def start_unit(
    run_id: str, grace_s: float, wrapper: list[str], env: dict[str, str], stop_post: list[list[str]] | None = None
) -> str | None:
    """Start the run's unit; its name, or None where units are not available here (the caller
    uses screen). Raises OSError with systemd-run's message when starting it failed."""
    prefix = privilege() if has_systemd() and shutil.which("systemd-run") else None
    if prefix is None:
        return None
    screen = shutil.which("screen") or "/usr/bin/screen"
    user = pwd.getpwuid(os.getuid()).pw_name
    argv = [*prefix, *systemd_run_argv(run_id, user, grace_s, wrapper, env, screen, stop_post)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise OSError(f"systemd-run failed for {unit_name(run_id)}: {(result.stderr or result.stdout).strip()}")
    return unit_name(run_id)


def stop_unit(unit: str) -> None:
    """Stop a run's unit (what is left of it: SIGTERM, then SIGKILL after its grace)."""
    prefix = privilege()
    if prefix is None:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*prefix, "systemctl", "stop", unit], capture_output=True, timeout=300)


UP_STATES = ("initializing", "starting", "running", "degraded", "maintenance")  # is-system-running's words


def stopping_from(said: str) -> bool:
    """Whether ``systemctl is-system-running``'s answer means the machine is going down: only a state
    of a machine that is up counts as up. No answer (the bus already gone, as late in a shutdown, or
    systemctl killed with the run) counts as going down: a run SIGTERMed from outside is then resumed
    at the next boot rather than recorded as stopped by its user and never resumed."""
    return said.strip() not in UP_STATES


def system_stopping() -> bool:
    """The machine is shutting down (the wrapper was SIGTERMed from outside and systemd is not up)."""
    if not has_systemd():
        return False
    try:
        out = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return stopping_from(out)


def boot_key() -> str:
    """Names this boot: the kernel's boot id (a new one at each VM boot) and when PID 1 started (a
    new one at each boot of a container, which shares the host's kernel)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/1/stat"):
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            text = ""
        parts.append(text.strip() if path.endswith("boot_id") else (text.rsplit(")", 1)[-1].split()[19:20] or [""])[0])
    return ":".join(parts)
