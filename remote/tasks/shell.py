"""`fab setup`, `ssh`, `nvidia-smi`: the host itself (its agent, a shell, its GPUs)."""

from __future__ import annotations

import base64
import json
import os
import sys

from invoke import Exit, task

from remote.tasks.session import STACK_HELP, Session


# -- setup --------------------------------------------------------------------------------------
@task(help={"stack": STACK_HELP})
def setup(c, stack=None):
    """Install the on-host agent with the stack's settings; on SSH stacks also `boot` at reboot.

    GCP VMs get this from their startup script. On an SSH host, `boot` is added to your crontab
    (@reboot) so runs a reboot interrupted carry on; power-off when idle stays off unless the stack
    sets gpu-train:idleStopMinutes (then `tick` runs every minute, and must be allowed to power off).
    """
    session = Session(stack)
    encoded = base64.b64encode(json.dumps(session.target.agent_settings).encode()).decode()
    doc = session.call("configure", encoded, *([] if session.target.is_gcp else ["--cron"]))
    session.close()
    print(f"agent settings on {session.target.host}: {json.dumps(doc['settings'])}")
    for line in doc.get("crontab", []):
        print(f"crontab: {line}")


def _exec_ssh(session: Session, *extra: str, command: str | None = None) -> None:
    from remote.ssh import connect as ssh

    session.connect()  # verifies (or learns) the host key first
    session.close()
    h = session.target.host
    argv = ["ssh", *ssh.openssh_options(session.target, h), *extra, "--", f"{h.user}@{h.host}", *([command] if command else [])]
    os.execvp("ssh", argv)


@task(name="ssh", help={"command": "run this command instead of a shell (also: gpu-train ssh -- CMD)", "stack": STACK_HELP})
def shell(c, command=None, stack=None):
    """A shell on the host, or one command (`ssh -- CMD`); the first contact also writes the alias gpu-train-STACK."""
    session = Session(stack)
    if command:
        _exec_ssh(session, *(["-t"] if sys.stdin.isatty() else []), command=command)
    _exec_ssh(session, "-t")


shell.remainder_kwarg = "command"  # `gpu-train ssh -- CMD` (remote/cli.py's Executor)


@task(name="nvidia-smi", help={"stack": STACK_HELP})
def nvidia_smi(c, stack=None):
    """nvidia-smi on the host (`gpus` lists the GPU types you can have)."""
    session = Session(stack)
    result = session.connect().run("command -v nvidia-smi >/dev/null && nvidia-smi || echo 'no nvidia-smi on this host'",
                                   warn=True, in_stream=False)
    session.close()
    if result.exited:
        raise Exit(code=result.exited)
