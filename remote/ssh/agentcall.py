"""The agent's calls over an open connection: one JSON answer per call, the launch that overlaps
the code sync, and a log streamed with the agent's start and end marks.
"""

from __future__ import annotations

import contextlib
import json
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from agent.bundle import agent_command
from gpu_train.answers import ANSWERS, Launched, LogEnd, LogStart, Ready, Waiting
from gpu_train.codec import Document, check
from gpu_train.contract import LOG_END, LOG_START
from gpu_train.errors import printable_doc
from remote.errors import RemoteError
from remote.ssh import early, mux
from remote.ssh.target import Target

if TYPE_CHECKING:  # paramiko is loaded only by a login (mux.channel_errors)
    import paramiko
    from fabric import Connection

START_MARK = LOG_START
END_MARK = LOG_END
# A host's answers are bounded: an agent call's output (a status of thousands of runs is a few MiB),
# how long it may take (`stop --grace` waits for jobs; nothing waits longer), one line of an answer,
# and the stderr a streamed log keeps (its end marks come last).
CALL_OUTPUT_MAX = 64 << 20
CALL_TIMEOUT_S = 600.0
LINE_MAX = 1 << 20
STDERR_KEEP = 1 << 20
T = TypeVar("T")


class AnswerLost(RemoteError):
    """A call's answer never came: its channel ended with no exit status of the agent's own (the connection
    lost) after the host was asked. What a start did there (a launch's run, a sweep's trials) is the host's
    to say, by the id the laptop chose (`launch-outcome`, remote/tasks/outcomes.py)."""


def run_bounded(
    conn: Connection, command: str, timeout: float = CALL_TIMEOUT_S, cap: int = CALL_OUTPUT_MAX, stdin: bytes = b""
) -> tuple[int, bytes, bytes]:
    """``command`` on the host: (exit status, stdout, stderr), or RemoteError once it has run ``timeout``
    seconds or written more than ``cap`` bytes (the channel is closed: the host's process gets SIGPIPE/EOF)."""
    chan = conn.client.get_transport().open_session()
    try:
        chan.exec_command(command)
        if stdin:  # a document kept off the command line, which every user of the host can read in /proc
            chan.sendall(stdin)
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteError(f"the gpu-train agent on {conn.host} did not answer within {timeout:g} s")
            select.select([chan], [], [], min(left, 1.0))
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if len(out) + len(err) > cap:
                raise RemoteError(f"the gpu-train agent on {conn.host} answered more than {cap} bytes")
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                return chan.recv_exit_status(), bytes(out), bytes(err)
            if chan.closed or not conn.transport.is_active():
                raise AnswerLost(f"the connection to {conn.host} closed during the agent's call")
    finally:
        chan.close()


def call(conn: Connection, target: Target, *args: str, timeout: float = CALL_TIMEOUT_S, stdin: bytes = b"") -> Any:
    """Run one agent subcommand on the host; its JSON answer as the contract declares it
    (answers.ANSWERS), or RemoteError with its message, or with what in it does not fit (AnswerLost: the
    connection went before the answer)."""
    status, out, err = run_bounded(conn, agent_command(target.remote_root, *args, cli=target.cli), timeout, stdin=stdin)
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        doc = printable_doc(json.loads(lines[-1])) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        detail = (err or out).decode("utf-8", "replace").strip()[-2000:]
        if status < 0 or status == mux.SSH_LOST:  # (no exit status of the agent's own: the connection went)
            raise AnswerLost(f"the connection to {conn.host} ended before the agent's answer" + (f" ({detail})" if detail else ""))
        raise RemoteError(f"the gpu-train agent failed on {conn.host} (exit {status}): {detail}")
    if "error" in doc:
        raise RemoteError(doc["error"])
    said = checked(ANSWERS[args[0]], doc, f"{conn.host}'s {args[0]} answer")
    return doc if isinstance(said, Document) else said  # (a Document's caller decodes it: scalars)


def checked(kind: Callable[..., T], doc: object, what: str) -> T:
    """``doc`` as the contract declares an answer of ``kind``, else a RemoteError saying what does not fit."""
    try:
        return check(kind, doc, what)
    except ValueError as e:
        raise RemoteError(f"{e}: is the gpu-train agent there this one? (run the task again to send it)") from None


