"""SSH to a target's hosts: verified host keys, waiting with backoff, one agent call per task.

Host keys are never added silently (Fabric's default is to auto-add): a stack's own known_hosts
learns a host's key on first contact and prints its fingerprint; a pinned ``knownHosts`` file is
only read; a changed key is a hard error. OpenSSH (rsync, ``fab ssh``) reads the same file.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import select
import shlex
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
from fabric import Config, Connection

from gpu_train.config import SshHost, split_host
from gpu_train.errors import ExitStatus, GpuTrainError
from remote.agent.bundle import agent_command
from remote.agent.protocol import LOG_END, LOG_START
from remote.target import Target

Say = Callable[[str], None]
# paramiko logs a lost connection ("Socket exception: ...") through logging's last-resort handler,
# onto the user's terminal; the tasks say what failed themselves.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
START_MARK = LOG_START
END_MARK = LOG_END


class RemoteError(GpuTrainError):
    """Something on the host or the way to it failed; the message says what and what to do."""


class HostKeyError(RemoteError):
    """A failure no retry or refreshed address can cure (the tasks stop at once)."""

    status = ExitStatus.UNREACHABLE


class KeyFileError(HostKeyError):
    """Our own private key cannot be used."""


class VmStopped(HostKeyError):
    """The Compute API says the VM is stopped: no wait and no refreshed address will reach it."""


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_id(host: SshHost) -> str:
    """The name known_hosts files use: 'host' on port 22, '[host]:port' elsewhere."""
    return host.host if host.port == 22 else f"[{host.host}]:{host.port}"


class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
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
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp.write(old + line)
        os.replace(tmp.name, path)
    finally:
        os.close(lock_fd)


def knows_host(target: Target, host: SshHost) -> bool:
    """Whether the stack's known_hosts already holds a key for ``host`` (OpenSSH can verify it)."""
    if not target.known_hosts.is_file():
        return False
    return bool(paramiko.HostKeys(str(target.known_hosts)).lookup(host_id(host)))


def _changed_key_message(name: str, target: Target, e: paramiko.BadHostKeyException) -> str:
    return (
        f"the host key of {name} has CHANGED: expected {fingerprint(e.expected_key)}, got "
        f"{fingerprint(e.key)}. This can mean someone is intercepting the connection, or the host was "
        f"rebuilt (a new VM at the same address). If you know it was rebuilt, forget the old key:\n"
        f"    ssh-keygen -f {target.known_hosts} -R '{name}'\nthen run the task again."
    )


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
        raise KeyFileError(f"the key {path} has a passphrase and ssh-agent does not hold it: add it once per login "
                           f"session (ssh-add {path}), then run the task again") from None
    except (paramiko.SSHException, ValueError, OSError, UnicodeError) as e:
        raise KeyFileError(f"{path} is not an SSH private key ({str(e).split('. ')[0]}): set gpu-train:sshKey to your "
                          "private key's path (not the .pub)") from None


OSLOGIN_MARK = "gpu-train: OS Login is on for this VM"  # what the startup script prints (serial console)


def refused_message(target: Target, host: SshHost, error: Exception) -> str:
    """Why the login was refused (the keys offered, the host's answer), and what to do. On GCP the
    usual cause is OS Login, enforced by the organisation or project: the VM then ignores the
    ssh-keys metadata, and its startup script says so on the serial console."""
    text = auth_message(host, target, error)
    if not target.is_gcp:
        return text
    return (f"{text} On Google Cloud this usually means OS Login is on for the project (organisation policy "
            "constraints/compute.requireOsLogin, or project metadata enable-oslogin=TRUE): the VM ignores the "
            f"ssh-keys metadata and {host.user} is never created. Check: `gcloud compute instances "
            "get-serial-port-output INSTANCE --zone ZONE | grep 'OS Login'` (the startup script prints "
            f"'{OSLOGIN_MARK}'); fix: let the project use metadata SSH keys.")


def _client(target: Target, say: Say) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if target.known_hosts.is_file():
        client.load_host_keys(str(target.known_hosts))
    client.set_missing_host_key_policy(TrustOnFirstUse(target.known_hosts, target.pinned, say))
    return client


