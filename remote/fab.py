"""The clone's `fab` (fabric.yaml names this executor): Fabric's own program over the same tasks as
`gpu-train`, with the same ``-- COMMAND`` and Ctrl-C handling. Fabric's executor, since `fab` keeps
Fabric's -H hosts: text after ``--`` goes to the task only when no hosts are given."""

from __future__ import annotations

from typing import Any

from fabric import Executor as FabricExecutor
from invoke import Call, ParserContext, Result, Task

from remote.cli import hand_remainder
from remote.errors import exit_for


class Executor(FabricExecutor):  # type: ignore[misc]  # (Fabric ships no types: its Executor is Any here)
    def execute(self, *tasks: str | tuple[str, dict[str, Any]] | ParserContext) -> dict[Task[Any], Result]:
        try:
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
