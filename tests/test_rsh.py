"""rsync's remote shell (remote/rsh.py) when the relay behind it goes away mid-stream."""

import fcntl
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

from remote.relay import RSH


def test_a_connection_reset_mid_stream_is_one_line_and_exit_255_not_a_traceback(tmp_path):
    # What a node lost mid-sync looks like to rsh.py: the relay drops its end with data unread,
    # so the kernel answers with a reset. rsync shows rsh's stderr to the user as the node's error.
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        client, _ = listener.accept()
        reader = client.makefile("rb")
        reader.readline()
        reader.read(256 << 10)  # rsync's stream is flowing
        while not struct.unpack("i", fcntl.ioctl(client, termios.FIONREAD, b"\0" * 4))[0]:
            time.sleep(0.01)  # more of it waits unread, so the close below resets the stream (not EOF)
        reader.close()
        client.close()

    threading.Thread(target=serve, daemon=True).start()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(RSH), path, "-l", "root", "node1", "rsync", "--server"],
        input=b"x" * (4 << 20),
        capture_output=True,
        timeout=30,
    )
    assert "Traceback" not in proc.stderr.decode()
    assert proc.returncode == 255
    assert proc.stderr.decode().startswith("connection to node1 lost:")
    listener.close()


def test_a_clean_end_while_stdin_stays_open_is_exit_0_at_once(tmp_path):
    # The far side's command finished: the relay sends its last output and closes. rsync keeps rsh's
    # stdin open, waiting for it to exit; quiet stdin means nothing of ours was refused.
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        client, _ = listener.accept()
        reader = client.makefile("rb")
        assert reader.readline() == b'"rsync --server"\n'
        assert reader.read(5) == b"hello"
        client.sendall(b"bye")
        client.shutdown(socket.SHUT_WR)
        reader.close()
        client.close()

    threading.Thread(target=serve, daemon=True).start()
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(RSH), path, "node1", "rsync", "--server"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
    listener.close()
