"""One fetch stream: an OpenSSH session running the agent's fetch server (agent/fetchserve.py).

Each stream is its own `ssh` process with its own SSH channel, so each has its own channel window
(OpenSSH advertises about 2 MiB, and one channel moves at most that per round trip). The agent
travels on the command line as for every task. Requests go down ssh's stdin; answers are read
from its stdout.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from agent.bundle import agent_command
from gpu_train.answers import Refusal
from gpu_train.codec import check
from gpu_train.fetchwire import RANGE_HEAD_RE, RANGE_TRAILER_RE
from gpu_train.stack.sshhost import SshHost
from remote.ssh.mux import PERSIST_S, shared_control_path
from remote.ssh.openssh import openssh_options
from remote.ssh.target import Target

READ_BUFFER = 64 * 1024  # reads of a range's data bigger than this go straight into the caller's buffer
PIPE_SIZE = 1 << 20  # a bigger pipe from ssh: fewer wake-ups on both sides per MiB
CHANNELS_PER_CONNECTION = 8  # streams beyond this many get connections of their own
# A hostile host's answers are bounded: a header line, a document's compressed and inflated bytes
# (a listing of 2,000,000 entries is about 150 MiB of JSON), its entries, a range's length (the request's).
MAX_LINE = 1 << 20
MAX_DOC = 256 << 20
# A host that stops answering mid-answer (its sessions frozen, the link alive: keepalives still answered)
# held a fetch, and `down`, for ever: no byte for this long while one is awaited closes the stream.
STALL_S = 120.0
T = TypeVar("T")


class StreamError(Exception):
    """The stream broke (connection dropped, server died) or answered nonsense; ``ssh_exit``: ssh's own
    exit status where ssh had ended (255: the host could not be reached)."""

    def __init__(self, message: str, ssh_exit: int | None = None):
        super().__init__(message)
        self.ssh_exit = ssh_exit


def host_command(target: Target) -> str:
    return agent_command(target.remote_root, "fetch-serve", cli=target.cli)


def ssh_argv(target: Target, host: SshHost, command: str, control: list[str] | None = None) -> list[str]:
    """`ssh` for one stream: the stack's key and known_hosts, no tty, no compression (checkpoints do not shrink)."""
    mux = control or ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    return ["ssh", *openssh_options(target, host), "-T", "-x", "-o", "Compression=no", *mux, "--", f"{host.user}@{host.host}", command]


SHARED_CHANNELS = 1  # the listing stream: ten fetches at once stay within a stock sshd's MaxSessions


def _checked(kind: Callable[..., T], doc: Any, what: str) -> T:
    """``doc`` as the contract declares it (the host's fetch server is this laptop's agent: a misfit is a
    host that lies), or a StreamError naming the key."""
    try:
        return check(kind, doc, what)
    except ValueError as e:
        raise StreamError(str(e)) from None


