"""Columns of text: the one way a table is laid out for a terminal (status, ls, gpus)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """Each row's cells in columns as wide as their widest cell, two spaces apart, ``right`` columns
    right-aligned; no line ends in spaces."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows
    ]
