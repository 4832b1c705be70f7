"""What the code sync leaves out, and why: .git never, .gitignore (git's own answer in a work tree,
rsync's per-directory rules otherwise), .gputrainignore, and the project's outputs (fetched runs, local
state); as rsync patterns, and sized and named for the user (`data/` stayed behind: push it). Apart
from sync.py, which runs rsync with them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_train.stack.project import GIT
from remote.transfer.codesize import human

IGNORE_FILE = ".gputrainignore"


def rsync_literal(path: str) -> str:
    """A file name as an rsync pattern matching only itself.

    rsync treats ``*?[`` as wildcards, and a backslash as an escape only in a pattern that has a
    wildcard; so a name without them is already literal, and one with them has each escaped. A
    newline cannot appear in a line-based rule file: it becomes ``?`` (a name differing only there
    is excluded too; never the other way round, which would send an ignored file).
    """
    if any(c in path for c in "*?[\n\r"):
        path = re.sub(r"([*?\[\\])", r"\\\1", path)
    return re.sub(r"[\n\r]", "?", path)


def code_filters(git_ignored: list[str] | None) -> list[str]:
    """rsync filter options: .git never; .gputrainignore everywhere; .gitignore via git or rsync."""
    opts = ["--exclude=/.git/", "--exclude=.git", f"--filter=:- {IGNORE_FILE}"]
    if git_ignored is None:
        opts.append("--filter=:- .gitignore")
    return opts


def git_ignored(directory: Path) -> list[str] | None:
    """Paths git ignores under ``directory`` (anchored rsync patterns), or None outside a work tree."""
    if not shutil.which("git"):
        return None
    inside = subprocess.run([*GIT, "-C", str(directory), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True)
    if inside.stdout.strip() != "true":
        return None
    out = subprocess.run(
        [*GIT, "-C", str(directory), "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"],
        capture_output=True,
        check=True,
    )
    names = out.stdout.decode("utf-8", "surrogateescape").split("\0")
    return ["/" + rsync_literal(p) for p in names if p]


@dataclass(frozen=True)
class LeftOut:
    """Something in the code directory that the sync does not send, and why."""

    path: str  # relative to the code directory; directories end in '/'
    bytes: int
    why: str
    capped: bool = False  # sized only in part (a huge tree): at least ``bytes``


def tree_bytes(path: Path, max_entries: int = 50_000) -> tuple[int, bool]:
    """(bytes under ``path``, whether the walk stopped at ``max_entries`` first); symlinks not followed."""
    total, seen, todo = 0, 0, [path]
    while todo:
        current = todo.pop()
        try:
            st = current.lstat()
        except OSError:
            continue
        seen += 1
        if seen > max_entries:
            return total, True
        if current.is_dir() and not current.is_symlink():
            try:
                todo.extend(current.iterdir())
            except OSError:
                continue
        elif current.is_file() and not current.is_symlink():
            total += st.st_size
    return total, False


def always_excluded(src: Path, outputs: list[tuple[Path, str | None]]) -> list[tuple[str, str | None]]:
    """Anchored rsync patterns for the outputs that lie inside ``src`` (fetched runs, local state):
    results never go back as code, whatever the ignore files say. Pairs of (pattern, why)."""
    out = []
    for path, why in outputs:
        try:
            rel = path.resolve().relative_to(src.resolve())
        except ValueError:
            continue
        if rel.parts:
            out.append(("/" + rsync_literal(rel.as_posix()) + "/", why))
    return out


@dataclass(frozen=True)
class Pushed:
    """A folder left out of the sync that `push` sent: ``to`` says where and when ("to HOST at 11:02"),
    ``change`` how it differs from what was sent ("" unchanged; None: too big to look)."""

    to: str
    change: str | None = ""


def left_out_summary(
    items: list[LeftOut], cli: str = "gpu-train", limit: int = 4, where: str = "", pushed: Mapping[str, Pushed] | None = None
) -> str:
    """One line naming the biggest things left out and their sizes, and how to send data instead:
    `push` of the biggest directory left out, and where the job finds it (as `push` puts it:
    $DATA_DIR/PATH, and as PATH/ in the job's working directory, nested ones too). ``where``: the synced
    folder as a path from where the user is (a monorepo's example from its root), so `push` names it.
    ``pushed``: the folders `push` sent (by folder_of), said as sent, or as changed since, instead."""
    shown = sorted(items, key=lambda i: -i.bytes)[:limit]
    if not shown:
        return ""
    pushed = pushed or {}
    parts = [f"{i.path} {'>= ' if i.capped else ''}{human(i.bytes)}, {i.why}" for i in shown]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    inside = f" in {where}" if where not in ("", ".") else ""
    folders = list(dict.fromkeys(f for f in map(folder_of, shown) if f and f not in ("runs", ".gpu-train")))
    said = [pushed_words(f, pushed[f], cli, f"{where}/{f}" if inside else f) for f in folders if f in pushed]
    head = f"left out{inside}: {'; '.join(parts)}{more}. " + "".join(f"{w}. " for w in said)
    folder = next((f for f in folders if f not in pushed), None)
    if folder is None and said:
        return head.rstrip()
    if folder is None:
        return f"{head}To send data: {cli} push DIR (the job finds it in $DATA_DIR/DIR)"
    typed = f"{where}/{folder}" if inside else folder
    return (
        f"{head}To send {folder}/: {cli} push {typed} (the job finds it in $DATA_DIR/{folder}, and as {folder}/ in its working directory)"
    )


def pushed_words(folder: str, p: Pushed, cli: str, typed: str) -> str:
    """A pushed folder in words: sent and unchanged, changed since (and how), or too big to look."""
    if p.change is None:
        return f"{folder}/ was pushed {p.to} (too many files to look for changes; `{cli} push {typed}` sends any)"
    if p.change:
        return f"{folder}/ changed since it was pushed {p.to} ({p.change}): `{cli} push {typed}` sends the changes"
    return f"{folder}/ was pushed {p.to} and is unchanged since: the job finds it in $DATA_DIR/{folder}"


def summary_change(then: Mapping[str, int], now: Mapping[str, int]) -> str:
    """How a folder's summary now (files, bytes, newest mtime: localstate.local_summary) differs from the
    one when it was pushed: "" when it does not."""
    if (then.get("files"), then.get("bytes"), then.get("newestNs")) == (now["files"], now["bytes"], now["newestNs"]):
        return ""
    if (then.get("files"), then.get("bytes")) == (now["files"], now["bytes"]):
        return "the same files and bytes, one modified"
    return f"{then.get('files', 0)} file(s), {human(then.get('bytes', 0))} then; {now['files']}, {human(now['bytes'])} now"


def folder_of(item: LeftOut) -> str | None:
    """The folder to push for a thing left out: itself, or the folder a file lies in (a gitignored
    data/mydata/train.bin is sent by `push data/mydata`); None for a file at the top."""
    if item.path.endswith("/"):
        return item.path.rstrip("/")
    return item.path.rsplit("/", 1)[0] if "/" in item.path else None


def ignore_sources(src: Path, paths: list[str]) -> dict[str, str]:
    """Which ignore file ignores each path (git check-ignore -v): path -> '.gitignore', 'data/.gitignore', ..."""
    if not paths:
        return {}
    names = "\0".join(paths) + "\0"
    out = subprocess.run(
        [*GIT, "-C", str(src), "check-ignore", "-v", "-z", "--no-index", "--stdin"],
        input=names.encode("utf-8", "surrogateescape"),
        capture_output=True,
    )
    fields = out.stdout.decode("utf-8", "surrogateescape").split("\0")
    found = {}
    for i in range(0, len(fields) - 3, 4):  # source, line number, pattern, path
        source = fields[i]
        found[fields[i + 3]] = Path(source).name if source.endswith(".gitignore") and "/" not in source else source
    return found


def left_out(src: Path, forced: list[tuple[str, str | None]], ignored: list[str]) -> list[LeftOut]:
    """What the sync leaves out, sized: the outputs ``forced`` out (those with a why), then what git
    ignores, biggest first, each named with the ignore file that ignores it."""
    items = []
    for pattern, why in forced:
        path = src / pattern.strip("/")
        if why and path.exists():  # no why: left out without a word (gpu-train's own state)
            size, capped = tree_bytes(path)
            items.append(LeftOut(pattern.lstrip("/"), size, why, capped))
    forced_paths = {p.lstrip("/") for p, _ in forced}
    rels = [p.lstrip("/") for p in ignored if p.lstrip("/") not in forced_paths and "\\" not in p]
    sized = [(rel, *tree_bytes(src / rel.rstrip("/"))) for rel in rels]
    sized = [t for t in sized if t[1] > 0]
    sized.sort(key=lambda t: -t[1])
    sources = ignore_sources(src, [rel for rel, _, _ in sized[:8]])
    for rel, size, capped in sized:
        source = sources.get(rel) or sources.get(rel.rstrip("/"))
        items.append(LeftOut(rel, size, f"ignored by {source or 'git'}", capped))
    return items
