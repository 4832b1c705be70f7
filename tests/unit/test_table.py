"""The one table layout: columns as wide as their widest cell, right-aligned where asked, no trailing spaces."""

from __future__ import annotations

import pytest

from gpu_train.views.table import aligned


@pytest.mark.parametrize(
    ("rows", "right", "expected"),
    [
        ([], (), []),
        ([["a", "bb"], ["ccc", "d"]], (), ["a    bb", "ccc  d"]),
        ([["run", "1", "2 s"], ["r", "10", "10 s"]], {1, 2}, ["run   1   2 s", "r    10  10 s"]),
        ([["x", ""], ["yy", ""]], (), ["x", "yy"]),  # an empty last column leaves no spaces behind
        ([["h1", "h2"], ["é", "日本"]], (), ["h1  h2", "é   日本"]),
    ],
)
def test_aligned(rows, right, expected) -> None:
    assert aligned(rows, right) == expected
