"""Bulk data with rsync over OpenSSH: code to the host, checkpoints home.

The command lines are built by plain functions (tested as tables); running them is a thin layer.
Code honours .gitignore (git's own answer when the directory is in a git work tree; rsync's
per-directory rules otherwise) and .gputrainignore, and never sends .git: those rules, and what
they leave out, are remote/transfer/ignores.py.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.bundle import GUARD
from gpu_train.stack.sshhost import SshHost
from remote.errors import RemoteError
from remote.ssh.openssh import openssh_options
from remote.ssh.target import Target
from remote.transfer.codesize import folder_counts, human
from remote.transfer.ignores import IGNORE_FILE, LeftOut, always_excluded, code_filters, git_ignored, left_out

# rsync before 3.4.0 has known client-side holes (CVE-2024-12085 .. 12088: a malicious server
# can read client memory or write outside the destination).
MIN_RSYNC = (3, 4, 0)
# Every rsync gets these: paths travel inside rsync's protocol, not through the remote shell
# (`--secluded-args`, called --protect-args before 3.3.0; it also holds with RSYNC_OLD_ARGS=1).
PROTECT = "--protect-args"


def ssh_command(target: Target, host: SshHost) -> str:
    return shlex.join(["ssh", *openssh_options(target, host)])


def remote_path(host: SshHost, path: str) -> str:
    h = f"[{host.host}]" if ":" in host.host else host.host
    return f"{host.user}@{h}:{path}"


def parse_rsync_version(text: str) -> tuple[int, ...] | None:
    """(3, 4, 1) from the first line of `rsync --version` ("rsync  version 3.4.1  protocol ..."); None if unknown."""
    m = re.search(r"version\s+v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else None


def rsync_problem(text: str | None) -> str | None:
    """Why the laptop's rsync cannot be used (None when it can), from its `--version` output."""
    if text is None:
        return "rsync is not installed here: install rsync 3.4.0 or newer (apt-get install rsync, brew install rsync)"
    version = parse_rsync_version(text)
    if version is None:
        return "cannot tell rsync's version from `rsync --version`: install rsync 3.4.0 or newer"
    if version < MIN_RSYNC:
        have = ".".join(map(str, version))
        return (
            f"rsync {have} is older than 3.4.0, which fixed holes a hostile host can use against your machine "
            "(CVE-2024-12084..12088): install a newer rsync (macOS: brew install rsync; Ubuntu/Debian: the "
            "security update, or a backport) and make it the first rsync on PATH"
        )
    return None


