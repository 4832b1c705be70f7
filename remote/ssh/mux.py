"""This user's shared OpenSSH connection to a host (ControlMaster): every task's second command within
PERSIST_S of the last one opens a channel on it (one round trip) instead of logging in (TCP, key
exchange, authentication: four round trips or more, and tens of milliseconds of CPU each side).

A task that finds no shared connection logs in with paramiko as before (host keys learned, the wait
for a booting VM, refusals explained) and starts the shared one beside it, in the background, for
the next task. A task that finds one uses ``MuxConnection``: the part of a Fabric Connection the
tasks use (``run``, exec channels, rsync's relay), each channel one `ssh` process talking to the
shared connection. Port forwards (tensorboard, jupyter, tunnel) keep their own connection: they
last long, and a login is nothing beside them. The fetch's listing stream rides on the same shared
connection (``shared_control_path`` is one place for both).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from gpu_train.stack.sshhost import SshHost
from remote.ssh.openssh import openssh_options
from remote.ssh.target import Target

PERSIST_S = 60  # how long the shared connection outlives its last use
PROBE_S = 5.0  # a shared connection that runs no `true` within this long has lost its host
SSH_LOST = 255  # what `ssh` exits with for a failure of its own (the connection lost), not the command's


def shared_control_path(options: list[str], destination: str) -> str | None:
    """Where this user's shared SSH connection to ``destination``, made with exactly ``options``, listens.

    One folder of the user's own in the temporary directory (0700, checked, in a parent that others
    cannot rename it out of: otherwise another user could plant a socket that our ssh would talk
    to, or listen on ours); the name hashes every option (key, known_hosts, jump hosts) and the
    destination, so a stack never rides on a connection another stack's key opened. None where no
    such folder can be had, where ssh would read the path differently (it expands %), or where
    the path is too long for a socket: the task then logs in as it would without one.
    """
    parent = tempfile.gettempdir()
    folder = os.path.join(parent, f"gpu-train-ssh-{os.getuid()}")
    if "%" in folder:
        return None
    try:
        up = os.stat(parent)
        if up.st_mode & 0o022 and not up.st_mode & stat.S_ISVTX:
            return None  # anyone may rename what is in it (/tmp has the sticky bit: only the owner may)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    path = os.path.join(folder, hashlib.sha256("\0".join([*options, destination]).encode()).hexdigest()[:16])
    # A socket's path holds 104 bytes (macOS; Linux 108), and ssh binds it first under a 17-byte longer name.
    return path if len(path.encode()) + 17 < 104 else None


def control_path(target: Target, host: SshHost) -> str | None:
    """The shared connection's socket for ``host`` (None where OpenSSH cannot share one here)."""
    if os.name != "posix" or not shutil.which("ssh"):
        return None
    return shared_control_path(openssh_options(target, host), f"{host.user}@{host.host}")


def master_up(path: str) -> bool:
    """Whether a shared connection listens at ``path`` (a socket left by a dead one refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def start_master(target: Target, host: SshHost) -> None:
    """Start the shared connection in the background for the next task (it runs `true` and stays
    PERSIST_S seconds after its last use). Where another started one meanwhile, this one only
    runs `true` over it."""
    path = control_path(target, host)
    if path is None or master_up(path):
        return
    argv = [
        "ssh",
        *openssh_options(target, host),
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={path}",
        "-o",
        f"ControlPersist={PERSIST_S}",
        "-T",
        "--",
        f"{host.user}@{host.host}",
        "true",
    ]
    with contextlib.suppress(OSError):
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def end_master(target: Target, host: SshHost) -> None:
    """Close the shared connection now (the host then counts no SSH session of ours)."""
    path = control_path(target, host)
    if path is not None and master_up(path):
        exit_master(path, host, timeout=30)


def exit_master(path: str, host: SshHost, timeout: float) -> None:
    """`ssh -O exit`: answered by the local master, whatever the host does."""
    subprocess.run(
        ["ssh", "-o", f"ControlPath={path}", "-O", "exit", "--", f"{host.user}@{host.host}"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def over_master(target: Target, host: SshHost, path: str) -> list[str]:
    """ssh's argv for a session over the shared connection at ``path`` (the command goes after it)."""
    return [
        "ssh",
        *openssh_options(target, host),
        "-o",
        "ControlMaster=no",
        "-o",
        f"ControlPath={path}",
        "-T",
        "-x",
        "--",
        f"{host.user}@{host.host}",
    ]


def answers(target: Target, host: SshHost, timeout: float = PROBE_S) -> bool | None:
    """Whether the shared connection still reaches the host: `true` over it within ``timeout`` (one round
    trip). True: it did; None: it failed at once (the connection ended meanwhile: log in); False: no
    answer. A host that vanished (a VM deleted, its packets dropped) leaves the connection up until its
    keepalive gives up (ServerAliveInterval 5 s x 3), and each command over it hangs until then; one
    that does not answer is ended here, so the next task logs in (or finds the host gone) at once."""
    path = control_path(target, host)
    if path is None:
        return None
    try:
        return (
            subprocess.run(
                [*over_master(target, host, path), "true"],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
            ).returncode
            != SSH_LOST
            or None
        )
    except subprocess.TimeoutExpired:
        exit_master(path, host, timeout=10)
        return False


