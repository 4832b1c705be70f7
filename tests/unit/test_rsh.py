"""rsync's remote shell (remote/transfer/rsh.py) when the relay behind it goes away mid-stream, or ends cleanly."""

import fcntl
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from remote.transfer.relay import RSH


def far_side(tmp_path: Path, serve: Callable[[socket.socket], None]) -> str:
    """A Unix socket where the relay would be; ``serve`` gets the one connection rsh.py makes."""
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def accept() -> None:
        with listener:
            client, _ = listener.accept()
        serve(client)

    threading.Thread(target=accept, daemon=True).start()
    return path


def rsh(path: str) -> list[str]:
    return [sys.executable, "-I", "-S", str(RSH), path, "-l", "root", "node1", "rsync", "--server"]


def test_a_connection_reset_mid_stream_is_one_line_and_exit_255_not_a_traceback(tmp_path):
    # What a node lost mid-sync looks like to rsh.py: the relay drops its end with data unread,
    # so the kernel answers with a reset. rsync shows rsh's stderr to the user as the node's error.
    def serve(client: socket.socket) -> None:
        reader = client.makefile("rb")
        reader.readline()
        reader.read(256 << 10)  # rsync's stream is flowing
        while not struct.unpack("i", fcntl.ioctl(client, termios.FIONREAD, b"\0" * 4))[0]:
            time.sleep(0.01)  # more of it waits unread, so the close below resets the stream (not EOF)
        reader.close()
        client.close()

    proc = subprocess.run(rsh(far_side(tmp_path, serve)), input=b"x" * (4 << 20), capture_output=True, timeout=30)
    assert "Traceback" not in proc.stderr.decode()
    assert proc.returncode == 255
    assert proc.stderr.decode().startswith("connection to node1 lost:")


def test_a_clean_end_while_stdin_stays_open_is_exit_0_at_once(tmp_path):
    # The far side's command finished: the relay sends its last output and closes. rsync keeps rsh's
    # stdin open, waiting for it to exit; quiet stdin means nothing of ours was refused.
    received: list[bytes] = []

    def serve(client: socket.socket) -> None:
        reader = client.makefile("rb")
        received.extend([reader.readline(), reader.read(5)])
        client.sendall(b"bye")
        client.shutdown(socket.SHUT_WR)
        reader.close()
        client.close()

    proc = subprocess.Popen(rsh(far_side(tmp_path, serve)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        proc.stdin.write(b"hello")
        proc.stdin.flush()  # and kept open
        assert proc.wait(timeout=3) == 0
        assert proc.stdout.read() == b"bye"
        assert proc.stderr.read() == b""
    finally:
        proc.kill()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
    assert received == [b'"rsync --server"\n', b"hello"]
