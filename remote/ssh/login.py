"""Logging in: the keys we offer a host, and why a host refused them.

A key file we cannot use (a .pub, a passphrase key ssh-agent does not hold) is said at once
rather than looking like a host not up; a refused login names every key offered and what the host
answered, and on GCP the usual cause (OS Login).
"""

from __future__ import annotations

import os

import paramiko

from gpu_train.stack.config import split_host
from gpu_train.stack.sshhost import SshHost
from remote.errors import KeyFileError
from remote.ssh.hostkeys import fingerprint
from remote.ssh.target import Target


def agent_fingerprints() -> set[str]:
    """Fingerprints of the keys ssh-agent holds (none without SSH_AUTH_SOCK)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return set()
    try:
        return {fingerprint(k) for k in paramiko.Agent().get_keys()}
    except paramiko.SSHException:
        return set()


def public_fingerprint(path: str) -> str | None:
    """The fingerprint of ``path``'s public half, from PATH.pub (readable without the passphrase)."""
    try:
        blob = paramiko.PublicBlob.from_file(f"{path}.pub")
        return fingerprint(paramiko.PKey.from_type_string(blob.key_type, blob.key_blob))
    except (OSError, ValueError, paramiko.SSHException):
        return None


def check_key_file(path: str) -> None:
    """KeyFileError at once when ``path`` is not a private key we can use (a .pub, a typo, a
    passphrase-protected key that ssh-agent does not hold): otherwise every attempt fails alike
    and it looks like a host not up."""
    try:
        paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's word for an OpenSSH-format one
        if public_fingerprint(path) in agent_fingerprints():
            return  # the agent signs with it
        raise KeyFileError(
            f"the key {path} has a passphrase and ssh-agent does not hold it: add it once per login "
            f"session (ssh-add {path}), then run the task again"
        ) from None
    except (paramiko.SSHException, ValueError, OSError, UnicodeError) as e:
        raise KeyFileError(
            f"{path} is not an SSH private key ({str(e).split('. ')[0]}): set gpu-train:sshKey to your private key's path (not the .pub)"
        ) from None


OSLOGIN_MARK = "gpu-train: OS Login is on for this VM"  # what the startup script prints (serial console)


def refused_message(target: Target, host: SshHost, error: Exception) -> str:
    """Why the login was refused (the keys offered, the host's answer), and what to do. On GCP the
    usual cause is OS Login, enforced by the organisation or project: the VM then ignores the
    ssh-keys metadata, and its startup script says so on the serial console."""
    text = auth_message(host, target, error)
    if not target.is_gcp:
        return text
    return (
        f"{text} On Google Cloud this usually means OS Login is on for the project (organisation policy "
        "constraints/compute.requireOsLogin, or project metadata enable-oslogin=TRUE): the VM ignores the "
        f"ssh-keys metadata and {host.user} is never created. Check: `gcloud compute instances "
        "get-serial-port-output INSTANCE --zone ZONE | grep 'OS Login'` (the startup script prints "
        f"'{OSLOGIN_MARK}'); fix: let the project use metadata SSH keys."
    )


def offered_keys(host: SshHost) -> list[str]:
    """What we offer a host, for messages: each key file and each ssh-agent key, with fingerprints."""
    out = [f"{path} ({public_fingerprint(path) or 'no .pub beside it'})" for path in host.keys]
    try:
        agent_keys = paramiko.Agent().get_keys() if os.environ.get("SSH_AUTH_SOCK") else ()
    except paramiko.SSHException:
        agent_keys = ()
    out += [f"ssh-agent: {fingerprint(k)}{' ' + k.comment if getattr(k, 'comment', '') else ''}" for k in agent_keys]
    return out


def auth_message(host: SshHost, target: Target, e: paramiko.AuthenticationException) -> str:
    """Which keys were offered to whom, and what the host answered."""
    where = f"{host.user}@{host.host}:{host.port}" + (f" ({host.spec})" if host.spec and split_host(host.spec)[1] != host.host else "")
    keys = offered_keys(host)
    if isinstance(e, paramiko.PasswordRequiredException):
        locked = ", ".join(host.keys)
        return (
            f"{where}: the key {locked} is protected by a passphrase and ssh-agent does not hold it; add it "
            f"once per login session: ssh-add {host.keys[0] if host.keys else ''}".rstrip()
        )
    answer = (str(e) or type(e).__name__).rstrip(".")
    allowed = getattr(e, "allowed_types", None)
    if allowed:
        answer += f" (it accepts: {', '.join(allowed)})"
    offered = "; ".join(keys) if keys else "no key at all (no identity file exists and no ssh-agent)"
    fix = "gpu-train:sshKey" if target.key_file else "gpu-train:sshKey or the IdentityFile in your ssh_config"
    return (
        f"{where} refused the login as {host.user!r}. Offered: {offered}. The host answered: {answer}. "
        f"Put one of these keys' public halves in ~{host.user}/.ssh/authorized_keys there, or set {fix}."
    )
