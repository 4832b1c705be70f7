"""A booted systemd guest standing in for a Compute Engine VM, for the `guest` test tier.

What a GPU VM does at boot and shutdown is what gpu-train's promises rest on (jobs resumed after a
reboot, a last checkpoint on preemption, idle power-off), and only a real systemd can say whether
the units keep them. So the tier boots Debian bookworm with ``systemd-nspawn -b`` (no KVM needed):

- the root file system is built once with debootstrap and cached outside the repo
  (``/var/cache/gpu-train-guest/bookworm``, tests/guest/rootfs.py; ``python -m tests.guest.harness build`` makes it, as
  ``scripts/test`` does when it is missing); each guest boots an overlay of it, never the cache;
- an ssh-keys user is added as Compute Engine's guest environment adds one (passwordless sudo
  through the ``google-sudoers`` group), and sshd listens on one loopback address of 127.0.9.x;
- ``google-startup-scripts.service`` is stood in for by a oneshot unit that fetches the
  ``startup-script`` attribute from the metadata server at every boot and runs it, as Google's
  ``google_metadata_script_runner startup`` does (tests/guest/startup.py, with the script the program declares);
- :class:`MetadataServer` is a small metadata server on loopback whose ``instance/preempted`` and
  ``instance/maintenance-event`` a test can flip (hanging GETs with ``wait_for_change`` as the real
  one); the guest's units find it through ``GPU_TRAIN_METADATA_URL`` (the agent's metadata setting);
- :meth:`Guest.power_off` is systemd's own orderly shutdown (SIGRTMIN+4 to the guest's init), as
  when Compute Engine stops or preempts a VM; :meth:`Guest.boot` again on the same overlay is the
  reboot.

Other tests reuse it: ``Guest(..., nspawn_args=[...])`` passes extra nspawn arguments (a loop device
bound in as a data disk, say), :meth:`Guest.sh` runs a command inside.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.guest.cgroups import drop_cgroups, own_cgroups
from tests.guest.metadata import METADATA_ADDRESS, METADATA_ENV, MetadataServer, free_port  # noqa: F401 (re-exported)
from tests.guest.rootfs import ROOTFS, skip_reason  # noqa: F401 (re-exported)
from tests.guest.startup import STARTUP_RUNNER, STARTUP_UNIT

GUEST_UID = 61000  # the ssh-keys user's uid in every guest (the same on a replaced VM: the data disk's files)
LOOPBACK = "127.0.9"  # this tier's loopback addresses: 127.0.9.1 the metadata server, .10 and up the guests
# Guests boot on every xdist worker at once: each worker numbers its own (gw0 .10-.49, gw1 .50-.89, ...).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 6
_guest_numbers = (10 + 40 * _WORKER + n % 40 for n in itertools.count())


# -- the guest --------------------------------------------------------------------------------
@dataclass
class Guest:
    """One booted Debian guest: an overlay of the cached root file system, its sshd on 127.0.9.N."""

    workdir: Path
    public_key: str  # the ssh-keys user's authorized key (text)
    metadata: MetadataServer
    user: str = "trainer"
    nspawn_args: list[str] = field(default_factory=list)
    rootfs: Path = ROOTFS
    address: str = ""
    port: int = 0
    name: str = ""
    proc: subprocess.Popen | None = None
    init_pid: int | None = None
    boots: list[float] = field(default_factory=list)  # seconds each boot took, until systemd was up
    _mounted: bool = False

    def __post_init__(self) -> None:
        number = next(_guest_numbers)
        self.address = self.address or f"{LOOPBACK}.{number}"
        self.port = self.port or free_port(self.address)
        self.name = self.name or f"gt9-{os.getpid()}-{number}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root = self.workdir / "root"

    # -- the root file system ---------------------------------------------------------------
    def prepare(self) -> Guest:
        """An overlay of the cached root file system (a full copy where overlayfs is refused), then
        what Compute Engine's guest environment and image would add."""
        upper, work = self.workdir / "upper", self.workdir / "work"
        for d in (self.root, upper, work):
            d.mkdir(exist_ok=True)
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={self.rootfs},upperdir={upper},workdir={work}", str(self.root)],
            capture_output=True,
            text=True,
        )
        if mounted.returncode == 0:
            self._mounted = True
        else:
            subprocess.run(["cp", "-a", "--reflink=auto", f"{self.rootfs}/.", str(self.root)], check=True)
        self._add_user()
        self.write(
            "/etc/ssh/sshd_config.d/gpu-train-guest.conf",
            f"ListenAddress {self.address}:{self.port}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n",
        )
        self.write("/usr/bin/google_metadata_script_runner", STARTUP_RUNNER, 0o755)
        self.write("/etc/systemd/system/google-startup-scripts.service", STARTUP_UNIT)
        self._chroot("systemctl", "enable", "google-startup-scripts.service")
        # Every unit (the agent's included) finds the metadata server through this setting; torch jobs
        # take one OpenMP thread, as on loopback sshd's sessions (tests/conftest.py says why).
        self.write(
            "/etc/systemd/system.conf.d/gpu-train-guest.conf",
            f"[Manager]\nDefaultEnvironment={METADATA_ENV}={self.metadata.url} OMP_NUM_THREADS=1\n",
        )
        # The journal kept across reboots, so a failure after one can show the boot before (journal(boot=-1)).
        self.write("/etc/systemd/journald.conf.d/gpu-train-guest.conf", "[Journal]\nStorage=persistent\n")
        self.path("/var/log/journal").mkdir(parents=True, exist_ok=True)
        self.write("/etc/hostname", self.name + "\n")
        self.write("/etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {self.name}\n")  # sudo resolves the host name
        return self

    def _chroot(self, *argv: str) -> None:
        subprocess.run(["chroot", str(self.root), *argv], check=True, capture_output=True)

    def _add_user(self) -> None:
        """As google-guest-agent does for an ``ssh-keys`` entry: the user, in google-sudoers."""
        self._chroot("groupadd", "-f", "google-sudoers")
        self.write("/etc/sudoers.d/google_sudoers", "%google-sudoers ALL=(ALL:ALL) NOPASSWD:ALL\n", 0o440)
        # A uid no host user has (useradd on the host counts from 1000): without a user namespace the
        # guest's processes are the host's too, and a test that kills a host user's processes
        # (pkill -u) must not reach the guest's jobs.
        self._chroot("useradd", "-m", "-u", str(GUEST_UID), "-s", "/bin/bash", "-G", "google-sudoers", self.user)
        self._chroot("usermod", "-p", "*", self.user)  # a locked password ('!') refuses key logins
        home = f"/home/{self.user}"
        self.write(f"{home}/.ssh/authorized_keys", self.public_key.strip() + "\n", 0o600)
        self._chroot("chown", "-R", f"{self.user}:{self.user}", f"{home}/.ssh")
        self._chroot("chmod", "700", f"{home}/.ssh")

    def path(self, inside: str) -> Path:
        """A path of the guest's file system, as seen from here."""
        return self.root / inside.lstrip("/")

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        p = self.path(inside)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)

    def add_python_with_torch(self, site_packages: Path | None = None, at: str = "/opt/conda") -> str:
        """A Python with torch where a Deep Learning VM has its conda (``/opt/conda/bin/python``):
        the guest's python3 in a venv that sees this machine's site-packages (torch, numpy, pip),
        bound in read-only. Returns the interpreter's path in the guest."""
        import sysconfig

        site = site_packages or Path(sysconfig.get_paths()["purelib"])
        self.nspawn_args += [f"--bind-ro={site}:/opt/host-site"]
        self._chroot("python3", "-m", "venv", "--without-pip", at)
        version = subprocess.run(
            ["chroot", str(self.root), "python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.write(f"{at}/lib/python{version}/site-packages/host-site.pth", "/opt/host-site\n")
        return f"{at}/bin/python"

    # -- boot and shutdown ------------------------------------------------------------------
    def boot(self, timeout: float = 120) -> float:
        """Boot the guest; return when systemd says the boot is done (the startup script included)
        and sshd answers. Returns the seconds it took. A boot that fails or does not finish raises,
        with what systemd last said and the guest's console."""
        assert self.proc is None, "the guest is already up"
        started = time.monotonic()
        console = open(self.workdir / "console.log", "ab")  # noqa: SIM115 (kept open for nspawn's life)
        nspawn = [
            "systemd-nspawn",
            "-q",
            "-b",
            "-D",
            str(self.root),
            "-M",
            self.name,
            "--register=no",
            "--keep-unit",
            "--console=pipe",
            *self.nspawn_args,
        ]
        drop_cgroups(self.name)  # (what a crashed run of the same name left)
        procs = own_cgroups(self.name)
        if procs:  # nspawn (the pid kept by exec) starts in them: the guest's cgroups go below
            moves = "; ".join(f"echo $$ > {shlex.quote(str(p))}" for p in procs)  # each as it can
            nspawn = ["sh", "-c", f'{moves}; exec "$@"', "sh", *nspawn]
        self.proc = subprocess.Popen(nspawn, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
        console.close()
        deadline = started + timeout
        said = ""  # what `systemctl is-system-running` last said (stdout and stderr)
        while time.monotonic() < deadline:
            self._check_nspawn(said)
            if self.init_pid is None:
                self.init_pid = self._init_pid()
            if self.init_pid is not None:
                # Blocks until the boot is done; answers at once while the manager's bus is not up yet.
                try:
                    result = self.sh("systemctl is-system-running --wait", check=False, timeout=max(1.0, deadline - time.monotonic()))
                    said = (result.stdout + result.stderr).strip()
                except subprocess.TimeoutExpired:
                    break
                state = result.stdout.strip()
                if state in ("running", "degraded"):
                    while time.monotonic() < deadline and not self._ssh_answers():
                        self._check_nspawn(said)
                        time.sleep(0.1)
                    if self._ssh_answers():
                        took = time.monotonic() - started
                        self.boots.append(took)
                        return took
                elif state == "stopping":  # going down (powered off, halted) before we saw it up
                    self._check_nspawn(said, wait=30)
            time.sleep(0.1)
        raise TimeoutError(
            f"the guest did not boot in {timeout:g} s (systemctl is-system-running said {said!r}; "
            f"init pid {self.init_pid}):\n{self.console_tail()}"
        )

    def _check_nspawn(self, said: str, wait: float = 0) -> None:
        """Raise, with the console, when systemd-nspawn has exited (waiting up to ``wait`` s for it)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            return
        if code is None:
            return
        self.init_pid = None
        why = "the guest powered itself off or halted before the boot was seen to finish" if code == 0 else "the container failed"
        raise RuntimeError(
            f"systemd-nspawn exited with {code} during the boot: {why} (systemctl "
            f"is-system-running last said {said!r}). The guest's console:\n{self.console_tail()}"
        )

    def _init_pid(self) -> int | None:
        """The guest's init: the child of systemd-nspawn that is pid 1 of a pid namespace of its own.
        (nspawn's first child sets up the container and exits; it is not in a new pid namespace.)"""
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in map(int, out):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                return pid
        return None

    def _ssh_answers(self) -> bool:
        try:
            with socket.create_connection((self.address, self.port), timeout=0.5) as s:
                return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False

    def power_off(self, timeout: float = 300) -> float:
        """systemd's orderly shutdown, as when Compute Engine stops or preempts the VM (ACPI power
        button): SIGRTMIN+4 to the guest's init. Returns the seconds until the guest was down."""
        assert self.proc is not None and self.init_pid is not None, "the guest is not up"
        started = time.monotonic()
        os.kill(self.init_pid, signal.SIGRTMIN + 4)
        self.wait_down(timeout)
        return time.monotonic() - started

    def wait_down(self, timeout: float = 300) -> None:
        """Wait until the guest has gone down (by power_off, or by itself: idle stop)."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the guest did not go down in {timeout:g} s:\n{self.console_tail()}") from None
        init, self.proc, self.init_pid = self.init_pid, None, None
        deadline = time.monotonic() + 30  # its last processes leave the cgroups a moment after nspawn
        while init and Path(f"/proc/{init}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        drop_cgroups(self.name)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reboot(self, timeout: float = 300) -> float:
        """Power off, then boot the same disk. Returns the boot's seconds."""
        self.power_off(timeout)
        return self.boot()

    def cleanup(self) -> None:
        """Kill the guest (its init too: SIGKILL ends its whole pid namespace, and an orphaned guest
        would hold its ports) and remove the overlay."""
        if self.proc is not None:
            # Only while nspawn still runs are its pid and its child's ours: a reaped pid may be anyone's now.
            init = (self.init_pid or self._init_pid()) if self.proc.poll() is None else None
            for pid in (init, self.proc.pid if self.proc.poll() is None else None):
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
            deadline = time.monotonic() + 30  # the init, reparented, takes a moment to die with its namespace
            while init and Path(f"/proc/{init}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            self.proc, self.init_pid = None, None
        drop_cgroups(self.name)
        if self._mounted:
            if subprocess.run(["umount", str(self.root)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
            self._mounted = False
        for d in ("upper", "work", "root"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)

    # -- inside the guest -------------------------------------------------------------------
    def sh(self, command: str, user: str | None = None, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """``command`` through bash inside the guest, as root or as ``user`` (a login shell)."""
        assert self.init_pid is not None, "the guest is not up"
        inner = ["runuser", "-l", user, "-c", command] if user else ["bash", "-c", command]
        result = subprocess.run(["nsenter", "-t", str(self.init_pid), "-a", *inner], capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"in the guest, {command!r} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def journal(self, unit: str | None = None, boot: int = 0) -> str:
        """The guest's journal of this boot (``boot=-1``: the one before), of one unit or all, for
        assertions and failure messages."""
        return self.sh(f"journalctl -b {boot} --no-pager -o short-monotonic" + (f" -u {unit}" if unit else ""), check=False).stdout

    def failed_units(self) -> list[str]:
        out = self.sh("systemctl list-units --failed --plain --no-legend", check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def console_tail(self, lines: int = 40) -> str:
        try:
            text = (self.workdir / "console.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def ssh_stack(self, stacks_dir: Path, name: str, key_file: Path, remote_root: str = "~/gpu-train", extra: str = "") -> Path:
        """An SSH stack pointing at this guest's sshd, for `fab --stack NAME` as a user would."""
        stacks_dir.mkdir(parents=True, exist_ok=True)
        path = stacks_dir / f"Pulumi.{name}.yaml"
        path.write_text(
            "config:\n  gpu-train:target: ssh\n"
            f"  gpu-train:hosts: ['{self.user}@{self.address}:{self.port}']\n"
            f"  gpu-train:sshKey: {key_file}\n  gpu-train:remoteRoot: {json.dumps(remote_root)}\n{extra}"
        )
        return path


if __name__ == "__main__":  # `python -m tests.guest.harness build`: scripts/test's command
    from tests.guest.rootfs import main

    sys.exit(main(sys.argv[1:]))
