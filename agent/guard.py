"""REMOTE_ROOT is the login user's alone: checked before the agent writes or runs anything there.

Another user who can write REMOTE_ROOT (a `remoteRoot` under /tmp they created first, a shared
directory) could replace the agent that cron, screen and `fab resume` run as you, or read your
runs. So the root (and every parent the agent creates) must be a real directory, owned by the login
user, not writable by group or others; it is created 0700 under umask 077, and an existing root of
ours is narrowed to 0700. Every folder above it (as written and as links resolve) belongs to root or
the user and is not writable by others unless sticky (OpenSSH's StrictModes rule).
Standard library only; this file's source also runs inline in the
laptop's bootstrap (agent/bundle.py), before the agent is written to the host, so it
imports nothing from the package.
"""

from __future__ import annotations  # (first in the bootstrap too: this source opens it)

import contextlib
import os
import stat


def _cli() -> str:
    """contract.cli_name, repeated here: this file runs inline before the package exists on the host."""
    name = os.environ.get("GPU_TRAIN_CLI", "")
    return name if name in ("gpu-train", "fab") else "gpu-train"


class UnsafeRoot(Exception):
    """REMOTE_ROOT is not ours alone; the message names the path, the reason and the fix."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def dir_problem(st: os.stat_result, uid: int | None) -> str:
    """Why a directory with this lstat() cannot hold gpu-train's files ('' when it can); any owner
    when ``uid`` is None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if uid is not None and st.st_uid != uid:
        return f"belongs to {_owner(st.st_uid)}, not to you ({_owner(uid)})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def ancestor_problem(st: os.stat_result, uid: int) -> str:
    """Why a folder above REMOTE_ROOT lets another user swap what is in it ('' when it does not):
    OpenSSH's StrictModes rule, owned by root or the user and not writable by others, with one
    allowance: a sticky folder of root's or the user's (/tmp), where only an entry's owner (or the
    folder's) may rename it. A sticky folder of another user's is refused: its owner renames anything."""
    if st.st_uid not in (0, uid):
        return f"belongs to {_owner(st.st_uid)}"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"others may write (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
    return ""


def link_problem(st: os.stat_result, uid: int) -> str:
    """Why a symbolic link on the way to REMOTE_ROOT lets another user swap where it leads ('' when it
    does not): its owner may replace it (in a sticky folder too), so it must be root's or the user's."""
    return "" if st.st_uid in (0, uid) else f"is a symbolic link that belongs to {_owner(st.st_uid)}"


def ancestors_problem(folder: str, uid: int) -> str:
    """The first of ``folder`` and the folders above it (as written, each link itself too, and as
    symbolic links resolve) that fails ancestor_problem or link_problem, with why; '' when none does."""
    for parent in (folder, os.path.realpath(folder)):
        while True:
            st = os.lstat(parent)
            why = link_problem(st, uid) if stat.S_ISLNK(st.st_mode) else ancestor_problem(st, uid)
            if not why and stat.S_ISLNK(st.st_mode):
                why = ancestor_problem(os.stat(parent), uid)
            if why:
                return f"{parent}, which {why}"
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
    return ""


def secure_root(root: str, own: bool = True) -> str:
    """Create REMOTE_ROOT 0700 (and its missing parents), or check the one there; its absolute path.

    Raises UnsafeRoot when it, or a parent created here, is a symlink, someone else's, or writable by
    group or others. ``own=False`` is for root's own copy of the agent on a VM (outside REMOTE_ROOT)
    reading the login user's root: any owner, and nothing created.
    """
    os.umask(0o077)
    root = os.path.abspath(os.path.expanduser(root))
    uid = os.geteuid() if own else None
    if not own and not os.path.lexists(root):
        return root
    created = []
    path = root
    while not os.path.lexists(path):
        created.append(path)
        path = os.path.dirname(path)
    if own and uid is not None:  # before anything is created in them
        why = ancestors_problem(path if created else os.path.dirname(root), uid)
        if why:
            raise UnsafeRoot(
                f"remoteRoot {root} lies in {why}, so another user could rename it and put theirs "
                "in its place: use a remoteRoot only you can write, under your home directory"
            )
    for path in reversed(created):
        with contextlib.suppress(FileExistsError):  # someone was faster: checked below like any other
            os.mkdir(path, 0o700)
    for path in [root, *created[1:]]:
        why = dir_problem(os.lstat(path), uid)
        if why:
            raise UnsafeRoot(
                f"remoteRoot {path} {why}: another user could replace gpu-train's agent, which runs as you, or "
                "read your runs. Use a remoteRoot only you can write, under your home directory (not under /tmp or a "
                "shared directory)" + ("" if path == root else f" (it was to hold {root})")
            )
    if own and stat.S_IMODE(os.lstat(root).st_mode) & 0o077:
        os.chmod(root, 0o700)  # ours and not writable by others, but readable: runs hold secrets
    return root


def check_own_file(path: str) -> None:
    """Refuse to run an agent file we did not write: a symlink, someone else's, or writable by others."""
    st = os.lstat(path)
    uid = os.geteuid()
    why = (
        "is a symbolic link"
        if stat.S_ISLNK(st.st_mode)
        else f"belongs to {_owner(st.st_uid)}"
        if st.st_uid != uid
        else f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_mode & 0o022
        else ""
    )
    if why:
        raise UnsafeRoot(
            f"{path} {why}: gpu-train did not write it for you, and will not run it. "
            f"Run any {_cli()} task (e.g. `{_cli()} status`) to reinstall the agent"
        )
