"""What the laptop keeps between tasks: atomic writes, pushed-code manifests, fetch records, ssh config.

Every file here is written whole or not at all, so an interrupted task never leaves half a record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.atomic import atomic_write

if TYPE_CHECKING:
    from gpu_train.stack.sshhost import SshHost


def read_doc(path: Path) -> dict[str, Any]:
    """A record of ours as its JSON object; {} when it is missing, unreadable or not an object (made anew)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class PushedManifests:
    """Which code (by manifest) each host last received for a run name: a local cache, so an
    unchanged tree is launched without a sync; the host checks the claim before trusting it."""

    def __init__(self, cache: Path):
        self.path = cache / "code-manifests.json"

    def _load(self) -> dict[str, Any]:
        return read_doc(self.path)

    def get(self, host: SshHost, base: str) -> str | None:
        manifest = self._load().get(f"{host}/{base}")
        return manifest if isinstance(manifest, str) else None

    def set(self, host: SshHost, base: str, manifest: str) -> None:
        doc = {**self._load(), f"{host}/{base}": manifest}
        atomic_write(self.path, json.dumps(doc, indent=1))


class SaidBefore:
    """Notices a task said, by subject (a project folder's "left out" line): one said before, word for
    word, is not said again on every train; a changed one is."""

    def __init__(self, cache: Path):
        self.path = cache / "said.json"

    def first_time(self, subject: str, text: str) -> bool:
        """Whether ``text`` is new for ``subject`` (and remember it)."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            doc = {}
        if not isinstance(doc, dict) or doc.get(subject) != text:
            atomic_write(self.path, json.dumps({**(doc if isinstance(doc, dict) else {}), subject: text}, indent=1))
            return True
        return False


class PushedData:
    """What `push DIR` sent to the stack's hosts, by the folder's path here: when, to which hosts, and the
    folder's local_summary as it was sent (taken before sending: a file written meanwhile reads as changed),
    so that `train` says a folder it leaves out was pushed, or changed since, not "push it"."""

    def __init__(self, cache: Path):
        self.path = cache / "data-pushes.json"

    def _load(self) -> dict[str, Any]:
        return read_doc(self.path)

    def get(self, src: Path) -> dict[str, Any] | None:
        got = self._load().get(str(src.resolve()))
        return got if isinstance(got, dict) and isinstance(got.get("hosts"), list) else None

    def record(self, src: Path, hosts: list[str], summary: Mapping[str, int], at: float) -> None:
        doc = {**self._load(), str(src.resolve()): {"at": at, "hosts": hosts, **summary}}
        atomic_write(self.path, json.dumps(doc, indent=1))


def local_summary(path: Path, skip: Collection[str] = ()) -> dict[str, Any]:
    """Regular files under ``path`` (links not followed): how many, their bytes, the newest mtime;
    ``skip``: folders at its top left out (a run's workdir/ and .gpu-train/ beside its JOB_DIR files)."""
    files = size = newest = 0
    todo = [str(path)]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if not (folder == str(path) and entry.name in skip):
                    todo.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return {"files": files, "bytes": size, "newestNs": newest}


class FetchRecord:
    """What each run's JOB_DIR, working directory's outputs and log looked like, on the host and here,
    after its last complete fetch.

    When both are unchanged there is nothing to fetch, and no rsync is started.
    """

    def __init__(self, cache: Path):
        self.path = cache / "fetched.json"
        try:
            self.doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.doc = {}

    @staticmethod
    def _entry(run: Mapping[str, Any], dest: Path) -> dict[str, Any]:
        return {
            "run": run["id"],
            "dest": str(dest.resolve()),
            "remote": run.get("jobSummary"),
            "workdir": run.get("workdirSummary"),
            "log": run.get("logSummary"),
            "local": local_summary(dest),
        }

    def up_to_date(self, run: Mapping[str, Any], dest: Path) -> bool:
        seen = self.doc.get(str(dest.resolve()))
        return (
            bool(seen)
            and all(run.get(k) is not None for k in ("jobSummary", "workdirSummary", "logSummary"))
            and seen == self._entry(run, dest)
        )

    def record(self, run: Mapping[str, Any], dest: Path) -> None:
        """Note a complete fetch; ``save`` writes the notes (once for all the runs of a fetch: one
        write per run made `fetch --all` of 300 runs rewrite the whole file 300 times)."""
        self.doc[str(dest.resolve())] = self._entry(run, dest)

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.doc, indent=1))


def run_time(cache: Path, now: datetime) -> datetime:
    """The time a new run's id is named by (jobs.run_id: to the second): ``now``, or a second after the last
    one named here for the stack when that has not passed yet. Two `train`s of one script within a second (a
    script starting runs, a quick job followed at once by the next) named one id, and the host refused the
    second as already there. Kept in cache/last-run-time under a lock (two trains at once take turns)."""
    import fcntl

    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = cache / "last-run-time"
    lock = os.open(cache / "last-run-time.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (this user's own state: held for milliseconds)
        try:
            last = datetime.fromisoformat(path.read_text().strip())
        except (OSError, ValueError):
            last = None
        when = now.replace(microsecond=0)
        if last is not None and when <= last < when + timedelta(hours=1):  # (a clock set back an hour or more: now)
            when = last + timedelta(seconds=1)
        atomic_write(path, when.isoformat() + "\n")
        return when
    finally:
        os.close(lock)
