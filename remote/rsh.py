"""rsync's remote shell, through the task's own SSH connection (standard library only).

rsync runs ``python rsh.py SOCKET [-l USER] HOST COMMAND...``; this relays stdin and stdout
over the Unix socket to the fab process, which runs COMMAND on its open paramiko connection.
So a task uses one SSH connection, and rsync pays no second handshake (about a second on a WAN).
"""

import json
import os
import socket
import sys
import threading


def main(argv: list) -> int:
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
    reset: list[OSError] = []
    sending = threading.Lock()  # held while a send is under way, until its outcome is recorded

    def upstream() -> None:
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                with sending:
                    try:
                        sock.sendall(data)
                    except ConnectionResetError as e:
                        # The far side dropped its end with our data unread. The kernel tells only the
                        # first call to ask, this one or downstream's recv (which then sees a plain end).
                        reset.append(e)
                        return
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the downstream side sees the same loss and reports it once

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
    if sending.acquire(timeout=5):  # a send the reset interrupted has recorded it
        sending.release()
    if reset:
        raise reset[0]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
