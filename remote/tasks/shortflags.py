"""One meaning per short flag, in every task: ``-s`` is ``--stack`` wherever it exists.

Invoke gives each option the first free letter of its name, so ``-s`` meant ``--stack``,
``--script``, ``--streams``, ``--source`` or ``--spot`` by task, and a letter learned in one task
did something else in the next. Tasks here get no automatic short flags; the few options every
task spells alike get the one letter below. Long names are unchanged.
"""

from __future__ import annotations

from typing import Any

from invoke import Argument, Task

SHORT = {"stack": "s", "run": "r", "json": "j", "follow": "f", "all": "a", "command": "c", "env": "e"}


def pin_short_flags(task: Task[Any]) -> Task[Any]:
    """``task`` (an invoke Task) with SHORT's letters as its only short flags; returns the task."""
    task.auto_shortflags = False
    get_arguments = task.get_arguments

    def pinned(*args: Any, **kwargs: Any) -> list[Argument]:
        arguments: list[Argument] = get_arguments(*args, **kwargs)
        for a in arguments:
            letter = SHORT.get(a.names[0])  # the long name as typed (``all``, not ``all_``)
            if letter and letter not in a.names:
                a.names = (*a.names, letter)
        return arguments

    task.get_arguments = pinned  # type: ignore[method-assign]  # (Invoke has no hook for a task's short flags)
    return task
