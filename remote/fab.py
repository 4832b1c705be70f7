"""The clone's `fab`: Fabric's own program over the same tasks as `gpu-train`, parsing and running them
alike. Its executor (fabric.yaml names this one) has the same ``-- COMMAND`` and Ctrl-C handling; Fabric's
executor (SIGTERM and SIGHUP as Ctrl-C too), since `fab` keeps Fabric's -H hosts: text after ``--`` goes to the task only when no hosts are
given. Its parsing of the task part of a command line is `gpu-train`'s (``remote.cli.TaskLine``), put
under Fabric's running program by fabfile.py (``adopt``)."""

from __future__ import annotations

from typing import Any

from fabric import Executor as FabricExecutor
from invoke import Call, ParserContext, Result, Task

from remote.cli import TaskLine, hand_remainder
from remote.errors import exit_for, stops_as_ctrl_c


class Executor(FabricExecutor):  # type: ignore[misc]  # (Fabric ships no types: its Executor is Any here)
    def execute(self, *tasks: str | tuple[str, dict[str, Any]] | ParserContext) -> dict[Task[Any], Result]:
        try:
            with stops_as_ctrl_c():
                done: dict[Task[Any], Result] = super().execute(*tasks)
            return done
        except KeyboardInterrupt as e:
            raise exit_for(e) from None

    def expand_calls(self, calls: list[Call], apply_hosts: bool = True) -> list[Call]:
        remainder = self.core.remainder
        if remainder and apply_hosts and not self.core[0].args.hosts.value:
            hand_remainder(self.core, calls)
            self.core.remainder = ""  # (else Fabric runs it on the hosts, of which there are none)
            try:
                expanded: list[Call] = super().expand_calls(calls, apply_hosts)
                return expanded
            finally:
                self.core.remainder = remainder
        expanded = super().expand_calls(calls, apply_hosts)
        return expanded


def adopt(program: object) -> None:
    """Fabric's program (``fabric.main.program``, the one `fab` runs) parses tasks as `gpu-train`'s does:
    ``TaskLine`` becomes a base of its class, in place. The fabfile is imported after the core options are
    parsed and before the tasks are, so everything ``TaskLine`` does is still ahead (a program that is
    already one is left alone)."""
    if not isinstance(program, TaskLine):
        program.__class__ = type(f"{type(program).__name__}TaskLine", (TaskLine, type(program)), {})