def launch(
    conn: Connection,
    target: Target,
    spec: str,
    sync: Callable[[], object] | None,
    reuse: bool = False,
    launching: Callable[[], object] | None = None,
) -> Launched | Waiting:
    """The agent's launch, started alongside the code sync and released by "go" after it.

    Opening the agent's channel, its start-up and its checks overlap the sync, so launching costs
    one round trip once the code is there. With ``reuse`` (the laptop's code matches the last push)
    the host first tries to reuse the last run's code and, when it could, launches without a "go";
    the sync runs only if it could not.
    Without ``sync`` (code already staged) it launches at once. ``launching`` is called once the host
    said it is ready and was told to start the run (or starts it by itself), while its answer is on the
    way: `train --follow` asks for the log then. (A launch without ``sync`` may be answered "waiting".)
    Its channel ending before the answer (the host may have started the run: it goes on by itself once it
    reused the code, was told "go", or in a fan-out had the code) raises AnswerLost.
    """
    # The spec (with the job's --env values) goes on the channel's stdin: a command line is readable
    # by every user of the host in /proc.
    command = agent_command(target.remote_root, *early.launch_call(awaits_go=sync is not None), cli=target.cli)
    opened: dict[str, object] = {}

    def open_channel() -> None:
        try:
            chan = conn.client.get_transport().open_session()
            chan.exec_command(command)
        except Exception as e:
            opened["error"] = e
            return
        opened["chan"] = chan
        try:
            chan.sendall(spec.encode() + b"\n")
        except Exception as e:  # the agent ended before it read the spec: its answer may say why (read below)
            opened["unsent"] = e

    opener = threading.Thread(target=open_channel, daemon=True)
    opener.start()
    failure: BaseException | None = None
    if sync is not None and not reuse:
        try:
            sync()
        except BaseException as e:
            failure = e
    opener.join()
    if "error" in opened:
        raise RemoteError(f"cannot start the gpu-train agent: {opened['error']}")
    chan: paramiko.Channel = opened["chan"]
    chan.settimeout(CALL_TIMEOUT_S)  # each wait for the host's word (a sync in between is not one)
    raw = chan.makefile("rb")
    silent = threading.Event()

    class _Out:
        """Each line of the host's answer within CALL_TIMEOUT_S, on any kind of channel (a shared
        connection's channel has no timeout of its own): past it, the channel is closed."""

        @staticmethod
        def readline(limit: int) -> bytes:
            def give_up() -> None:
                silent.set()
                chan.close()

            timer = threading.Timer(CALL_TIMEOUT_S, give_up)
            timer.start()
            try:
                line: bytes = raw.readline(limit)
            finally:
                timer.cancel()
            if silent.is_set():
                raise TimeoutError
            return line

    out = _Out()

    def answer_line() -> bytes:
        """The host's next line of the launch; its channel ending first is an AnswerLost, but where the agent
        itself ended without a word (an exit status of its own: it could not start, say), its error."""
        try:
            line = out.readline(LINE_MAX)
        except TimeoutError:
            raise
        except mux.channel_errors() as e:
            raise AnswerLost(f"the connection to {conn.host} ended before the launch's answer ({e})") from None
        if line:
            return line
        status = exit_status(chan)
        if status is not None and status >= 0 and status != mux.SSH_LOST:
            err = chan.recv_stderr(STDERR_KEEP).decode("utf-8", "replace").strip() if chan.recv_stderr_ready() else ""
            raise RemoteError(f"the gpu-train agent failed on {conn.host} (exit {status}): {err[-2000:]}")
        raise AnswerLost(f"the connection to {conn.host} ended before the launch's answer")

    try:
        if "unsent" in opened:
            # A refusal before the spec was read (REMOTE_ROOT not ours): certain where the call was opened early
            # (remote/ssh/early.py), whose agent refused while the code was planned. Its answer, not the pipe's.
            with contextlib.suppress(*mux.channel_errors(), TimeoutError, ValueError):
                said = printable_doc(json.loads(out.readline(LINE_MAX)))
                if isinstance(said, dict) and "error" in said:
                    raise RemoteError(said["error"])
            raise RemoteError(f"cannot start the gpu-train agent: {opened['unsent']}")
        if sync is not None:
            # The agent's first word even when the sync failed: a refusal (REMOTE_ROOT not ours, a
            # busy name) explains the failed sync better than rsync's exit code.
            line = out.readline(LINE_MAX) if failure is not None else answer_line()
            if failure is not None:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    if "error" in (said := printable_doc(json.loads(line))):
                        raise RemoteError(said["error"])
                first: Ready | Waiting | Launched | dict[str, Any] = {}
            else:
                first = _answer(line, chan)
            if failure is None and "ready" in first and reuse and not first.get("reused"):
                try:
                    sync()
                except BaseException as e:
                    failure = e
            if failure is not None:
                with contextlib.suppress(OSError):
                    chan.sendall(b"abort\n")
                # In a fan-out the host may have gone on its own word first (the code did reach it from
                # node 0): then it runs, and says so, and the caller must count it as started.
                with contextlib.suppress(*mux.channel_errors(), RemoteError):
                    chan.settimeout(30)
                    late = _answer(out.readline(LINE_MAX), chan)
                    if "runId" in late:
                        return cast(Launched, late)
                raise failure
            if "ready" not in first:
                return cast(Waiting, first)  # waiting for the driver: the code stays staged for the next try
            if not (reuse and first.get("reused")):  # a host that reused the code goes on by itself (agent/launch.py)
                # In a fan-out the host may have gone on its own word (the spec's goWhen) and ended: its
                # answer is already here, and this "go" has no one to read it.
                with contextlib.suppress(*mux.channel_errors()):
                    chan.sendall(b"go\n")
            if launching is not None:  # (the host said ready and was told to go, or goes by itself: it launches now)
                launching()
        said = _answer(answer_line(), chan)
        if "ready" in said:
            raise RemoteError(f"the gpu-train agent on {conn.host} said ready twice")
        return said
    except TimeoutError:
        raise RemoteError(f"the gpu-train agent on {conn.host} did not answer within {CALL_TIMEOUT_S:g} s") from None
    finally:
        chan.close()


