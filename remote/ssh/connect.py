"""SSH to a target's hosts with paramiko: verified connections through their jump hosts, waiting with
backoff (the same policy spelled as OpenSSH options is ``remote.ssh.openssh``).

Host keys are checked by ``remote.ssh.hostkeys``, the keys offered and refusals explained by
``remote.ssh.login``; the agent's calls over a connection are ``remote.ssh.agentcall``.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import time
from collections.abc import Callable

import paramiko
from fabric import Config, Connection

from gpu_train.retry import Backoff
from gpu_train.stack.config import split_host
from gpu_train.stack.sshhost import SshHost
from remote.errors import HostKeyError, RemoteError, VmStopped
from remote.ssh.hostkeys import Say, TrustOnFirstUse, changed_key_message
from remote.ssh.login import check_key_file, refused_message
from remote.ssh.openssh import host_id
from remote.ssh.target import Target

# paramiko logs a lost connection ("Socket exception: ...") through logging's last-resort handler,
# onto the user's terminal; the tasks say what failed themselves.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


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
            hop.host,
            user=hop.user,
            port=hop.port,
            connect_timeout=10,
            gateway=chain[-1] if chain else None,
            config=Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}}),
            connect_kwargs={
                "key_filename": list(hop.keys),
                "look_for_keys": False,
                "allow_agent": True,
                "banner_timeout": 15,
                "auth_timeout": 15,
            },
        )
        conn.client = _client(target, say)
        chain.append(conn)
    return chain


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
        and all(getattr(err, "errno", None) == errno.ECONNREFUSED for err in e.errors.values())
    )
    if refused:
        return f"connection refused by {where}: nothing listens on port {host.port} (is sshd running? is the port right?)", True
    if isinstance(e, paramiko.ChannelException):
        via = host.jump[-1] if host.jump else None
        return f"the jump host {via.host if via else '?'} could not open a connection to {where}: {e.text}", False
    return None


def _close(chain: list[Connection]) -> None:
    for conn in reversed(chain):
        conn.close()


def open_connection(
    target: Target, host: SshHost, timeout: float, say: Say, probe: Callable[[], str | None] | None = None, again: bool = False
) -> Connection:
    """Connect, retrying with backoff until ``timeout`` while the host is not up yet.

    An unresolvable name fails at once; so does a refused connection, except on GCP, where a
    booting VM refuses until its sshd is up, and ``again`` (reconnecting to a host that answered
    a moment ago: its sshd may be restarting). ``probe`` (GCP: the Compute API's view of the VM)
    runs while SSH does not answer, and its message (a stopped VM) ends the wait.
    """
    if target.key_file:
        check_key_file(target.key_file)
    backoff, told, probed_at = Backoff.within(timeout, first=0.5, cap=10), False, -1e9
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
            raise HostKeyError(changed_key_message(e.hostname or host_id(hop), target, e)) from None
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
            if backoff.left() <= 0:
                raise RemoteError(
                    f"cannot reach {host} over SSH after {timeout:g} s ({e or type(e).__name__}); is the host up and the port right?"
                ) from None
            if not told:
                say(f"waiting for SSH on {host} (up to {timeout:g} s): {e or type(e).__name__}")
                told = True
            time.sleep(backoff.next())
