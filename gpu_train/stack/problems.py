"""What is wrong with a stack: one ``Problem`` per thing (the setting, its value, what and the fix),
and ``ConfigError``, which carries every one so a user sees them all at once.

Parsing (``config``), the pools (``pools``), the rules (``validate``) and the stack files
(``stackfile``) all speak in these; values in messages are bounded (``shown``), since a stack value
can be megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_train.errors import UsageError
from gpu_train.stack.settings import NAMESPACE


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a stack: the setting, its value, what is wrong and how to fix it."""

    key: str
    message: str
    fix: str = ""
    value: Any = None
    severity: str = "error"  # or "warning": reported, does not stop anything

    def __str__(self) -> str:
        where = self.key if self.key.count(":") else f"{NAMESPACE}:{self.key}"
        value = "" if self.value is None else f" = {shown(self.value)}"
        text = f"{shown_key(where)}{value}: {self.message}"
        return f"{text}\n    fix: {self.fix}" if self.fix else text


def shown(value: object, limit: int = 80) -> str:
    """A value for a message: its repr, cut to ``limit`` characters (a stack value can be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown_key(key: str, limit: int = 60) -> str:
    """A setting's name for a message: unknown keys come from the file, so they are bounded too."""
    return key if len(key) <= limit and key.isprintable() else shown(key, limit)


class ConfigError(UsageError, ValueError):
    """A stack's settings are invalid; ``problems`` lists every one."""

    def __init__(self, problems: list[Problem], stack: str = ""):
        self.stack = stack
        head = f"stack {stack!r} is invalid" if stack else "invalid stack settings"
        lines = [f"{head} ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"]
        lines += [f"  - {p}".replace("\n", "\n  ") for p in problems]
        super().__init__("\n".join(lines), problems)