def reuse(target: Target, host: SshHost) -> MuxConnection | None:
    """A connection over the shared one when it is up, else None (the caller logs in)."""
    path = control_path(target, host)
    if path is None or not master_up(path):
        return None
    return MuxConnection(host, over_master(target, host, path))


@dataclass
class Result:
    """What Fabric's ``run`` answers, as far as the tasks read it."""

    stdout: str
    stderr: str
    exited: int


def channel_errors() -> tuple[type[BaseException], ...]:
    """What sending on or reading from a channel may raise: OSError and EOFError (the shared connection's
    `ssh`), and paramiko's SSHException where a login made a paramiko channel. Only a login imports
    paramiko: a task on the shared connection never loads it (about 60 ms of its start), and then no
    paramiko channel can exist."""
    paramiko = sys.modules.get("paramiko")
    return (OSError, EOFError, *((paramiko.SSHException,) if paramiko is not None else ()))


# Channels started before a task asked for them (remote/ssh/early.py), by their exact command line.
_EARLY: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def start_early(argv: list[str], stdin: bool = False) -> None:
    """Start ``argv``, an `ssh` over the shared connection (with ``stdin``: a pipe the channel sends on
    once it takes it; else nothing to send), for a channel that will ask for exactly it
    (``MuxChannel.exec_command`` takes it over); ended at exit if none does."""
    if not _EARLY:
        atexit.register(_end_unused)
    if tuple(argv) in _EARLY:  # (asked again, a launch retried: the first is the one to take)
        return
    _EARLY[tuple(argv)] = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        start_new_session=True,
    )


def end_early(argv: list[str]) -> None:
    """End ``argv``'s early call where no channel took it (its agent on the host then reads no more and ends)."""
    proc = _EARLY.pop(tuple(argv), None)
    if proc is not None:
        _end(proc)


def _end_unused() -> None:
    for proc in _EARLY.values():
        _end(proc)
    _EARLY.clear()


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(5)


class MuxConnection:
    """The tasks' view of a Fabric Connection, over the shared OpenSSH connection."""

    def __init__(self, host: SshHost, argv: list[str]):
        self.host = host.host
        self.argv = argv
        self.client = self
        self.transport = MuxTransport(argv)

    def get_transport(self) -> MuxTransport:
        return self.transport

    def run(self, command: str, hide: bool = True, warn: bool = True, in_stream: bool = False) -> Result:
        done = subprocess.run([*self.argv, command], capture_output=True, stdin=subprocess.DEVNULL)
        return Result(done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"), done.returncode)

    def close(self) -> None:
        pass  # the shared connection stays for the next task


class MuxTransport:
    def __init__(self, argv: list[str]):
        self.argv = argv

    def open_session(self) -> MuxChannel:
        return MuxChannel(self.argv)

    def is_active(self) -> bool:
        return True

    def set_keepalive(self, _interval: int) -> None:
        pass


class MuxChannel:
    """An exec channel of the shared connection: one `ssh` process whose pipes are the channel's
    stdin, stdout and stderr, with the few calls of paramiko's Channel the tasks make."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._eof = False
        self._err = bytearray()
        self._lock = threading.Lock()
        self._drain: threading.Thread | None = None
        self._reader: io.BufferedReader | None = None

    def exec_command(self, command: str) -> None:
        early = _EARLY.pop((*self.argv, command), None)  # started while the command loaded (early.py): the same call
        self.proc = early or subprocess.Popen(
            [*self.argv, command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, start_new_session=True
        )
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while data := self.proc.stderr.read(65536):
            with self._lock:
                self._err += data

    def sendall(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        view = memoryview(data)
        while view:
            view = view[self.proc.stdin.write(view) or 0 :]

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        assert self.proc is not None and isinstance(self.proc.stdout, io.FileIO)  # (bufsize=0: a raw pipe)
        if self._reader is None:
            self._reader = io.BufferedReader(self.proc.stdout)
        return self._reader

    def fileno(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def recv_ready(self) -> bool:
        return not self._eof and bool(select.select([self.fileno()], [], [], 0)[0])

    def recv(self, n: int) -> bytes:
        data = os.read(self.fileno(), n)
        self._eof = self._eof or not data
        return data

    def recv_stderr_ready(self) -> bool:
        with self._lock:
            return bool(self._err)

    def recv_stderr(self, n: int) -> bytes:
        with self._lock:
            data = bytes(self._err[:n])
            del self._err[:n]
        return data

    def exit_status_ready(self) -> bool:
        if self.proc is None or self.proc.poll() is None:
            return False
        if self._drain is not None:
            self._drain.join(5)  # all of stderr read before the end is reported (the log's end marks)
        return True

    def recv_exit_status(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def settimeout(self, _timeout: float | None) -> None:
        pass  # the shared connection's ServerAlive ends a dead one; a read waits for it

    def shutdown_write(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self) -> None:
        """End the channel: its `ssh` process goes, and the shared connection closes the channel."""
        self.closed = True
        if self.proc is None:
            return
        self.shutdown_write()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # (stderr is the drain thread's, which ends with the process)
