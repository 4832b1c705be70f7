"""Local port forwarding over a task's own SSH connection (what `ssh -L` does), with clear failures.

``LocalForward`` listens on 127.0.0.1:LOCAL and carries each connection to 127.0.0.1:PORT on the
host through a direct-tcpip channel of the paramiko transport, so `tunnel`, `tensorboard` and
`jupyter` need no second login. A busy local port and a remote port nobody listens on are each
reported as such, before the user opens a browser on a dead link.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import threading

import paramiko

from remote.errors import RemoteError


class ForwardError(RemoteError):
    """A port cannot be forwarded; the message says which and what to do."""


def remote_listens(transport: paramiko.Transport, port: int, host: str = "127.0.0.1") -> bool:
    """Whether something on the host accepts connections on host:port (one channel, opened and closed)."""
    try:
        chan = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=15)
    except (paramiko.ChannelException, paramiko.SSHException, OSError):
        return False
    chan.close()
    return True


def local_port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def pick_local_port(wanted: int) -> int:
    """``wanted`` when free, else any free port (for servers whose default port is often taken)."""
    if local_port_free(wanted):
        return wanted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalForward:
    def __init__(self, transport: paramiko.Transport, remote_port: int, local_port: int, remote_host: str = "127.0.0.1"):
        self.transport, self.remote = transport, (remote_host, remote_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", local_port))
        except OSError as e:
            self.listener.close()
            if e.errno == errno.EADDRINUSE:
                raise ForwardError(
                    f"local port {local_port} is busy (another tunnel, TensorBoard or Jupyter?): stop what uses it, or pass --local-port N"
                ) from None
            raise ForwardError(f"cannot listen on local port {local_port}: {e}") from None
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        try:
            chan = self.transport.open_channel("direct-tcpip", self.remote, peer, timeout=15)
        except (paramiko.ChannelException, paramiko.SSHException, OSError):
            sock.close()
            return
        with contextlib.closing(sock), contextlib.closing(chan):
            while not self.closed.is_set():
                ready, _, _ = select.select([sock, chan], [], [], 1.0)
                if sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        return
                    sock.sendall(data)

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread; close alone does not
        with contextlib.suppress(OSError):
            self.listener.close()