def connections(target: Target, host: SshHost, say: Say) -> list[Connection]:
    """Unopened Connections to ``host``'s jump hosts, in order, and last to ``host`` through them, each
    verified against the stack's known_hosts; keys: the hop's identity files, then ssh-agent's
    (where passphrase keys live)."""
    chain: list[Connection] = []
    for hop in (*host.jump, host):
        conn = Connection(
            hop.host, user=hop.user, port=hop.port, connect_timeout=10, gateway=chain[-1] if chain else None,
            config=Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}}),
            connect_kwargs={"key_filename": list(hop.keys), "look_for_keys": False, "allow_agent": True,
                            "banner_timeout": 15, "auth_timeout": 15},
        )
        conn.client = _client(target, say)
        chain.append(conn)
    return chain


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
        return (f"{where}: the key {locked} is protected by a passphrase and ssh-agent does not hold it; add it "
                f"once per login session: ssh-add {host.keys[0] if host.keys else ''}".rstrip())
    answer = (str(e) or type(e).__name__).rstrip(".")
    allowed = getattr(e, "allowed_types", None)
    if allowed:
        answer += f" (it accepts: {', '.join(allowed)})"
    offered = "; ".join(keys) if keys else "no key at all (no identity file exists and no ssh-agent)"
    fix = "gpu-train:sshKey" if target.key_file else "gpu-train:sshKey or the IdentityFile in your ssh_config"
    return (f"{where} refused the login as {host.user!r}. Offered: {offered}. The host answered: {answer}. "
            f"Put one of these keys' public halves in ~{host.user}/.ssh/authorized_keys there, or set {fix}.")


def unreachable_now(e: BaseException, host: SshHost) -> tuple[str, bool] | None:
    """A connection failure that waiting cannot fix: (message, refused?). None for timeouts and the like.

    A name that does not resolve never will; a refused connection means nothing listens on that
    port (on a booting VM it may yet: the caller decides). A jump host that cannot reach the
    target says so in a channel error.
    """
    where = f"{host.host}:{host.port}" + (f" ({host.spec})" if host.spec and split_host(host.spec)[1] != host.host else "")
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host name {host.host!r} ({where}): {e.strerror or e}", False
    refused = isinstance(e, ConnectionRefusedError) or (
        isinstance(e, paramiko.ssh_exception.NoValidConnectionsError)
        and all(getattr(err, "errno", None) == errno.ECONNREFUSED for err in e.errors.values()))
    if refused:
        return f"connection refused by {where}: nothing listens on port {host.port} (is sshd running? is the port right?)", True
    if isinstance(e, paramiko.ChannelException):
        via = host.jump[-1] if host.jump else None
        return f"the jump host {via.host if via else '?'} could not open a connection to {where}: {e.text}", False
    return None


def _close(chain: list[Connection]) -> None:
    for conn in reversed(chain):
        conn.close()


def open_connection(target: Target, host: SshHost, timeout: float, say: Say,
                    probe: Callable[[], str | None] | None = None, again: bool = False) -> Connection:
    """Connect, retrying with backoff until ``timeout`` while the host is not up yet.

    An unresolvable name fails at once; so does a refused connection, except on GCP, where a
    booting VM refuses until its sshd is up, and ``again`` (reconnecting to a host that answered
    a moment ago: its sshd may be restarting). ``probe`` (GCP: the Compute API's view of the VM)
    runs while SSH does not answer, and its message (a stopped VM) ends the wait.
    """
    if target.key_file:
        check_key_file(target.key_file)
    deadline = time.monotonic() + timeout
    delay, told, probed_at = 0.5, False, -1e9
    hops = (*[dataclasses.replace(h, jump=host.jump[:i]) for i, h in enumerate(host.jump)], host)
    while True:
        chain = connections(target, host, say)
        hop = hops[0]
        try:
            for i, conn in enumerate(chain):  # one by one: a failure names its hop
                hop = hops[i]
                conn.open()
                conn.transport.set_keepalive(5)
            return chain[-1]
        except paramiko.BadHostKeyException as e:
            _close(chain)
            raise HostKeyError(_changed_key_message(e.hostname or host_id(hop), target, e)) from None
        except HostKeyError:
            _close(chain)
            raise
        except paramiko.AuthenticationException as e:
            _close(chain)
            raise RemoteError(refused_message(target, hop, e)) from None
        except (TimeoutError, OSError, paramiko.SSHException, EOFError) as e:
            _close(chain)
            fatal = unreachable_now(e, hop)
            if fatal is not None and hop is not host:
                fatal = (f"{fatal[0]} (the jump host on the way to {host.spec or host})", fatal[1])
            if probe is not None and time.monotonic() - probed_at > 15:
                probed_at = time.monotonic()
                verdict = probe()
                if verdict:
                    raise VmStopped(verdict) from None
            if fatal is not None and not ((target.is_gcp or again) and fatal[1]):
                raise RemoteError(fatal[0]) from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteError(f"cannot reach {host} over SSH after {timeout:g} s ({e or type(e).__name__}); "
                                  "is the host up and the port right?") from None
            if not told:
                say(f"waiting for SSH on {host} (up to {timeout:g} s): {e or type(e).__name__}")
                told = True
            time.sleep(min(delay, left))
            delay = min(delay * 2, 10)


