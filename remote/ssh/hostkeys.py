"""Host keys: never added silently, never trusted when changed.

Fabric's default is to auto-add; here a stack's own known_hosts learns a host's key on first
contact and prints its fingerprint, a pinned ``knownHosts`` file is only read, and a changed key is
a hard error. OpenSSH (rsync, ``fab ssh``) reads the same file.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import paramiko

from gpu_train.atomic import atomic_write
from remote.errors import HostKeyError
from remote.ssh.target import Target

Say = Callable[[str], None]


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # (paramiko ships no types: Any here)
    """Learn an unknown host's key into the stack's known_hosts, saying so; refuse if pinned."""

    def __init__(self, path: Path, pinned: bool, say: Say):
        self.path, self.pinned, self.say = path, pinned, say

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.pinned:
            raise HostKeyError(
                f"{hostname} is not in {self.path} (gpu-train:knownHosts pins host keys); its {key.get_name()} "
                f"key is {fingerprint(key)}. If that is right, add it: ssh-keyscan -p PORT HOST >> {self.path}"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        append_known_host(self.path, f"{hostname} {key.get_name()} {key.get_base64()}\n")
        self.say(f"first contact with {hostname}: {key.get_name()} key {fingerprint(key)}, saved to {self.path}")


def append_known_host(path: Path, line: str) -> None:
    """Add a line to a known_hosts file that other tasks (other nodes, other stacks) write at once.

    Under an exclusive lock on a lock file beside it: re-read, append, write a temp file, rename.
    Without the lock two hosts learned at once each write "old + mine" and one line is lost.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        old = path.read_text() if path.exists() else ""
        if line in old.splitlines(keepends=True):
            return  # learned by the task beside us meanwhile
        if old and not old.endswith("\n"):
            old += "\n"
        atomic_write(path, old + line)
    finally:
        os.close(lock_fd)


def changed_key_message(name: str, target: Target, e: paramiko.BadHostKeyException) -> str:
    return (
        f"the host key of {name} has CHANGED: expected {fingerprint(e.expected_key)}, got "
        f"{fingerprint(e.key)}. This can mean someone is intercepting the connection, or the host was "
        f"rebuilt (a new VM at the same address). If you know it was rebuilt, forget the old key:\n"
        f"    ssh-keygen -f {target.known_hosts} -R '{name}'\nthen run the task again."
    )