@functools.lru_cache(maxsize=1)
def _rsync_version_text() -> str | None:
    if not shutil.which("rsync"):
        return None
    try:
        return subprocess.run(["rsync", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def local_rsync_problem() -> str | None:
    """What is wrong with this machine's rsync, with the fix; None when it will do."""
    return rsync_problem(_rsync_version_text())


def check_rsync() -> None:
    """RemoteError naming the fix when the local rsync is missing or too old."""
    if (why := local_rsync_problem()) is not None:
        raise RemoteError(why)


def guard_command(target: Target) -> str:
    """A shell command that checks REMOTE_ROOT is the login user's alone (creating it 0700), as the
    agent does, so that rsync writes nothing into a root another user made or can write. The sync
    runs alongside the agent's start, so it cannot wait for the agent's word."""
    check = GUARD + (
        "\nimport sys\ntry:\n    secure_root(sys.argv[1])\nexcept (UnsafeRoot, OSError) as e:\n    sys.exit('gpu-train: %s' % e)\n"
    )
    return f'p=/usr/bin/python3; [ -x "$p" ] || p=python3; "$p" -S -c {shlex.quote(check)} {shlex.quote(target.remote_root)}'


def push_command(
    target: Target, host: SshHost, src: Path, run_id: str, base: str, exclude_from: Path | None, git_mode: bool, rsh: str | None = None
) -> list[str]:
    """rsync the code into REMOTE_ROOT/staging/RUN, hard-linking files unchanged since the last run.

    ``rsh``: rsync's remote shell; default OpenSSH, or the task's own connection (remote/transfer/relay.py).
    """
    cmd = [
        "rsync",
        "-a",
        "--delete",
        PROTECT,
        "-e",
        rsh or ssh_command(target, host),
        *staging_options(target, base),
        *code_filters([] if git_mode else None),
    ]
    if exclude_from is not None:
        cmd.append(f"--exclude-from={exclude_from}")
    return [*cmd, f"{src}/", staging_dest(target, host, run_id)]


def staging_options(target: Target, base: str, guard: bool = True, marker: str | None = None) -> list[str]:
    """The receiving side of a code sync into ``target``'s staging area (from the laptop, or from
    node 0 passing the code on): its root checked first (``guard``; node 0's hop comes after an
    agent call there checked it, so it skips a Python start), and files unchanged since the last run
    of ``base`` hard-linked rather than sent. With ``marker`` (a path as rsync takes it) the receiving
    rsync leaves that file once it has the whole tree (a fan-out's RUN.arrived)."""
    mkdir = shlex.join(["mkdir", "-p", f"{target.rsync_root()}/staging"])  # older rsyncs lack --mkpath
    check = f"{guard_command(target)} && " if guard else ""
    rsync = "rsync"
    if marker is not None:  # rsync appends its own arguments: they become "$@"
        rsync = shlex.join(["sh", "-c", f'rsync "$@" && : > {shlex.quote(marker)}', "rsync"])
    return [f"--rsync-path={check}{mkdir} && {rsync}", f"--link-dest=../../code/{base}.last"]


def staging_dest(target: Target, host: SshHost, run_id: str) -> str:
    return remote_path(host, f"{target.rsync_root()}/staging/{run_id}/")


def list_command(src: Path, exclude_from: Path | None, git_mode: bool) -> list[str]:
    """A local rsync listing of what would be sent: the size shown before syncing."""
    cmd = ["rsync", "-a", "--list-only", "--no-h", *code_filters([] if git_mode else None)]
    if exclude_from is not None:
        cmd.append(f"--exclude-from={exclude_from}")
    return [*cmd, f"{src}/"]


def listed_bytes(listing: str) -> tuple[int, int]:
    """(files, bytes) from `rsync --list-only` output."""
    files = total = 0
    for line in listing.splitlines():
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[0].startswith("-"):
            files += 1
            total += int(parts[1].replace(",", ""))
    return files, total


@dataclass
class CodePlan:
    """What a code sync would send, decided locally before any connection: files, size, manifest.

    The manifest (a hash of rsync's own listing: names, sizes, times, modes) lets the host reuse
    the last run's code without a sync when nothing changed.
    """

    src: Path
    files: int
    bytes: int
    manifest: str
    git_mode: bool
    exclude: Path | None
    left_out: tuple[LeftOut, ...] = ()
    folders: dict[str, int] = field(default_factory=dict)  # files per top-level folder (codesize.folder_counts)

    def describe(self) -> str:
        return f"{self.src} ({self.files} files, {human(self.bytes)}; .gitignore and {IGNORE_FILE} honoured)"


def plan_code(src: Path, scratch: Path, outputs: tuple[tuple[Path, str | None], ...] = ()) -> CodePlan:
    """List what would be synced from ``src`` (git's ignores go to a file in ``scratch``).

    ``outputs`` (the fetched runs' folder, the local state) are never sent; what is left out is
    sized, so the user hears that ``data/`` stayed behind before the job looks for it.
    """
    check_rsync()
    ignored = git_ignored(src)
    forced = always_excluded(src, list(outputs))
    patterns = [p for p, _ in forced] + (ignored or [])
    exclude = None
    if patterns:
        exclude = scratch / "code.exclude"
        exclude.write_text("\n".join(patterns) + "\n", encoding="utf-8", errors="surrogateescape")
    listing = subprocess.run(list_command(src, exclude, ignored is not None), capture_output=True, text=True)
    if listing.returncode != 0:
        raise RemoteError(f"cannot list {src}: {listing.stderr.strip()}")
    files, size = listed_bytes(listing.stdout)
    manifest = hashlib.sha256(listing.stdout.encode()).hexdigest()
    return CodePlan(
        src,
        files,
        size,
        manifest,
        ignored is not None,
        exclude,
        tuple(left_out(src, forced, ignored or [])),
        folder_counts(listing.stdout),
    )


class SyncCancelled(RemoteError):
    """The code sync was stopped from here (Ctrl-C): nothing was launched."""


def push_code(
    target: Target, host: SshHost, plan: CodePlan, run_id: str, base: str, rsh: str | None = None, cancel: threading.Event | None = None
) -> None:
    """Sync the planned code to the host's staging area for ``run_id``.

    ``cancel`` set (Ctrl-C on the laptop, seen by the main thread only) ends rsync at once and
    raises SyncCancelled, also when it is set just as rsync finished: the launch must not go on.
    """
    cmd = push_command(target, host, plan.src, run_id, base, plan.exclude, plan.git_mode, rsh)
    if cancel is not None and cancel.is_set():
        raise SyncCancelled(f"the code sync to {host} was interrupted before it began")
    with tempfile.TemporaryFile() as err, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err) as proc:
        while True:
            try:
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    proc.terminate()
                    proc.wait()
                    break
        if cancel is not None and cancel.is_set():
            raise SyncCancelled(f"the code sync to {host} was interrupted")
        if proc.returncode != 0:
            err.seek(0)
            text = err.read().decode("utf-8", "replace").strip()
            raise RemoteError(f"rsync of the code to {host} failed (exit {proc.returncode}): {text}")


def data_command(target: Target, host: SshHost, src: Path, dest: str, progress: bool, rsh: str | None = None) -> list[str]:
    """rsync a data directory to ``dest`` on the host: incremental, resumable, never deleting there."""
    mkdir = shlex.join(["mkdir", "-p", dest])  # older rsyncs lack --mkpath
    cmd = ["rsync", "-a", "--partial", PROTECT, "-e", rsh or ssh_command(target, host), f"--rsync-path={mkdir} && rsync"]
    if progress:
        cmd += ["--info=progress2", "--no-inc-recursive"]
    return [*cmd, f"{src}/", remote_path(host, f"{dest}/")]


def push_data(target: Target, host: SshHost, src: Path, dest: str, progress: bool, rsh: str | None = None) -> None:
    check_rsync()
    result = subprocess.run(
        data_command(target, host, src, dest, progress, rsh),
        stdout=None if progress else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if result.returncode != 0:
        raise RemoteError(f"push to {host} failed (rsync exit {result.returncode}): {result.stderr.strip()}")
