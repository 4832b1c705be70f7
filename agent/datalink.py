"""What `gpu-train push` sent, also where the code reads it: DATA_DIR's entries linked into the working directory."""

from __future__ import annotations

import filecmp
import os
from typing import IO


def link_data(data_dir: str, code_dir: str, log: IO[bytes], only: list[str] | None = None) -> None:
    """What `gpu-train push` sent, also where the code reads it: each path of DATA_DIR at the same path
    in the working directory, merged with the code's own folders (a folder in both gets the pushed
    entries it lacks, one by one, as symlinks into DATA_DIR). On a name in both whose contents differ
    the code's own file is used, and the log says so; nothing is ever silently left out.
    ``only``: the pushed folders' own paths (a bucket's data manifests): those are linked and nothing
    else of DATA_DIR, so no other name there (a `numpy.py`) ever lands beside the code."""
    if not os.path.isdir(data_dir):
        return
    linked: list[str] = []
    kept: list[str] = []
    if only is None:
        merge_links(data_dir, code_dir, "", linked, kept)
    else:
        for folder in sorted(set(only)):
            parent, _, name = folder.rpartition("/")
            src, dest = os.path.join(data_dir, parent), os.path.join(code_dir, parent)
            if os.path.isdir(os.path.join(src, name)) and not os.path.islink(dest) and (os.path.isdir(dest) or not os.path.lexists(dest)):
                os.makedirs(dest, exist_ok=True)
                merge_links(src, dest, f"{parent}/" if parent else "", linked, kept, (name,))
        others = sorted(set(os.listdir(data_dir)) - {f.split("/")[0] for f in only})
        if others:
            log.write(f"[gpu-train] not linked (not in the pushed data's manifest; still in $DATA_DIR): {', '.join(others[:8])}\n".encode())
    if linked:
        shown = ", ".join(linked[:8]) + (f" and {len(linked) - 8} more" if len(linked) > 8 else "")
        log.write(f"[gpu-train] DATA_DIR={data_dir}; linked into the working directory: {shown}\n".encode())
    for rel in kept:
        log.write(
            f"[gpu-train] {rel}: the code and the pushed data both have it, and they differ: the code's "
            f"own copy is used (the pushed one is $DATA_DIR/{rel}; rename one to use both)\n".encode()
        )


def merge_links(src: str, dest: str, rel: str, linked: list[str], kept: list[str], names: tuple[str, ...] | None = None) -> None:
    """Link ``src``'s entries (``names`` of them, else all) into ``dest``: an entry ``dest`` lacks as a
    symlink to it, a folder in both entry by entry; a link already there (an earlier start's) stays.
    ``linked``/``kept`` collect paths."""
    for name in sorted(os.listdir(src) if names is None else names):
        s, d, r = os.path.join(src, name), os.path.join(dest, name), f"{rel}{name}"
        if os.path.islink(d):
            continue
        if not os.path.lexists(d):
            os.symlink(s, d)
            linked.append(r)
        elif os.path.isdir(d) and os.path.isdir(s):
            merge_links(s, d, f"{r}/", linked, kept)
        elif not (os.path.isfile(d) and os.path.isfile(s) and filecmp.cmp(s, d, shallow=False)):
            kept.append(r)
