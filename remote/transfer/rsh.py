"""rsync's remote shell, through the task's own SSH connection (standard library only).

rsync runs ``python rsh.py SOCKET [-l USER] HOST COMMAND...``; this relays stdin and stdout
over the Unix socket to the fab process, which runs COMMAND on its open paramiko connection.
So a task uses one SSH connection, and rsync pays no second handshake (about a second on a WAN).
"""

import json
import os
import select
import socket
import sys
import threading
import time


def main(argv: list[str]) -> int:
    """Relay until the far side closes; a lost connection is one line and exit 255, as ssh says it.

    rsync prints whatever its remote shell writes to stderr, and gpu-train shows rsync's error to
    the user; a Python traceback there (a node lost mid-sync) would read as a bug in gpu-train.
    """
    path, args = argv[0], argv[1:]
    if args[:1] == ["-l"]:
        args = args[2:]
    host = args[0] if args else "host"
    try:
        return relay(path, " ".join(args[1:]))  # as ssh does: the remote shell splits it
    except OSError as e:
        sys.stderr.write(f"connection to {host} lost: {e.strerror or e}\n")
        return 255


def relay(path: str, command: str) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall((json.dumps(command) + "\n").encode())
    lost: list[OSError] = []
    ended: list[bool] = []  # upstream is done: stdin ended, or a send failed
    # Held while upstream takes data from stdin and sends it, until the outcome is recorded: so the
    # end below can tell "nothing of ours in flight" from "our data refused".
    sending = threading.Lock()

    def upstream() -> None:
        try:
            while True:
                select.select([0], [], [])  # data or the end of stdin, without holding the lock
                with sending:
                    data = os.read(0, 65536)
                    if not data:
                        sock.shutdown(socket.SHUT_WR)
                        return
                    try:
                        sock.sendall(data)
                    except OSError as e:  # the far side is gone with our data unread (reset) or unsent (pipe)
                        lost.append(e)
                        return
        except OSError:
            pass  # stdin itself failed: the downstream side sees the end and reports it
        finally:
            ended.append(True)

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
    # A plain end is a lost connection if our data was still flowing: Linux reports the reset of a far
    # side that dropped its end with data unread to the first call to ask, or (6.18 here, now and then)
    # to none. So wait while stdin holds data for upstream to try (its send then fails), and ask the
    # socket for a reset no call has taken; when stdin is quiet (rsync waits for us), the end is clean.
    # At most 5 s in all: a far side that half-closed and stopped reading would block a send for good.
    deadline = time.monotonic() + 5
    while sending.acquire(timeout=max(0.0, deadline - time.monotonic())):
        try:
            if lost or ended or not select.select([0], [], [], 0)[0]:
                pending = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if pending and not lost:
                    lost.append(OSError(pending, os.strerror(pending)))
                break
        finally:
            sending.release()
        if time.monotonic() >= deadline:
            break
        time.sleep(0.001)
    if lost:
        raise lost[0]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
