"""`fab logs`: a run's log from every node, followed to its end with --follow (and `train --follow`'s, the
dashboard's, the report's: the one stream of a log)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn, cast

from invoke import task

from gpu_train.contract import SUCCEEDED
from gpu_train.environment import Environment
from gpu_train.errors import CommandExit, GpuTrainError, Interrupted
from remote.tasks.session import ALL_PROJECTS_HELP, CLI, STACK_HELP, Session, failures, nodes_failed, on_every_node, say
from remote.tasks.taskoptions import LogsOptions

if TYPE_CHECKING:
    from invoke import Context

    from gpu_train.answers import LogEnd


# -- logs -------------------------------------------------------------------------------------
@task(
    help={
        "run": "run id or a unique prefix (default: this project's newest)",
        "follow": "stream until the job ends; exit with its exit code",
        "lines": "show the last N lines first (default 50; 0 for the whole log)",
        "node": "which node (default 0)",
        "all": "every node's log, each line prefixed with its node",
        "stack": STACK_HELP,
        "all_projects": ALL_PROJECTS_HELP,
    }
)
def logs(
    c: Context,
    run: str | None = None,
    follow: bool = False,
    lines: str | None = None,
    node: str | None = None,
    all_: bool = False,
    stack: str | None = None,
    all_projects: bool = False,
) -> None:
    """Show a run's log; with --follow, stream it (reconnecting if the connection drops)."""
    o = LogsOptions.read(
        run=run, follow=bool(follow), lines=lines, node=node, all_nodes=bool(all_), stack=stack, all_projects=bool(all_projects)
    )
    show_logs(Environment.of(c), o)


def show_logs(env: Environment, o: LogsOptions) -> None:
    """`logs`' work for checked options: one node's log, or every node's with its lines prefixed."""
    session = Session(env, o.stack, node=o.node)
    scope = env.scope(o.all_projects).agent_args()
    follow, run = o.follow, o.run
    try:
        _show_logs(session, o, scope)
    except KeyboardInterrupt:
        if not follow:
            raise
        _detached(run)


def _detached(run: str | None) -> NoReturn:
    """Ctrl-C while following a log: only the stream ends, the job goes on under screen on the host."""
    named = f" --run {run}" if run else ""
    say(f"\ndetached: {run or 'the run'} goes on ({CLI} logs --follow{named} to watch it again, {CLI} stop{named} to stop it)")
    raise Interrupted() from None


def _show_logs(session: Session, o: LogsOptions, scope: Sequence[str]) -> None:
    run, lines, follow = o.run, o.lines, o.follow
    out = sys.stdout.buffer
    if not o.all_nodes:
        trailer = _stream_log(session, run, lines, follow, out.write, out.flush, scope)
        session.close()
        if follow and trailer is not None:  # (following ends with the agent's end mark)
            _exit_with(trailer)
        return
    lock = threading.Lock()

    def prefixed(s: Session) -> Callable[[bytes], None]:
        pending = b""

        def write(data: bytes) -> None:
            nonlocal pending
            *complete, pending = (pending + data).split(b"\n")
            with lock:
                for line in complete:
                    out.write(f"[node {s.node}] ".encode() + line + b"\n")
                out.flush()

        return write

    sessions = session.nodes()
    trailers = on_every_node(sessions, lambda s: _stream_log(s, run, lines, follow, prefixed(s), out.flush, scope))
    if failures(trailers):
        raise nodes_failed(trailers)
    if follow:
        ended = cast("list[LogEnd]", trailers)  # (no node failed: each followed its log to the end mark)
        bad = [t for t in ended if t["state"] != SUCCEEDED]
        _exit_with(bad[0] if bad else ended[0])


def follow_to_end(session: Session, run: str) -> None:
    """`train --follow`: the run's whole log as it grows, then exit with the job's exit code.
    Ctrl-C detaches: only this stream ends, the job goes on under screen on the host."""
    out = sys.stdout.buffer
    try:
        trailer = _stream_log(session, run, 0, True, out.write, out.flush, awaited=True)  # (early.start_follow's call)
    except KeyboardInterrupt:
        _detached(run)
    session.close()
    if trailer is not None:
        _exit_with(trailer)


def _stream_log(
    session: Session,
    run: str | None,
    lines: int,
    follow: bool,
    write: Callable[[bytes], object],
    flush: Callable[[], object],
    scope: Sequence[str] = (),
    deadline: float | None = None,
    awaited: bool = False,
) -> LogEnd | None:
    """One node's log from the agent, resuming at the right byte after a dropped connection; ``deadline``
    (time.monotonic()) bounds a log that is not followed; ``awaited``: a run just launched (early.follow_call)."""
    from agent.bundle import agent_command
    from gpu_train.errors import TerminalStream
    from remote.ssh import agentcall, early

    offset: int | None = None
    received = 0
    shown = TerminalStream()  # the job's text and colours; its other escapes written out (OSC 52 ...)

    def counted(data: bytes) -> None:
        nonlocal received
        received += len(data)
        write(shown.feed(data))
        flush()

    while True:
        args = early.logs_call(run, scope, follow, offset, lines, awaited)  # (the call `logs` may have started early)
        received = 0
        try:
            command = agent_command(session.target.remote_root, *args, cli=session.target.cli)
            status, err = agentcall.stream(session.connect(), command, counted, deadline)
        except TimeoutError:
            raise GpuTrainError(f"{session.target.host}: the log did not end in time (a host streaming without end?)") from None
        except (OSError, EOFError) as e:
            status, err = -1, str(e)
        start = agentcall.start_offset(err)
        trailer = agentcall.end_trailer(err)
        if trailer is not None or not follow:
            write(shown.end())
        if trailer is not None:
            return trailer
        if status not in (-1, 0) and agentcall.START_MARK not in err:
            raise GpuTrainError(_agent_error(err))
        if not follow:
            raise GpuTrainError(f"the connection dropped: {err.strip()}")
        if start is not None:
            offset = start + received
        say(f"{session.target.host}: connection lost; reconnecting ...")
        session.reconnect()


def _exit_with(trailer: LogEnd) -> None:
    """End `fab logs --follow` with the job's own exit code."""
    state, code = trailer["state"], trailer["exitCode"]
    say(f"{trailer['runId']}: {state}" + (f", exit code {code}" if code is not None else ""))
    if code or state != SUCCEEDED:
        raise CommandExit(exited=code, command=trailer["runId"])


def _agent_error(err: str) -> str:
    """The host's error, written out: its newlines cannot make lines of ours."""
    from gpu_train.errors import printable

    for line in reversed(err.splitlines()):
        if line.startswith("{"):
            try:
                return printable(str(json.loads(line).get("error", line)))
            except (ValueError, AttributeError):
                pass
    return printable(err.strip()) or "the log could not be read"
