"""The clone's `fab` (fabric.yaml names this executor): Fabric's own program over the same tasks as
`gpu-train`, with the same ``-- COMMAND`` and Ctrl-C handling. Fabric's executor, since `fab` keeps
Fabric's -H hosts: text after ``--`` goes to the task only when no hosts are given."""

from __future__ import annotations

from fabric import Executor as FabricExecutor

from remote.cli import hand_remainder
from remote.errors import exit_for


class Executor(FabricExecutor):
    def execute(self, *tasks):
        try:
            return super().execute(*tasks)
        except KeyboardInterrupt as e:
            raise exit_for(e) from None

    def expand_calls(self, calls, apply_hosts=True):
        remainder = self.core.remainder
        if remainder and apply_hosts and not self.core[0].args.hosts.value:
            hand_remainder(self.core, calls)
            self.core.remainder = ""  # (else Fabric runs it on the hosts, of which there are none)
            try:
                return super().expand_calls(calls, apply_hosts)
            finally:
                self.core.remainder = remainder
        return super().expand_calls(calls, apply_hosts)