def exit_status(chan: paramiko.Channel, wait_s: float = 5.0) -> int | None:
    """The exit status of the command on ``chan``, whose output has ended: sshd sends it just after (a
    paramiko channel whose connection is lost says -1; the shared connection's `ssh` exits SSH_LOST);
    None if none came within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while not chan.exit_status_ready():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    status: int = chan.recv_exit_status()
    return status


def _answer(line: bytes, chan: paramiko.Channel) -> Ready | Waiting | Launched:
    """A line of launch's: its first (Ready, or Waiting) or its last (Launched, or Waiting), as the contract declares each."""
    try:
        doc = printable_doc(json.loads(line))
    except ValueError:
        err = chan.recv_stderr(65536).decode("utf-8", "replace") if chan.recv_stderr_ready() else ""
        raise RemoteError(f"the gpu-train agent failed: {err.strip() or line.decode('utf-8', 'replace')}") from None
    if isinstance(doc, dict) and "error" in doc:
        raise RemoteError(doc["error"])
    if isinstance(doc, dict) and "ready" in doc:
        return checked(Ready, doc, "the agent's launch answer (Ready)")
    if isinstance(doc, dict) and "waiting" in doc:
        return checked(Waiting, doc, "the agent's launch answer (Waiting)")
    return checked(Launched, doc, "the agent's launch answer (Launched)")


def stream(conn: Connection, command: str, out: Callable[[bytes], None], deadline: float | None = None) -> tuple[int, str]:
    """Run ``command``, passing stdout bytes to ``out`` as they come; (exit status, stderr).
    Past ``deadline`` (a time.monotonic() value; None: none) the channel is closed and TimeoutError
    raised: a host that never ends its answer does not hold the caller forever.

    The status is -1 when the connection ended before the command did: paramiko's channel closed
    without one, or the shared connection's `ssh` exiting 255 (mux.SSH_LOST, its own failure: the host's
    sshd gone). A follower told so reconnects even when the host said nothing yet (no start mark)."""
    chan = conn.client.get_transport().open_session()
    chan.exec_command(command)
    err = b""

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    while True:
        if late():
            chan.close()
            raise TimeoutError("the host's answer did not end in time")
        ready, _, _ = select.select([chan], [], [], 1.0)
        if ready or chan.recv_ready() or chan.recv_stderr_ready():
            while chan.recv_ready() and not late():
                data = chan.recv(65536)
                if data:
                    out(data)
            while chan.recv_stderr_ready():
                err = (err + chan.recv_stderr(65536))[-STDERR_KEEP:]
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed or not conn.transport.is_active():
            break
    status = chan.recv_exit_status() if chan.exit_status_ready() else -1
    if status == mux.SSH_LOST and isinstance(chan, mux.MuxChannel):
        status = -1
    return status, err.decode("utf-8", "replace")


def start_offset(stderr: str) -> int | None:
    """Where the agent started reading the log (so a dropped stream resumes at the right byte)."""
    for line in stderr.splitlines():
        if line.startswith(START_MARK):
            return checked(LogStart, json.loads(line[len(START_MARK) :]), "the log's start mark")["offset"]
    return None


def end_trailer(stderr: str) -> LogEnd | None:
    """The agent's last word after streaming a log: state, exit code, offset."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(END_MARK):
            return checked(LogEnd, printable_doc(json.loads(line[len(END_MARK) :])), "the log's end mark")
    return None
