"""`gpu-train status` asks the host while the command is still loading.

Python's start with gpu-train's tasks (Invoke above all) is about 0.18 s, and a status over the shared
connection is two round trips and the agent's start on the host: one after the other, status over a
100 ms link took 0.5 s. The entry point (gpu_train/launcher.py) hands a plain `status` command line
here before it loads the tasks: when the stack's shared OpenSSH connection is up, the very `ssh` the
status task will start is started now (mux.start_early), and the task's channel takes it over
(mux.MuxChannel.exec_command) only when it asks for exactly that command, which it computes on its
own as before. Anything else (another flag, no shared connection, a stack that does not resolve)
starts nothing here, and an early call no channel took is ended at exit. Status is read-only on the
host, so an early call that goes unused changes nothing there.
"""

from __future__ import annotations

# A plain status: its own flags only (name -> whether it takes a value). Any other word, or a core
# option before the task (--stacks-dir would change where the stack is read), and nothing is started.
STATUS_FLAGS = {"--json": False, "-j": False, "--all-projects": False, "--stack": True, "-s": True}


def status_stack(words: list[str]) -> tuple[bool, str | None]:
    """Whether ``words`` (the command line after the program's name) is a plain `status`, and its --stack."""
    if not words or words[0] != "status":
        return False, None
    stack, i = None, 1
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name not in STATUS_FLAGS or (eq and not STATUS_FLAGS[name]):
            return False, None
        if STATUS_FLAGS[name]:
            if not eq:
                i += 1
                if i >= len(words):
                    return False, None
                value = words[i]
            stack = value
        i += 1
    return True, stack


def start_status(words: list[str]) -> None:
    """Start node 0's status call on the shared connection now, when ``words`` is a plain `status`."""
    plain, stack = status_stack(words)
    if not plain:
        return
    try:
        from agent.bundle import agent_command
        from gpu_train.environment import Environment
        from remote.ssh import mux
        from remote.ssh.target import resolve

        target = resolve(Environment.from_os(), stack).for_node(0)
        path = None if target.root_unknown else mux.control_path(target, target.host)
        if path is None or not mux.master_up(path):
            return
        command = agent_command(target.remote_root, "status", "--summaries", cli=target.cli)  # (runs.status's call)
        mux.start_early([*mux.over_master(target, target.host, path), command])
    except Exception:  # the task meets whatever failed here itself, and says it
        return
