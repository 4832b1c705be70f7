"""A setting gpu-train adds to a stack file itself (``bucketArea``, made once): one line under ``config:``,
every other byte of the file as it was (its comments, order, quoting and line endings).

The new text is parsed again before it is written, and must read as the old settings plus the new one;
a file whose ``config:`` this cannot extend so (a flow mapping, ``config: {...}``) is left as it is and the
user is told the line to add. Written whole or not at all (gpu_train/atomic.py), keeping the file's mode.
"""

from __future__ import annotations

import fcntl
import re
import time
from pathlib import Path

import yaml

from gpu_train.atomic import atomic_write
from gpu_train.stack.problems import ConfigError, Problem
from gpu_train.stack.settings import NAMESPACE
from gpu_train.stack.stackfile import read_stack_file

CONFIG_LINE = re.compile(r"config:[ \t]*(#.*)?")
INDENTED = re.compile(r"([ ]+)\S")
LOCK_WAIT_S = 10.0


def with_setting(text: str, key: str, value: str) -> str | None:
    """``text`` (a stack file) with ``gpu-train:KEY: VALUE`` as the last line of its ``config:`` block, or
    None when that would not read as the old settings plus this one (``value``: a plain YAML scalar)."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if CONFIG_LINE.fullmatch(line.rstrip("\r\n"))]
    line = f"{NAMESPACE}:{key}: {value}"
    if not starts:
        body = text if not text or text.endswith(("\n", "\r")) else text + newline
        new = f"{body}config:{newline}  {line}{newline}"
    else:
        at, indent = starts[0] + 1, "  "
        for i in range(starts[0] + 1, len(lines)):
            bare = lines[i].rstrip("\r\n")
            if not bare.strip() or bare.lstrip().startswith("#"):
                continue
            m = INDENTED.match(bare)
            if m is None:  # the next top-level key (or a `- ` list at the left: not a block mapping)
                break
            indent = indent if at > starts[0] + 1 else m.group(1)
            at = i + 1
        before = lines[:at]
        if before and not before[-1].endswith(("\n", "\r")):
            before[-1] += newline
        new = "".join([*before, f"{indent}{line}{newline}", *lines[at:]])
    try:
        old_doc, new_doc = yaml.safe_load(text) or {}, yaml.safe_load(new) or {}
    except yaml.YAMLError:
        return None
    if not isinstance(old_doc, dict) or not isinstance(new_doc, dict):
        return None
    old_config = old_doc.get("config") or {}
    if not isinstance(old_config, dict) or new_doc.get("config") != {**old_config, f"{NAMESPACE}:{key}": value}:
        return None
    if {k: v for k, v in new_doc.items() if k != "config"} != {k: v for k, v in old_doc.items() if k != "config"}:
        return None
    return new


def add_setting(path: Path, key: str, value: str, wait_s: float = LOCK_WAIT_S) -> str:
    """``gpu-train:KEY`` in the stack file at ``path``: the value already there (another command wrote it
    meanwhile), else ``value``, added. ConfigError naming the line to add when the file cannot take it.

    Read and written under a lock on the file: two first `train`s at once (a script starting several) each
    made an area, and the one written last left the other's runs in an area the stack no longer names. The
    lock is the inode's that was opened, and the write replaces the inode: the file is read again by its
    path once the lock is held, so a writer that waited sees what the one before it wrote. A lock held past
    ``wait_s`` (gpu-train holds it for milliseconds; anyone who can read the file can take it) is refused, naming
    the line to add, rather than waited on for ever."""
    with open(path, "rb") as held:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        [_cannot_add(path, key, value, f"another process has held a lock on {path} for {wait_s:g} s")]
                    ) from None
                time.sleep(0.02)
        have = read_stack_file(path).get(f"{NAMESPACE}:{key}")
        if have is not None:
            return str(have)
        text = path.read_text(encoding="utf-8")
        new = with_setting(text, key, value)
        if new is None:
            raise ConfigError([_cannot_add(path, key, value, "gpu-train could not add it to that file's config: safely")])
        atomic_write(path, new, mode=0o644)
    return value


def _cannot_add(path: Path, key: str, value: str, why: str) -> Problem:
    return Problem(
        key,
        f"is not in {path}, and {why}",
        f"add the line `{NAMESPACE}:{key}: {value}` under config: (or `pulumi config set {NAMESPACE}:{key} {value}`)",
    )
