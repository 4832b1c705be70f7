"""The dashboard's actions: stop a run, fetch a run, stop a VM. Each is the `gpu-train` command itself.

An action runs `gpu-train stop|fetch|vm-stop` as a process of its own with this dashboard's settings
(its stacks, records and project), so it does what the command does, guards included (`vm-stop`
refuses while a run runs and fetches first). The page sees its state and its last lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_train.contract import is_run_id
from gpu_train.environment import Environment
from gpu_train.errors import UsageError

# What each action runs: the command's words; RUN and STACK are filled in.
COMMANDS = {
    "stop": ("stop", "--stack", "STACK", "--run", "RUN"),
    "fetch": ("fetch", "--stack", "STACK", "--run", "RUN"),
    "vm-stop": ("vm-stop", "--stack", "STACK"),
}
NEEDS_RUN = {name for name, words in COMMANDS.items() if "RUN" in words}
KEEP_LINES = 40
LAUNCH = "import sys; from gpu_train.launcher import main; sys.argv[0] = 'gpu-train'; main()"


def command(action: str, stack: str, run: str | None, stacks: list[str]) -> list[str]:
    """The command's words for a page's request, checked: a known action, one of the project's stacks, a run id."""
    if action not in COMMANDS:
        raise UsageError(f"no action {action!r} (there are {', '.join(COMMANDS)})")
    if stack not in stacks:
        raise UsageError(f"no stack {stack!r} in this project")
    if action in NEEDS_RUN and not is_run_id(run):
        raise UsageError(f"{action} needs a run id, not {run!r}")
    return [{"STACK": stack, "RUN": run or ""}.get(w, w) for w in COMMANDS[action]]


@dataclass
class Action:
    id: int
    action: str
    stack: str
    run: str | None
    argv: list[str]
    started: float = field(default_factory=time.time)
    ended: float | None = None
    exit_code: int | None = None
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_LINES))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "stack": self.stack,
            "run": self.run,
            "command": " ".join(["gpu-train", *self.argv]),
            "started": self.started,
            "ended": self.ended,
            "exitCode": self.exit_code,
            "state": "running" if self.ended is None else ("done" if self.exit_code == 0 else "failed"),
            "lines": list(self.lines),
        }


class Actions:
    """The actions started from the pages, newest last; ``after(action)`` runs when one ends (a new look)."""

    def __init__(self, env: Environment, after: Callable[[Action], None] = lambda action: None):
        self.env, self.after = env, after
        self.started: list[Action] = []
        self.lock = threading.Lock()

    def start(self, action: str, stack: str, run: str | None, stacks: list[str]) -> Action:
        argv = command(action, stack, run, stacks)
        with self.lock:
            a = Action(len(self.started) + 1, action, stack, run, argv)
            self.started.append(a)
        threading.Thread(target=self._run, args=(a,), name=f"action-{a.id}", daemon=True).start()
        return a

    def _run(self, a: Action) -> None:
        variables = {**self.env.exported(), "GPU_TRAIN_PROJECT": str(self.env.project_root)}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCH, *a.argv],
                env={**os.environ, **variables},
                cwd=self.env.project_root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                a.lines.append(line.rstrip("\n")[:500])
            a.exit_code = proc.wait()
        except OSError as e:
            a.lines.append(str(e))
            a.exit_code = 1
        a.ended = time.time()
        self.after(a)

    def to_json(self) -> list[dict[str, Any]]:
        with self.lock:
            return [a.to_json() for a in self.started[-20:]]