def call(conn: Connection, target: Target, *args: str) -> dict:
    """Run one agent subcommand on the host; its JSON answer, or RemoteError with its message."""
    result = conn.run(agent_command(target.remote_root, *args), hide=True, warn=True, in_stream=False)
    lines = result.stdout.strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        detail = (result.stderr or result.stdout).strip()[-2000:]
        raise RemoteError(f"the gpu-train agent failed on {conn.host} (exit {result.exited}): {detail}")
    if "error" in doc:
        raise RemoteError(doc["error"])
    return doc


def launch(conn: Connection, target: Target, spec: str, sync: Callable[[], object] | None,
           reuse: bool = False) -> dict:
    """The agent's launch, started alongside the code sync and released by "go" after it.

    Opening the agent's channel, its start-up and its checks overlap the sync, so launching costs
    one round trip once the code is there. With ``reuse`` (the laptop's code matches the last push)
    the host first tries to reuse the last run's code, and the sync runs only if it cannot.
    Without ``sync`` (code already staged) it launches at once.
    """
    # The spec (with the job's --env values) goes on the channel's stdin: a command line is readable
    # by every user of the host in /proc.
    command = agent_command(target.remote_root, "launch", "-", *(["--await-go"] if sync else []))
    opened: dict[str, object] = {}

    def open_channel() -> None:
        try:
            chan = conn.client.get_transport().open_session()
            chan.exec_command(command)
            chan.sendall(spec.encode() + b"\n")
            opened["chan"] = chan
        except Exception as e:
            opened["error"] = e

    opener = threading.Thread(target=open_channel, daemon=True)
    opener.start()
    failure: BaseException | None = None
    if sync is not None and not reuse:
        try:
            sync()
        except BaseException as e:
            failure = e
    opener.join()
    if "error" in opened:
        raise RemoteError(f"cannot start the gpu-train agent: {opened['error']}")
    chan: paramiko.Channel = opened["chan"]  # type: ignore[assignment]
    out = chan.makefile("rb")
    try:
        if sync is not None:
            # The agent's first word even when the sync failed: a refusal (REMOTE_ROOT not ours, a
            # busy name) explains the failed sync better than rsync's exit code.
            line = out.readline()
            if failure is not None:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    if "error" in (said := json.loads(line)):
                        raise RemoteError(said["error"])
                first = {}
            else:
                first = _answer(line, chan)
            if failure is None and "ready" in first and reuse and not first.get("reused"):
                try:
                    sync()
                except BaseException as e:
                    failure = e
            if failure is not None:
                with contextlib.suppress(OSError):
                    chan.sendall(b"abort\n")
                raise failure
            if "ready" not in first:
                return first  # waiting for the driver: the code stays staged for the next try
            chan.sendall(b"go\n")
        return _answer(out.readline(), chan)
    finally:
        chan.close()


def _answer(line: bytes, chan: paramiko.Channel) -> dict:
    try:
        doc = json.loads(line)
    except ValueError:
        err = chan.recv_stderr(65536).decode("utf-8", "replace") if chan.recv_stderr_ready() else ""
        raise RemoteError(f"the gpu-train agent failed: {err.strip() or line.decode('utf-8', 'replace')}") from None
    if "error" in doc:
        raise RemoteError(doc["error"])
    return doc


def stream(conn: Connection, command: str, out: Callable[[bytes], None]) -> tuple[int, str]:
    """Run ``command``, passing stdout bytes to ``out`` as they come; (exit status, stderr)."""
    chan = conn.client.get_transport().open_session()
    chan.exec_command(command)
    err = b""
    while True:
        ready, _, _ = select.select([chan], [], [], 1.0)
        if ready or chan.recv_ready() or chan.recv_stderr_ready():
            while chan.recv_ready():
                data = chan.recv(65536)
                if data:
                    out(data)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed or not conn.transport.is_active():
            break
    status = chan.recv_exit_status() if chan.exit_status_ready() else -1
    return status, err.decode("utf-8", "replace")


def start_offset(stderr: str) -> int | None:
    """Where the agent started reading the log (so a dropped stream resumes at the right byte)."""
    for line in stderr.splitlines():
        if line.startswith(START_MARK):
            return int(json.loads(line[len(START_MARK):])["offset"])
    return None


def end_trailer(stderr: str) -> dict | None:
    """The agent's last word after streaming a log: state, exit code, offset."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(END_MARK):
            return json.loads(line[len(END_MARK):])
    return None


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
    return shlex.join(["ssh", *openssh_options(target, via), "-W", "%h:%p", f"{via.user}@{via.host}"])
