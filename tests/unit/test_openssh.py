"""A stack's SSH policy as OpenSSH's command line (remote/ssh/openssh.py): what fetch asks before its
streams ride on the shared connection, answered as OpenSSH itself reads known_hosts, without paramiko."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from gpu_train.stack.sshhost import SshHost
from remote.ssh.openssh import knows_host
from tests.unit.test_codehop import _target

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFq1n7Vj2mYtJ0b1Yy3d5a7c9e1f3h5j7l9n1p3r5t7v"


@pytest.mark.parametrize(
    ("lines", "hashed", "peer", "known"),
    [
        ("[10.0.0.9]:2222 {key}\n", False, SshHost("me", "10.0.0.9", 2222), True),
        ("[10.0.0.9]:2222 {key}\n", True, SshHost("me", "10.0.0.9", 2222), True),  # HashKnownHosts
        ("[10.0.0.9]:2222 {key}\n", False, SshHost("me", "10.0.0.9", 2223), False),  # another port
        ("10.0.0.9 {key}\n", False, SshHost("me", "10.0.0.9", 22), True),
        ("10.0.0.9 {key}\n", False, SshHost("me", "10.0.0.99", 22), False),
        (None, False, SshHost("me", "10.0.0.9", 22), False),  # no file yet: a login learns the key
    ],
)
def test_a_known_host_is_found_as_openssh_reads_the_file(tmp_path: Path, lines, hashed: bool, peer: SshHost, known: bool) -> None:
    target = dataclasses.replace(_target(tmp_path), known_hosts=tmp_path / "known_hosts")
    if lines is not None:
        target.known_hosts.write_text(lines.format(key=KEY))
        if hashed:
            subprocess.run(["ssh-keygen", "-H", "-f", str(target.known_hosts)], check=True, capture_output=True)
            assert "10.0.0.9" not in target.known_hosts.read_text()
    assert knows_host(target, peer) is known
