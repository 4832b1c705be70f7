"""Accepting connections on a listening socket until its owner closes it.

The relay for rsync, the benchmarks' delay proxy and the tests' stand-in servers all accept in a
background thread and stop when the socket is closed (``accept`` then raises ``OSError``): one
loop, so that ending is handled the same everywhere.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def accept_each(listener: socket.socket, handle: Callable[[socket.socket], None]) -> threading.Thread:
    """Accept on ``listener`` in a daemon thread, passing each connection to ``handle``, until the
    listener is closed. ``handle`` runs in that thread: one that blocks delays the next accept,
    so long work belongs in a thread of its own."""

    def loop() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by its owner
            handle(client)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