class Opener:
    """Opens a host's streams: the first (the listing) as a channel of this user's shared connection to
    the host, the next ones as channels of a connection of this fetch's own, any more as connections
    of their own.

    Each channel has its own window, so N channels move N windows per round trip, as N connections
    would; but a channel opens in one round trip where a connection needs a key exchange and a
    login (three or four round trips, and tens of milliseconds of CPU on each side). The shared
    connection (OpenSSH's ControlPersist) stays up for PERSIST_S seconds after its last stream
    closes, so a fetch soon after another (a re-fetch, `fetch --watch`, `down` after `fetch`) that
    finds nothing new logs in no more: it opens a channel. While it is up the host counts an SSH
    connection (its idle clock waits for it). Where the shared connection cannot give a channel (it
    died without a word: after ServerAlive gives up; the host's session limit is reached) OpenSSH
    itself logs in on a connection of its own. With ``mux=False`` (or where OpenSSH cannot share a
    connection) every stream is a connection.
    """

    def __init__(self, target: Target, host: SshHost, mux: bool = os.name == "posix"):
        self.target, self.host, self.mux = target, host, mux
        self.command = host_command(target)
        options = openssh_options(target, host)
        self.shared = shared_control_path(options, f"{host.user}@{host.host}") if mux else None
        self._dir = tempfile.mkdtemp(prefix="gpu-train-mux-") if mux else None
        self.opened = 0

    def control(self) -> list[str] | None:
        if self._dir is None:
            return None
        own = self.opened - (SHARED_CHANNELS if self.shared is not None else 0)
        if own < 0:
            return ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.shared}", "-o", f"ControlPersist={PERSIST_S}"]
        if own >= CHANNELS_PER_CONNECTION:
            return None  # a connection of its own (sshd's MaxSessions is 10 by default)
        master = "yes" if own == 0 else "no"
        return ["-o", f"ControlMaster={master}", "-o", f"ControlPath={self._dir}/c", "-o", "ControlPersist=no"]

    def __call__(self) -> Stream:
        control = self.control()
        stream = Stream(ssh_argv(self.target, self.host, self.command, control))
        self.opened += 1
        if control is not None and "ControlMaster=yes" in control:
            self._await_master(stream)
        return stream

    def _await_master(self, stream: Stream, timeout: float = 30) -> None:
        """Until the fetch's own connection listens (it does once logged in): a stream that found no
        socket yet would quietly log in on a connection of its own."""
        socket_path = f"{self._dir}/c"
        deadline = time.monotonic() + timeout
        while not os.path.exists(socket_path) and stream.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class Watched(io.RawIOBase):
    """ssh's output, each read timed: ``waiting`` is when the read now blocked began (None between reads)."""

    def __init__(self, raw: io.FileIO) -> None:
        self.raw = raw
        self.waiting: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int | None:  # (a writable buffer; None: a non-blocking pipe with nothing yet)
        self.waiting = time.monotonic()
        try:
            return self.raw.readinto(b)
        finally:
            self.waiting = None


