"""A TCP proxy that adds a fixed delay each way, keeping order: a long link on loopback.

tc/netem needs privileges this machine does not give, so the delay is added in user space: each
direction of each connection has a reader thread that stamps every chunk with its due time and a
writer thread that sends the chunks in order once they are due. The queue between them is not
bounded: like a real long link, the proxy holds what is in flight, and the sender's own windows
(TCP's, SSH's channel window) bound how much that is. That is the point of the benchmark: over
100 ms one SSH channel moves at most its window per round trip.

Blocking sockets in threads (the copies release the GIL) with 1 MiB reads keep the proxy well
clear of being the limit: `python bench/delayproxy.py --selftest` measures its own throughput
with no delay.

Use from a benchmark: ``DelayProxy(("127.0.16.1", 0), (sshd_host, sshd_port), 0.050).start()``. A
``window`` (bytes) bounds what each direction of a connection holds in flight, as a TCP sender's window
does: for a sender with no window of its own above TCP (an HTTP upload), the link then moves at most
window per round trip per connection, as a real long one does.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable

from remote.ssh.listener import accept_each

CHUNK = 1 << 20


class _Direction:
    """One way of one connection: read, stamp, deliver in order after ``delay``. With a ``window``, at
    most that many bytes are in flight, as a TCP sender's window bounds what it has sent and not seen
    acknowledged: a byte read counts for one round trip (2 x ``delay``), the receiver taken to keep up
    (a server that reads one connection at a time, as gcp-storage-emulator does, does not slow the
    others' link: what it has not read yet waits in the proxy)."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float, window: int | None = None):
        self.src, self.dst, self.delay, self.window = src, dst, delay, window
        self.bytes = 0  # delivered so far (only this direction's writer thread adds)
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.acks: collections.deque[tuple[float, int]] = collections.deque()  # (when the sender would see the ACK, bytes)
        self.in_flight = 0

    def _room(self) -> int:
        """Bytes the reader may take now: waits while the window is full."""
        if self.window is None:
            return CHUNK
        while True:
            while self.acks and self.acks[0][0] <= time.monotonic():
                self.in_flight -= self.acks.popleft()[1]
            if self.in_flight < self.window:
                return min(CHUNK, self.window - self.in_flight)
            time.sleep(max(0.0005, self.acks[0][0] - time.monotonic()) if self.acks else 0.001)

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.src.recv(self._room())
            except OSError:
                data = b""
            self.in_flight += len(data)
            if self.window is not None:
                self.acks.append((time.monotonic() + 2 * self.delay, len(data)))
            with self.ready:
                self.queue.append((time.monotonic() + self.delay, data))
                self.ready.notify()
            if not data:
                return

    def _write(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                due, data = self.queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                _quietly(self.dst.shutdown, socket.SHUT_WR)
                return
            try:
                self.dst.sendall(data)
                self.bytes += len(data)
            except OSError:
                _quietly(self.src.shutdown, socket.SHUT_RDWR)
                return


def _quietly(fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(OSError):
        fn(*args)


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the delay is ours, not Nagle's
    return sock


class DelayProxy:
    """Listen on ``listen`` (port 0: any free one, see ``.address``); forward to ``upstream``."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], delay: float, window: int | None = None):
        self.upstream, self.delay, self.window = upstream, delay, window
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(listen)
        self._listener.listen(64)
        self.address: tuple[str, int] = self._listener.getsockname()
        self.connections = 0
        self.down = False  # (cut: the link stays down)
        self._ways: list[tuple[_Direction, _Direction]] = []  # (client to server, server to client) per connection

    def start(self) -> DelayProxy:
        accept_each(self._listener, self._forward)
        return self

    def _forward(self, client: socket.socket) -> None:
        if self.down:
            client.close()
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        self.connections += 1
        up = _Direction(_tuned(client), _tuned(server), self.delay, self.window)
        down = _Direction(server, client, self.delay, self.window)
        self._ways.append((up, down))
        up.start()
        down.start()

    @property
    def bytes_up(self) -> int:
        """Bytes the clients sent through the proxy so far, all connections together (an uplink's load)."""
        return sum(up.bytes for up, _ in self._ways)

    def cut(self, stay_down: bool = False) -> None:
        """Drop every connection through the proxy now, as a link that fails does (each end sees it
        close). A new connection goes through, unless the link is to ``stay_down`` (each is closed at once)."""
        self.down = stay_down
        for up, _ in self._ways:
            for sock in (up.src, up.dst):
                _quietly(sock.shutdown, socket.SHUT_RDWR)
                _quietly(sock.close)

    def close(self) -> None:
        self._listener.close()


def selftest(address: str, megabytes: int = 512) -> float:
    """MiB/s through the proxy with no delay: a sink server, one connection, ``megabytes`` sent."""
    sink = socket.socket()
    sink.bind((address, 0))
    sink.listen(1)
    received = []

    def drain() -> None:
        conn, _ = sink.accept()
        total = 0
        while data := conn.recv(CHUNK):
            total += len(data)
        received.append(total)
        conn.close()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    proxy = DelayProxy((address, 0), sink.getsockname(), 0.0).start()
    block = b"\0" * CHUNK
    start = time.perf_counter()
    with socket.create_connection(proxy.address) as c:
        for _ in range(megabytes):
            c.sendall(block)
        c.shutdown(socket.SHUT_WR)
        t.join()
    elapsed = time.perf_counter() - start
    proxy.close()
    sink.close()
    assert received == [megabytes * CHUNK], received
    return megabytes / elapsed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="127.0.16.1:0", help="HOST:PORT to listen on")
    p.add_argument("--to", help="HOST:PORT to forward to")
    p.add_argument("--delay", type=float, default=0.050, help="seconds added each way (default 0.050)")
    p.add_argument("--selftest", action="store_true", help="measure the proxy's own throughput with no delay")
    args = p.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    if args.selftest:
        print(f"delay proxy, no delay: {selftest(host):.0f} MiB/s through one connection")
        return 0
    if not args.to:
        p.error("--to HOST:PORT is required")
    up_host, up_port = args.to.rsplit(":", 1)
    proxy = DelayProxy((host, int(port)), (up_host, int(up_port)), args.delay).start()
    print(f"{proxy.address[0]}:{proxy.address[1]} -> {args.to}, +{args.delay * 1000:.0f} ms each way", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
