"""Serve rsync's remote shell (remote/transfer/rsh.py) over an open connection (paramiko's, or the shared one)."""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from remote.ssh.listener import accept_each
from remote.ssh.mux import channel_errors

if TYPE_CHECKING:
    import paramiko

RSH = Path(__file__).with_name("rsh.py")


class ChannelRelay:
    """A Unix socket; each connection to it becomes one exec channel on ``transport``."""

    def __init__(self, transport: paramiko.Transport):
        self.transport = transport
        self._dir = tempfile.TemporaryDirectory(prefix="gpu-train-rsh-")
        self.path = str(Path(self._dir.name) / "s")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(4)
        accept_each(self._listener, self._start_serving)

    def rsh(self) -> str:
        """The value for rsync's -e: a Python without site imports starts in milliseconds."""
        return shlex.join([sys.executable, "-I", "-S", str(RSH), self.path])

    def _start_serving(self, client: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        # A lost connection (the host went down mid-sync) ends the relay quietly: rsync sees its
        # stream close and reports the failure itself, which the task turns into that node's error.
        ended: tuple[type[BaseException], ...] = (ValueError, *channel_errors())  # what ends the relay quietly
        reader = client.makefile("rb")
        chan = None
        try:
            command = json.loads(reader.readline())
            chan = self.transport.open_session()
            chan.exec_command(command)

            def upstream() -> None:
                with contextlib.suppress(*channel_errors()):
                    while data := reader.read1(65536):
                        chan.sendall(data)
                    chan.shutdown_write()

            threading.Thread(target=upstream, daemon=True).start()
            while data := chan.recv(65536):
                client.sendall(data)
            client.shutdown(socket.SHUT_WR)  # rsync reports the far side's errors through its own protocol
        except ended:
            pass
        finally:
            client.close()
            if chan is not None:
                chan.close()

    def close(self) -> None:
        self._listener.close()
        self._dir.cleanup()

    def __enter__(self) -> ChannelRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
