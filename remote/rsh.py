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
    path, args = argv[0], argv[1:]
    if args[:1] == ["-l"]:
        args = args[2:]
    command = " ".join(args[1:])  # as ssh does: the remote shell splits it
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall((json.dumps(command) + "\n").encode())

    def upstream() -> None:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
