"""Optional positional arguments for invoke tasks (``gpus [NAME]``), which invoke itself lacks.

Invoke treats every positional argument as required: its parser eats the next token for a positional
that has no value yet, and when a task's arguments end (``ParseMachine.complete_context``, the state
machine behind ``Parser.parse_argv``) it fails if one is still missing. An argument named in a task's
``optional_positional`` keeps the first behaviour (``gpus T4`` takes T4) and skips the second (``gpus``
alone runs with the argument's default): at the end of the task's arguments, a marked argument still
without a value stops being a required positional of that parsed context (a copy the parser made for
this command line).

That end is one public method of Invoke's parser, wrapped here once for the process, so `fab`
(Fabric's own program, which the tests and the clone use) and `gpu-train` parse alike. It relies on
Invoke 2.2's ``ParseMachine.complete_context``, ``ParserContext.missing_positional_args`` and
``ParserContext.positional_args``; tests/unit/test_optional.py pins them and fails when one moves.
"""

from __future__ import annotations

from typing import Any

from invoke.parser.parser import ParseMachine

_complete_context = ParseMachine.complete_context


def _complete_context_with_optionals(self: ParseMachine) -> None:
    context = self.context
    if context is not None:
        for argument in [a for a in context.missing_positional_args if getattr(a, "optional_positional", False)]:
            context.positional_args.remove(argument)  # given no value: the task gets the default
    _complete_context(self)


ParseMachine.complete_context = _complete_context_with_optionals  # type: ignore[method-assign]  # (Invoke has no hook for optional positionals)


def optional_positional(task: Any, *names: str) -> Any:
    """Mark ``names`` of ``task`` (an invoke Task) as optional positionals; returns the task."""
    get_arguments = task.get_arguments

    def with_optional(*args: Any, **kwargs: Any) -> Any:
        arguments = get_arguments(*args, **kwargs)
        for a in arguments:
            if a.name in names:
                a.optional_positional = True
        return arguments

    task.get_arguments = with_optional
    return task
