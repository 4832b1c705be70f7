"""How much a code sync carries, and what to say when it is a lot (pure).

Every run keeps its own copy of the code on the host, so a dataset, a virtualenv or checkpoints kept
beside the code and synced with it cost every run their space and the first sync its time. Above
these limits `train` says how much goes, which folders hold most of it, and how to leave them out.
"""

from __future__ import annotations

LARGE_SYNC_BYTES = 100 * 1024 * 1024
MANY_FILES = 3000


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def folder_counts(listing: str) -> dict[str, int]:
    """Files per top-level folder of the code, from `rsync --list-only` output ('.' for the top itself)."""
    counts: dict[str, int] = {}
    for line in listing.splitlines():
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[0].startswith("-"):
            top = parts[4].split("/", 1)[0] + "/" if "/" in parts[4] else "."
            counts[top] = counts.get(top, 0) + 1
    return counts


def heavy_code(files: int, size: int, folders: dict[str, int], ignore_file: str, cli: str) -> str | None:
    """The warning for a code sync of many files or many bytes, naming the folders that hold most of
    the files and how to leave one out; None for an ordinary one."""
    if files <= MANY_FILES and size <= LARGE_SYNC_BYTES:
        return None
    top = sorted(((n, f) for f, n in folders.items() if f != "."), reverse=True)[:3]
    where = f" (most in {', '.join(f'{f} {n:,} file' + ('s' * (n != 1)) for n, f in top)})" if top else ""
    example = top[0][1] if top else "data/"
    return (
        f"warning: {files:,} files, {human(size)} go as code{where}, and every run keeps its own copy on the "
        f"host. Leave out what is not code: a line `{example}` in {ignore_file}, and `{cli} push DIR` for data; "
        f"`{cli} prune` frees the copies of finished runs"
    )
