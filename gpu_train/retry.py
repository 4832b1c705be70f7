"""Waiting with backoff: the one way gpu-train waits for something to come up (a host's sshd, a VM's
driver, capacity in a zone) without hammering it, and without waiting past its deadline."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Waits of ``first`` seconds, growing by ``factor`` up to ``cap``; with a ``deadline`` (on ``clock``,
    monotonic), never past it. The caller decides what to try and when to give up (``left() <= 0``);
    this only says how long to wait before the next try."""

    first: float
    cap: float
    factor: float = 2.0
    deadline: float | None = None
    clock: Callable[[], float] = time.monotonic
    _delay: float = field(init=False)

    def __post_init__(self) -> None:
        self._delay = self.first

    @classmethod
    def within(cls, seconds: float, first: float, cap: float, factor: float = 2.0) -> Backoff:
        """A backoff whose deadline is ``seconds`` from now."""
        return cls(first, cap, factor, deadline=time.monotonic() + seconds)

    def left(self) -> float:
        """Seconds until the deadline (negative once past it; infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - self.clock()

    def next(self) -> float:
        """The wait before the next try (clipped to the deadline); the one after it grows."""
        wait = min(self._delay, max(self.left(), 0.0))
        self._delay = min(self._delay * self.factor, self.cap)
        return wait
