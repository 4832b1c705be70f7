"""Backoff: the waits grow to their cap and never run past the deadline."""

from __future__ import annotations

import math

import pytest

from gpu_train.retry import Backoff


@pytest.mark.parametrize(
    ("first", "cap", "factor", "want"),
    [
        (0.5, 10, 2.0, [0.5, 1, 2, 4, 8, 10, 10]),
        (5, 30, 1.5, [5, 7.5, 11.25, 16.875, 25.3125, 30, 30]),
        (30, 600, 2.0, [30, 60, 120, 240, 480, 600, 600]),
        (1, 1, 2.0, [1] * 7),
    ],
)
def test_the_waits_grow_to_their_cap(first: float, cap: float, factor: float, want: list[float]) -> None:
    b = Backoff(first, cap, factor)
    assert [b.next() for _ in want] == want and b.left() == math.inf


def test_no_wait_runs_past_the_deadline() -> None:
    now = [100.0]
    b = Backoff(4, 60, deadline=110.0, clock=lambda: now[0])
    assert b.next() == 4 and b.left() == 10
    now[0] = 107.0
    assert b.next() == 3  # 8 s would run past the deadline
    now[0] = 111.0
    assert b.left() == -1 and b.next() == 0