class Stream:
    """A running `ssh ... fetch-server`: send requests, read framed answers; a read that waits more than
    ``stall_s`` for any byte ends the stream (ssh killed, a StreamError saying so)."""

    def __init__(self, argv: list[str], stall_s: float = STALL_S):
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (open as long as the stream)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, bufsize=0, start_new_session=True
        )
        assert isinstance(self.proc.stdout, io.FileIO) and self.proc.stdin is not None  # pipes with bufsize=0: raw files
        self._stdin = self.proc.stdin
        with contextlib.suppress(OSError, AttributeError):  # Linux only; elsewhere the default pipe
            fcntl.fcntl(self.proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self._watched = Watched(self.proc.stdout)
        self.out = io.BufferedReader(self._watched, READ_BUFFER)
        self.stall_s, self.stalled, self._done = stall_s, False, threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        """Kill ssh when a read has waited ``stall_s`` for a byte: the blocked read then ends (no more output)."""
        while not self._done.wait(min(1.0, self.stall_s / 4)) and self.proc.poll() is None:
            since = self._watched.waiting
            if since is not None and time.monotonic() - since > self.stall_s:
                self.stalled = True
                with contextlib.suppress(OSError):
                    self.proc.kill()
                return

    def send(self, request: dict[str, Any]) -> None:
        # stdin is unbuffered (a raw pipe): one write() may take only part of a request of megabytes when
        # a signal arrives meanwhile (Ctrl-Z and fg, a debugger, a handler), and the host would then wait
        # for the rest of the line while we wait for its answer. So write until all is taken.
        view = memoryview(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        try:  # a host that stops reading (the pipe full) is a stall too: the deadline covers the write
            while view:
                self._watched.waiting = time.monotonic()
                view = view[self._stdin.write(view) or 0 :]
        except OSError as e:
            raise self.broken(f"cannot send: {e}") from None
        finally:
            self._watched.waiting = None

    def _line(self) -> dict[str, Any]:
        return self._parse(self.out.readline(MAX_LINE))

    def _parse(self, line: bytes) -> dict[str, Any]:
        if len(line) >= MAX_LINE and not line.endswith(b"\n"):
            raise StreamError(f"the host answered a line longer than {MAX_LINE} bytes")
        if not line.endswith(b"\n"):
            raise self.broken("the connection closed", ended=True)
        try:
            doc: dict[str, Any] = json.loads(line)
            return doc
        except ValueError:
            raise self.broken(f"unexpected answer {line[:200]!r}") from None

    def _exactly(self, n: int) -> bytes:
        data = self.out.read(n)
        if len(data) != n:
            raise self.broken("the connection closed", ended=True)
        return data

    def read_doc(self, kind: Callable[..., T], what: str) -> T:
        """A compressed JSON document (listing, hashes), within MAX_DOC bytes before and after inflating
        and MAX_ENTRIES rows (counted before parsing: each row is a JSON array), as ``kind`` (one of
        gpu_train/answers.py's) declares it: else a StreamError naming ``what`` and the key."""
        from remote.transfer.fetch.generator import MAX_ENTRIES

        head = self._line()
        size = head.get("len") if isinstance(head, dict) else None
        if not isinstance(size, int) or not 0 <= size <= MAX_DOC:
            raise StreamError(f"the host announced a document of {str(size)[:40]} bytes (at most {MAX_DOC})")
        inflate = zlib.decompressobj()
        try:
            text = inflate.decompress(self._exactly(size), MAX_DOC)
        except zlib.error as e:
            raise StreamError(f"the host's document is not zlib data ({e})") from None
        if inflate.unconsumed_tail:
            raise StreamError(f"the host's document inflates to more than {MAX_DOC} bytes")
        if text.count(b"[") > MAX_ENTRIES + 16:
            raise StreamError(f"the host's document has more than {MAX_ENTRIES} entries")
        try:
            doc = json.loads(text)
        except ValueError:
            raise StreamError(f"the host's document is not JSON: {text[:200]!r}") from None
        if not isinstance(doc, dict):
            raise StreamError(f"the host's document is not one: {text[:200]!r}")
        if "error" in doc:
            raise StreamError(f"the host refused: {_checked(Refusal, doc, 'the host refusal')['error']}")
        return _checked(kind, doc, what)

    def read_range(self, sink: Callable[[memoryview], None], buf: memoryview, expected: int) -> tuple[dict[str, Any], int]:
        """One range of ``expected`` bytes (the request's: the host pads a file that shrank): ``sink(view)``
        for each chunk as it comes; (trailer or error header, length). Any other length is refused."""
        line = self.out.readline(MAX_LINE)
        if (m := RANGE_HEAD_RE.fullmatch(line)) is not None:  # the usual header, without a JSON parser
            length = int(m[1])
        else:
            head = self._parse(line)
            if "error" in head:
                return head, 0
            said = head.get("len")
            length = said if isinstance(said, int) else -1
        if length != expected:
            raise StreamError(f"the host answered {length} bytes for a request of {expected}")
        left = length
        while left > 0:  # ``buf`` filled whole each time (but at the end): direct writes take whole blocks
            want, got = min(len(buf), left), 0
            while got < want:
                n = self.out.readinto(buf[got:want])
                if not n:
                    raise self.broken("the connection closed", ended=True)
                got += n
            sink(buf[:got])
            left -= got
        line = self.out.readline(MAX_LINE)
        if (m := RANGE_TRAILER_RE.fullmatch(line)) is not None:
            return {"sha256": m[1].decode(), "stat": [int(m[2]), int(m[3]), int(m[4])]}, length
        return self._parse(line), length

    def broken(self, what: str, ended: bool = False) -> StreamError:
        """``what`` went wrong, with ssh's exit status and own words when it has exited (a refused key, a reset
        connection). ``ended``: ssh closed its output, so it is exiting: its status is waited for (briefly)."""
        if self.stalled:
            return StreamError(
                f"the host did not answer for {self.stall_s:g} s (nothing sent, nothing taken) mid-exchange: the stream was closed"
            )
        if ended and not self._err.closed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.proc.poll() is None or self._err.closed:  # closed: the fetch is ending (Ctrl-C)
            return StreamError(what)
        self._err.seek(0)
        err = self._err.read().decode("utf-8", "replace").strip()[-500:]
        return StreamError(f"{what} (ssh exit {self.proc.returncode}{': ' + err if err else ''})", self.proc.returncode)

    def close(self, kill: bool = False) -> None:
        self._done.set()
        if self.proc.poll() is None:
            try:
                if kill:
                    self.proc.kill()
                else:
                    self._stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()
