"""Optional positional arguments for invoke tasks (``gpus [NAME]``), which invoke itself lacks.

Invoke treats every positional argument as required: its parser eats the next token for a
positional that has no value yet, and when the task's arguments end it fails if one is still
missing. An argument named in a task's ``optional_positional`` keeps the first behaviour
(``gpus T4`` takes T4) and skips the second (``gpus`` alone runs with the argument's default).
Both questions go through ``ParserContext.missing_positional_args``, so the property answers by who
asks; the task collection is copied by invoke's loader (``Collection.from_module``), which keeps
the task objects but not a Collection subclass, hence the property on ParserContext itself.
"""

from __future__ import annotations

import sys

from invoke.parser import ParserContext

_required = ParserContext.missing_positional_args


def _missing_positional_args(self: ParserContext):
    missing = _required.fget(self)  # type: ignore[attr-defined]
    if sys._getframe(1).f_code.co_name == "complete_context":  # the end of the task's arguments
        return [a for a in missing if not getattr(a, "optional_positional", False)]
    return missing


ParserContext.missing_positional_args = property(_missing_positional_args)  # type: ignore[method-assign,assignment]


def optional_positional(task, *names: str):
    """Mark ``names`` of ``task`` (an invoke Task) as optional positionals; returns the task."""
    get_arguments = task.get_arguments

    def with_optional(*args, **kwargs):
        arguments = get_arguments(*args, **kwargs)
        for a in arguments:
            if a.name in names:
                a.optional_positional = True
        return arguments

    task.get_arguments = with_optional
    return task
