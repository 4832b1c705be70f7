"""`gpu-train status` and `gpu-train logs` ask the host while the command is still loading, `train`
opens its launch while it plans the code, and `train --follow` asks for the log while the launch's
answer is on its way.

Python's start with gpu-train's tasks (Invoke above all) is about 0.18 s, and a status or a log over the
shared connection is two round trips and the agent's start on the host: one after the other, status
over a 100 ms link took 0.5 s. The entry point (gpu_train/launcher.py) hands a plain `status` or `logs`
command line here before it loads the tasks: when the stack's shared OpenSSH connection is up, the very
`ssh` the task will start is started now (mux.start_early), and the task's channel takes it over
(mux.MuxChannel.exec_command) only when it asks for exactly that command, which it computes on its own
(with the same function: ``logs_call``). Anything else (a flag not asked early, no shared connection, a
stack that does not resolve) starts nothing here, and an early call no channel took is ended at exit.
Both calls only read on the host, so an early call that goes unused changes nothing there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remote.ssh.target import Target

# Each task's flags as typed -> (its parameter, whether it takes a value); an option in NOT_EARLY
# (another node, every node) is left to the task. Any other word, or a core option before the task
# (--stacks-dir would change where the stack is read), and nothing is started. A test compares these
# with the tasks' own flags.
FLAGS: dict[str, dict[str, tuple[str, bool]]] = {
    "status": {
        "--json": ("json_", False),
        "-j": ("json_", False),
        "--all-projects": ("all_projects", False),
        "--stack": ("stack", True),
        "-s": ("stack", True),
    },
    "logs": {
        "--run": ("run", True),
        "-r": ("run", True),
        "--follow": ("follow", False),
        "-f": ("follow", False),
        "--lines": ("lines", True),
        "--node": ("node", True),
        "--all": ("all_", False),
        "-a": ("all_", False),
        "--stack": ("stack", True),
        "-s": ("stack", True),
        "--all-projects": ("all_projects", False),
    },
}
NOT_EARLY = {"node", "all_"}


def plain(words: list[str]) -> tuple[str, dict[str, str | bool]] | None:
    """(the task, its options) when ``words`` (the command line after the program's name) is a plain
    `status` or `logs` (its own flags only, each once, none of NOT_EARLY); else None."""
    if not words or words[0] not in FLAGS:
        return None
    flags, options, i = FLAGS[words[0]], {}, 1
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name not in flags:
            return None
        option, takes_value = flags[name]
        if option in NOT_EARLY or option in options or (eq and not takes_value):
            return None
        if takes_value and not eq:
            i += 1
            if i >= len(words):
                return None
            value = words[i]
        options[option] = value if takes_value else True
        i += 1
    return words[0], options


def logs_call(run: str | None, scope: Sequence[str], follow: bool, offset: int | None, lines: int, awaited: bool = False) -> list[str]:
    """The agent's arguments for one node's log: from ``offset`` (a resumed stream), else its last
    ``lines`` (0: the whole log); ``awaited``: the run is being launched, the host waits for it to
    appear. `logs` (runlogs._stream_log) and the early calls both build it here."""
    args = ["logs", *(["--run", run] if run else []), *scope, *(["--follow"] if follow else [])]  # (--run: the scope's first)
    args += ["--await-run"] if awaited else []
    return args + (["--offset", str(offset)] if offset is not None else (["--lines", str(lines)] if lines else []))


def launch_call(awaits_go: bool) -> list[str]:
    """The agent's launch: the spec on stdin; ``awaits_go``: the code is synced meanwhile, "go" follows."""
    return ["launch", "-", *(["--await-go"] if awaits_go else [])]


def start_launches(cluster: Target) -> list[list[str]]:
    """`train`: each node's launch channel opened, and its agent started (reading the spec it waits for on
    stdin), while the laptop still plans the code: the channel's round trip and the agent's start overlap
    that work instead of following it. Taken over by agentcall.launch when it asks for exactly this call
    (a launch whose code is synced: --await-go); an image's own program (no sync) leaves it unused, ended
    by ``end_unused`` once the launches answered (the agent then reads no spec and ends, having done
    nothing), not at exit: `train --follow` lasts as long as the run. Returns the calls started."""
    from agent.bundle import agent_command
    from remote.ssh import mux

    started = []
    for node in range(len(cluster.hosts)):
        target = cluster.for_node(node)
        path = None if target.root_unknown else mux.control_path(target, target.host)
        if path is not None and mux.master_up(path):
            command = agent_command(target.remote_root, *launch_call(awaits_go=True), cli=target.cli)
            started.append([*mux.over_master(target, target.host, path), command])
            mux.start_early(started[-1], stdin=True)
    return started


def end_unused(calls: list[list[str]]) -> None:
    """End those of ``calls`` (early launches, ``start_launches``) that no launch took."""
    from remote.ssh import mux

    for argv in calls:
        mux.end_early(argv)


def follow_call(run: str) -> list[str]:
    """`train --follow`'s call: the run's whole log, to its end, from a host that may not have started it yet."""
    return logs_call(run, (), True, None, 0, awaited=True)


def start_follow(target: Target, run: str) -> None:
    """`train --follow`: ask node 0 for ``run``'s log now, as the launch's last answer is on its way, so
    that the follow's channel, the agent's start and its first read overlap that round trip (the host
    waits the moment until the run appears: ``follow_call``). Only on the shared connection, where the
    follow's channel takes this call over (runlogs.follow_to_end); else nothing."""
    from agent.bundle import agent_command
    from remote.ssh import mux

    path = None if target.root_unknown else mux.control_path(target, target.host)
    if path is not None and mux.master_up(path):
        mux.start_early([*mux.over_master(target, target.host, path), agent_command(target.remote_root, *follow_call(run), cli=target.cli)])


def agent_args(task: str, options: dict[str, str | bool], scope: Sequence[str]) -> list[str] | None:
    """The agent call the task will make first for these options (None: one this module does not ask)."""
    if task == "status":
        return ["status", "--summaries"]  # (runs.status's call)
    from gpu_train.jobs import JobError, check_run_id

    run, lines = options.get("run"), options.get("lines", "50")
    if not (isinstance(lines, str) and lines.isascii() and lines.isdigit()):
        return None  # the task says what is wrong with it
    try:
        checked = None if run is None else check_run_id(run)
    except JobError:
        return None
    return logs_call(checked, scope, bool(options.get("follow")), None, int(lines))


def start(words: list[str]) -> None:
    """Start node 0's first agent call on the shared connection now, when ``words`` is a plain `status` or `logs`."""
    asked = plain(words)
    if asked is None:
        return
    task, options = asked
    try:
        from agent.bundle import agent_command
        from gpu_train.environment import Environment
        from remote.ssh import mux
        from remote.ssh.target import resolve

        env = Environment.from_os()
        stack = options.get("stack")
        target = resolve(env, stack if isinstance(stack, str) else None, ask_pulumi=False).for_node(0)
        path = None if target.root_unknown else mux.control_path(target, target.host)
        if path is None or not mux.master_up(path):
            return
        scope = [] if task == "status" else env.scope(bool(options.get("all_projects"))).agent_args()
        args = agent_args(task, options, scope)
        if args is not None:
            mux.start_early([*mux.over_master(target, target.host, path), agent_command(target.remote_root, *args, cli=target.cli)])
    except Exception:  # the task meets whatever failed here itself, and says it
        return
