"""A stack's SSH policy spelled as OpenSSH's command line (rsync, the shared connection, `gpu-train ssh`,
the fetch streams), and the names known_hosts files give hosts.

Apart from ``remote.ssh.connect`` (paramiko's logins, which speak the same policy) so that a task riding
on the shared OpenSSH connection never imports paramiko: about 60 ms of every such command's start.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess

from gpu_train.stack.sshhost import SshHost
from remote.ssh.target import Target


def openssh_options(target: Target, host: SshHost) -> list[str]:
    """OpenSSH options matching our paramiko policy: the host's keys (and ssh-agent's), our
    known_hosts, no prompts, and its jump hosts as a ProxyCommand built the same way."""
    keys = [opt for k in host.keys for opt in ("-i", k)]
    opts = [
        "-p", str(host.port), *keys, "-F", "/dev/null",
        "-o", f"IdentitiesOnly={'yes' if target.key_file and host.keys else 'no'}", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={target.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=15",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
        # AES-GCM runs on the CPU's AES instructions: faster bulk transfers than OpenSSH's default.
        "-o", "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com",
    ]  # fmt: skip
    if host.jump:
        opts += ["-o", "ProxyCommand=" + proxy_command(target, host)]
    return opts


def proxy_command(target: Target, host: SshHost) -> str:
    """OpenSSH's ProxyCommand reaching ``host`` through its last jump host (itself through the
    earlier ones), with the same keys and known_hosts; "" without jump hosts."""
    if not host.jump:
        return ""
    via = dataclasses.replace(host.jump[-1], jump=host.jump[:-1])
    return shlex.join(["ssh", *openssh_options(target, via), "-W", "%h:%p", "--", f"{via.user}@{via.host}"])


def host_id(host: SshHost) -> str:
    """The name known_hosts files use: 'host' on port 22, '[host]:port' elsewhere."""
    return host.host if host.port == 22 else f"[{host.host}]:{host.port}"


def knows_host(target: Target, host: SshHost) -> bool:
    """Whether the stack's known_hosts holds a key for ``host``, as OpenSSH itself reads the file
    (`ssh-keygen -F`: hashed names too), so that OpenSSH can verify it without a login first."""
    if not target.known_hosts.is_file():
        return False
    try:
        found = subprocess.run(
            ["ssh-keygen", "-F", host_id(host), "-f", str(target.known_hosts)],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False  # (a login learns or checks the key instead)
    return found.returncode == 0 and bool(found.stdout.strip())
