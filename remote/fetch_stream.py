"""One fetch stream: an OpenSSH connection running the host's fetch server (remote/fetch_host.py).

Each stream is its own `ssh` process, so each has its own SSH channel window (OpenSSH advertises
about 2 MiB, and one channel moves at most that per round trip) and its own core for the
cipher. The server's source travels compressed on the command line, as the agent's does: one exec,
no file needed on the host. Requests go down ssh's stdin; answers are read from its stdout.
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import subprocess
import tempfile
import zlib
from pathlib import Path

from gpu_train.config import SshHost
from remote.ssh import openssh_options
from remote.target import Target

HOST_SOURCE = Path(__file__).with_name("fetch_host.py")
READ_BUFFER = 1 << 20


class StreamError(Exception):
    """The stream broke (connection dropped, server died) or answered nonsense."""


def host_command(remote_root: str) -> str:
    """The shell command that runs the fetch server shipped inline (the system Python when there is one)."""
    packed = base64.b64encode(zlib.compress(HOST_SOURCE.read_bytes(), 9)).decode()
    boot = ("import base64,sys,zlib;s=zlib.decompress(base64.b64decode(sys.argv.pop(1)));"
            "exec(compile(s,'gpu-train-fetch','exec'),{'__name__':'__main__'})")
    run = shlex.join(["-S", "-c", boot, packed, "--root", remote_root])
    return f'p=/usr/bin/python3; [ -x "$p" ] || p=python3; exec "$p" {run}'


def ssh_argv(target: Target, host: SshHost, command: str) -> list[str]:
    """`ssh` for one stream: the stack's key and known_hosts, no tty, no compression (checkpoints do not shrink)."""
    return ["ssh", *openssh_options(target, host), "-T", "-x", "-o", "Compression=no",
            "-o", "ControlMaster=no", "-o", "ControlPath=none", f"{host.user}@{host.host}", command]


class Stream:
    """A running `ssh ... fetch-server`: send requests, read framed answers."""

    def __init__(self, argv: list[str]):
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (open as long as the stream)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     bufsize=0, start_new_session=True)
        self.out = io.BufferedReader(self.proc.stdout, READ_BUFFER)  # type: ignore[arg-type]

    def send(self, request: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as e:
            raise StreamError(self.why(f"cannot send: {e}")) from None

    def _line(self) -> dict:
        line = self.out.readline()
        if not line.endswith(b"\n"):
            raise StreamError(self.why("the connection closed"))
        try:
            return json.loads(line)
        except ValueError:
            raise StreamError(self.why(f"unexpected answer {line[:200]!r}")) from None

    def _exactly(self, n: int) -> bytes:
        data = self.out.read(n)
        if len(data) != n:
            raise StreamError(self.why("the connection closed"))
        return data

    def read_doc(self) -> dict:
        """A compressed JSON document (listing, hashes)."""
        head = self._line()
        doc = json.loads(zlib.decompress(self._exactly(int(head["len"]))))
        if "error" in doc:
            raise StreamError(f"the host refused: {doc['error']}")
        return doc

    def read_range(self, sink, buf: memoryview) -> tuple[dict, int]:
        """One range: ``sink(view)`` for each chunk as it comes; (trailer or error header, length)."""
        head = self._line()
        length = int(head.get("len", 0))
        if "error" in head:
            return head, 0
        left = length
        while left > 0:
            n = self.out.readinto(buf[: min(len(buf), left)])
            if not n:
                raise StreamError(self.why("the connection closed"))
            sink(buf[:n])
            left -= n
        return self._line(), length

    def why(self, what: str) -> str:
        """``what``, with ssh's own words when it has exited (a refused key, a reset connection)."""
        if self.proc.poll() is None:
            return what
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace").strip()[-500:]
        return f"{what} (ssh exit {self.proc.returncode}{': ' + err if err else ''})"

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            try:
                if kill:
                    self.proc.kill()
                else:
                    self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()
