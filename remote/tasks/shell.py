"""`fab setup`, `ssh`, `nvidia-smi`: the host itself (its agent, a shell, its GPUs)."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from invoke import Context, task

from gpu_train.atomic import atomic_write
from gpu_train.contract import BOOT_CRON_STOPPED, BOOT_NO_CRONTAB, BOOT_OFF
from gpu_train.environment import Environment
from gpu_train.errors import CommandExit
from remote.tasks.session import CLI, STACK_HELP, Session, say


# -- setup --------------------------------------------------------------------------------------
@task(help={"stack": STACK_HELP})
def setup(c: Context, stack: str | None = None) -> None:
    """Install the on-host agent with the stack's settings; on SSH stacks also `boot` at reboot.

    GCP VMs get this from their startup script. On an SSH host, `boot` is added to your crontab
    (@reboot) so runs a reboot interrupted carry on; power-off when idle stays off unless the stack
    sets gpu-train:idleStopMinutes (then `tick` runs every minute, and must be allowed to power off).
    """
    session = Session(Environment.of(c), stack)
    from gpu_train.stack.agentdoc import settings_part

    encoded = base64.b64encode(json.dumps(settings_part(session.target.agent_settings)).encode()).decode()
    doc = session.call("configure", encoded, *([] if session.target.is_gcp else ["--cron"]))
    session.close()
    from remote.tasks.render import settings_lines

    print(f"agent set up on {session.target.host}:")
    for line in settings_lines(doc.get("settings") or {}):
        print(f"  {line}")
    for line in doc.get("crontab", []):
        print(f"  crontab: {line}")
    if doc.get("bootResume") == BOOT_CRON_STOPPED:
        say(f"warning: {session.target.host}: {CRON_STOPPED_WORDS}")


CRON_STOPPED_WORDS = "no cron daemon runs there, so a reboot will not resume runs (start it: sudo systemctl enable --now cron, or crond)"
BOOT_OFFERED = "boot-offered.json"  # in the stack's cache: hosts already told how to turn reboot-resume on


def say_host_notes(sessions: list[Session], answers: Sequence[Mapping[str, Any]]) -> None:
    """After "started": each node's warnings (its GPUs busy, other runs of ours), and on an SSH host
    whether a reboot resumes the run; how to turn that on is said once per host."""
    from remote.ssh.target import host_key

    for s, answer in zip(sessions, answers, strict=True):
        where = f"node {s.node} ({s.target.host})" if len(sessions) > 1 else str(s.target.host)
        warnings = answer.get("warnings")
        for words in (warnings if isinstance(warnings, list) else [])[:5]:
            say(f"warning: {where}: {str(words)[:400]}")
        state, offered = answer.get("bootResume"), s.target.cache / BOOT_OFFERED
        if state in (BOOT_CRON_STOPPED, BOOT_OFF, BOOT_NO_CRONTAB):  # said once per host and state
            try:
                told = json.loads(offered.read_text())
            except (OSError, ValueError):
                told = {}
            if told.get(host_key(s.target.host)) == state:
                continue
        if state == BOOT_CRON_STOPPED:
            say(f"warning: {where}: {CRON_STOPPED_WORDS}")
            atomic_write(offered, json.dumps({**told, host_key(s.target.host): state}))
        elif state in (BOOT_OFF, BOOT_NO_CRONTAB):
            fix = f"`{CLI} setup`" if state == BOOT_OFF else f"install cron there (sudo apt-get install cron), then `{CLI} setup`"
            say(
                f"{where}: a reboot there leaves this run interrupted until `{CLI} resume`; {fix} makes reboots resume "
                f"runs (an @reboot line in your crontab there, which `{CLI} down` takes away)"
            )
            atomic_write(offered, json.dumps({**told, host_key(s.target.host): state}))


def _exec_ssh(session: Session, *extra: str, command: str | None = None) -> None:
    from remote.ssh.openssh import openssh_options

    session.connect()  # verifies (or learns) the host key first
    session.close()
    h = session.target.host
    argv = ["ssh", *openssh_options(session.target, h), *extra, "--", f"{h.user}@{h.host}", *([command] if command else [])]
    os.execvp("ssh", argv)


@task(name="ssh", help={"command": "run this command instead of a shell (also: gpu-train ssh -- CMD)", "stack": STACK_HELP})
def shell(c: Context, command: str | None = None, stack: str | None = None) -> None:
    """A shell on the host, or one command (`ssh -- CMD`); the first contact also writes the alias gpu-train-STACK."""
    session = Session(Environment.of(c), stack)
    if command:
        _exec_ssh(session, *(["-t"] if session.env.stdin_isatty else []), command=command)
    _exec_ssh(session, "-t")


shell.remainder_kwarg = "command"  # `gpu-train ssh -- CMD` (remote/cli.py's Executor)


@task(name="nvidia-smi", help={"stack": STACK_HELP})
def nvidia_smi(c: Context, stack: str | None = None) -> None:
    """nvidia-smi on the host (`gpus` lists the GPU types you can have)."""
    from gpu_train.errors import shown
    from remote.ssh.agentcall import run_bounded

    session = Session(Environment.of(c), stack)
    try:  # the host's output, bounded, its escapes written out
        status, out, err = run_bounded(
            session.connect(),
            "command -v nvidia-smi >/dev/null && nvidia-smi || echo 'no nvidia-smi on this host'",
            timeout=120,
            cap=4 << 20,
        )
    finally:
        session.close()
    sys.stdout.write(shown(out.decode("utf-8", "backslashreplace")))
    sys.stderr.write(shown(err.decode("utf-8", "backslashreplace")))
    if status:
        raise CommandExit(exited=status, command="nvidia-smi", host=str(session.target.host), stderr=err[-2000:].decode("utf-8", "replace"))
